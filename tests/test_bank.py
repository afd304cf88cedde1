"""ExperienceBank on a real SQLite file with a real hnswlib index (vectors are random unit
vectors: the bank does not care where they come from, and the embedder has its own tests)."""

from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest

from crl_bench.experience.bank import (
    SCHEMA_VERSION, BankCompatibilityError, ExperienceBank, ReadOnlyBankError, StaleEntriesError,
    read_meta, restore_bank)

DIM = 16


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def brute_force_top_k(bank, queries: np.ndarray, k: int, family: str | None = None
                      ) -> list[list[tuple[int, float]]]:
    """Exact top-k by cosine over the stored embeddings (what the ANN index approximates)."""
    q = np.asarray(queries, dtype=np.float32).reshape(-1, bank.dim)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    ids = bank.all_ids(family)
    sims = q @ bank.get_embeddings(ids).T
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return [[(ids[j], float(sims[r, j])) for j in row] for r, row in enumerate(top)]


def entry(i: int, family: str = "minihack", **extra) -> dict:
    return {"title": f"title {i}", "content": f"content {i}", "family": family, **extra}


@pytest.fixture
def bank(tmp_path):
    b = ExperienceBank(tmp_path / "bank.sqlite", dim=DIM, embedder_name="test-embedder")
    yield b
    b.close()


def test_add_get_roundtrip_and_provenance(bank):
    rng = np.random.default_rng(0)
    ids = bank.add([entry(0, task_ids=["room-5x5"], run="run-a", source_trajectories=["t0", "t1"]),
                    entry(1, family="webshop")], unit(rng, 2), step=7)
    assert ids == [1, 2] and len(bank) == 2
    e0, e1 = bank.get(ids)
    assert (e0.title, e0.content, e0.family, e0.task_ids, e0.run) == (
        "title 0", "content 0", "minihack", ["room-5x5"], "run-a")
    assert e0.source_trajectories == ["t0", "t1"]
    assert (e0.created_step, e0.updated_step, e0.version) == (7, 7, 0)
    assert (e0.times_retrieved, e0.last_retrieved, e0.times_trained, e0.n_used) == (0, None, 0, 0)
    assert e0.mean_outcome is None
    assert e0.render() == "title 0: content 0"
    assert e1.family == "webshop"
    assert bank.get([2, 99, 1]) == [e1, e0]  # given order, missing ids skipped
    assert bank.family_counts() == {"minihack": 1, "webshop": 1}
    assert bank.verify() == []


def test_search_finds_itself_and_matches_exact(bank):
    rng = np.random.default_rng(1)
    vecs = unit(rng, 300)
    ids = bank.add([entry(i, family="a" if i % 3 else "b") for i in range(300)], vecs, step=0)
    hits = bank.search(vecs, k=1)
    assert [h[0][0] for h in hits] == ids
    assert all(abs(h[0][1] - 1.0) < 1e-5 for h in hits)
    # family filter: only ids of that family, and the same as brute force
    queries = unit(rng, 20)
    ann = bank.search(queries, k=5, family="b")
    exact = brute_force_top_k(bank, queries, k=5, family="b")
    fam_b = set(bank.all_ids("b"))
    assert all(i in fam_b for row in ann for i, _ in row)
    assert sum(a[0][0] == e[0][0] for a, e in zip(ann, exact)) >= 19
    for row in ann:
        sims = [s for _, s in row]
        assert sims == sorted(sims, reverse=True)
    # all families: merged, best first, k results
    both = bank.search(queries, k=4)
    assert all(len(r) == 4 for r in both)
    assert bank.search(queries[:2], k=3, family="nope") == [[], []]


def test_k_larger_than_family_returns_what_exists(bank):
    rng = np.random.default_rng(2)
    bank.add([entry(i) for i in range(3)], unit(rng, 3), step=0)
    assert [len(r) for r in bank.search(unit(rng, 2), k=10)] == [3, 3]


