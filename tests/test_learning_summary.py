"""experiments/learning_minihack.py's arithmetic: start/end pairing per held-out episode, CIs.

Run directories are written by hand here (episodes.jsonl / metrics.jsonl lines in the loop's
format) so that every expected number is known; the script's end-to-end path (real runs) is
exercised by running it (see results/learning_minihack/summary.md for the command).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "learning_minihack", Path(__file__).resolve().parents[1] / "experiments" / "learning_minihack.py")
lm = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lm)


def _reading_probe():
    """experiments/minihack_reading.py, loaded as a module (experiments/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "minihack_reading", Path(__file__).resolve().parents[1] / "experiments" / "minihack_reading.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def _run(path: Path, start: list[int], end: list[int], last_step: int = 4) -> Path:
    path.mkdir(parents=True)
    eps = []
    for step, outcome in ((0, start), (last_step, end)):
        for i, ok in enumerate(outcome):
            eps.append({"phase": "eval", "step": step, "task_id": f"t{i}", "seed": 100 + i,
                        "with_experience": False, "success": bool(ok)})
    eps.append({"phase": "train", "step": 1, "task_id": "x", "seed": 1, "with_experience": False,
                "success": True})  # training episodes are not evaluation
    (path / "episodes.jsonl").write_text("\n".join(json.dumps(e) for e in eps) + "\n")
    metrics = [{"step": 0, "timing_s/eval": 60.0}, {"step": 1, "timing_s/step": 120.0},
               {"step": 4, "timing_s/step": 180.0}]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    return path


def test_wilson_known_values() -> None:
    lo, hi = lm.wilson(0, 8)
    assert lo == 0.0 and hi == pytest.approx(0.3244, abs=1e-3)
    lo, hi = lm.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-3), pytest.approx(0.7634, abs=1e-3))


def test_summary_pairs_episodes_and_computes_cis(tmp_path: Path) -> None:
    runs = {("grpo", 0): _run(tmp_path / "a", [0, 0, 1, 0], [1, 1, 1, 0]),
            ("grpo", 1): _run(tmp_path / "b", [0, 0, 0, 0], [1, 0, 0, 0])}
    s = lm.summarise(runs)["grpo"]
    assert s["start"]["mean"] == pytest.approx(0.125)        # (1/4 + 0/4) / 2
    assert s["end"]["mean"] == pytest.approx(0.5)            # (3/4 + 1/4) / 2
    assert s["delta_over_seeds"]["mean"] == pytest.approx(0.375)
    # two seeds: t(0.975, 1) = 12.706, deltas 0.5 and 0.25 -> sd 0.17678, se 0.125
    assert s["delta_over_seeds"]["high"] - s["delta_over_seeds"]["mean"] == pytest.approx(12.706 * 0.125, rel=1e-3)
    assert s["start_pooled"]["k"] == 1 and s["end_pooled"]["k"] == 4 and s["end_pooled"]["n"] == 8
    # paired per episode: +1 x3, 0 x5 -> mean 3/8
    d = s["delta_paired_episodes"]
    assert d["mean"] == pytest.approx(3 / 8) and d["n"] == 8
    sd = math.sqrt(sum((x - 3 / 8) ** 2 for x in [1, 1, 1, 0, 0, 0, 0, 0]) / 7)
    assert d["high"] - d["mean"] == pytest.approx(2.3646 * sd / math.sqrt(8), rel=1e-3)
    assert s["first_last_step"] == [(0, 4), (0, 4)]
    assert s["wall_min_per_run"] == [6.0, 6.0]                # (60 + 120 + 180) s


def test_evaluation_levels_a_run_also_trained_on_are_counted(tmp_path: Path) -> None:
    clean = _run(tmp_path / "a", [0, 0], [1, 0])
    leaky = _run(tmp_path / "b", [0, 0], [1, 0])
    with (leaky / "episodes.jsonl").open("a") as fh:  # a training episode on held-out level 101
        fh.write(json.dumps({"phase": "train", "step": 2, "task_id": "t1", "seed": 101,
                             "with_experience": False, "success": True}) + "\n")
    assert lm.trained_eval_levels(clean) == [] and lm.trained_eval_levels(leaky) == [101]
    s = lm.summarise({("grpo", 0): clean, ("grpo", 1): leaky})["grpo"]
    assert s["eval_levels_trained_on"] == [0, 1]


