"""Search-and-Ask answers become extractor samples credited with the asking episode's score.

The tiny runs ask only when the sampled tiny model happens to write ``<ask>``, and whether that
ask meets a non-empty bank depends on the machine the tiny weights were trained on
(``tests/test_runner_ablations.py::test_search_and_ask_wiring``). Here the asks are forced
(``ForcedBackend``: the real tiny model scores the chosen text), the bank holds one entry, and
the two asking episodes end differently, so crediting either ask with the other episode's score
(or with none) fails.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from _forced_backend import ForcedBackend  # noqa: E402

TASK = "crl/MiniHack-Room-Adjacent-3x3-Balanced-v0"
_SPEC = importlib.util.spec_from_file_location(
    "learning_minihack", Path(__file__).resolve().parents[1] / "experiments" / "learning_minihack.py")
BENCH = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(BENCH)
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east",
            "northeast": "southwest", "southwest": "northeast",
            "northwest": "southeast", "southeast": "northwest"}


def stairs_direction(prompt_text: str) -> str:
    """Where the prompt's last observation names the staircase down (the learning benchmark's
    own reader, ``experiments/learning_minihack.py``)."""
    direction = BENCH.stairs_direction(prompt_text[prompt_text.rindex("You see:"):])
    assert direction is not None, "the staircase is not in the observation"
    return direction


@pytest.fixture
def ctx(tmp_path):
    from crl_bench.agent import load_agent
    from crl_bench.experience.manager import Operation
    from crl_bench.config.schema import build_config
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    # 2 groups of 2 (one with experience each); 2 turns: the ask, then the one move that counts.
    # Groups of 2 are too small for split advantages (validation asks the agent); this context
    # is built for the ask's credit, not trained with split GRPO
    cfg = build_config(agent="comp_rl", tasks=TASK, preset="tiny", overrides={
        "threads": 1, "extractor.runs": "inline", "rollout.groups": 2,
        "rollout.group_size": 2, "rollout.env_max_steps": {"minihack": 2},
        "method.split_advantages": False})
    context = RunContext(cfg, RunDir(tmp_path / "run"))
    context.seed_everything()
    load_agent("comp_rl").build(context)
    context.manager.apply_operations(
        [Operation("add", "stairs", "Step once toward the staircase down named in the observation.")],
        family="minihack", task_id="seeded", provenance={}, step=0)
    yield context
    context.close()


def test_each_ask_sample_is_credited_with_its_own_episodes_score(ctx):
    answered = []

    def policy(prompt: str) -> str:
        if "If you need advice instead" in prompt:       # with experience, an ask still left
            return "<ask>where are the stairs?</ask>"
        right = stairs_direction(prompt)
        if "Advice for your question" in prompt:          # the asking episodes: right, then wrong
            answered.append(prompt)
            return f"<answer>{right if len(answered) == 1 else OPPOSITE[right]}</answer>"
        return f"<answer>{right}</answer>"

    ctx.backend = ForcedBackend(ctx.backend, policy)
    ctx.step = 1                                          # as the run loop sets it
    trajectories = ctx.play("train", 1, ctx.plan(1, with_experience=1), sampling_seed=1)

    asking = [t for t in trajectories if t.n_tool_calls]
    assert [t.with_experience for t in trajectories] == [True, False, True, False]
    assert len(asking) == 2 and all(t.with_experience for t in asking)
    assert [t.score for t in asking] == [1.0, 0.0]          # the right move, then the wrong one
    assert [t.score for t in trajectories if not t.with_experience] == [1.0, 1.0]
    # one extractor sample per ask (the bank had an entry: no NO_MATCH), in episode order, each
    # with exactly its own episode's score as its first usage
    asks = [s for s in ctx.extractor.samples if s.kind == "ask"]
    assert [s.usage for s in asks] == [[1.0], [0.0]]
    # the samples are the extractor's real generations (its tokens and log-probs)
    for s in asks:
        assert s.completion_ids and len(s.logprobs) == len(s.completion_ids)
        assert s.created_step == 1
    # and the ask's answer reached the asking episode as its next observation
    assert all("Advice for your question \"where are the stairs?\"" in p for p in answered)


def test_evaluation_asks_make_no_samples(ctx):
    """Evaluation episodes may ask too, but their asks are not trained (no credit, no sample)."""
    def policy(prompt: str) -> str:
        if "If you need advice instead" in prompt:
            return "<ask>where are the stairs?</ask>"
        return f"<answer>{stairs_direction(prompt)}</answer>"

    ctx.backend = ForcedBackend(ctx.backend, policy)
    trajectories = ctx.play("eval", 0, ctx.eval_plan(with_experience=True)[:2], sampling_seed=0)
    assert sum(t.n_tool_calls for t in trajectories) == 2
    assert [s for s in ctx.extractor.samples if s.kind == "ask"] == []
