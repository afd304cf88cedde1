"""ExperienceManager with the real embedder (all-MiniLM-L6-v2) on a real SQLite bank: retrieval,
micro-batching, operations, outcomes, merge (with a scripted extractor, including malformed
answers) and Search-and-Ask."""

from __future__ import annotations

import json
import re
import threading

import pytest

from crl_bench.extractor.merge import merge_bank
from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.embedder import load_embedder
from crl_bench.experience.manager import Operation
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig
from _scripted_extractor import ScriptedGenerator, TextGeneration
from crl_bench.extractor.search_ask import NO_MATCH, EpisodeContext, SearchAndAsk

def limit_torch_threads() -> None:
    """One torch thread: on a shared 2-core CI machine two OpenMP threads spin against each
    other and run the embedder several times slower."""
    import torch

    torch.set_num_threads(1)


PROV = {"run": "test-run", "trajectories": ["traj-1"]}

FACTS = [
    ("Find the stairs", "The goal in a dungeon room is the staircase '>'; walk straight to it."),
    ("Avoid monsters", "When a monster letter approaches, step away from it before attacking."),
    ("Buy the cheapest match", "In the shop, pick the cheapest product that has every "
                               "requested attribute, then click buy now."),
    ("Heat food in the microwave", "To heat an object, take it to the microwave and use heat."),
]


@pytest.fixture(scope="module")
def embedder():
    limit_torch_threads()
    return load_embedder()


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make_manager(tmp_path, embedder):
    made = []

    def make(**retrieval) -> ExperienceManager:
        bank = ExperienceBank(tmp_path / f"bank{len(made)}.sqlite", dim=embedder.dim,
                              embedder_name=embedder.name)
        m = ExperienceManager(bank, embedder, RetrievalConfig(**retrieval), clock=FakeClock())
        made.append(m)
        return m

    yield make
    for m in made:
        m.bank.close()


def add_facts(m: ExperienceManager, facts=FACTS, family="mixed", task_id="task-0") -> list[int]:
    return m.apply_operations([Operation("add", t, c) for t, c in facts], family=family,
                              task_id=task_id, provenance=PROV, step=1)


# ------------------------------------------------------------------ retrieval
def test_retrieve_nearest_by_meaning_and_counts_usage(make_manager):
    m = make_manager(diversify=False)
    ids = add_facts(m)
    got = m.retrieve(["Where is the staircase down?", "A goblin is coming at me",
                      "which item should I purchase", "warm up the potato"], k=1)
    assert [r[0].id for r in got] == ids
    assert all(len(r) == 1 for r in got)
    again = m.retrieve(["Where is the staircase down?"], k=2)[0]
    assert again[0].id == ids[0] and len(again) == 2
    e = m.bank.get([ids[0]])[0]
    assert e.times_retrieved == 2 and e.last_retrieved == m.clock()
    stats = m.stats()
    assert stats["bank/size"] == 4 and stats["bank/queries"] == 5
    assert stats["bank/entries_returned"] == 6 and stats["bank/ops_add"] == 4


def test_retrieve_respects_family_and_empty_bank(make_manager):
    m = make_manager(diversify=False)
    assert m.retrieve(["anything"]) == [[]]
    shop = add_facts(m, FACTS[2:3], family="webshop")
    dungeon = add_facts(m, FACTS[:2], family="minihack")
    assert m.retrieve(["buy a cheap shirt"], k=3, family="minihack")[0][0].id in dungeon
    assert [e.id for e in m.retrieve(["buy a cheap shirt"], k=3, family="webshop")[0]] == shop
    assert m.retrieve(["buy a cheap shirt"], k=1, family="alfworld") == [[]]
    assert m.stats()["bank/size_minihack"] == 2
    with pytest.raises(TypeError):
        m.retrieve("one string")


