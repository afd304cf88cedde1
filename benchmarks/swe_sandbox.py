"""How much the SWE sandbox costs, measured against plain subprocesses in the same run.

Prints, for each isolation mode available here:

* per-command latency of ``true`` in the sandbox vs ``subprocess.run(["bash", "-c", "true"])``
  (the disk quota in force is named: a tmpfs, or the budget measured while commands run; set
  ``CRL_SWE_NO_QUOTA_MOUNT=1`` for the second);
* the ``mini`` grading test run (pytest on one test file) in the sandbox vs the same pytest
  command run directly on the host in a copy of the workspace;
* one whole ``mini`` episode: reset, replay the gold patch through the tools, submit.

Usage: ``python benchmarks/swe_sandbox.py [--commands 30] [--tasks 3]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from crl_bench.envs.swe.env import SWETextEnv
from crl_bench.envs.swe.sandbox import LocalSandbox, namespaces_available
from crl_bench.envs.swe.tasks import MiniTaskSet


def _median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=3)
    args = parser.parse_args(argv)
    modes = ["unsafe-rlimits"] + (["namespaces"] if namespaces_available()[0] else [])
    mini = MiniTaskSet()
    task_ids = sorted(mini.tasks)[: args.tasks]
    runtime = mini.local_runtime(mini.task(task_ids[0]))

    base = _median_s(lambda: subprocess.run(["bash", "-c", "true"], check=True), args.commands)
    print(f"plain subprocess `bash -c true`: {base * 1e3:7.1f} ms (baseline)")
    with tempfile.TemporaryDirectory() as tmp:
        host_copy = Path(tmp) / "ws"
        shutil.copytree(runtime.template, host_copy)
        py = str(runtime.venv / "bin" / "python")
        cmd = runtime.test_command.replace("python ", py + " ", 1)
        host_test = _median_s(lambda: subprocess.run(
            cmd, shell=True, cwd=host_copy, capture_output=True,
            env={"PYTHONPATH": str(host_copy), "PATH": "/usr/bin:/bin"}), 3)
    print(f"pytest on the host (test file of {task_ids[0]}): {host_test:6.2f} s (baseline)")

    for mode in modes:
        sb = LocalSandbox(isolation=mode, venv=str(runtime.venv), ro_binds=runtime.ro_binds,
                          env=dict(runtime.env))
        sb.prepare(runtime.template)
        t = _median_s(lambda sb=sb: sb.run("true"), args.commands)
        print(f"[{mode}] sandboxed `true`: {t * 1e3:7.1f} ms  = {t / base:4.1f}x plain "
              f"(quota: {sb.describe()['quota']})")
        tt = _median_s(lambda sb=sb: sb.run(runtime.test_command, timeout_s=300), 3)
        print(f"[{mode}] sandboxed pytest: {tt:6.2f} s  = {tt / host_test:4.2f}x host")
        reset = _median_s(sb.reset, 5)
        print(f"[{mode}] workspace reset (copy + chown): {reset * 1e3:7.1f} ms")
        sb.close()

        env = SWETextEnv(task_set="mini", split="all", isolation=mode)
        episodes = []
        for iid in task_ids:
            t = time.perf_counter()
            env.reset(options={"task_id": iid})
            for action in env.reference_actions():
                info = env.step(action)[4]
            assert info["success"], iid
            episodes.append(time.perf_counter() - t)
        env.close()
        print(f"[{mode}] gold episode (reset, edits, submit+grade): median "
              f"{statistics.median(episodes):.2f} s over {len(episodes)} tasks "
              f"= {statistics.median(episodes) / host_test:4.2f}x one host pytest run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
