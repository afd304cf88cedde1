"""One process per run directory: a second trainer is refused, ``reproduce`` leaves a run that
another live process trains alone, and a SIGKILLed holder frees the run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crl_bench.runner.reproduce import reproduce
from crl_bench.report.suites import run_dir_name
from crl_bench.runner.api import run_experiment
from crl_bench.records.files import RunDir, RunInUseError, run_holder

from test_report import fixture_runner

HOLD = """
import sys, time
from crl_bench.records.files import RunDir
run = RunDir(sys.argv[1]); run.acquire(); print("held", flush=True); time.sleep(600)
"""


def hold(path: Path) -> subprocess.Popen:
    """A child process that takes the run in ``path`` and sleeps holding it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_process_is_refused_and_sigkill_frees_the_run(tmp_path):
    path = tmp_path / "run"
    assert run_holder(path) is None  # no folder yet
    proc = hold(path)
    try:
        assert run_holder(path) == proc.pid
        with pytest.raises(RunInUseError, match=rf"another process \(pid {proc.pid}\).*--resume"):
            RunDir(path).acquire()
        # the runner refuses before touching the records
        with pytest.raises(RunInUseError):
            run_experiment("grpo", "minihack", "tiny", 0, path, steps=1, progress=False)
        assert not (path / "config.json").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert run_holder(path) is None
    run = RunDir(path)
    run.acquire()
    run.acquire()  # idempotent within the owner
    assert run_holder(path) == os.getpid()  # flock is per open file: our own hold shows too
    run.release()
    assert run_holder(path) is None


def test_reproduce_leaves_a_run_trained_elsewhere_alone(tmp_path):
    busy = tmp_path / "runs" / run_dir_name("minihack", "grpo", 0)
    proc = hold(busy)
    try:
        calls: list = []
        logs: list[str] = []
        result = reproduce("single", "tiny", 1, tmp_path, steps=4, tasks=["minihack"], plots=False,
                           run_fn=fixture_runner(calls), log=logs.append)
        assert [(c[0], c[1]) for c in calls] == [("minihack", "comp_rl")]
        assert [(m.tasks, m.agent) for m in result.missing] == [("minihack", "grpo")]
        assert any(f"pid {proc.pid}" in m and "skipped" in m for m in logs)
        assert f"being trained by another process (pid {proc.pid})" in result.markdown.read_text()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # once the holder is gone the next call trains it
    calls.clear()
    result = reproduce("single", "tiny", 1, tmp_path, steps=4, tasks=["minihack"], plots=False,
                       run_fn=fixture_runner(calls), log=lambda m: None)
    assert [(c[0], c[1]) for c in calls] == [("minihack", "grpo")]
    assert result.missing == []


def test_reproduce_skips_a_run_taken_after_planning(tmp_path):
    """Two reproduce processes over one folder: a run the other one starts between our planning
    and our turn is skipped (not reported as a failure, not trained twice)."""
    busy = tmp_path / "runs" / run_dir_name("minihack", "comp_rl", 0)
    holders: list[subprocess.Popen] = []
    calls: list = []
    inner = fixture_runner(calls)

    def run_fn(**kw):
        if kw["agent"] == "grpo":  # while grpo trains, another process takes comp_rl
            holders.append(hold(busy))
        if Path(kw["out_dir"]) == busy:
            RunDir(busy).acquire()  # what run_experiment does first: refused
        return inner(**kw)

    logs: list[str] = []
    try:
        result = reproduce("single", "tiny", 1, tmp_path, steps=4, tasks=["minihack"], plots=False,
                           run_fn=run_fn, log=logs.append)
    finally:
        for proc in holders:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert [(c[0], c[1]) for c in calls] == [("minihack", "grpo")]
    assert not any("FAILED" in m for m in logs)
    assert any("skipped" in m and "comp_rl" in m for m in logs)
    assert [(m.tasks, m.agent) for m in result.missing] == [("minihack", "comp_rl")]