def test_concurrent_callers_share_batches(make_manager):
    m = make_manager(diversify=False, batch_size=32, batch_wait_ms=50.0)
    ids = add_facts(m)
    queries = ["Where is the staircase down?", "A goblin is coming at me",
               "which item should I purchase", "warm up the potato"]
    results: dict[int, int] = {}
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = m.retrieve([queries[i % 4]])[0][0].id

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: ids[i % 4] for i in range(8)}
    stats = m.stats()
    assert stats["bank/retrieve_calls"] == 8
    assert stats["bank/retrieval_batches"] < 8          # callers were served together
    assert stats["bank/mean_batch_queries"] > 1


def test_diversification_spreads_repeated_queries(make_manager):
    facts = [(f"Stairs tip {i}", f"Find the staircase '>' and walk to it, variant {i}.")
             for i in range(6)]
    query = "find the stairs"
    plain = make_manager(diversify=False)
    add_facts(plain, facts)
    firsts = {plain.retrieve([query])[0][0].id for _ in range(10)}
    assert len(firsts) == 1
    # No random demotion: 6 identical queries in ONE batch, worked out by hand from the similarity
    # order r0, r1, ...: q1 r0 (score 0). q2: r0 = -0.4 ln 2 - 1 = -1.28 < r1 = -1 -> r1.
    # q3: r0 -1.28 > r1 -1 - 1 - 0.28 and > r2 = -2 -> r0; q4..q6: r0 = -1 - 0.4 ln(1+n) stays
    # above -2 (n <= 4) -> r0.
    div = make_manager(diversify=True, drop_recent_top1_p=0.0)
    add_facts(div, facts)
    order = [i for i, _ in div.bank.search(div.embedder.encode([query]), k=6)[0]]
    batch = div.retrieve([query] * 6)
    assert [r[0].id for r in batch] == [order[0], order[1]] + [order[0]] * 4
    assert div.stats()["bank/retrieval_batches"] == 1
    assert div.stats()["bank/query_cache_hits"] == 5
    # with the random demotion (p = 0.5) back-to-back retrievals spread further
    rnd = make_manager(diversify=True, seed=0)
    add_facts(rnd, facts)
    firsts = [rnd.retrieve([query])[0][0].id for _ in range(8)]
    assert len(set(firsts)) >= 3


# ------------------------------------------------------------------ operations
def test_apply_operations_add_update_return(make_manager):
    m = make_manager()
    a, b, c = add_facts(m, FACTS[:3])
    m.record_outcomes([a], 1.0)
    written = m.apply_operations(
        [Operation("update", "Stairs and monsters", "Walk to '>' and step away from monsters.",
                   [a, b]),
         Operation("add", "Read the goal", "Read the whole goal text before acting.")],
        family="minihack", task_id="task-7", provenance={"run": "r2", "trajectories": ["t9"]},
        step=3)
    new_id = written[0]
    assert written == [new_id, a] and new_id > c
    updated = m.bank.get([a])[0]
    assert (updated.title, updated.version, updated.updated_step, updated.origin) == (
        "Stairs and monsters", 1, 3, "update")
    assert updated.task_ids == ["task-0", "task-7"]
    assert updated.source_trajectories == ["traj-1", "t9"]
    assert updated.parent_ids == [b] and updated.n_used == 1     # usage history kept
    assert m.bank.get([b]) == []                                 # folded into a
    assert m.bank.get([new_id])[0].family == "minihack"
    assert m.retrieve(["a monster near the stairs"], k=1)[0][0].id == a
    assert m.apply_operations([Operation("return")], family="minihack", task_id="x",
                              provenance={}, step=4) == []
    # targets gone meanwhile (merged, evicted): the update's text is kept as a new entry
    (as_add,) = m.apply_operations([Operation("update", "T", "C", [b])], family="minihack",
                                   task_id="x", provenance={}, step=5)
    assert m.bank.get([as_add])[0].origin == "add"
    assert m.stats()["bank/ops_update_as_add"] == 1
    assert m.bank.verify() == []
    with pytest.raises(ValueError, match="provenance keys"):
        m.apply_operations([], family="f", task_id="t", provenance={"trajectory": "x"}, step=0)


