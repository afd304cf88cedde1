"""8 reader threads retrieving while 2 writer threads add / update / delete, for several seconds:
no exceptions, no lost or duplicated entries, no lost usage counts, and the SQLite table and the
ANN index agree at the end (and after reopening the file)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import numpy as np
import pytest

from crl_bench.experience.bank import ExperienceBank
from crl_bench.experience.embedder import load_embedder
from crl_bench.experience.manager import Operation
from crl_bench.experience.manager import ExperienceManager, RetrievalConfig

def limit_torch_threads() -> None:
    """One torch thread: on a shared 2-core CI machine two OpenMP threads spin against each
    other and run the embedder several times slower."""
    import torch

    torch.set_num_threads(1)


READERS, WRITERS = 8, 2
SUBJECTS = ["the stairs", "a locked door", "a hungry monster", "the cheapest shirt", "a mug",
            "the microwave", "a key on the floor", "lava", "a narrow corridor", "the shop search"]
VERBS = ["find", "avoid", "open", "buy", "heat", "pick up", "cross", "search for"]


def run_threads(readers, writers, seconds: float, enough=None, max_seconds: float = 120.0):
    """Run the threads for ``seconds``, then on until ``enough()`` holds (at most
    ``max_seconds``): a loaded machine gets more time to do the same amount of work."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guard(fn, *args):
        def run():
            try:
                fn(stop, *args)
            except BaseException as exc:  # collected and re-raised in the test thread
                errors.append(exc)
                stop.set()
        return threading.Thread(target=run)

    threads = [guard(fn, i) for i, fn in enumerate(readers)] + [
        guard(fn, i) for i, fn in enumerate(writers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    deadline = time.monotonic() + max_seconds - seconds
    while enough is not None and not enough() and not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    if errors:
        raise errors[0]


@pytest.mark.slow
def test_manager_readers_and_writers(tmp_path):
    limit_torch_threads()
    embedder = load_embedder()
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim, embedder_name=embedder.name)
    manager = ExperienceManager(bank, embedder, RetrievalConfig(k=1, batch_wait_ms=2.0))
    families = ["minihack", "webshop"]
    expected: list[dict[int, str]] = [{} for _ in range(WRITERS)]   # writer -> id -> title
    returned: list[Counter] = [Counter() for _ in range(READERS)]
    n_reads = [0] * READERS
    n_writes = [0] * WRITERS

    def reader(stop, r):
        rng = random.Random(100 + r)
        while not stop.is_set():
            query = f"how do I {rng.choice(VERBS)} {rng.choice(SUBJECTS)}?"
            k = rng.choice([1, 2, 4])
            family = rng.choice([None, *families])
            result = manager.retrieve([query], k=k, family=family)
            assert len(result) == 1 and len(result[0]) <= k
            ids = [e.id for e in result[0]]
            assert len(set(ids)) == len(ids)
            for e in result[0]:
                assert e.title.startswith("w") and (family is None or e.family == family)
            returned[r].update(ids)
            n_reads[r] += 1

    def writer(stop, w):
        rng = random.Random(w)
        mine = expected[w]
        seq = 0
        while not stop.is_set():
            seq += 1
            roll = rng.random()
            if roll < 0.5 or len(mine) < 3:
                title = f"w{w}-n{seq}"
                (new_id,) = manager.apply_operations(
                    [Operation("add", title, f"{rng.choice(VERBS)} {rng.choice(SUBJECTS)}")],
                    family=families[w], task_id=f"task-{seq}", provenance={}, step=seq)
                mine[new_id] = title
            elif roll < 0.8:
                target = rng.choice(sorted(mine))
                title = f"w{w}-n{seq}-updated"
                written = manager.apply_operations(
                    [Operation("update", title, f"{rng.choice(VERBS)} {rng.choice(SUBJECTS)}",
                               [target])],
                    family=families[w], task_id=f"task-{seq}", provenance={}, step=seq)
                assert written == [target]
                mine[target] = title
            else:
                target = rng.choice(sorted(mine))
                assert manager.delete([target]) == [target]
                del mine[target]
            n_writes[w] += 1

    # seed a few entries so readers have something from the start
    for w in range(WRITERS):
        for j in range(3):
            (i,) = manager.apply_operations([Operation("add", f"w{w}-seed{j}", SUBJECTS[j])],
                                            family=families[w], task_id="seed", provenance={},
                                            step=0)
            expected[w][i] = f"w{w}-seed{j}"

    run_threads([reader] * READERS, [writer] * WRITERS, seconds=5.0,
                enough=lambda: sum(n_reads) >= 50 and min(n_writes) >= 5)

    assert sum(n_reads) >= 50 and min(n_writes) >= 5, (n_reads, n_writes)
    want = {i: t for mine in expected for i, t in mine.items()}
    assert bank.all_ids() == sorted(want)                                    # none lost or extra
    entries = bank.get(bank.all_ids())
    assert {e.id: e.title for e in entries} == want                          # no lost update
    assert len({e.title for e in entries}) == len(entries)                   # no duplicate
    total_returned = sum(returned, Counter())
    for e in entries:                                                        # no lost count
        assert e.times_retrieved == total_returned[e.id], e.id
    assert bank.verify() == []
    stats = manager.stats()
    assert stats["bank/retrieve_calls"] == sum(n_reads)
    bank.close()
    with ExperienceBank(tmp_path / "bank.sqlite", dim=embedder.dim) as reopened:
        assert reopened.all_ids() == sorted(want)
        assert reopened.verify() == []


def test_bank_readers_and_writers_with_eviction(tmp_path):
    """The bank alone, at full speed (no embedder): 8 searching threads, 2 writers doing mixed
    transactions with FIFO eviction and background graph rebuilds; the final ids are exactly
    those added and not removed."""
    from crl_bench.experience.ann import IndexConfig

    dim = 32
    # small compaction threshold: graphs get rebuilt in the background during the run
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=dim, capacity=400,
                          index=IndexConfig(compact_min=100, compact_ratio=0.5))
    lock = threading.Lock()
    added: set[int] = set()
    removed: set[int] = set()
    n_search = [0] * READERS

    def vecs(rng, n):
        v = rng.standard_normal((n, dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def reader(stop, r):
        rng = np.random.default_rng(100 + r)
        while not stop.is_set():
            k = int(rng.integers(1, 8))
            family = [None, "a", "b"][int(rng.integers(0, 3))]
            for row in bank.search(vecs(rng, 32), k, family=family):
                sims = [s for _, s in row]
                assert len(row) <= k and sims == sorted(sims, reverse=True)
                assert len({i for i, _ in row}) == len(row)
            n_search[r] += 1

    def writer(stop, w):
        rng = np.random.default_rng(w)
        fam = "ab"[w]
        while not stop.is_set():
            live = bank.all_ids(fam)
            n = int(rng.integers(1, 6))
            updates = []
            if live and rng.random() < 0.5:
                updates = [(int(rng.choice(live)), {"title": "upd", "content": "c"},
                            vecs(rng, 1)[0])]
            deletes = [int(i) for i in rng.choice(live, size=min(2, len(live)), replace=False)
                       ] if live and rng.random() < 0.3 else []
            deletes = [i for i in deletes if i not in {u[0] for u in updates}]
            try:
                res = bank.commit(adds=[{"title": f"{fam}{j}", "content": "c", "family": fam}
                                        for j in range(n)],
                                  add_embeddings=vecs(rng, n), updates=updates, deletes=deletes,
                                  step=0, missing_ok=True)
            except KeyError:
                continue  # the update target was evicted by the other writer: nothing written
            with lock:
                added.update(res.added_ids)
                removed.update(res.deleted_ids + res.evicted_ids)

    run_threads([reader] * READERS, [writer] * WRITERS, seconds=4.0,
                enough=lambda: sum(n_search) >= 20 and len(added) > 400)
    assert sum(n_search) >= 20
    assert len(added) > 400                      # eviction happened
    bank.wait_for_compaction()
    assert set(bank.all_ids()) == added - removed
    # full, never over: a last commit of 1 add + 2 deletes may leave it one below capacity
    assert 398 <= len(bank) <= 400 and bank.evicted_total > 0
    assert bank.compactions >= 1 and bank.compaction_errors == []
    assert bank.verify() == []
    bank.close()


@pytest.mark.parametrize("n", [3])
def test_rwlock_excludes_writers(n):
    from crl_bench.experience.locks import RWLock

    lock = RWLock()
    inside = {"readers": 0, "writers": 0, "max_readers": 0, "violations": 0}
    guard = threading.Lock()

    def reader():
        for _ in range(300):
            with lock.read():
                with guard:
                    inside["readers"] += 1
                    inside["max_readers"] = max(inside["max_readers"], inside["readers"])
                    inside["violations"] += inside["writers"] > 0
                time.sleep(0.0001)
                with guard:
                    inside["readers"] -= 1

    def writer():
        for _ in range(100):
            with lock.write():
                with guard:
                    inside["writers"] += 1
                    inside["violations"] += inside["writers"] > 1 or inside["readers"] > 0
                time.sleep(0.0001)
                with guard:
                    inside["writers"] -= 1

    threads = [threading.Thread(target=reader) for _ in range(4)] + [
        threading.Thread(target=writer) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inside["violations"] == 0
    assert inside["max_readers"] >= 2     # reads did overlap
    with pytest.raises(RuntimeError):
        lock.release_read()
