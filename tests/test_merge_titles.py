"""A merged entry's title agrees with its content.

With the ``action`` answer template an extracted entry is titled "<goal>: what worked" or
"<goal>: what went wrong" (``ContentTemplate.title``) and says "To succeed, take the action X." or
"To avoid this failure, do not take the action X." (``ActionTemplate``). The merge of a window
writes success wording when any entry of the window claims a success (``ActionItemTemplate``);
the title must then be a success title too, even when most of the window's entries are failures
(the actor is shown "title: content"). The template is ours (no official counterpart); the
expected values follow from its definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

from crl_bench.experience.bank import ExperienceBank  # noqa: E402
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig  # noqa: E402
from crl_bench.extractor.extraction import ActionTemplate, parse_operations  # noqa: E402
from crl_bench.extractor.merge import ActionItemTemplate, merge_bank  # noqa: E402
from tests.test_extractor_track import embedder  # noqa: E402,F401

GOAL = "Reach the staircase down."


@dataclass
class Gen:
    text: str
    finish_reason: str = "stop"


def written(template: ActionTemplate, success: bool, move: str):
    """The bank operation the extraction writes for an episode that took ``move``: the real
    template's pre-fill and answer, parsed by the real parser."""
    prefill = template.prefill(GOAL, success, [move])
    ops, malformed = parse_operations(template.answer(prefill, f" {move}", [move]),
                                      valid_target_ids=set())
    assert not malformed and len(ops) == 1
    return ops[0]


def outcome(text: str) -> str:
    return "success" if "what worked" in text or "To succeed" in text else "failure"


@pytest.mark.parametrize("successes", [1, 2])
def test_a_merged_success_item_is_titled_as_a_success(tmp_path, embedder, successes):  # noqa: F811
    t = ActionTemplate()
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(k=1, diversify=False))
    try:
        # a window of one start: failures first, then the success(es)
        moves = ["west", "north", "south", "east"][: 4 - successes] + ["east"] * successes
        for i, move in enumerate(moves):
            op = written(t, move == "east", move)
            manager.apply_operations([op], family="minihack", task_id="level-0", provenance={},
                                     step=i, key_text="start 0")
        entries = bank.get(bank.all_ids())
        assert [outcome(e.title) for e in entries] == [outcome(e.content) for e in entries]
        # the window's own title (most shared, ties: the oldest) is a failure title
        assert ActionItemTemplate.title(entries).endswith(": what went wrong")

        def names_the_success_move(messages, stop=()):  # the move the window's success names
            return [Gen(" east.") for _ in messages]
        result = merge_bank(manager, names_the_success_move, step=5, chunk=5, fmt="items",
                            template=ActionItemTemplate(), scope="key")
        assert result.n_windows == 1 and result.n_malformed == 0
        (merged,) = bank.get(bank.all_ids())
        assert merged.content == "To succeed, take the action east."
        assert merged.title == "Reach the staircase down: what worked"
        # the prompt's pre-filled title is that title (what the model continued from)
        assert "<title>Reach the staircase down: what worked</title>" in \
            result.samples[0].messages[-1]["content"]
    finally:
        bank.close()


def test_a_failure_only_window_keeps_a_failure_title(tmp_path, embedder):  # noqa: F811
    t = ActionTemplate()
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(k=1, diversify=False))
    try:
        for i, move in enumerate(["west", "north"]):
            manager.apply_operations([written(t, False, move)], family="minihack",
                                     task_id="level-0", provenance={}, step=i, key_text="start 0")
        result = merge_bank(manager, lambda msgs, stop=(): [Gen(" west.") for _ in msgs], step=5,
                            chunk=5, fmt="items", template=ActionItemTemplate(), scope="key")
        assert result.n_malformed == 0
        (merged,) = bank.get(bank.all_ids())
        assert merged.title == "Reach the staircase down: what went wrong"
        assert merged.content == "To avoid this failure, do not take the action west."
    finally:
        bank.close()