def test_record_outcomes_gives_extractor_reward(make_manager):
    m = make_manager()
    a, b = add_facts(m, FACTS[:2])
    m.record_outcomes([a, b], 1.0)      # success
    m.record_outcomes([a], 0.0)         # failure counts -1
    m.record_outcomes([b], 0.5)         # partial score counts as is
    ea, eb = m.bank.get([a, b])
    assert (ea.n_used, ea.mean_outcome) == (2, 0.0)
    assert (eb.n_used, eb.mean_outcome) == (2, 0.75)
    m.mark_trained([a], step=9)
    assert m.bank.get([a])[0].times_trained == 1


def test_manager_refuses_other_embedder(tmp_path, embedder):
    with ExperienceBank(tmp_path / "b.sqlite", dim=8) as bank:
        with pytest.raises(ValueError, match="384-dim vectors but the bank"):
            ExperienceManager(bank, embedder)
    with ExperienceBank(tmp_path / "c.sqlite", dim=384, embedder_name="other-model") as bank:
        with pytest.raises(ValueError, match="built with embedder 'other-model'"):
            ExperienceManager(bank, embedder)


# ------------------------------------------------------------------ merge
def window_ids(messages) -> list[int]:
    return [int(i) for i in re.findall(r"\[id (\d+)\]", messages[1]["content"])]


def merge_first_two(messages) -> str:
    ids = window_ids(messages)
    return ("<answer>" + json.dumps([{"op": "merge", "ids": ids[:2], "title": f"merged {ids[:2]}",
                                      "content": "combined advice"}]) + "</answer>")


def test_merge_sliding_window_carries_merged_entry(make_manager):
    m = make_manager()
    facts = [(f"tip {i}", f"advice number {i} about the dungeon") for i in range(9)]
    ids: list[int] = []
    for i in range(9):  # one trajectory tag per entry, to follow where each went
        ids += m.apply_operations([Operation("add", *facts[i])], family="minihack",
                                  task_id="t", provenance={"trajectories": [f"s{i}"]}, step=0)
    gen = ScriptedGenerator(merge_first_two)
    result = merge_bank(m, gen, step=10, chunk=3)
    seen = [window_ids(p) for p in gen.prompts]
    # window 1 = ids 1..3; merge(1,2) -> 10 opens window 2 with 4, 5; and so on
    assert seen[0] == ids[:3]
    assert seen[1] == [result.created_ids[0], ids[3], ids[4]]
    assert seen[2] == [result.created_ids[1], ids[5], ids[6]]
    assert seen[3] == [result.created_ids[2], ids[7], ids[8]]
    assert len(seen) == 4 and result.n_windows == 4
    final = result.created_ids[-1]
    assert m.bank.all_ids() == [ids[2], ids[4], ids[6], ids[8], final]
    last = m.bank.get([final])[0]
    assert last.origin == "merge" and last.parent_ids == [result.created_ids[2], ids[7]]
    # every source trajectory survives exactly once across the bank
    tags = [t for e in m.bank.get(m.bank.all_ids()) for t in e.source_trajectories]
    assert sorted(tags) == [f"s{i}" for i in range(9)]
    assert (result.size_before, result.size_after, result.merged) == (9, 5, 8)
    assert [g.text for g in result.generations()] == [s.generation.text for s in result.samples]
    assert m.bank.verify() == []


