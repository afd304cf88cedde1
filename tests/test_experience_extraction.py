"""Extractor prompt, strict operation parser, merge-decision parser, trajectory text."""

from __future__ import annotations

import json

import pytest

from crl_bench.experience.bank import ExperienceEntry
from crl_bench.experience.manager import Operation
from crl_bench.extractor.extraction import (
    ANSWER_TEMPLATES, EXPERIENCE_CLOSE, EXPERIENCE_OPEN, MAX_CONTENT_CHARS, ContentTemplate,
    SentenceTemplate, build_extraction_messages, clip_middle, first_sentence, is_complete_sentence, extract_answer, parse_operations, render_experience_block,
    strip_experience_block, trajectory_to_text)
from crl_bench.extractor.merge import build_merge_messages, parse_merge_decisions


def make_entry(i: int, title: str = "Use the stairs", content: str = "Walk to '>' first.",
               **kw) -> ExperienceEntry:
    base = dict(id=i, title=title, content=content, family="minihack", task_ids=["room"], run="r",
                created_step=0, updated_step=0, source_trajectories=[], times_retrieved=3,
                last_retrieved=None, times_trained=0, n_used=0, mean_outcome=None)
    base.update(kw)
    return ExperienceEntry(**base)


def answer(ops) -> str:
    return f"I thought about it.\n<answer>{json.dumps(ops)}</answer>"


# ------------------------------------------------------------------ parse_operations
def test_valid_operations():
    text = answer([{"op": "add", "title": " Check doors ", "content": "Open doors before going."},
                   {"op": "update", "target_ids": [4, 7], "title": "T", "content": "C"}])
    ops, malformed = parse_operations(text, {4, 7, 9})
    assert not malformed
    assert ops == [Operation("add", "Check doors", "Open doors before going."),
                   Operation("update", "T", "C", [4, 7])]
    assert parse_operations(answer([{"op": "return"}]), set()) == ([Operation("return")], False)


def test_last_answer_block_wins_and_code_fence_is_allowed():
    text = ('draft: <answer>[{"op": "bogus"}]</answer> final:\n<answer>\n```json\n'
            '[{"op": "return"}]\n```\n</answer>')
    assert parse_operations(text, set()) == ([Operation("return")], False)
    assert extract_answer("no tags here") is None


@pytest.mark.parametrize("text", [
    "",                                                       # nothing
    '[{"op": "return"}]',                                     # no answer tags
    "<answer>not json</answer>",
    '<answer>{"op": "return"}</answer>',                      # an object, not a list
    "<answer>[]</answer>",                                    # empty list
    answer([{"op": "return"}] * 0 + [{"op": "add", "title": "a", "content": "b"}] * 4),  # > 3
    answer([{"op": "delete", "target_ids": [1]}]),            # unknown op
    answer([{"op": "add", "title": "a"}]),                    # missing content
    answer([{"op": "add", "title": "a", "content": "b", "target_ids": []}]),  # extra key
    answer([{"op": "add", "title": "  ", "content": "b"}]),   # blank title
    answer([{"op": "add", "title": "a", "content": 5}]),      # content not a string
    answer([{"op": "add", "title": "a", "content": "x" * (MAX_CONTENT_CHARS + 1)}]),
    answer([{"op": "update", "target_ids": [99], "title": "a", "content": "b"}]),  # not retrieved
    answer([{"op": "update", "target_ids": [], "title": "a", "content": "b"}]),
    answer([{"op": "update", "target_ids": [1, 1], "title": "a", "content": "b"}]),
    answer([{"op": "update", "target_ids": [True], "title": "a", "content": "b"}]),
    answer([{"op": "update", "target_ids": "1", "title": "a", "content": "b"}]),
    answer([{"op": "update", "target_ids": [1], "title": "a", "content": "b"},
            {"op": "update", "target_ids": [1], "title": "c", "content": "d"}]),  # same target
    answer([{"op": "return"}, {"op": "add", "title": "a", "content": "b"}]),  # return + write
    answer([{"op": "return", "title": "x"}]),
    answer(["add"]),
])
def test_malformed_answers_change_nothing(text):
    assert parse_operations(text, {1, 2}) == ([], True)


def test_max_ops_is_configurable():
    text = answer([{"op": "add", "title": f"t{i}", "content": "c"} for i in range(2)])
    assert parse_operations(text, set(), max_ops=1) == ([], True)
    assert len(parse_operations(text, set(), max_ops=2)[0]) == 2


