"""End to end: `crl-bench run` for each agent on MiniHack with the tiny preset, a SIGKILL resume,
and the report written from those real run directories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.records.files import read_jsonl  # noqa: E402

AGENTS = ("grpo", "static_exp", "exp_only", "comp_rl")
STEPS = 3
# tiny preset: 2 groups x K=4 per step; eval every 2 steps and at the end on 2 episodes per mode
GROUPS, K = 2, 4
TRAIN_EPISODES_PER_STEP = GROUPS * K
BIN = Path(sys.executable).parent


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "crl-bench"), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TQDM_DISABLE": "1"})


@pytest.fixture(scope="module")
def tiny_runs(tiny_run) -> dict[tuple[str, int], Path]:
    """Real tiny runs (shared per session, see conftest): the four agents with seed 0, and
    grpo / comp_rl with seed 1 too."""
    return {(agent, seed): tiny_run(agent, seed).path
            for agent, seed in [(a, 0) for a in AGENTS] + [("grpo", 1), ("comp_rl", 1)]}


@pytest.mark.slow
@pytest.mark.parametrize("agent", AGENTS)
def test_tiny_run_leaves_a_complete_run_directory(tiny_runs, agent):
    run = tiny_runs[(agent, 0)]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "done" and status["step"] == STEPS
    config = json.loads((run / "config.json").read_text())
    assert config["agent"] == agent and config["preset"] == "tiny" and config["task_names"] == ["MiniHack Room"]
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(0, STEPS + 1))
    for m in metrics[1:]:
        assert {"charts/success_rate", "timing_s/rollout", "timing_s/step", "timing_s/extractor_wait"} <= set(m)
        assert 0 < m["memory/rss_gb"] <= m["memory/peak_rss_gb"]
    # the bank's lag at each training rollout: 0 with the tiny preset's inline extractor (every
    # earlier step's entries are in); agents without an extractor log none
    lags = [m.get("extractor/bank_lag_steps") for m in metrics[1:]]
    assert lags == ([None] * STEPS if agent == "grpo" else [0] * STEPS), lags
    episodes = read_jsonl(run / "episodes.jsonl")
    train = [e for e in episodes if e["phase"] == "train"]
    assert [sum(e["step"] == s for e in train) for s in range(1, STEPS + 1)] == [TRAIN_EPISODES_PER_STEP] * STEPS
    with_exp = sum(e["with_experience"] for e in train)
    expected_with = {"grpo": 0, "static_exp": STEPS * GROUPS * 2, "exp_only": STEPS * GROUPS * 4,
                     "comp_rl": STEPS * GROUPS * 2}[agent]
    assert with_exp == expected_with
    evals = read_jsonl(run / "eval.jsonl")
    assert sorted({e["step"] for e in evals}) == [0, 2, 3]
    modes = {e["with_experience"] for e in evals}
    assert modes == ({False} if agent == "grpo" else {False, True})
    assert (run / "checkpoints" / "last" / "loop_state.json").exists()
    assert (run / "bank.sqlite").exists() == (agent != "grpo")
    # tiny preset: 1 warm-up step, in which agents with a bank only fill it
    trained = ["losses/actor_samples" in m for m in metrics[1:]]
    assert trained == {"grpo": [True] * STEPS, "exp_only": [False] * STEPS,
                       "static_exp": [False] + [True] * (STEPS - 1),
                       "comp_rl": [False] + [True] * (STEPS - 1)}[agent]
    # the updates are real: some samples carry an advantage and the gradient is not zero, for
    # every role that trains; a frozen role logs no update at all
    for role, trains in (("actor", agent != "exp_only"), ("extractor", agent in ("exp_only", "comp_rl"))):
        active = [m.get(f"losses/{role}_active_samples", 0.0) for m in metrics[1:]]
        grads = [m.get(f"losses/{role}_grad_norm", 0.0) for m in metrics[1:]]
        if trains:
            assert max(active) > 0 and max(grads) > 0, (role, active, grads)
            for a, g in zip(active, grads):  # an update with active samples moves the weights
                assert (a > 0) == (g > 0), (role, active, grads)
        else:
            assert not any(f"losses/{role}_samples" in m for m in metrics), role
    for key in ("bank/size", "bank/retrievals"):  # the report plots them under these names
        assert (key in metrics[-1]) == (agent != "grpo")
    if agent in ("static_exp", "exp_only", "comp_rl"):
        assert sum(m["bank/retrievals"] for m in metrics[1:]) > 0
    assert len(list((run / "trajectories").glob("train_step_*.jsonl.gz"))) == STEPS
    # every extractor batch keeps its own record (the track runs inline here: one per step,
    # finished in the step that submitted it); the step records combine them
    batches = read_jsonl(run / "extractor.jsonl")
    if agent == "grpo":
        assert not batches and not any("extractor/batches_done" in m for m in metrics)
    else:
        assert [(b["step"], b["batch_step"]) for b in batches] == [(s, s) for s in range(1, STEPS + 1)]
        assert sum(m["extractor/batches_done"] for m in metrics[1:]) == len(batches)
        assert sum(m["extractor/extract_s"] for m in metrics[1:]) == pytest.approx(
            sum(b["extractor/extract_s"] for b in batches))


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_has_no_duplicate_or_missing_records(tmp_path):
    out = tmp_path / "killed"
    args = [str(BIN / "crl-bench"), "run", "--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny",
            "--steps", "4", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        deadline = time.time() + 600
        while time.time() < deadline:  # kill as soon as step 3's episodes are on disk
            if any(e["step"] == 3 and e["phase"] == "train" for e in read_jsonl(out / "episodes.jsonl")):
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = json.loads((out / "status.json").read_text())
    assert killed_at["state"] == "running"
    # work after the checkpoint is redone on resume, so its bank writes must go too: the bank
    # comes back from the checkpoint's copy (a marker written now stands for such a write)
    import numpy as np

    from crl_bench.experience.bank import ExperienceBank

    assert (out / "checkpoints" / "last" / "bank.sqlite").is_file()
    with ExperienceBank.open(out / "bank.sqlite") as bank:
        vec = np.ones((1, bank.dim), dtype=np.float32) / np.sqrt(bank.dim)
        bank.add([{"title": "written after the checkpoint", "content": "x",
                  "family": "minihack"}], vec, step=99)
    res = run_cli("run", "--out", str(out), "--resume", "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    with ExperienceBank.open(out / "bank.sqlite", read_only=True) as bank:
        assert "written after the checkpoint" not in {e.title for e in bank.get(bank.all_ids())}
        assert bank.verify() == []
    assert json.loads((out / "status.json").read_text())["state"] == "done"
    episodes = read_jsonl(out / "episodes.jsonl")
    train = [e for e in episodes if e["phase"] == "train"]
    counts = [sum(e["step"] == s for e in train) for s in range(1, 5)]
    assert counts == [TRAIN_EPISODES_PER_STEP] * 4, counts
    # each step's episodes exactly once: per group K/2 with and K/2 without experience, on the
    # group's own seed (context.train_seed: step * groups + group for run seed 0)
    from collections import Counter

    for step in range(1, 5):
        mine = [e for e in train if e["step"] == step]
        assert Counter((e["group"], e["with_experience"]) for e in mine) == {
            (g, w): K // 2 for g in range(GROUPS) for w in (True, False)}, step
        assert {(e["group"], e["seed"]) for e in mine} == {(g, step * GROUPS + g) for g in range(GROUPS)}
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    evals = read_jsonl(out / "eval.jsonl")
    assert sorted({e["step"] for e in evals}) == [0, 2, 4]
    for step in (0, 2, 4):  # each evaluation exactly once: 2 modes x 1 task
        assert sum(e["step"] == step for e in evals) == 2


@pytest.mark.slow
def test_report_tables_and_plots_from_real_tiny_runs(tiny_runs, tmp_path):
    from scipy import stats

    from crl_bench.report.writer import write_report

    result = write_report(sorted(set(tiny_runs.values())), tmp_path, plots=True)
    doc = json.loads((tmp_path / "report.json").read_text())
    names = {t["name"] for t in doc["tables"]}
    assert {"single_success", "single_actions"} <= names
    (single,) = [t for t in doc["tables"] if t["name"] == "single_success"]
    rows = {r["label"]: r for r in single["rows"]}
    assert {"Baseline", "Comp. RL w/ exp", "Comp. RL w/o exp"} <= set(rows)
    (cell,) = [c for c in rows["Baseline"]["cells"] if c["column"] == "MiniHack Room"]
    values = []
    for seed in (0, 1):
        evals = read_jsonl(tiny_runs[("grpo", seed)] / "eval.jsonl")
        last = max(e["step"] for e in evals)
        (rec,) = [e for e in evals if e["step"] == last and not e["with_experience"]]
        values.append(rec["success_rate"])
    assert cell["values"] == values and cell["n"] == 2
    mean = sum(values) / 2
    if stats.sem(values) > 0:
        lo, hi = stats.t.interval(0.95, 1, loc=mean, scale=stats.sem(values))
        assert (cell["ci_low"], cell["ci_high"]) == pytest.approx((lo, hi))
    else:  # identical values: a zero-width interval
        assert cell["ci_low"] == pytest.approx(mean) and cell["ci_high"] == pytest.approx(mean)
    assert result.plots, "no plots written"
    for p in result.plots:
        assert p.path.stat().st_size > 5_000
    assert (tmp_path / "report.md").read_text().count("|") > 10
    # what each run took, from its own records
    for rec in doc["runs"]:
        run_dir = Path(rec["path"])
        train = [e for e in read_jsonl(run_dir / "episodes.jsonl") if e["phase"] == "train"]
        assert rec["steps"] == STEPS and rec["train_episodes"] == len(train) == STEPS * TRAIN_EPISODES_PER_STEP
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        assert "timing_s/eval" in metrics[0]  # the step-0 evaluation is timed too
        timed = metrics[0]["timing_s/eval"] + sum(m["timing_s/step"] for m in metrics[1:])
        assert rec["time_min"] == pytest.approx(timed / 60)
        assert (rec["bank_size"] is None) == (rec["agent"] == "grpo")
    assert f"## Runs ({len(doc['runs'])})" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_extracted_entries_reach_the_bank_and_later_prompts(tmp_path):
    """The whole experience path with the answer template: the extractor's answers become bank
    entries (with provenance), retrieval hands them to later "with experience" episodes, and
    `crl-bench bank show` lists them."""
    out = tmp_path / "run"
    res = run_cli("run", "--agent", "comp_rl", "--tasks", "minihack", "--preset", "tiny", "--steps", str(STEPS),
                  "--out", str(out), "--no-progress", "--set", "extractor.answer_template=content")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["bank/size"] >= 1
    extract = [m for m in metrics if "extractor/malformed_frac" in m]
    assert extract and min(m["extractor/malformed_frac"] for m in extract) < 1.0
    episodes = read_jsonl(out / "episodes.jsonl")
    used = [e for e in episodes if e["experience_ids"]]
    assert used and all(e["with_experience"] for e in used)
    shown = run_cli("bank", "show", str(out / "bank.sqlite"))
    assert shown.returncode == 0
    assert "what went wrong" in shown.stdout or "what worked" in shown.stdout
    assert f"run {out.name}" in shown.stdout
