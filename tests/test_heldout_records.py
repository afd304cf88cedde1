"""Held out, end to end: short real runs (the ``tiny`` preset on the real
``crl/MiniHack-Room-Landmark-5x5-v0``, 2 steps, evaluated at steps 0, 1 and 2) for several run
seeds, and a check, from the levels the runs actually played, that no training episode played an
evaluation level.

"Played" is read from the run directory, not from the seed formula
(``crl_bench.run.parts.seeds.train_seed``): the level seed of every training episode in
``episodes.jsonl`` (one record per episode, checked against the step's trajectory file), the
first observation each training trajectory recorded (a fresh env reset with the recorded seed
must show the same room: the recorded seed is the level that was played) and the level seeds of
the evaluation records. The control run swaps ``train_seed`` for the formula the runner used
before training moved past the evaluation block (``run_seed * 1_000_003 + index``: run seed 1's
groups land on evaluation levels 1,000,002+): the same check must then find the overlap, so the
test fails if training ever plays evaluation levels again.

The same runs feed ``experiments/experience_records.py``: their compact records are exported and
the plan's analysis recomputed from those files alone.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import experience_records as er  # noqa: E402

ENV = "crl/MiniHack-Room-Landmark-5x5-v0"
EVAL_LEVELS = 16  # evaluation levels 1,000,000 - 1,000,015: the old formula's overlap is inside
STEPS = 2
RUNS = (("grpo", 0), ("grpo", 1), ("grpo", 2), ("comp_rl", 1), ("comp_rl", 2))
OVERRIDES = {"threads": 1, "extractor.runs": "inline", "eval.every": 1,
             "eval.episodes_per_task": EVAL_LEVELS, "rollout.env_max_steps": {"minihack": 1},
             "rollout.env_kwargs": {"minihack": {"view": "compact"}}}
pytestmark = pytest.mark.slow


def play(agent: str, seed: int, path: Path) -> Path:
    from crl_bench.runner.api import run_experiment

    return Path(run_experiment(agent, ENV, "tiny", seed, path, steps=STEPS, progress=False,
                               overrides=dict(OVERRIDES)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, int], Path]:
    root = tmp_path_factory.mktemp("heldout_runs")
    return {(a, s): play(a, s, root / f"{a}__{s}") for a, s in RUNS}


def levels_played(run: Path) -> dict[str, list[int]]:
    """Level seeds by phase, one per episode, from the run's episode records; the training ones
    checked against the step's trajectory file and each training trajectory's first observation
    against a fresh env reset with its recorded seed."""
    import gymnasium

    import crl_bench  # noqa: F401  (registers the crl/ envs)

    episodes = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    cfg = json.loads((run / "config.json").read_text())
    train = [e for e in episodes if e["phase"] == "train"]
    r = cfg["rollout"]
    assert len(train) == cfg["steps"] * r["groups"] * r["group_size"], "a training episode unrecorded"
    env = gymnasium.make(ENV, max_steps=1, view="compact")
    first: dict[int, str] = {}
    for step in range(1, cfg["steps"] + 1):
        with gzip.open(run / "trajectories" / f"train_step_{step:05d}.jsonl.gz", "rt") as fh:
            trajs = [json.loads(line) for line in fh]
        assert sorted(t["seed"] for t in trajs) == sorted(e["seed"] for e in train if e["step"] == step)
        for t in trajs:
            if t["seed"] not in first:
                first[t["seed"]] = str(env.reset(seed=t["seed"])[0])
            assert t["first_observation"] == first[t["seed"]], f"level {t['seed']} not the one played"
    return {phase: [e["seed"] for e in episodes if e["phase"] == phase] for phase in ("train", "eval")}


def overlap(levels: dict[str, list[int]]) -> set[int]:
    return set(levels["train"]) & set(levels["eval"])


def test_no_training_episode_played_an_evaluation_level(runs) -> None:
    train_by_seed: dict[int, set[int]] = {}
    for (agent, seed), run in runs.items():
        levels = levels_played(run)
        modes = 2 if agent == "comp_rl" else 1  # with and without experience
        evaluations = STEPS + 1  # steps 0, 1, 2
        assert sorted(levels["eval"]) == sorted(
            list(range(1_000_000, 1_000_000 + EVAL_LEVELS)) * modes * evaluations)
        assert not overlap(levels), f"{agent} seed {seed} trained on evaluation levels"
        train_by_seed.setdefault(seed, set()).update(levels["train"])
    # runs of different seeds are independent replicates: disjoint training levels
    seeds = sorted(train_by_seed)
    for i, a in enumerate(seeds):
        for b in seeds[i + 1:]:
            assert not train_by_seed[a] & train_by_seed[b]


def test_the_check_finds_training_on_evaluation_levels(tmp_path, monkeypatch) -> None:
    """The control: with the old seed formula, run seed 1's training groups 2-5 play levels
    1,000,005 - 1,000,008, which the evaluation plays too; the check above must see it."""
    import crl_bench.run.parts.player as player  # where the plan takes its training seeds

    monkeypatch.setattr(player, "train_seed", lambda run_seed, index, offset: run_seed * 1_000_003 + index)
    levels = levels_played(play("grpo", 1, tmp_path / "old_formula"))
    assert overlap(levels) == {1_000_003 + i for i in range(2, 6)}


def test_exported_records_hold_what_the_run_recorded_and_analyse_reads_only_them(runs, tmp_path) -> None:
    records = tmp_path / "records"
    for run in runs.values():
        path = er.export_run(run, records)
        assert path.stat().st_size < 100_000
    header, episodes = er.load_records(records / "comp_rl__seed1.jsonl")
    raw = [json.loads(x) for x in (runs[("comp_rl", 1)] / "episodes.jsonl").read_text().splitlines()]
    raw_eval = [e for e in raw if e["phase"] == "eval"]
    assert [(e["step"], e["seed"], e["exp"], e["success"], e["actions"]) for e in episodes] == [
        (e["step"], e["seed"], int(e["with_experience"]), int(e["success"]), e["actions"])
        for e in raw_eval]
    assert all(len(e["actions"]) <= 1 for e in episodes)  # one-action levels
    assert header["train_levels"] == sorted({e["seed"] for e in raw if e["phase"] == "train"})
    assert er.held_out_check(header, episodes) == []
    # the analysis from the exported files alone: comp_rl seed 0 and exp_only were not run
    for run in runs.values():  # the run directories are not read
        (run / "episodes.jsonl").unlink()
    result = er.analyse(records, agents=("grpo", "comp_rl", "exp_only"), seeds=(0, 1, 2), steps=STEPS)
    missing = {(m["agent"], m["seed"]) for m in result["missing"]}
    assert missing == {("comp_rl", 0)} | {("exp_only", s) for s in (0, 1, 2)}
    grpo1 = next(r for r in result["runs"] if r["series"] == "grpo" and r["seed"] == 1)
    with_exp = {s: sum(e["success"] for e in raw_eval if e["step"] == s and e["with_experience"])
                / EVAL_LEVELS for s in range(STEPS + 1)}
    comp1 = next(r for r in result["runs"] if r["series"] == "comp_rl with exp" and r["seed"] == 1)
    assert comp1["start"] == with_exp[0] and comp1["end"] == with_exp[STEPS]
    assert comp1["auc"] == pytest.approx((with_exp[0] + 2 * with_exp[1] + with_exp[2]) / 4)
    assert set(grpo1) >= {"start", "end", "auc", "top_move_share", "collapsed"}
    primary = result["comparisons"][0]
    assert (primary["metric"], primary["a"], primary["b"]) == ("auc", "comp_rl with exp", "grpo")
    assert (primary["n_a"], primary["n_b"], primary["perm_assignments"]) == (2, 3, 10)
    assert primary["paired_seeds"] == [1, 2]
    assert result["verdict"] in ("hit", "miss", "reverse")
    assert result["held_out_violations"] == {}
    text = er.summary_markdown(result)
    assert "comp_rl seed 0: no records file" in text and "exp_only seed 2" in text