# ------------------------------------------------------------------ prompt
def test_extraction_prompt_has_everything_and_no_injected_experience():
    retrieved = [make_entry(12), make_entry(15, title="Avoid lava", content="Never step on '}'.")]
    trajectory = ("[step 1]\n" + render_experience_block(retrieved) +
                  "\nYou see a room.\n> move east")
    messages = build_extraction_messages("Reach the stairs down.", trajectory,
                                         {"success": False, "score": 0.0, "n_actions": 30},
                                         retrieved)
    assert [m["role"] for m in messages] == ["system", "user"]
    system, user = messages[0]["content"], messages[1]["content"]
    assert "at most 3" in system and "<answer>" in system
    assert "Reach the stairs down." in user
    assert "failed (score 0.00) after 30 actions" in user
    assert "[id 12] Use the stairs: Walk to '>' first." in user
    assert "[id 15] Avoid lava" in user
    assert "You see a room." in user and "> move east" in user
    assert EXPERIENCE_OPEN not in user and user.count("Avoid lava") == 1
    none = build_extraction_messages("g", "t", {"success": True, "score": 1.0, "n_actions": 3}, [])
    assert "without stored experience" in none[1]["content"]
    with pytest.raises(ValueError, match="n_actions"):
        build_extraction_messages("g", "t", {"success": True, "score": 1.0}, [])


def test_experience_block_roundtrip():
    entries = [make_entry(1), make_entry(2, title="B", content="b.")]
    block = render_experience_block(entries)
    assert block.startswith(EXPERIENCE_OPEN) and block.endswith(EXPERIENCE_CLOSE)
    assert "- Use the stairs: Walk to '>' first." in block and "- B: b." in block
    prompt = f"Goal: win.\n\n{block}\n\nObservation: dark room."
    assert strip_experience_block(prompt) == "Goal: win.\n\nObservation: dark room."
    assert render_experience_block([]) == ""


# ------------------------------------------------------------------ trajectory text
def test_trajectory_text_fits_untouched():
    text = trajectory_to_text([("You see a door.", "open door"), ("The door opens.", "go east")])
    assert text == "[step 1]\nYou see a door.\n> open door\n\n[step 2]\nThe door opens.\n> go east"


def test_trajectory_text_clips_long_observations():
    obs = "A" * 150 + "B" * 200 + "C" * 150         # 500 chars
    turns = [(obs, "wait")] * 3
    # whole: 3 * (9 + 500 + 7) + 2 * 2 = 1552 > 1500
    text = trajectory_to_text(turns, max_chars=1500)
    # limit = max(200, 1500 // 8) = 200: head 98 + " ... " + tail 97; 3 * 216 + 4 = 652 fits
    assert clip_middle(obs, 200) == "A" * 98 + " ... " + "C" * 97
    assert text.count(" ... ") == 3 and len(text) == 652
    assert text.startswith("[step 1]\n" + "A" * 98 + " ... " + "C" * 97 + "\n> wait")


def test_trajectory_text_omits_middle_steps():
    turns = [(f"observation {i:02d} " + "x" * 80, f"action {i:02d}") for i in range(20)]
    text = trajectory_to_text(turns, max_chars=700)
    assert len(text) <= 700
    assert text.startswith("[step 1]\nobservation 00")
    assert text.endswith("> action 19")
    # step 1 block: 9 + 95 + 12 = 116 chars, later ones 117; the marker is 26 chars; with "\\n\\n"
    # separators: 116 + 2 + 26 + 119k <= 700 -> k = 4 tail blocks (steps 17-20), 15 omitted
    assert "[... 15 steps omitted ...]" in text
    assert "[step 17]" in text and "[step 16]" not in text and "[step 2]" not in text


def test_trajectory_text_removes_injected_experience():
    obs = "Goal: reach '>'.\n" + render_experience_block([make_entry(3)]) + "\nYou see a room."
    text = trajectory_to_text([(obs, "move east")])
    assert "Use the stairs" not in text and "You see a room." in text


# ------------------------------------------------------------------ merge decisions
def test_merge_decisions_valid():
    text = answer([{"op": "merge", "ids": [1, 2], "title": "M", "content": "merged"},
                   {"op": "rewrite", "ids": [3], "title": "R", "content": "rewritten"},
                   {"op": "discard", "ids": [4]}, {"op": "keep", "ids": [5]}])
    decisions, malformed = parse_merge_decisions(text, [1, 2, 3, 4, 5])
    assert not malformed
    assert [(d.kind, d.ids, d.title) for d in decisions] == [
        ("merge", [1, 2], "M"), ("rewrite", [3], "R"), ("discard", [4], ""), ("keep", [5], "")]


