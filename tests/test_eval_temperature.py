"""``eval.temperature``: evaluation can decode greedily (the policy's most likely move), so a
held-out score does not move with the sampling seed; unset, evaluation samples as training does."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")


def play_eval_twice(tmp_path, name, **overrides):
    """The same evaluation plan played with two different sampling seeds; the actions of each."""
    import crl_bench  # noqa: F401  (registers the envs)
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="grpo", tasks="minihack", preset="tiny", overrides={
        "threads": 1, "rollout.env_max_steps": {"minihack": 3}, "eval.episodes_per_task": 6,
        "rollout.temperature": 1.0, **overrides})
    ctx = RunContext(cfg, RunDir(tmp_path / name))
    try:
        ctx.seed_everything()
        load_agent("grpo").build(ctx)
        plan = ctx.eval_plan(False)
        runs = [ctx.play("eval", 0, plan, sampling_seed=seed) for seed in (11, 12)]
        return [[tuple(turn.completion_ids) for t in trajs for turn in t.turns] for trajs in runs]
    finally:
        ctx.close()


def test_greedy_evaluation_does_not_depend_on_the_sampling_seed(tmp_path):
    first, second = play_eval_twice(tmp_path, "greedy", **{"eval.temperature": 0.0})
    assert first == second


def test_unset_evaluation_samples_as_training_does(tmp_path):
    """The check above can fail: at the training temperature two seeds play differently."""
    first, second = play_eval_twice(tmp_path, "sampled")
    assert first != second
