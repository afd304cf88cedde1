"""Prompt building and answer parsing (pure functions)."""

from __future__ import annotations

import pytest

from crl_bench.llm.prompting import (HistoryItem, PromptConfig, build_followup_message,
                                     build_messages, example_action, invalid_format_feedback,
                                     parse_completion)

CFG = PromptConfig()


@pytest.mark.parametrize("text, kind, action, query", [
    ("<think>go east?</think><answer> east </answer>", "action", "east", None),
    ("<answer>search[red shoes]</answer>", "action", "search[red shoes]", None),
    ("<think>maybe <answer>west</answer></think><answer>north</answer>", "action", "north", None),
    ("<ask>where are keys?</ask>", "ask", None, "where are keys?"),
    ("<answer>east</answer><ask>why?</ask>", "action", "east", None),   # the answer wins
    ("<answer>  </answer>", "invalid", None, None),
    ("<answer>east", "invalid", None, None),
    ("I would go east.", "invalid", None, None),
    ("", "invalid", None, None),
])
def test_parse_completion(text, kind, action, query):
    parsed = parse_completion(text, CFG, asks_left=1)
    assert (parsed.kind, parsed.action, parsed.query) == (kind, action, query)
    if kind == "invalid":
        assert parsed.error


def test_ask_without_budget_is_invalid_format():
    parsed = parse_completion("<ask>help</ask>", CFG, asks_left=0)
    assert parsed.kind == "invalid" and "no ask left" in parsed.error


def test_custom_tags():
    cfg = PromptConfig(answer_tag="action", ask_tag="query")
    assert parse_completion("<action>go</action>", cfg).action == "go"
    assert parse_completion("<query>q</query>", cfg, asks_left=2).query == "q"
    assert cfg.stop_strings() == ("</action>", "</query>")


def test_build_messages_has_every_part_in_order():
    history = [HistoryItem(f"obs{i}", f"act{i}") for i in range(4)]
    msgs = build_messages(CFG, family="minihack", goal="Reach the stairs.", observation="now",
                          history=history, admissible_actions=["north", "east"],
                          experience_text="Walls block you.", asks_left=2, turn_index=4)
    from crl_bench.envs.minihack.registration import SYSTEM_PROMPT  # the family owns its prompt

    assert msgs[0] == {"role": "system", "content": SYSTEM_PROMPT}
    user = msgs[1]["content"]
    order = ["Your task: Reach the stairs.", "Walls block you.", "[Turn 3] Observation:\nobs2",
             "[Turn 4] You: act3", "Current observation (turn 5):\nnow",
             "Admissible actions: north, east", "<think>", "<ask>your question</ask> (2 left)"]
    positions = [user.index(s) for s in order]
    assert positions == sorted(positions)
    assert "obs1" not in user and "act1" not in user       # window of the last 2 turns


def test_history_window_options_and_unknown_family_fallback():
    history = [HistoryItem(f"obs{i}", f"act{i}") for i in range(3)]
    full = build_messages(PromptConfig(history=-1), family="nope", goal="g", observation="o",
                          history=history, admissible_actions=None, turn_index=3)
    assert all(f"act{i}" in full[1]["content"] for i in range(3))
    assert full[0]["content"] == CFG.system_prompts["text"]
    none = build_messages(PromptConfig(history=0, think=False, show_admissible=False),
                          family="webshop", goal="g", observation="o", history=history,
                          admissible_actions=["click[x]"], turn_index=3)
    user = none[1]["content"]
    assert "act2" not in user and "click[x]" not in user and "<think>" not in user
    assert "<ask>" not in user  # no asks left / no callback: not offered


def test_small_model_preset_and_long_observation_cut():
    cfg = PromptConfig.for_small_model(max_observation_chars=100)
    msgs = build_messages(cfg, family="minihack", goal="g", observation="x" * 500, history=[],
                          admissible_actions=["north", "south"])
    user = msgs[1]["content"]
    assert "e.g. <answer>north</answer>" in user
    assert "[... 400 characters cut ...]" in user
    assert parse_completion(cfg.response_prefix + "south</answer>", cfg).action == "south"


MOVES = ["north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest"]


