"""The ``action`` answer template: the extractor's content names an action the episode took."""

from __future__ import annotations

import dataclasses

import pytest

from crl_bench.extractor.extraction import (ANSWER_TEMPLATES, ActionTemplate, ContentTemplate,
                                             SentenceTemplate, episode_actions, parse_operations)
from crl_bench.config.schema import ExtractorConfig, build_config
from tests.test_extractor_track import (FixedAnswers, ModelAnswers, embedder, make_track,  # noqa: F401
                                        tiny_extractor, trajectory)

GOAL = "Reach the stairs down."


def contents(template, text, actions, success=True):
    pre = template.prefill(GOAL, success, actions)
    ops, malformed = parse_operations(template.answer(pre, text, actions), set())
    return None if malformed else [(op.kind, op.title, op.content) for op in ops]


def test_prefill_asks_for_an_action_after_the_content_prefill():
    t = ActionTemplate()
    base = ContentTemplate().prefill(GOAL, True)
    # the stem ends as the trajectory text renders an action ("\n> east"): a cue to copy one
    assert t.prefill(GOAL, True, ["northeast"]) == base + "To succeed, take the action\n>"
    assert t.prefill(GOAL, False, ["south"]).endswith(
        '"title": "Reach the stairs down: what went wrong", "content": "To avoid this failure, '
        'do not take the action\n>')
    assert ANSWER_TEMPLATES["action"] == t
    assert '"' not in t.stop and "\n" in t.stop  # a quoted action is not cut before its word


@pytest.mark.parametrize("text", [" northeast", " northeast.", " Northeast, then wait",
                                  ' "northeast" to reach', " of moving northeast", " 'northeast'"])
def test_a_taken_action_within_the_first_words_gives_an_add_naming_it(text):
    assert contents(ActionTemplate(), text, ["northeast"]) == [
        ("add", "Reach the stairs down: what worked", "To succeed, take the action northeast.")]


def test_a_failed_episode_names_the_move_to_avoid():
    assert contents(ActionTemplate(), " south.", ["south"], success=False) == [
        ("add", "Reach the stairs down: what went wrong",
         "To avoid this failure, do not take the action south.")]


@pytest.mark.parametrize("text, actions", [
    (" the change would be this", ["northeast"]),   # unrelated text
    (" south", ["northeast"]),                      # an action, but not one the episode took
    (" north", ["northeast"]),                      # a prefix of the action is not the action
    (" the the the northeast", ["northeast"]),      # too late in the continuation
    ("", ["northeast"]),                            # nothing written
    (" northeast", []),                             # the episode took no action
    (" northeast", None),                           # no actions handed to the template
])
def test_anything_else_is_malformed(text, actions):
    assert contents(ActionTemplate(), text, actions) is None


def test_multi_word_actions_and_the_longest_match():
    acts = ["go to cabinet 1", "go to cabinet 12", "open cabinet 1"]
    assert contents(ActionTemplate(), " go to cabinet 12 first", acts)[0][2] == \
        "To succeed, take the action go to cabinet 12."
    assert contents(ActionTemplate(), " 'open cabinet 1'", acts)[0][2] == \
        "To succeed, take the action open cabinet 1."
    assert contents(ActionTemplate(), " go to the cabinet", acts) is None


def test_a_copy_cue_at_the_end_of_the_stem_is_left_out_of_the_content():
    t = ActionTemplate(stems=("To succeed, take this action again:\n>", "x"))
    assert t.prefill(GOAL, True, ["east"]).endswith('"content": "To succeed, take this action again:\n>')
    assert contents(t, " east\n", ["east"])[0][2] == "To succeed, take this action again: east."


def test_the_other_templates_ignore_the_actions():
    for t in (ContentTemplate(), SentenceTemplate()):
        pre = t.prefill(GOAL, True)
        assert t.prefill(GOAL, True, ["east"]) == pre
        for text in (' walk east until the stairs are adjacent. Then', 'go east" x'):
            assert t.answer(pre, text, ["east"]) == t.answer(pre, text)


def test_episode_actions_are_the_distinct_actions_sent_in_order():
    traj = trajectory(GOAL, True)
    second = dataclasses.replace(traj.turns[0], action="north")
    ask = dataclasses.replace(traj.turns[0], action=None, kind="ask")
    traj.turns += [second, ask, traj.turns[0]]
    assert episode_actions(traj) == ["east", "north"]


def test_config_accepts_the_action_template():
    cfg = build_config(agent="comp_rl", tasks="minihack", preset="cpu",
                       overrides={"extractor.answer_template": "action"})
    cfg.validate()
    assert ANSWER_TEMPLATES[cfg.extractor.answer_template] == ActionTemplate()
    assert ExtractorConfig(answer_template="action").answer_template == "action"


def test_track_prefills_the_stem_and_writes_entries_that_name_the_move(tmp_path, embedder):
    gen = FixedAnswers([" east. Then more", " the change would be this."])
    track = make_track(tmp_path, embedder, gen, "action")
    track.submit(1, [trajectory(GOAL, True), trajectory(GOAL, False)])
    (batch, stop), = gen.calls
    assert stop == ActionTemplate().stop
    assert batch[0][-1]["content"].endswith('"content": "To succeed, take the action\n>')
    assert batch[1][-1]["content"].endswith('"content": "To avoid this failure, do not take the action\n>')
    entries = track.manager.bank.get(track.manager.bank.all_ids())
    assert [e.content for e in entries] == ["To succeed, take the action east."]
    assert track.stats["extractions"] == 2 and track.stats["malformed"] == 1


def test_tiny_model_extraction_through_the_track_gives_parseable_operations(
        tmp_path, embedder, tiny_extractor):
    """The tiny model's own tokens and log-probs for an action continuation: the track parses
    the template's answer into one add per episode and keeps each sample with its entry."""
    gen = ModelAnswers(tiny_extractor, [" east.", ' "east"}'])
    track = make_track(tmp_path, embedder, gen, "action")
    track.submit(1, [trajectory(GOAL, True), trajectory(GOAL, False)])
    entries = track.manager.bank.get(track.manager.bank.all_ids())
    assert sorted(e.content for e in entries) == [
        "To avoid this failure, do not take the action east.", "To succeed, take the action east."]
    assert track.stats["malformed"] == 0 and len(track.samples) == 2
    for s in track.samples:
        assert s.entry_ids and not s.malformed
        assert len(s.completion_ids) == len(s.logprobs) > 0
        assert tiny_extractor.tokenizer.decode(s.completion_ids).strip().strip('".}') == "east"