def test_fifo_capacity_evicts_oldest(tmp_path):
    rng = np.random.default_rng(3)
    with ExperienceBank(tmp_path / "b.sqlite", dim=DIM, capacity=5) as bank:
        first = bank.add([entry(i) for i in range(4)], unit(rng, 4), step=0)
        second = bank.add([entry(i) for i in range(4, 7)], unit(rng, 3), step=1)
        assert len(bank) == 5
        assert bank.all_ids() == first[2:] + second
        assert bank.evicted_total == 2
        # a batch larger than the capacity keeps only its newest entries
        third = bank.add([entry(i) for i in range(7, 14)], unit(rng, 7), step=2)
        assert bank.all_ids() == third[2:]
        assert bank.verify() == []
        assert {i for row in bank.search(unit(rng, 10), k=5) for i, _ in row} <= set(third[2:])


def test_update_in_place_changes_text_vector_and_version(bank):
    rng = np.random.default_rng(4)
    vecs = unit(rng, 3)
    ids = bank.add([entry(i) for i in range(3)], vecs, step=0)
    new_vec = unit(rng, 1)[0]
    bank.update(ids[1], {"title": "better", "content": "clearer", "task_ids": ["x", "y"]},
                new_vec, step=5)
    e = bank.get([ids[1]])[0]
    assert (e.title, e.content, e.task_ids, e.version, e.updated_step, e.created_step) == (
        "better", "clearer", ["x", "y"], 1, 5, 0)
    assert bank.search(new_vec[None], k=1)[0][0][0] == ids[1]
    assert np.allclose(bank.get_embeddings([ids[1]])[0], new_vec, atol=1e-6)
    assert bank.verify() == []
    # a second update with the old version is refused
    with pytest.raises(StaleEntriesError):
        bank.update(ids[1], {"run": "r"}, None, step=6, expect_version=0)
    bank.update(ids[1], {"run": "r"}, None, step=6, expect_version=1)
    assert bank.get([ids[1]])[0].version == 2


def test_update_refuses_bad_fields(bank):
    rng = np.random.default_rng(5)
    (i,) = bank.add([entry(0)], unit(rng, 1), step=0)
    with pytest.raises(ValueError, match="pass the new embedding"):
        bank.update(i, {"content": "new text"}, None, step=1)
    with pytest.raises(ValueError, match="cannot set"):
        bank.update(i, {"times_retrieved": 5}, None, step=1)
    with pytest.raises(ValueError, match="cannot set"):
        bank.update(i, {"family": "other"}, None, step=1)
    with pytest.raises(KeyError):
        bank.update(999, {"run": "x"}, None, step=1)
    assert bank.get([i])[0].version == 0


def test_add_validates_entries_and_embeddings(bank):
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match="non-empty string 'title'"):
        bank.add([{"title": "", "content": "c", "family": "f"}], unit(rng, 1), step=0)
    with pytest.raises(ValueError, match="unknown keys"):
        bank.add([entry(0, colour="red")], unit(rng, 1), step=0)
    with pytest.raises(ValueError, match=r"shape \(2, 16\)"):
        bank.add([entry(0), entry(1)], unit(rng, 2, dim=8), step=0)
    with pytest.raises(ValueError, match="finite and non-zero"):
        bank.add([entry(0)], np.zeros((1, DIM), np.float32), step=0)
    with pytest.raises(ValueError, match="list of strings"):
        bank.add([entry(0, task_ids="room")], unit(rng, 1), step=0)
    assert len(bank) == 0 and bank.verify() == []


def test_replace_is_one_transaction(bank):
    rng = np.random.default_rng(7)
    ids = bank.add([entry(i) for i in range(4)], unit(rng, 4), step=0)
    merged_vec = unit(rng, 1)
    new = bank.replace(ids[:2], [entry(9, parent_ids=ids[:2], origin="merge")], merged_vec, step=3)
    assert bank.all_ids() == ids[2:] + new
    assert bank.get(new)[0].parent_ids == ids[:2]
    # one original already gone: nothing happens, not even the add
    with pytest.raises(StaleEntriesError):
        bank.replace([ids[2], ids[0]], [entry(10)], unit(rng, 1), step=4)
    assert bank.all_ids() == ids[2:] + new
    # a version mismatch also refuses
    bank.update(ids[2], {"run": "x"}, None, step=5)
    with pytest.raises(StaleEntriesError):
        bank.replace([ids[2]], [entry(11)], unit(rng, 1), step=6, expect_versions={ids[2]: 0})
    assert bank.all_ids() == ids[2:] + new
    assert bank.verify() == []


