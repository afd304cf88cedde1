"""A merge pass ends, whatever the model returns: a window always holds a fresh entry.

Official (ComplementaryRL ab2574f, ``roll/pipeline/agentic/memory/async_memory_manager.py``,
``_merge_single_task``): the scope is pre-cut into chunks (:2504-2506), one model call per chunk
(:2513-2516), the items a chunk returns are appended to the next chunk (:2576-2578) and those of
the last chunk are final (:2579-2581). So a pass makes exactly ``ceil(n / 5)`` calls for ``n``
entries, however many items each call returns. Ours (``style="ours"``) cuts its windows
differently (it carries at most ``chunk - 1`` items) but must end the same way: a window of
only carried items, with no fresh entry left, is never sent. Before, a model answering every
window with two or more items made ``style="ours"`` merge its own output forever.

The windows are real (a SQLite bank, the real embedder), the model's answers scripted
(``tests/_scripted_extractor.py``): a list of answers that runs out (and raises) past the bound.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")

from crl_bench.experience.bank import ExperienceBank  # noqa: E402
from crl_bench.experience.manager import ExperienceManager, Operation, RetrievalConfig  # noqa: E402
from crl_bench.extractor.merge import merge_bank  # noqa: E402
from tests._scripted_extractor import ScriptedGenerator  # noqa: E402
from tests.test_extractor_track import embedder  # noqa: E402,F401

ITEMS = "".join(
    f"<<<KNOWLEDGE_ITEM>>>\n<title>Rule {k}</title>\n<content>When the observation shows "
    f"signal number {k}, act on it first; otherwise keep exploring the room.</content>\n"
    f"<<<END_ITEM>>>\n" for k in range(3))
ITEMS_ANSWER = f"<think>keep three</think><answer>\n{ITEMS}</answer>"


def ops_answer(messages) -> str:
    """Rewrite every entry of the window (each a new entry that is carried on)."""
    ids = [int(i) for i in re.findall(r"\[id (\d+)\]", messages[-1]["content"])]
    ops = ", ".join('{"op": "rewrite", "ids": [%d], "title": "Rule %d", "content": '
                    '"When signal %d shows, act on it first."}' % (i, i, i) for i in ids)
    return f"<answer>[{ops}]</answer>"


def make_manager(path, embedder, n: int) -> ExperienceManager:  # noqa: F811
    bank = ExperienceBank(path, dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(diversify=False))
    for i in range(n):
        manager.apply_operations([Operation("add", f"tip {i}", f"Advice number {i} about rooms.")],
                                 family="minihack", task_id="t", provenance={}, step=0)
    return manager


# windows per pass for 12 entries and three items returned per window:
# official: chunks 5 | 5 + 3 carried | 2 + 3 carried (async_memory_manager.py:2504-2506,
# :2576-2578), then the last chunk's items are final (:2579-2581): 3 calls, 3 entries left.
# ours: 5 | 3 carried + 2 fresh (three times) | 3 carried + 1 fresh, then final: 5 calls.
@pytest.mark.parametrize("style, windows", [("official", [5, 8, 5]), ("ours", [5, 5, 5, 5, 4])])
def test_a_pass_whose_windows_return_several_items_ends(tmp_path, embedder, style,  # noqa: F811
                                                       windows):
    manager = make_manager(tmp_path / "bank.sqlite", embedder, 12)
    try:
        # the bound: one call per entry at most; running out of answers raises
        model = ScriptedGenerator([ITEMS_ANSWER] * 12)
        result = merge_bank(manager, model, step=5, chunk=5, fmt="items", style=style)
        assert [m[1]["content"].count("--- Entry ") for m in model.prompts] == windows
        assert result.n_windows == len(windows) and result.n_malformed == 0
        assert [e.title for e in manager.get(manager.bank.all_ids())] == [
            "Rule 0", "Rule 1", "Rule 2"]
    finally:
        manager.bank.close()


@pytest.mark.parametrize("style", ["ours", "official"])
def test_ops_answers_that_rewrite_every_entry_end_too(tmp_path, embedder, style):  # noqa: F811
    """The ``ops`` format: each rewritten entry is carried on as a new entry; with two fresh
    entries and every answer rewriting both, the carried pair must not come back as a window."""
    manager = make_manager(tmp_path / "bank.sqlite", embedder, 2)
    try:
        first = manager.bank.all_ids()
        calls = []

        def script(messages):
            calls.append(messages)
            if len(calls) > 2:
                raise RuntimeError(f"merge pass made {len(calls)} model calls for 2 entries")
            return ops_answer(messages)
        result = merge_bank(manager, ScriptedGenerator(script), step=5, chunk=5, fmt="ops",
                            style=style)
        assert result.n_windows == 1 and result.rewritten == 2
        assert sorted(e.title for e in manager.get(manager.bank.all_ids())) == [
            f"Rule {i}" for i in sorted(first)]
    finally:
        manager.bank.close()