def test_merge_malformed_rewrite_discard_keep(make_manager):
    m = make_manager()
    ids = add_facts(m, [(f"tip {i}", f"advice {i}") for i in range(6)], family="minihack")
    script = [
        "<answer>[{\"op\": \"merge\", \"ids\": [1]}]</answer>",          # malformed: no text
        json.dumps([{"op": "discard", "ids": [ids[3]]}]),                  # malformed: no tags
        "<answer>" + json.dumps([{"op": "rewrite", "ids": [ids[4]], "title": "better tip",
                                  "content": "clearer advice"},
                                 {"op": "keep", "ids": [ids[5]]}]) + "</answer>",
    ]
    # chunk 2: windows (1,2) malformed -> no carry; (3,4) malformed; (5,6) rewrite 5 keep 6
    result = merge_bank(m, ScriptedGenerator(script), step=2, chunk=2)
    assert [s.malformed for s in result.samples] == [True, True, False]
    assert result.n_malformed == 2 and result.rewritten == 1
    new = result.created_ids
    assert m.bank.all_ids() == ids[:4] + [ids[5]] + new
    assert m.bank.get(new)[0].title == "better tip"
    assert m.bank.get(new)[0].parent_ids == [ids[4]]
    # a discard pass
    result = merge_bank(m, ScriptedGenerator(lambda msgs: "<answer>" + json.dumps(
        [{"op": "discard", "ids": window_ids(msgs)[:1]}]) + "</answer>"), step=3, chunk=6)
    assert result.discarded == 1 and len(m.bank) == 5
    assert m.stats()["bank/merge_malformed"] == 2


def test_merge_batches_families_and_skips_changed_windows(make_manager):
    m = make_manager()
    a = add_facts(m, [("a1", "x"), ("a2", "y")], family="minihack")
    w = add_facts(m, [("w1", "x"), ("w2", "y")], family="webshop")
    batches = []

    def generate(batch):
        batches.append(len(batch))
        # meanwhile the extractor track updates one minihack entry of the window
        m.apply_operations([Operation("update", "a1 v2", "newer", [a[0]])], family="minihack",
                           task_id="t", provenance={}, step=5)
        return [TextGeneration(merge_first_two(msgs)) for msgs in batch]

    result = merge_bank(m, generate, step=6, chunk=5)
    assert batches == [2]                       # both families' windows in one call
    stale = [s for s in result.samples if s.stale]
    assert [s.family for s in stale] == ["minihack"] and result.n_stale == 1
    assert m.bank.get([a[0]])[0].title == "a1 v2"        # the concurrent update survived
    assert set(a) <= set(m.bank.all_ids())               # minihack window untouched
    assert not set(w) & set(m.bank.all_ids())            # webshop window merged
    with pytest.raises(ValueError, match="returned 0 outputs"):
        merge_bank(m, lambda batch: [], step=7)
    with pytest.raises(ValueError, match="chunk"):
        merge_bank(m, generate, step=7, chunk=1)


# ------------------------------------------------------------------ Search-and-Ask
def test_search_and_ask(make_manager):
    m = make_manager(diversify=False)
    ids = add_facts(m, family="minihack")
    gen = ScriptedGenerator([
        "Thinking...<answer>Head for the '>' in the corner now.</answer>",
        "I am not sure what to say.",                                  # malformed
    ])
    tool = SearchAndAsk(m, gen, k=2)
    ctx = EpisodeContext(goal="Reach the stairs.", observation="You are in a dark room.",
                         family="minihack", task_id="room-1")
    out = tool("how do I find the way down?", ctx)
    assert out == "Head for the '>' in the corner now."
    user = gen.prompts[0][1]["content"]
    assert "how do I find the way down?" in user and "You are in a dark room." in user
    assert f"[id {ids[0]}] Find the stairs" in user
    fallback = tool("stairs?", {"goal": "Reach the stairs.", "family": "minihack"})
    assert fallback.startswith("Related experience:") and "Find the stairs" in fallback
    samples = tool.drain_samples()
    assert [s.malformed for s in samples] == [False, True]
    assert samples[0].entry_ids[0] == ids[0] and len(samples[0].entry_ids) == 2
    assert samples[0].generation.text.startswith("Thinking")
    assert tool.samples == []
    assert tool("anything", EpisodeContext(goal="g", family="alfworld")) == NO_MATCH
    assert tool.samples == []
    with pytest.raises(ValueError, match="goal"):
        tool("q", {"observation": "x"})