def test_random_example_answer_is_a_seeded_admissible_action_that_varies_by_turn_and_episode():
    cfg = PromptConfig.for_small_model(example_pick="random")
    picks = {(seed, turn): example_action(cfg, MOVES, seed, turn)
             for seed in range(20) for turn in range(10)}
    assert set(picks.values()) == set(MOVES)          # every action gets shown, not only the first
    counts = [list(picks.values()).count(m) for m in MOVES]
    assert max(counts) < 0.25 * len(picks)            # no action dominates (uniform: 1/8 each)
    assert picks == {(s, t): example_action(cfg, MOVES, s, t) for s, t in picks}  # deterministic
    assert len({picks[(0, t)] for t in range(10)}) > 1   # changes within an episode
    assert len({picks[(s, 0)] for s in range(20)}) > 1   # and across episodes
    # the pick is the one the prompt shows, in the first and in follow-up messages
    user = build_messages(cfg, family="minihack", goal="g", observation="o", history=[],
                          admissible_actions=MOVES, example_seed=7, turn_index=3)[1]["content"]
    assert user.endswith(f"e.g. <answer>{example_action(cfg, MOVES, 7, 3)}</answer>.")
    follow = build_followup_message(cfg, observation="o", admissible_actions=MOVES,
                                    example_seed=7, turn_index=4)
    assert follow.endswith(f"e.g. <answer>{example_action(cfg, MOVES, 7, 4)}</answer>.")
    # "first" (the default) always shows the first action; no example without the flag or actions
    assert {example_action(PromptConfig.for_small_model(), MOVES, s, 0) for s in range(9)} == {"north"}
    assert example_action(PromptConfig(), MOVES, 0, 0) is None
    assert example_action(cfg, None, 0, 0) is None
    with pytest.raises(ValueError, match="example_pick"):
        PromptConfig(example_pick="last")


def test_no_example_answer_under_example_pick_none():
    cfg = PromptConfig.for_small_model(example_pick="none")
    assert {example_action(cfg, MOVES, s, t) for s in range(5) for t in range(5)} == {None}
    user = build_messages(cfg, family="minihack", goal="g", observation="o", history=[],
                          admissible_actions=MOVES, example_seed=7, turn_index=0)[1]["content"]
    assert user.endswith("Reply with exactly one action inside <answer>...</answer>.")
    assert "e.g." not in build_followup_message(cfg, observation="o", admissible_actions=MOVES,
                                                example_seed=7, turn_index=1)


def test_prompt_config_rejects_bad_values():
    with pytest.raises(ValueError, match="history"):
        PromptConfig(history=-2)
    with pytest.raises(ValueError, match="must differ"):
        PromptConfig(answer_tag="a", ask_tag="a")
    with pytest.raises(ValueError, match="'text' entry"):
        PromptConfig(system_prompts={"minihack": "x"})
    assert "did not change" in invalid_format_feedback("no answer block found", CFG)


def test_a_family_prompt_comes_from_its_registration_and_can_be_overridden():
    from crl_bench.envs.webshop.registration import SYSTEM_PROMPT

    assert CFG.system_prompt("webshop") == SYSTEM_PROMPT
    assert CFG.system_prompt("no-such-family") == CFG.system_prompts["text"]
    override = PromptConfig(system_prompts={"text": "fallback", "webshop": "shop!"})
    assert override.system_prompt("webshop") == "shop!"
    assert override.system_prompt("alfworld").startswith("You are a household robot")


def test_observation_last_moves_the_current_observation_after_the_answer_format():
    cfg = PromptConfig.for_small_model(example_pick="random", observation_last=True)
    user = build_messages(cfg, family="minihack", goal="g", observation="OBS", history=[],
                          admissible_actions=MOVES, example_seed=7, turn_index=0)[1]["content"]
    parts = user.split("\n\n")
    assert parts[0] == "Your task: g" and parts[-1] == "Current observation (turn 1):\nOBS"
    assert parts[-2].startswith("Reply with exactly one action") and parts[-3].startswith("Admissible")
    follow = build_followup_message(cfg, observation="OBS2", admissible_actions=MOVES,
                                    example_seed=7, turn_index=1).split("\n\n")
    assert follow[-1] == "Observation (turn 2):\nOBS2" and follow[-2].startswith("Reply with")
    # the default keeps the observation before the admissible actions
    default = build_messages(PromptConfig.for_small_model(), family="minihack", goal="g",
                             observation="OBS", history=[], admissible_actions=MOVES)[1]["content"]
    assert default.split("\n\n")[1] == "Current observation (turn 1):\nOBS"
    assert sorted(parts) == sorted(build_messages(
        PromptConfig.for_small_model(example_pick="random"), family="minihack", goal="g",
        observation="OBS", history=[], admissible_actions=MOVES, example_seed=7)[1]["content"].split("\n\n"))


def test_experience_last_moves_the_experience_block_just_before_the_answer_format():
    def parts(**kw):
        return build_messages(PromptConfig.for_small_model(example_pick="random", **kw),
                              family="minihack", goal="g", observation="OBS", history=[],
                              admissible_actions=MOVES, example_seed=7,
                              experience_text="t: To succeed, take the action west.")[1][
            "content"].split("\n\n")

    default, last = parts(), parts(experience_last=True)
    assert default[1].startswith("Experience from earlier episodes") and \
        default[1].endswith("take the action west.")
    assert last[-2] == default[1] and last[-1].startswith("Reply with exactly one action")
    assert last[:2] == ["Your task: g", "Current observation (turn 1):\nOBS"]
    assert sorted(default) == sorted(last)  # the same parts, only the order differs
    # no experience: the option changes nothing
    plain = {k: build_messages(PromptConfig.for_small_model(experience_last=k), family="minihack",
                               goal="g", observation="OBS", history=[],
                               admissible_actions=MOVES)[1]["content"] for k in (False, True)}
    assert plain[False] == plain[True]