@pytest.mark.parametrize("ops", [
    [{"op": "merge", "ids": [1], "title": "M", "content": "c"}],           # merge of one
    [{"op": "rewrite", "ids": [1, 2], "title": "R", "content": "c"}],      # rewrite of two
    [{"op": "discard", "ids": [9]}],                                        # not in window
    [{"op": "discard", "ids": [1]}, {"op": "keep", "ids": [1]}],           # id twice
    [{"op": "merge", "ids": [1, 2], "title": "", "content": "c"}],         # blank title
    [{"op": "keep", "ids": [1], "title": "x"}],                             # extra key
    [{"op": "split", "ids": [1]}],
    [],
])
def test_merge_decisions_malformed(ops):
    assert parse_merge_decisions(answer(ops), [1, 2, 3]) == ([], True)
    assert parse_merge_decisions("no answer", [1, 2]) == ([], True)


def test_merge_prompt_lists_window():
    msgs = build_merge_messages([make_entry(3), make_entry(8, n_used=4, mean_outcome=0.5)],
                                "minihack")
    user = msgs[1]["content"]
    assert "[id 3] Use the stairs: Walk to '>' first. (retrieved 3x)" in user
    assert "mean outcome +0.50 over 4 uses" in user and "minihack" in user
    with pytest.raises(ValueError):
        build_merge_messages([], "minihack")


# ------------------------------------------------------------------ one-sentence templates (cpu)

@pytest.mark.parametrize("text,ok", [
    ("Walk east until the stairs are adjacent.", True),
    ("Go around the wall (then north)!", True),
    ("Is the stairs east?", True),
    ("Walk east until the", False),          # cut by the token cap
    ("Walk east until the stairs are...", False),
    ("Go east.", False),                     # too short to carry advice
    ("", False), ("   .", False),
])
def test_is_complete_sentence(text, ok):
    assert is_complete_sentence(text) is ok


def test_first_sentence_ends_at_the_first_sentence_end_or_closer():
    # the stop string fires one token after the sentence end: only the sentence is kept
    assert first_sentence("Walk east toward the stairs. Then", ('"',)) == "Walk east toward the stairs."
    assert first_sentence("Take 3.5 steps east now.\n", ('"',)) == "Take 3.5 steps east now."
    # the model closed the field without a full stop: its words are complete, the stop is added
    assert first_sentence('Walk east toward the stairs" trailing. More', ('"',)) == \
        "Walk east toward the stairs."
    assert first_sentence("Walk east toward", ('"',)) is None  # never ended (token cap)
    assert first_sentence('"', ('"',)) is None                 # empty
    assert first_sentence(" go east.", (), stem="To succeed,") == "To succeed, go east."
    assert first_sentence(" east.", (), stem="To succeed,") is None  # one word of its own


def test_sentence_template_keeps_one_sentence_and_rejects_a_cut_one():
    t = SentenceTemplate()
    pre = t.prefill("Reach the stairs down.", True)
    # the content starts with a stem (no trailing space: the model's next token carries it)
    assert pre == ContentTemplate().prefill("Reach the stairs down.", True) + "To succeed,"
    assert t.prefill("Reach the stairs down.", False).endswith('"content": "To avoid this failure,')
    assert '"' in t.stop and ". " in t.stop and "\n" in t.stop
    ops, malformed = parse_operations(t.answer(pre, " walk east until the stairs are adjacent. Then"),
                                      set())
    assert not malformed and ops[0].content == "To succeed, walk east until the stairs are adjacent."
    assert ops[0].title == "Reach the stairs down: what worked"
    assert parse_operations(t.answer(pre, ' say "hi" to the shopkeeper first'), set())[1]  # one word
    assert parse_operations(t.answer(pre, " walk east until the stairs are"), set()) == ([], True)
    # a line break ends the field like a closing quote
    assert parse_operations(t.answer(pre, " read the map first\nThen"), set())[0][0].content == \
        "To succeed, read the map first."
    assert ANSWER_TEMPLATES["sentence"].stop == t.stop


def test_cpu_preset_uses_the_one_sentence_templates():
    from crl_bench.config.schema import PRESETS

    ext = PRESETS["cpu"]().extractor
    assert ext.answer_template == "sentence" and ext.merge_format == "items"
