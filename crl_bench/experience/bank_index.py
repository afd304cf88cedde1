"""The bank's ANN upkeep: one hnswlib graph per env family (``ann.FamilyIndex``), kept in step
with the committed table, and rebuilt in the background when tombstones pile up.

Graphs are insert-only (see ``ann.py``): a deletion or a re-embedding leaves a tombstone. Once a
family's graph holds too many, a fresh graph is built from a snapshot of its live vectors in a
thread while searches go on in the old one; changes committed meanwhile are journaled and
replayed onto the new graph, which then replaces the old one under the write lock.

Locking: the bank holds its readers-writer lock (``lock``) around every call here, the write
side for changes and the read side for searches; the compaction thread takes the write side
itself to swap its graph in.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

import numpy as np

from crl_bench.experience.ann import FamilyIndex, IndexConfig
from crl_bench.experience.locks import RWLock

# (op, entry id, family, unit vector or None); op: "add" | "update" | "del"
IndexChange = tuple[str, int, str, "np.ndarray | None"]


class BankIndex:
    """The family graphs of one bank (see the module docstring)."""

    def __init__(self, dim: int, config: IndexConfig, lock: RWLock) -> None:
        self.dim = dim
        self.config = config
        self.lock = lock
        self.graphs: dict[str, FamilyIndex] = {}
        self.built = False
        # family -> changes made while its graph is being rebuilt (replayed before the swap)
        self.compacting: dict[str, list[tuple[str, list[int], np.ndarray | None]]] = {}
        self.threads: list[threading.Thread] = []
        self.compactions = 0
        self.errors: list[str] = []
        self.closed = False
        self.generation = 0  # bumped when the graphs are replaced wholesale (build, drop)

    # ------------------------------------------------------------------ building
    def build(self, family_of: dict[int, str],
              vectors: Callable[[list[int]], np.ndarray]) -> None:
        """(Re)build every family's graph; ``vectors(ids)`` reads the stored embeddings."""
        by_family: dict[str, list[int]] = {}
        for entry_id, family in family_of.items():
            by_family.setdefault(family, []).append(entry_id)
        self.graphs = {}
        self.compacting = {}
        self.generation += 1
        for family, ids in by_family.items():
            self.graphs[family] = self._build_graph(ids, vectors(ids))
        self.built = True

    def drop(self) -> None:
        """Forget the graphs (after a failed update: the next search rebuilds them)."""
        self.graphs, self.compacting, self.built = {}, {}, False
        self.generation += 1

    def close(self) -> None:
        self.closed = True
        self.graphs.clear()
        self.compacting.clear()

    def _build_graph(self, ids: list[int], vecs: np.ndarray) -> FamilyIndex:
        graph = FamilyIndex(self.dim, self.config, capacity_hint=2 * len(ids))
        graph.add(ids, vecs, threads=self.config.build_threads or (os.cpu_count() or 1))
        return graph

    # ------------------------------------------------------------------ changes
    def apply(self, changes: list[IndexChange]) -> None:
        """Apply one committed transaction to the family graphs (caller holds the write lock)."""
        # An entry added and evicted by the same commit (batch larger than the free capacity)
        # never enters the graph; one updated and then evicted is only removed.
        added = {c[1] for c in changes if c[0] == "add"}
        gone = {c[1] for c in changes if c[0] == "del"}
        changes = [c for c in changes if not (c[1] in added and c[1] in gone)
                   and not (c[0] == "update" and c[1] in gone)]
        removals: dict[str, list[int]] = {}
        inserts: dict[str, list[tuple[int, np.ndarray]]] = {}
        for op, entry_id, family, vec in changes:
            if op == "del":
                removals.setdefault(family, []).append(entry_id)
            else:  # "add" or "update": a new node (an update's old node dies)
                inserts.setdefault(family, []).append((entry_id, vec))
        for family, ids in removals.items():
            self.graphs[family].remove(ids)
            if family in self.compacting:
                self.compacting[family].append(("del", ids, None))
        for family, items in inserts.items():
            index = self.graphs.get(family)
            if index is None:
                index = self.graphs[family] = FamilyIndex(self.dim, self.config)
            ids = [i for i, _ in items]
            vecs = np.stack([v for _, v in items]).astype(np.float32)
            index.add(ids, vecs)
            if family in self.compacting:
                self.compacting[family].append(("add", ids, vecs))
        for family in set(removals) | set(inserts):
            if self.graphs[family].needs_compaction():
                self.start_compaction(family)

    # ------------------------------------------------------------------ compaction
    def start_compaction(self, family: str) -> None:
        """Rebuild ``family``'s graph without its tombstones (caller holds the write lock)."""
        if family in self.compacting:
            return
        old = self.graphs[family]
        ids = list(old.label_of)
        vecs = old.vectors(ids)
        self.compacting[family] = []
        if not self.config.background_compaction:
            self._finish_compaction(family, self._build_graph(ids, vecs))
            return
        thread = threading.Thread(target=self._compaction_worker,
                                  args=(family, ids, vecs, self.generation),
                                  name=f"bank-compact-{family}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def compact_all(self) -> None:
        """Start a rebuild of every graph that has tombstones (caller holds the write lock)."""
        for family, index in list(self.graphs.items()):
            if index.tombstones:
                self.start_compaction(family)

    def _compaction_worker(self, family: str, ids: list[int], vecs: np.ndarray,
                           generation: int) -> None:
        try:
            graph = self._build_graph(ids, vecs)
        except BaseException as exc:  # keep the old graph; the bank stays correct
            with self.lock.write():
                if generation == self.generation:
                    self.compacting.pop(family, None)
                self.errors.append(f"{family}: {type(exc).__name__}: {exc}")
            return
        with self.lock.write():
            # not if the bank closed, or its graphs were replaced meanwhile (this one is stale)
            if not self.closed and generation == self.generation:
                self._finish_compaction(family, graph)

    def _finish_compaction(self, family: str, graph: FamilyIndex) -> None:
        for op, ids, vecs in self.compacting.pop(family, []):
            if op == "add":
                graph.add(ids, vecs)
            else:
                graph.remove(ids, missing_ok=True)
        graph.set_ef(self.config.ef_search)  # in case it changed during the rebuild
        self.graphs[family] = graph
        self.compactions += 1

    def wait(self, timeout: float | None = None) -> None:
        """Block until the rebuilds started so far have been swapped in (or ``timeout``)."""
        for thread in list(self.threads):
            thread.join(timeout)
        self.threads = [t for t in self.threads if t.is_alive()]

    # ------------------------------------------------------------------ queries
    def stats(self) -> dict[str, dict[str, int]]:
        return {f: {"live": i.live, "tombstones": i.tombstones}
                for f, i in sorted(self.graphs.items())}

    def set_ef(self, ef_search: int) -> None:
        for index in self.graphs.values():
            index.set_ef(ef_search)

    def search(self, q: np.ndarray, k: int, family: str | None
               ) -> list[list[tuple[int, float]]]:
        """Top-k per query row over one family's graph, or merged over all (caller holds the
        read lock); q: unit float32 [Q, dim]."""
        out: list[list[tuple[int, float]]] = [[] for _ in range(q.shape[0])]
        families = [family] if family is not None else list(self.graphs)
        for fam in families:
            index = self.graphs.get(fam)
            if index is None or index.live == 0:
                continue
            ids, sims = index.search(q, k, self.config.search_threads)
            for row, (row_ids, row_sims) in enumerate(zip(ids.tolist(), sims.tolist())):
                out[row].extend(zip(row_ids, row_sims))
        if len(families) > 1:
            out = [sorted(hits, key=lambda h: -h[1])[:k] for hits in out]
        return out

    def problems(self, rows: list[tuple[int, str, bytes]],
                 decode: Callable[[bytes, int], np.ndarray]) -> list[str]:
        """Disagreements between the graphs and the table ``rows`` (id, family, stored
        embedding; ``decode(blob, id)`` reads one)."""
        problems: list[str] = []
        table = {i: f for i, f, _ in rows}
        for fam, index in self.graphs.items():
            want = {i for i, f in table.items() if f == fam}
            have = set(index.label_of)
            if have != want:
                problems.append(f"index[{fam}] holds {len(have)} entries, table "
                                f"{len(want)}: missing {sorted(want - have)[:10]}, "
                                f"extra {sorted(have - want)[:10]}")
            problems += [f"index[{fam}]: {p}" for p in index.problems()]
        for fam in set(table.values()) - set(self.graphs):
            problems.append(f"family {fam!r} has entries but no index")
        for entry_id, fam, blob in rows:
            index = self.graphs.get(fam)
            if index is None or entry_id not in index.label_of:
                continue  # already reported as missing
            if not np.allclose(index.vectors([entry_id])[0], decode(blob, entry_id), atol=1e-5):
                problems.append(f"entry {entry_id}: index vector differs from the table's")
        return problems
