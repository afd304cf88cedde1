"""Benchmarks and experiments are code too: every script in benchmarks/ and experiments/ runs at
its smoke size.

:data:`SMOKE` gives each script the arguments of its smallest real run: the tiny models
(``tiny-random``, the ``tiny`` preset), a handful of envs, steps and samples. The one test runs
them all, in order, each in its own process, and fails on the first that exits non-zero,
naming it with the tail of its output. Scripts that need env data this machine lacks (see
tests/_data_paths.py) are not run; they are named in the test's skip message when nothing else
failed. The figures printed at this size mean nothing; only that the script still works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _data_paths import shared_data_dir

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "experiments")

SMOKE: dict[str, list[str]] = {
    # script: arguments; "{tmp}" is a scratch folder, "{data:FAMILY}" the family's data folder,
    # "{runs}" the run folder that learning_minihack.py wrote (it runs before the scripts
    # that read runs)
    "benchmarks/bank.py": ["--sizes", "300", "--dim", "32", "--repeats", "2", "--no-embed",
                           "--readers", "1", "--seconds", "0.3", "--build-threads", "1"],
    "benchmarks/env_throughput.py": ["--steps", "100", "--repeats", "1"],
    "benchmarks/rollout_throughput.py": ["--model", "tiny-random", "--envs", "2", "--turns", "1",
                                         "--max-new-tokens", "4", "--threads", "1"],
    "benchmarks/train_throughput.py": ["--model", "tiny-random", "--episodes", "2", "--turns",
                                       "2", "--max-new-tokens", "4", "--micro-batch", "2",
                                       "--repeats", "1"],
    "benchmarks/shared_prefix_update.py": ["--model", "tiny-random", "--groups", "2",
                                           "--group-size", "2", "--micro-batch", "2",
                                           "--repeats", "1"],
    "benchmarks/generation_memory.py": ["--model", "tiny-random", "--sizes", "4", "--rows", "4",
                                        "--prompt-tokens", "32", "--new-tokens", "2"],
    "experiments/extractor_format.py": ["--model", "tiny-random", "--samples", "1",
                                        "--max-new-tokens", "8", "--show", "0"],
    "experiments/learning_minihack.py": ["--agents", "grpo", "--seeds", "0", "--preset", "tiny",
                                         "--steps", "1", "--out", "{tmp}/learning",
                                         "--no-progress", "--set", "threads=1"],
    "experiments/minihack_credit.py": ["{runs}"],
    "experiments/minihack_reading.py": ["--preset", "tiny", "--levels", "2", "--samples", "1",
                                        "--views", "compact", "--examples", "none"],
    "experiments/minihack_reading_sft.py": ["--preset", "tiny", "--examples", "4", "--batch",
                                            "2", "--probe-every", "4", "--levels", "2",
                                            "--samples", "1", "--out", "{tmp}/reading_sft"],
    # its smoke run and a planted FAIL are also tested by tests/test_gpu_check_smoke.py
    "benchmarks/gpu_check.py": ["--smoke", "--device", "cpu", "--json", "{tmp}/gpu_check.json"],
    "benchmarks/webshop_throughput.py": ["--data-dir", "{data:webshop}", "--episodes", "3",
                                         "--queries", "5"],
    "experiments/webshop_oracle_ceiling.py": ["--data-dir", "{data:webshop}"],
    "experiments/webshop_reward_parity.py": ["--webshop-src", "{webshop_src}", "--data-dir",
                                             "{data:webshop}", "--cases", "5"],
    "benchmarks/alfworld_latency.py": ["--data-dir", "{data:alfworld}", "--games", "1",
                                       "--think-ms", "0"],
    "experiments/alfworld_expert.py": ["--data-dir", "{data:alfworld}", "--train-per-type", "0"],
    "benchmarks/scale_envs.py": ["--family", "alfworld", "--workers", "1", "--envs", "1",
                                 "--episodes", "1"],
    "benchmarks/swe_sandbox.py": ["--commands", "2", "--tasks", "1"],
    "benchmarks/plan_memory.py": ["--smoke", "--precision", "fp32"],
    "benchmarks/precision_memory.py": ["--model", "tiny-random"],
    "benchmarks/actor_wait.py": ["--smoke", "--json", "{tmp}/actor_wait.json"],
    # no finished runs: every run reported missing, the verdict "no data" (its figures are
    # tested on hand-written and real tiny-run records in tests/test_experience_records.py)
    "experiments/experience_records.py": ["analyse", "--summary-only", "--records",
                                          "{tmp}/no_records", "--out",
                                          "{tmp}/experience_analysis"],
    # the reader comparison's analysis on an empty records folder: every run missing, every
    # comparison pending (its figures: tests/test_reader_analysis.py, test_reader_recompute.py)
    "experiments/reader_analysis.py": ["--records", "{tmp}/no_reader_records", "--out",
                                       "{tmp}/reader_analysis"],
    "benchmarks/quick_preset_cost.py": ["--tokens-only"],
    "experiments/minihack_landmark.py": ["--smoke", "--baselines", "--levels", "8"],
}
NEEDS: dict[str, tuple[str, ...]] = {
    "benchmarks/webshop_throughput.py": ("webshop",),
    "experiments/webshop_oracle_ceiling.py": ("webshop",),
    "experiments/webshop_reward_parity.py": ("webshop", "webshop_src"),
    "benchmarks/alfworld_latency.py": ("alfworld",),
    "experiments/alfworld_expert.py": ("alfworld",),
    "benchmarks/scale_envs.py": ("alfworld", "ray"),
}
WEBSHOP_SRC = "CRL_BENCH_WEBSHOP_SRC"
"""A checkout of princeton-nlp/WebShop, for webshop_reward_parity.py (its reward, run beside ours)."""


def test_every_benchmark_has_a_smoke_size():
    scripts = sorted(f"{folder}/{p.name}" for folder in FOLDERS
                     for p in (REPO / folder).glob("*.py"))
    assert sorted(SMOKE) == scripts, (
        f"scripts without a smoke size: {sorted(set(scripts) - set(SMOKE))}; "
        f"smoke sizes without a script: {sorted(set(SMOKE) - set(scripts))}")


def _missing(needs: tuple[str, ...]) -> str | None:
    for need in needs:
        if need == "webshop_src" and not os.environ.get(WEBSHOP_SRC):
            return f"${WEBSHOP_SRC} (a princeton-nlp/WebShop checkout) is not set"
        if need == "ray":
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                return "ray is not installed"
        elif need != "webshop_src" and shared_data_dir(need) is None:
            return f"no {need} data"
    return None


@pytest.mark.slow
def test_every_benchmark_runs_at_its_smoke_size(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1", CRL_WANDB="0",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    subs = {"{tmp}": str(tmp_path), "{runs}": str(tmp_path / "learning" / "runs" / "minihack__grpo__0"),
            "{webshop_src}": os.environ.get(WEBSHOP_SRC, "")}
    for family in ("webshop", "alfworld", "swe"):
        found = shared_data_dir(family)
        subs[f"{{data:{family}}}"] = str(found) if found else ""
    not_run, took = {}, {}
    for script, args in SMOKE.items():
        reason = _missing(NEEDS.get(script, ()))
        if reason:
            not_run[script] = reason
            continue
        argv = [a.replace(k, v) if k in a else a for a in args for k, v in [_sub_of(a, subs)]]
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, str(REPO / script), *argv], capture_output=True,
                             text=True, timeout=600, env=env, cwd=tmp_path)
        took[script] = round(time.perf_counter() - t0, 1)
        assert res.returncode == 0, (f"{script} {' '.join(argv)} exited "
                                     f"{res.returncode}:\n{(res.stdout + res.stderr)[-3000:]}")
    print(f"seconds per script: {took}")
    if not_run:
        pytest.skip(f"all others ran; not run here: {not_run}")


def _sub_of(arg: str, subs: dict[str, str]) -> tuple[str, str]:
    for key, value in subs.items():
        if key in arg:
            return key, value
    return "\0", ""
