"""The main command's live progress line, end-of-run summary and report (issue 18, "must show").

One real ``tiny`` run as a subprocess whose stdout is a pipe (not a terminal): the progress line
must appear within the first seconds and then at least every 10 s (the default period, not
overridden here), and the run must end by printing the summary table and the report's path
(the report must exist). When ``wandb`` is installed the same run logs to it offline
(``WANDB_MODE=offline``, no network) and the offline run files must be there.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from crl_bench.run.progress import ProgressReporter

FIRST_LINE_WITHIN_S = 30.0   # interpreter + torch import + config on 2 shared cores
PERIOD_S = 10.0
SLACK_S = 5.0                # a loaded machine may wake the printing thread late
HAS_WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("progress") / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="0")
    env.pop("CRL_PROGRESS_EVERY", None)
    env.pop("CRL_WANDB", None)
    if HAS_WANDB:
        env["WANDB_MODE"] = "offline"
        env["WANDB_SILENT"] = "true"
    else:
        env.pop("WANDB_MODE", None)
        env.pop("WANDB_API_KEY", None)
    cmd = [sys.executable, "-m", "crl_bench.cli", "run", "--preset", "tiny", "--agent", "grpo",
           "--tasks", "minihack", "--out", str(out), "--set", "threads=1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=Path(__file__).resolve().parents[1])
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    reader.join(timeout=10)
    return {"rc": rc, "lines": lines, "out": out, "end_s": time.monotonic() - t0}


def test_progress_line_on_a_pipe_early_and_every_10s(tiny_run: dict) -> None:
    assert tiny_run["rc"] == 0, "\n".join(line for _, line in tiny_run["lines"])
    progress = [(t, line) for t, line in tiny_run["lines"] if line.startswith("[progress")]
    assert progress, "no progress line on a non-terminal stdout"
    assert progress[0][0] <= FIRST_LINE_WITHIN_S, f"first progress line after {progress[0][0]:.1f} s"
    assert all("\r" not in line for _, line in progress)  # plain lines, no terminal rewriting
    # a line at least every PERIOD_S until the run's summary
    times = [t for t, _ in progress]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps, default=0.0) <= PERIOD_S + SLACK_S, f"gaps {gaps}"
    text = "\n".join(line for _, line in progress)
    for phase in ("loading models", "evaluating", "playing", "updating actor"):
        assert phase in text, f"phase {phase!r} never shown"
    assert re.search(r"run \d+/\d+ episodes", text)
    assert re.search(r"\d+\.\d tok/s", text)
    assert re.search(r"ETA >?=?\d+m\d\ds", text)
    # the count reaches the planned total: 3 steps x 2 groups x 4 + 3 evaluations (0, 2, 3) x 2
    assert "run 30/30 episodes" in text


def test_run_ends_with_summary_and_report_path(tiny_run: dict) -> None:
    lines = [line for _, line in tiny_run["lines"]]
    tail = lines[next(i for i, line in enumerate(lines) if line.startswith("run directory:")):]
    assert "success rate over held-out episodes, evaluation at step 0 -> step 3:" in tail
    assert any(re.match(r"\s+MiniHack Room\s+\d\.\d\d -> \d\.\d\d \(2 episodes\)", line) for line in tail)
    report = [line for line in tail if line.startswith("report: ")]
    assert report, tail
    path = Path(report[0].split()[1])
    assert path == tiny_run["out"] / "report" / "report.md"
    assert path.is_file() and "MiniHack" in path.read_text()
    assert list((tiny_run["out"] / "report" / "plots").glob("*.png"))
    # then what the run was and what to run next for a result
    assert any(line.startswith("This was the `tiny` preset: 3 step(s) of grpo on minihack")
               for line in tail), tail
    # the command as the user started this one (here `python -m crl_bench.cli`)
    prog = f"{Path(sys.executable).name} -m crl_bench.cli"
    assert f"  {prog} run --agent comp_rl --tasks minihack --preset cpu --seed 0 1 2" in tail


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install 'crl-bench[wandb]')")
def test_wandb_offline_logs_beside_tensorboard(tiny_run: dict) -> None:
    runs = list((tiny_run["out"] / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tiny_run["out"]).iterdir())
    assert list(runs[0].glob("run-*.wandb")), list(runs[0].iterdir())
    if importlib.util.find_spec("tensorboard") is not None:  # TensorBoard beside it, when installed
        assert list((tiny_run["out"] / "tensorboard").iterdir())


def test_reporter_eta_and_lines() -> None:
    stream = io.StringIO()
    rep = ProgressReporter(stream=stream, every_s=10)
    rep.plan_run(total_steps=2, start_step=0, train_episodes_per_step=4, eval_episodes=2,
                 eval_steps=[0, 2])
    assert rep.snapshot()["episodes_total"] == 12
    assert rep.snapshot()["eta_s"] is None          # nothing measured yet
    rep.begin_play("evaluating", 2)
    rep.on_play_progress({"episodes_done": 1, "episodes": 2, "turns": 5, "turns_max": 10,
                          "tokens": 40})
    s = rep.snapshot()
    assert s["play_done"] == 1 and s["eta_s"] is not None and s["eta_lower_bound"]
    rep._play_t0 -= 2.0                              # the play took 2 s so far: 1 of 12 episodes
    eta = rep.snapshot()["eta_s"]
    assert 20.0 <= eta <= 24.0                       # 11 episodes left at ~2 s each
    rep.end_play()
    assert rep.snapshot()["episodes_done"] == 2
    line = rep.line()
    assert "evaluating" in line and "run 2/12 episodes" in line and "ETA >=" in line
    rep.set_phase("playing")                         # a phase change prints a line (non-terminal)
    assert stream.getvalue().strip().splitlines()[-1].startswith("[progress")