def test_floors_on_the_one_action_level(tmp_path: Path) -> None:
    """chance() on the real Adjacent-3x3 env: each level is solved by exactly one of the 8
    moves, so the constant-move successes over the evaluation's levels sum to 1; the uniform
    walker lands near 1/8."""
    pytest.importorskip("nle")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({
        "env_ids": ["crl/MiniHack-Room-Adjacent-3x3-v0"], "eval": {"episodes_per_task": 24},
        "rollout": {"env_max_steps": {"minihack": 1}}}))
    floor = lm.chance(run, episodes=400)
    per_move = floor["best_constant_move"]["per_move"]
    assert len(per_move) == 8 and sum(per_move.values()) == pytest.approx(1.0)
    assert floor["best_constant_move"]["success"] == max(per_move.values()) >= 1 / 8
    lo, hi = floor["wilson95"]
    assert lo < 1 / 8 < hi


def test_one_seed_has_no_t_ci_over_seeds(tmp_path: Path) -> None:
    s = lm.summarise({("grpo", 0): _run(tmp_path / "a", [0, 1], [1, 1])})["grpo"]
    assert s["delta_over_seeds"]["low"] is None and s["delta_over_seeds"]["mean"] == 0.5


def test_time_breakdown_reads_the_loop_phases_and_every_extractor_batch(tmp_path: Path) -> None:
    """The loop's phases from the step records; the extractor's from its per-batch records,
    so two batches that finished in one step both count; without that file, the step records
    (a lower bound, said so)."""
    run = _run(tmp_path / "a", [0], [1])
    metrics = [{"step": 0, "timing_s/eval": 60.0},
               {"step": 1, "timing_s/step": 300.0, "timing_s/rollout": 120.0,
                "timing_s/actor_update": 180.0, "timing_s/extractor_wait": 30.0,
                "extractor/backlog": 1, "extractor/extract_s": 6.0},
               {"step": 2, "timing_s/step": 420.0, "timing_s/rollout": 150.0, "timing_s/actor_update": 150.0,
                "timing_s/eval": 120.0, "timing_s/extractor_wait": 90.0, "extractor/backlog": 0,
                "extractor/extract_s": 30.0, "extractor/merge_s": 12.0,
                "losses/extractor_time_forward_s": 18.0, "losses/extractor_time_backward_s": 24.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    t = lm.time_breakdown(run)
    assert (t["run"], t["evaluation"], t["playing"], t["actor_update"], t["waiting"]) == (13.0, 3.0, 4.5, 5.5, 2.0)
    assert (t["distilling"], t["merging"], t["extractor_training"]) == (0.6, 0.2, 0.7)
    assert t["extractor_records"] == "metrics.jsonl (a lower bound)"
    # waited 30 + 90 s of 300 + 420 s of training steps; records older than the lag say nothing
    assert t["actor_wait_share"] == pytest.approx(120 / 720) and t["bank_lag_max"] is None
    batches = [{"step": 1, "batch_step": 1, "extractor/extract_s": 6.0},
               {"step": 2, "batch_step": 1, "extractor/extract_s": 24.0, "extractor/merge_s": 12.0},
               {"step": 2, "batch_step": 2, "extractor/extract_s": 30.0,
                "losses/extractor_time_forward_s": 18.0, "losses/extractor_time_backward_s": 24.0}]
    (run / "extractor.jsonl").write_text("\n".join(json.dumps(b) for b in batches) + "\n")
    t = lm.time_breakdown(run)
    assert (t["distilling"], t["merging"], t["extractor_training"]) == (1.0, 0.2, 0.7)
    assert t["extractor_records"] == "extractor.jsonl"
    assert lm.time_breakdown(_run(tmp_path / "b", [0], [1]))["extractor_records"] is None  # grpo


def test_summary_markdown_has_the_time_table(tmp_path: Path) -> None:
    runs = {("grpo", 0): _run(tmp_path / "a", [0, 1], [1, 1]), ("grpo", 1): _run(tmp_path / "b", [0, 0], [1, 0])}
    floor = {"env_id": "crl/X-v0", "max_actions": 1, "episodes": 10, "success": 0.1, "wilson95": [0.0, 0.4]}
    lm.write_markdown(tmp_path, lm.summarise(runs), "python experiments/learning_minihack.py", "cpu", floor)
    text = (tmp_path / "summary.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| agent | whole run"))
    assert header.count("|") == len(lm.TIME_PHASES) + 2
    # each run: 6.0 min in all (60 s evaluation + 120 s and 180 s steps), no phase timings written
    assert "| grpo | 6.0 | 1.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 |" in text
    assert "a lower bound" not in text


def test_lane_args_drop_only_the_per_lane_options():
    argv = ["--tasks", "crl/MiniHack-Room-Random-5x5-v0", "--agents", "grpo", "comp_rl", "--seeds",
            "0", "1", "2", "--jobs", "2", "--set", "actor.lr=3e-4", "--set",
            'rollout.env_max_steps={"minihack": 10}', "--out", "o"]
    assert lm.lane_args(argv) == ["--tasks", "crl/MiniHack-Room-Random-5x5-v0", "--set",
                                  "actor.lr=3e-4", "--set",
                                  'rollout.env_max_steps={"minihack": 10}', "--out", "o"]


def test_turn_stats_reads_actions_against_the_observation_each_prompt_showed(tmp_path: Path) -> None:
    """Turns written by hand in the trajectory format, prompts rendered by the real prompt builder
    and tokenizer: 5 turns, 4 actions (valid 4/5); the stairs are named "far southeast" then
    "near west" (one prompt shows none: left out of toward-stairs); 2 of the 3 actions that saw
    them went that way (one written "West", which the env reads as west); 1 of 4 copied the
    example answer."""
    import gzip

    pytest.importorskip("gguf")
    from crl_bench.llm.models import load_tokenizer
    from crl_bench.llm.prompting import PromptConfig, build_messages

    tok = load_tokenizer("smollm2-135m")
    cfg = PromptConfig.for_small_model(history=0, example_pick="random")
    moves = ["north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest"]

    def turn(observation: str, kind: str, action: str | None, example_seed: int) -> dict:
        messages = build_messages(cfg, family="minihack", goal="Reach the staircase down (>).",
                                  observation=observation, history=[], admissible_actions=moves,
                                  example_seed=example_seed)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        return {"prompt_ids": list(ids), "kind": kind, "action": action}

    far = "You see:\n- staircase down: far southeast\nOpen directions: east 4, south 3."
    near = "You see:\n- staircase down: near west\n- boulder: adjacent north\nOpen directions: west 2."
    dark = "You see:\n- nothing\nOpen directions: none known."
    from crl_bench.llm.prompting import example_action

    copied = example_action(cfg, moves, 5, 0)
    # "West" as the model may write it: the env reads it as west, so it counts as toward
    turns = [turn(far, "action", "southeast", 1), turn(near, "action", "West", 2),
             turn(near, "action", "north" if copied == "west" else "east", 3),
             turn(dark, "action", copied, 5), turn(far, "invalid", None, 4)]
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": {"actor": "smollm2-135m"}}))
    # group 0: a success and a failure (advantages non-zero); group 1: two failures (flat)
    episodes = [(0, 1.0, turns[0:2]), (0, 0.0, turns[2:3]), (1, 0.0, turns[3:4]),
                (1, 0.0, turns[4:5])]
    with gzip.open(run / "trajectories" / "train_step_00003.jsonl.gz", "wt") as fh:
        for group, reward, its_turns in episodes:
            fh.write(json.dumps({"group_id": group, "reward": reward, "turns": its_turns}) + "\n")
    st = lm.turn_stats(run)[3]
    assert st["flat_groups"] == 0.5
    actions = [t["action"].lower() for t in turns if t["kind"] == "action"]
    shares = [actions.count(a) / 4 for a in set(actions)]
    assert st["action_entropy_bits"] == pytest.approx(-sum(q * math.log2(q) for q in shares))
    assert 1.5 <= st["action_entropy_bits"] <= 2.0  # 4 actions, at most one repeated
    assert st["turns"] == 5 and st["valid"] == pytest.approx(4 / 5)
    assert st["toward_goal"] == pytest.approx(2 / 3)
    # the example each prompt showed, recomputed: turns 1-3 copy it only by coincidence
    shown = [example_action(cfg, moves, s, 0) for s in (1, 2, 3, 5)]
    expected_copies = sum(a == e for a, e in zip(["southeast", "west", turns[2]["action"], copied], shown))
    assert st["copies_example"] == pytest.approx(expected_copies / 4)
    # a summary over seeds reads the first and the last step
    stats = {("grpo", 0): {1: {"valid": 0.5, "toward_goal": 0.1, "copies_example": 0.5},
                           3: st}}
    got = lm._turns_first_last(stats, "grpo", [0])
    assert got["valid_first"] == 0.5 and got["toward_goal_last"] == pytest.approx(0.667, abs=1e-3)


def test_reading_probe_scores_first_turns_of_the_real_engine(tmp_path: Path) -> None:
    """experiments/minihack_reading.py end to end with the tiny model: every (level, sample) is
    one first turn; shares are counted over the right denominators and written out."""
    pytest.importorskip("nle")
    pytest.importorskip("torch")
    probe = _reading_probe()
    assert probe.stairs_direction("You see:\n- staircase down: far southeast") == "southeast"
    assert probe.stairs_direction("You see nothing of note nearby.") is None
    out = tmp_path / "probe.json"
    assert probe.main(["--preset", "tiny", "--levels", "3", "--samples", "2", "--views", "compact",
                       "full", "--examples", "random", "--set", "threads=1",
                       "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["view"], r["example"]) for r in rows] == [("compact", "random"), ("full", "random")]
    for r in rows:
        assert r["turns"] == 6 and r["valid"]["n"] == 6
        assert r["toward_stairs"]["n"] <= r["valid"]["k"]  # actions on levels that show the stairs
        assert r["copies_example"]["n"] == r["valid"]["k"]
        assert 0 <= r["toward_stairs"]["k"] <= r["toward_stairs"]["n"]


def test_reading_probe_plays_whole_episodes_with_max_steps(tmp_path: Path) -> None:
    """``--max-steps``: whole episodes (up to that many actions) on the real engine; the first turn
    is still scored, success is counted per episode and a random walker's floor comes beside it.
    The walker's floor is a real measurement: on the one-action Adjacent level it wins about 1/8."""
    pytest.importorskip("nle")
    pytest.importorskip("torch")
    probe = _reading_probe()
    out = tmp_path / "whole.json"
    assert probe.main(["--preset", "tiny", "--levels", "2", "--samples", "2", "--views", "compact",
                       "--examples", "random", "--max-steps", "3", "--set", "threads=1",
                       "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    row = got["rows"][0]
    assert got["max_steps"] == 3 and row["max_steps"] == 3
    assert row["turns"] == 4 and row["success"]["n"] == 4 and row["walker_success"]["n"] == 4
    assert 0 <= row["mean_actions"] <= 3
    wins = probe.walker_wins("crl/MiniHack-Room-Adjacent-3x3-v0", list(range(1_000_000, 1_000_064)),
                             2, 1, 0)
    assert 3 <= wins <= 35  # Binomial(128, 1/8): mean 16, sd 3.7
    with pytest.raises(SystemExit):
        probe.main(["--preset", "tiny", "--max-steps", "0"])


def _lora_b_norm(ctx) -> float:
    """Sum of |LoRA B| over the actor's adapter: 0 for a fresh adapter (PEFT initialises B to
    zero), > 0 once an update has moved it."""
    return float(sum(p.detach().abs().sum() for n, p in
                     ctx.raw_backend.trainable_model("actor").named_parameters()
                     if "lora_B" in n and "actor" in n))


def test_reading_probe_loads_a_trained_run(tiny_run, tmp_path: Path) -> None:
    """``--run``: the probe plays with the run's stored configuration and the adapters of its last
    checkpoint (weights moved by training); ``--base`` with the same configuration and no adapters
    (the step-0 policy). Bad uses are refused with the way out."""
    pytest.importorskip("nle")
    from crl_bench.config.schema import ConfigError

    probe = _reading_probe()
    run = tiny_run("grpo").path
    cfg, ckpt = probe.run_config(run, {"threads": 1}, [])
    assert cfg.preset == "tiny" and cfg.threads == 1 and ckpt["roles"] == ["actor"]
    assert ckpt["step"] == json.loads((run / "checkpoints" / "last" / "loop_state.json").read_text())["step"] >= 1
    trained = probe.context(cfg, ckpt, tmp_path / "a")
    base = probe.context(cfg, probe.run_config(run, {}, [], base=True)[1], tmp_path / "b")
    assert _lora_b_norm(trained) > 0 and _lora_b_norm(base) == 0

    out = tmp_path / "probe.json"
    assert probe.main(["--run", str(run), "--levels", "2", "--samples", "1", "--views", "compact",
                       "--examples", "random", "--set", "threads=1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["preset"] == "tiny" and got["checkpoint"]["step"] == ckpt["step"]
    assert got["rows"][0]["turns"] == 2

    with pytest.raises(ConfigError, match="only threads may change"):
        probe.run_config(run, {"actor.lr": 1e-3}, [])
    with pytest.raises(ConfigError, match="drop --preset"):
        probe.run_config(run, {}, ["--preset", "cpu"])
    with pytest.raises(ConfigError, match="holds no run"):
        probe.run_config(tmp_path / "nothing", {}, [])
    assert not (tmp_path / "nothing").exists()  # a wrong path is not created
    young = tmp_path / "young"  # a run with no checkpoint yet: only --base can probe it
    young.mkdir()
    (young / "config.json").write_text((run / "config.json").read_text())
    with pytest.raises(ConfigError, match="no checkpoint with adapters yet.*--base"):
        probe.run_config(young, {}, [])
    assert probe.run_config(young, {}, [], base=True)[1] == {"adapters": None, "step": 0,
                                                             "roles": ["actor"]}
    with pytest.raises(SystemExit):  # the command line says it in one line, no traceback
        probe.main(["--run", str(young)])


def test_reading_sft_diagnostic_targets_the_greedy_answer_and_learns_it(tmp_path: Path) -> None:
    """experiments/minihack_reading_sft.py: each labelled first turn is the engine's own prompt with
    the direction the observation names the stairs in as the answer; supervised steps raise the
    log-probability of exactly those answers (effect, tiny model); the script runs end to end."""
    pytest.importorskip("nle")
    torch = pytest.importorskip("torch")
    import sys

    bench = Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(bench))
    try:
        import minihack_reading_sft as sft
    finally:
        sys.path.remove(str(bench))
    from crl_bench.config.schema import build_config

    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny", overrides={"threads": 1})
    ctx = sft.context(cfg, None, tmp_path / "run")
    data = sft.labelled_first_turns(ctx, "crl/MiniHack-Room-Random-5x5-v0", "compact", "random",
                                    range(4), seed=0)
    tok = ctx.backend.tokenizer
    assert len(data) == 4
    for prompt, target in data:
        shown = tok.decode(prompt).rsplit("Current observation", 1)[-1]
        goal = sft.stairs_direction(shown.split("\n", 1)[-1])
        assert tok.decode(target) == f"<answer>{goal}</answer>{tok.eos_token}"

    def mean_target_logprob() -> float:  # token-weighted, as the loss is
        with torch.no_grad():
            lps = ctx.raw_backend.logprobs([p for p, _ in data], [t for _, t in data], "actor")
        return sum(map(sum, lps)) / sum(map(len, lps))

    before = mean_target_logprob()
    opt = torch.optim.AdamW(ctx.raw_backend.trainable_parameters("actor"), lr=1e-2)
    losses = [sft.sft_step(ctx, opt, data) for _ in range(3)]
    assert losses[-1] < losses[0] and mean_target_logprob() > before + 0.1
    assert -losses[0] == pytest.approx(before, abs=1e-3)  # the loss is minus that mean

    out = tmp_path / "sft.json"
    assert sft.main(["--preset", "tiny", "--examples", "4", "--batch", "2", "--probe-every", "2",
                     "--levels", "2", "--samples", "1", "--set", "threads=1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["examples_seen"] for r in rows] == [0, 2, 4]
    assert rows[0]["train_loss"] is None and all(r["turns"] == 2 for r in rows)
    assert out.with_suffix(".png").stat().st_size > 0


def test_the_summary_reports_the_banks_lag_beside_the_wait(tmp_path: Path) -> None:
    """An extractor beside the actor can cost the loop no wait and still leave the bank behind:
    a run with 0 s of wait whose bank was 2 steps behind at one rollout says both."""
    run = _run(tmp_path / "a", [0, 1], [1, 1])
    metrics = [{"step": 1, "timing_s/step": 100.0, "timing_s/extractor_wait": 0.0,
                "timing_s/bank_wait": 0.0, "extractor/backlog": 2, "extractor/bank_lag_steps": 0},
               {"step": 2, "timing_s/step": 100.0, "timing_s/extractor_wait": 0.0,
                "timing_s/bank_wait": 0.0, "extractor/backlog": 2, "extractor/bank_lag_steps": 2}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    t = lm.time_breakdown(run)
    assert t["actor_wait_share"] == 0.0 and t["bank_lag_max"] == 2
    floor = {"env_id": "crl/X-v0", "max_actions": 1, "episodes": 10, "success": 0.1, "wilson95": [0.0, 0.4]}
    lm.write_markdown(tmp_path, lm.summarise({("comp_rl", 0): run}), "python x.py", "cpu", floor)
    assert "Bank lag beside the wait" in (tmp_path / "summary.md").read_text()
    assert "comp_rl 2." in (tmp_path / "summary.md").read_text()