def test_failed_write_leaves_file_and_index_unchanged(bank):
    rng = np.random.default_rng(8)
    ids = bank.add([entry(i) for i in range(3)], unit(rng, 3), step=0)
    with pytest.raises(KeyError):  # the update of a missing id fails after the add ran
        bank.commit(adds=[entry(5)], add_embeddings=unit(rng, 1),
                    updates=[(404, {"run": "x"}, None)], deletes=[ids[0]], step=1)
    assert bank.all_ids() == ids
    assert bank.verify() == []


def test_delete_and_slot_reuse(bank):
    rng = np.random.default_rng(9)
    for round_ in range(5):
        vecs = unit(rng, 50)
        ids = bank.add([entry(i) for i in range(50)], vecs, step=round_)
        bank.delete(ids[::2])
        bank.delete([123456])  # unknown ids are ignored
        hits = bank.search(vecs, k=1)
        kept = set(ids[1::2])
        assert all(h[0][0] in kept or h[0][0] not in ids for h in hits)
    assert len(bank) == 125
    assert bank.verify() == []


def test_usage_accounting(bank):
    rng = np.random.default_rng(10)
    ids = bank.add([entry(i) for i in range(3)], unit(rng, 3), step=0)
    bank.record_retrievals([ids[0], ids[0], ids[1], 999], when=100.0)
    bank.record_outcomes([ids[0], ids[0], ids[1]], 1.0)
    bank.record_outcomes([ids[0]], -1.0)
    bank.mark_trained([ids[1]], step=4)
    e0, e1, e2 = bank.get(ids)
    assert (e0.times_retrieved, e0.last_retrieved, e0.n_used) == (2, 100.0, 2)
    assert e0.mean_outcome == pytest.approx(0.0)       # (1 + -1) / 2
    assert (e1.times_retrieved, e1.n_used, e1.mean_outcome) == (1, 1, 1.0)
    assert (e1.times_trained, e1.last_trained_step) == (1, 4)
    assert (e2.times_retrieved, e2.mean_outcome) == (0, None)
    assert bank.usage(ids + [999]) == ({ids[0]: 2, ids[1]: 1, ids[2]: 0},
                                       {ids[0]: 100.0, ids[1]: 100.0, ids[2]: None})


def test_reopen_rebuilds_index_with_everything(tmp_path):
    rng = np.random.default_rng(11)
    path = tmp_path / "b.sqlite"
    vecs = unit(rng, 200)
    with ExperienceBank(path, dim=DIM, embedder_name="e") as bank:
        ids = bank.add([entry(i, family=f"f{i % 4}") for i in range(200)], vecs, step=0)
        bank.delete(ids[:50])
        bank.record_retrievals(ids[60:62], when=5.0)
    with ExperienceBank(path, dim=DIM, embedder_name="e") as bank:
        assert bank.all_ids() == ids[50:]
        assert bank.verify() == []
        assert [h[0][0] for h in bank.search(vecs[50:], k=1)] == ids[50:]
        assert bank.usage([ids[60]]) == ({ids[60]: 1}, {ids[60]: 5.0})
        new = bank.add([entry(1000)], unit(rng, 1), step=1)
        assert new[0] > max(ids)  # ids are never reused
    opened = ExperienceBank.open(path)
    assert (opened.dim, opened.embedder_name, len(opened)) == (DIM, "e", 151)
    opened.close()


def test_read_only_bank_reads_and_refuses_writes(tmp_path):
    rng = np.random.default_rng(12)
    path = tmp_path / "b.sqlite"
    writer = ExperienceBank(path, dim=DIM)
    vecs = unit(rng, 5)
    ids = writer.add([entry(i) for i in range(5)], vecs, step=0)
    reader = ExperienceBank.open(path, read_only=True, build_index=False)
    try:
        assert reader.all_ids() == ids and reader.get(ids[:1])[0].title == "title 0"
        assert reader.search(vecs[:1], k=1)[0][0][0] == ids[0]  # index built on demand
        with pytest.raises(ReadOnlyBankError):
            reader.add([entry(9)], unit(rng, 1), step=0)
    finally:
        reader.close()
        writer.close()


