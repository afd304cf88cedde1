"""The official merge answer: knowledge items that REPLACE the window.

Official (ComplementaryRL fork of ROLL at ab2574f, ``roll/pipeline/agentic/memory/
async_memory_manager.py``): ``parse_answer_to_list`` (:69-135) reads ``<<<KNOWLEDGE_ITEM>>>``
blocks from the ``<answer>``, ``return`` is a no-op (:96-98), items of 30 characters or fewer and
placeholders are dropped (:122-127), no valid item is a parse failure (:129-131);
``_merge_single_task`` (:2540-2580) deletes every entry of the chunk and adds the returned items
(a failure or a no-op keeps the chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

from crl_bench.experience.bank import ExperienceBank  # noqa: E402
from crl_bench.experience.manager import ExperienceManager, Operation, RetrievalConfig  # noqa: E402
from crl_bench.extractor.merge import (ItemTemplate, build_item_merge_messages, merge_bank,  # noqa: E402
                                       parse_merge_items)
from tests.test_extractor_track import embedder  # noqa: E402,F401

ITEM = ("<<<KNOWLEDGE_ITEM>>>\n<title>Head for the stairs</title>\n<content>When the stairs are "
        "named in the observation, step toward them; if a wall blocks, go around it.</content>\n"
        "<<<END_ITEM>>>")


@dataclass
class Gen:
    text: str
    finish_reason: str = "stop"


class Script:
    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def __call__(self, messages, stop=()):
        self.calls.append((messages, tuple(stop)))
        return [Gen(*a) if isinstance(a, tuple) else Gen(a) for a in self.answers[:len(messages)]]


@pytest.fixture
def manager(tmp_path, embedder):  # noqa: F811
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    m = ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))
    for t in ("stairs east", "walls block", "monsters flee"):
        m.apply_operations([Operation("add", t, f"Advice about {t}, long enough to be kept.")],
                           family="minihack", task_id="t", provenance={}, step=0)
    yield m
    bank.close()


def test_parse_merge_items_as_official():
    assert parse_merge_items(f"<think>x</think><answer>\n{ITEM}\n</answer>") == [
        ("Head for the stairs", "When the stairs are named in the observation, step toward them; "
                                "if a wall blocks, go around it.")]
    assert parse_merge_items("<answer>return</answer>") == []
    assert parse_merge_items('<answer>{"function_name": "return"}</answer>') == []
    for bad in ("no answer", "<answer></answer>", "<answer>[1, 2]</answer>",
                "<answer><<<KNOWLEDGE_ITEM>>>too short<<<END_ITEM>>></answer>",
                "<answer><<<KNOWLEDGE_ITEM>>><content></content><<<END_ITEM>>></answer>"):
        assert parse_merge_items(bad) is None, bad
    # an item without tags: the text is the content, its first sentence the title
    (title, content), = parse_merge_items(
        "<answer><<<KNOWLEDGE_ITEM>>>Walk toward the stairs. Avoid walls on the way.<<<END_ITEM>>></answer>")
    assert title == "Walk toward the stairs." and content.endswith("Avoid walls on the way.")


def test_a_merge_answer_that_omits_an_entry_deletes_it(manager):
    before = manager.bank.all_ids()
    gen = Script([f"<answer>{ITEM}</answer>"])
    result = merge_bank(manager, gen, step=5, chunk=5, fmt="items")
    after = manager.get(manager.bank.all_ids())
    assert [e.title for e in after] == ["Head for the stairs"]       # the window replaced
    assert sorted(result.deleted_ids) == sorted(before) and result.n_malformed == 0
    assert sorted(after[0].parent_ids) == sorted(before)
    # the model saw the items as "--- Entry i ---" blocks of <title>/<content>
    user = gen.calls[0][0][0][1]["content"]
    assert "--- Entry 1 ---\n<title>stairs east</title>" in user and "--- Entry 3 ---" in user


def test_return_and_unparseable_answers_keep_the_window(manager):
    before = manager.bank.all_ids()
    r = merge_bank(manager, Script(["<answer>return</answer>"]), step=5, chunk=5, fmt="items")
    assert manager.bank.all_ids() == before and r.n_malformed == 0
    r = merge_bank(manager, Script(["I would merge them."]), step=5, chunk=5, fmt="items")
    assert manager.bank.all_ids() == before and r.n_malformed == 1


def test_the_ops_format_keeps_entries_it_does_not_mention(manager):
    before = manager.bank.all_ids()
    answer = ('<answer>[{"op": "rewrite", "ids": [%d], "title": "Stairs", "content": '
              '"Walk toward the stairs."}]</answer>' % before[0])
    merge_bank(manager, Script([answer]), step=5, chunk=5, fmt="ops")
    assert len(manager.bank.all_ids()) == 3


def test_item_template_prefills_one_item_and_closes_it(manager):
    """For models too small for the format: the answer is pre-filled up to one item's text; the
    model writes the knowledge; a text cut by the token cap stays malformed."""
    t = ItemTemplate(one_sentence=False)
    gen = Script([("Step toward the stairs when you see them; go around walls.", "eos")])
    result = merge_bank(manager, gen, step=5, chunk=5, fmt="items", template=t)
    messages, stop = gen.calls[0]
    assert messages[0][-1] == {"role": "assistant", "content": t.prefill()} and stop == t.stop
    assert result.n_malformed == 0 and len(manager.bank.all_ids()) == 1
    cut = merge_bank(manager, Script([("Step toward the stairs when you", "length")]), step=6,
                     chunk=5, fmt="items", template=t)
    assert cut.n_windows == 0 or cut.n_malformed == cut.n_windows
    assert t.answer("x" * 40, "length") == t.prefill() + "x" * 40
    # cut by the cap after a complete sentence: the complete sentences are the item
    assert parse_merge_items(t.answer("Walk toward the stairs when you see them. Then go", "length")) \
        == [("Walk toward the stairs when you see them.", "Walk toward the stairs when you see them.")]
    with pytest.raises(ValueError, match="items"):
        merge_bank(manager, gen, step=5, chunk=5, fmt="ops", template=t)


def test_item_merge_messages_need_entries():
    with pytest.raises(ValueError):
        build_item_merge_messages([])


def test_sentence_item_template_fixes_the_title_and_takes_one_sentence(manager):
    """The ``cpu`` merge format: pre-filled up to one item's content under the window's title;
    the model writes one sentence, ended by its first sentence end (a stop string) or a tag."""
    t = ItemTemplate()
    entries = manager.bank.get(manager.bank.all_ids())
    prefill = t.prefill(entries)
    # no shared title: the oldest; the content starts with a conditional stem
    assert prefill.endswith("<title>stairs east</title>\n<content>When")
    assert ". " in t.stop and "<" in t.stop
    # the stop string came one token after the sentence end: the sentence alone is kept
    gen = Script([(" you see the stairs, step toward them. Then", "stop")])
    result = merge_bank(manager, gen, step=5, chunk=5, fmt="items", template=t)
    messages, stop = gen.calls[0]
    assert messages[0][-1] == {"role": "assistant", "content": prefill} and stop == t.stop
    assert result.n_malformed == 0
    (entry,) = manager.bank.get(manager.bank.all_ids())
    assert (entry.title, entry.content) == ("stairs east", "When you see the stairs, step toward them.")
    # closed by a tag without a full stop: the model ended the field, the stop is added
    assert parse_merge_items(t.answer(" a wall blocks, go around it</content>", "stop",
                                      prefill)) == [("stairs east", "When a wall blocks, go around it.")]
    # cut by the token cap inside the sentence, or too short to be one: malformed
    assert parse_merge_items(t.answer(" you see the stairs, step toward", "length", prefill)) is None
    assert parse_merge_items(t.answer(" ready.</content>", "stop", prefill)) is None


def test_sentence_item_template_title_is_the_most_shared_one():
    @dataclass
    class E:
        title: str

    assert ItemTemplate.title([E("a"), E("b: what worked"), E("b:  what worked")]) == "b: what worked"
    assert ItemTemplate.title([E("a"), E("b")]) == "a"
    assert ItemTemplate.title([]) == "Merged knowledge"
