"""The placeholder answer example (``example_pick="placeholder"``) names no move: the format line
shows ``<answer>ACTION</answer>`` whatever the episode, so copying the example cannot send a move
and no agent's score is steered by it. The other picks are unchanged."""

from __future__ import annotations

from crl_bench.llm.prompting import (PLACEHOLDER_EXAMPLE, PromptConfig, build_followup_message,
                                     build_messages, example_action)

MOVES = ["north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest"]


def _user(cfg, seed, turn=0):
    return build_messages(cfg, family="minihack", goal="g", observation="o", history=[],
                          admissible_actions=MOVES, example_seed=seed,
                          turn_index=turn)[1]["content"]


def test_placeholder_example_names_no_move():
    cfg = PromptConfig.for_small_model(example_pick="placeholder")
    assert {example_action(cfg, MOVES, s, t) for s in range(6) for t in range(3)} == {None}
    lines = {_user(cfg, s).splitlines()[-1] for s in range(20)}
    assert lines == {f"Reply with exactly one action inside <answer>...</answer>, e.g. "
                     f"<answer>{PLACEHOLDER_EXAMPLE}</answer> where {PLACEHOLDER_EXAMPLE} is one "
                     "of the admissible actions."}
    assert PLACEHOLDER_EXAMPLE.lower() not in MOVES
    follow = build_followup_message(cfg, observation="o", admissible_actions=MOVES,
                                    example_seed=3, turn_index=1)
    assert f"<answer>{PLACEHOLDER_EXAMPLE}</answer>" in follow
    # no admissible actions listed: no example at all, as under the other picks
    assert "e.g." not in build_messages(cfg, family="minihack", goal="g", observation="o",
                                        history=[], admissible_actions=None)[1]["content"]


def test_the_other_picks_are_unchanged():
    rnd = PromptConfig.for_small_model(example_pick="random")
    assert len({example_action(rnd, MOVES, s, 0) for s in range(40)}) == 8
    assert _user(rnd, 5).endswith(f"e.g. <answer>{example_action(rnd, MOVES, 5, 0)}</answer>.")
    first = PromptConfig.for_small_model()
    assert _user(first, 5).endswith("e.g. <answer>north</answer>.")


def test_the_run_config_accepts_the_placeholder_pick():
    from crl_bench.config.schema import build_config
    from crl_bench.builds.reader import prompt_config

    cfg = build_config(agent="grpo", tasks="minihack", preset="cpu",
                       overrides={"rollout.example_pick": "placeholder"})
    cfg.validate()
    assert prompt_config(cfg).example_pick == "placeholder"


def test_experience_records_read_the_placeholder_as_the_example_shown():
    """The analysis counts answers equal to the example shown; under the placeholder that is the
    placeholder word (an answer copying it is not a move)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from experience_records import format_example

    cfg = PromptConfig.for_small_model(example_pick="placeholder")
    assert format_example(_user(cfg, 1)) == PLACEHOLDER_EXAMPLE.lower()