# ---------------------------------------------------------------- bad input refused with a fix
def test_other_dimension_is_refused_with_fix(tmp_path):
    path = tmp_path / "b.sqlite"
    ExperienceBank(path, dim=DIM, embedder_name="all-MiniLM-L6-v2").close()
    with pytest.raises(BankCompatibilityError) as err:
        ExperienceBank(path, dim=1024, embedder_name="Qwen3-Embedding-0.6B")
    msg = str(err.value)
    assert "16-dimensional" in msg and "dim=1024" in msg
    assert "all-MiniLM-L6-v2" in msg and "new bank at another path" in msg


def test_other_embedder_same_dim_is_refused_with_fix(tmp_path):
    path = tmp_path / "b.sqlite"
    ExperienceBank(path, dim=DIM, embedder_name="model-a").close()
    with pytest.raises(BankCompatibilityError, match="built with embedder 'model-a'.*Open it with"):
        ExperienceBank(path, dim=DIM, embedder_name="model-b")
    ExperienceBank(path, dim=DIM).close()  # no name given: no check


def test_other_schema_version_is_refused_with_fix(tmp_path):
    path = tmp_path / "b.sqlite"
    ExperienceBank(path, dim=DIM).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(BankCompatibilityError) as err:
        ExperienceBank(path, dim=DIM)
    msg = str(err.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in msg and f"reads version {SCHEMA_VERSION}" in msg
    assert "start a new bank" in msg
    with pytest.raises(BankCompatibilityError, match="schema version"):
        ExperienceBank.open(path)


def test_files_that_are_not_banks_are_refused(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("this is not a database, just text long enough to fill a header page" * 20)
    with pytest.raises(BankCompatibilityError, match="not an experience bank"):
        ExperienceBank(text, dim=DIM)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(BankCompatibilityError, match="SQLite file but not an experience bank"):
        ExperienceBank(other, dim=DIM)
    with pytest.raises(BankCompatibilityError, match="not an experience bank"):
        read_meta(other)
    with pytest.raises(FileNotFoundError):
        ExperienceBank.open(tmp_path / "missing.sqlite")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="dim must be a positive int"):
        ExperienceBank(tmp_path / "b.sqlite", dim=0)
    with pytest.raises(ValueError, match="capacity"):
        ExperienceBank(tmp_path / "b.sqlite", dim=DIM, capacity=0)
    with ExperienceBank(tmp_path / "b.sqlite", dim=DIM) as bank:
        with pytest.raises(ValueError, match=r"shape \(Q, 16\)"):
            bank.search(np.zeros((2, 8), np.float32), k=1)
        with pytest.raises(ValueError, match="k must be"):
            bank.search(np.zeros((2, DIM), np.float32), k=0)
    with pytest.raises(RuntimeError, match="closed"):
        bank.get([1])


def test_entry_updated_and_evicted_in_one_commit(tmp_path):
    """Found by the concurrency stress test: an update of the oldest entry together with adds
    that evict it must leave table and index agreeing (the entry is simply gone)."""
    rng = np.random.default_rng(13)
    with ExperienceBank(tmp_path / "b.sqlite", dim=DIM, capacity=3) as bank:
        ids = bank.add([entry(i) for i in range(3)], unit(rng, 3), step=0)
        res = bank.commit(adds=[entry(3)], add_embeddings=unit(rng, 1),
                          updates=[(ids[0], {"title": "t", "content": "c"}, unit(rng, 1)[0])],
                          step=1)
        assert res.updated_ids == [ids[0]] and res.evicted_ids == [ids[0]]
        assert bank.all_ids() == ids[1:] + res.added_ids
        assert bank.verify() == []


def test_deletes_leave_tombstones_until_compaction(tmp_path):
    from crl_bench.experience.ann import IndexConfig

    rng = np.random.default_rng(14)
    cfg = IndexConfig(compact_min=10, compact_ratio=0.3, background_compaction=False)
    with ExperienceBank(tmp_path / "b.sqlite", dim=DIM, index=cfg) as bank:
        vecs = unit(rng, 40)
        ids = bank.add([entry(i) for i in range(40)], vecs, step=0)
        bank.delete(ids[:10])
        bank.update(ids[10], {"title": "t", "content": "c"}, unit(rng, 1)[0], step=1)
        # 11 tombstones (10 deletes + the update's old node) > max(10, 0.3 * 30 = 9): rebuilt
        assert bank.compactions == 1
        assert bank.index_stats() == {"minihack": {"live": 30, "tombstones": 0}}
        bank.delete(ids[11:20])          # 9 tombstones <= max(10, 6.3): kept for now
        assert bank.index_stats()["minihack"] == {"live": 21, "tombstones": 9}
        assert bank.verify() == []
        assert [h[0][0] for h in bank.search(vecs[20:], k=1)] == ids[20:]
        bank.compact()
        assert bank.index_stats()["minihack"] == {"live": 21, "tombstones": 0}
        assert bank.verify() == []


def test_background_compaction_replays_writes_made_during_the_rebuild(tmp_path):
    from crl_bench.experience.ann import IndexConfig

    rng = np.random.default_rng(15)
    cfg = IndexConfig(compact_min=50, compact_ratio=0.1, background_compaction=True,
                      build_threads=1)
    with ExperienceBank(tmp_path / "b.sqlite", dim=DIM, index=cfg) as bank:
        # The rebuild thread waits at a gate until the writes below are made, so they land
        # during the rebuild however fast or loaded the machine is (a 2700-node rebuild can
        # finish before the next line runs; then nothing would be journaled or replayed).
        started, release = threading.Event(), threading.Event()
        build = bank._ann._build_graph

        def gated_build(ids, vecs):
            started.set()
            assert release.wait(120), "the test never opened the gate"
            return build(ids, vecs)

        bank._ann._build_graph = gated_build
        ids = bank.add([entry(i) for i in range(3000)], unit(rng, 3000), step=0)
        bank.delete(ids[:300])               # starts a rebuild of 2700 nodes in the background
        assert started.wait(120)             # the rebuild thread is running (generous ceiling)
        assert bank._compacting             # (still running: the writes below get journaled)
        late = bank.add([entry(i) for i in range(3000, 3100)], unit(rng, 100), step=1)
        bank.delete(ids[300:320] + late[:5])
        bank.update(ids[500], {"title": "moved", "content": "c"}, unit(rng, 1)[0], step=2)
        assert len(bank._compacting["minihack"]) == 3   # one journal record per family op
        assert bank.compactions == 0
        release.set()
        bank.wait_for_compaction()
        assert bank.compactions >= 1 and bank.compaction_errors == []
        assert bank.verify() == []
        live = bank.all_ids()
        assert live == ids[320:] + late[5:]
        hits = bank.search(bank.get_embeddings(live), k=1)
        assert [h[0][0] for h in hits] == live


def test_backup_then_restore_returns_the_bank_to_that_moment(tmp_path):
    rng = np.random.default_rng(5)
    path, copy = tmp_path / "bank.sqlite", tmp_path / "ckpt" / "bank.sqlite"
    copy.parent.mkdir()
    vecs = unit(rng, 30)
    with ExperienceBank(path, dim=DIM, embedder_name="e") as bank:
        kept = bank.add([entry(i) for i in range(20)], vecs[:20], step=1)
        bank.record_retrievals(kept[:2], when=3.0)
        assert bank.backup(copy) == copy
        later = bank.add([entry(i) for i in range(20, 30)], vecs[20:], step=2)
        bank.update(kept[0], {"title": "changed after the backup"}, unit(rng, 1)[0], step=2)
        bank.delete(kept[1:3])
    assert not copy.with_name("bank.sqlite.tmp").exists()
    restore_bank(copy, path)
    assert not (tmp_path / "bank.sqlite-wal").exists()
    with ExperienceBank(path, dim=DIM, embedder_name="e") as bank:
        assert bank.all_ids() == kept and not set(later) & set(bank.all_ids())
        assert bank.get([kept[0]])[0].title == "title 0"
        assert bank.usage([kept[0]])[0] == {kept[0]: 1}
        assert bank.verify() == []
        assert [h[0][0] for h in bank.search(vecs[:20], k=1)] == kept
    with pytest.raises(FileNotFoundError, match="no bank backup"):
        restore_bank(tmp_path / "missing.sqlite", path)
