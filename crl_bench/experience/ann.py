"""One hnswlib cosine graph for the entries of one env family.

hnswlib can overwrite a deleted node in place (``replace_deleted``) or update a node's vector,
but both re-link every neighbour of the node: measured at 20k entries, 384 dims, M=32, that is
~55 ms of CPU against ~2.3 ms for a plain insert, and the bank holds readers off while it runs.
So this graph only ever inserts: graph labels are our own counter (not entry ids), a deleted or
re-embedded entry leaves a tombstone (hnswlib's mark_deleted: skipped in results), and when
tombstones pile up the bank builds a fresh graph in the background and swaps it in
(``ExperienceBank`` does that; see ``needs_compaction``).

Not thread-safe by itself: ExperienceBank serialises writes against searches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass
class IndexConfig:
    """hnswlib parameters (see the hnswlib docs); defaults chosen with benchmarks/bank.py."""

    M: int = 32
    """Graph degree: memory ~ 2*M*4 bytes per entry on top of the vector. 32 rather than the
    usual 16: at 384 dims it reaches the same recall with half the ef, for less search time."""
    ef_construction: int = 200
    """Candidate list size while inserting; higher builds a better graph, slower."""
    ef_search: int = 16
    """Candidate list size while searching (raised to k when k is larger); recall vs latency.
    16: recall@1 0.998 against exact search at both 20k and 200k MiniLM-embedded entries, p99
    of a 32-query batch 2.5 ms (20k) and 4.1 ms (200k) on 2 idle cores; ef 24-32 reach
    0.999-1.000 for 15-50% more search time (benchmarks/bank.py --data text)."""
    search_threads: int = 0
    """Threads hnswlib splits one query batch over; 0 = min(4, CPUs). The manager sends one
    micro-batch at a time, so splitting it cuts its latency (20k entries, 2 cores: p99 6.1 ms
    with 1 thread, 4.7 ms with 2); set 1 when many threads search the bank directly."""
    build_threads: int = 0
    """Threads for building a graph (on open, compaction); 0 = all CPUs."""
    initial_capacity: int = 1024
    compact_ratio: float = 0.5
    """Rebuild a family's graph once its tombstones exceed this fraction of its live entries..."""
    compact_min: int = 1000
    """...and this many (small graphs are cheap to search even with many tombstones)."""
    background_compaction: bool = True
    """Rebuild in a background thread and swap in (False: rebuild inside the write; tests)."""

    def __post_init__(self) -> None:
        if self.M < 2 or self.ef_construction < 1 or self.ef_search < 1:
            raise ValueError("M must be >= 2, ef_construction and ef_search >= 1")
        if self.compact_ratio <= 0 or self.compact_min < 0:
            raise ValueError("compact_ratio must be > 0 and compact_min >= 0")


class FamilyIndex:
    """Insert-only hnswlib graph mapping entry ids to graph labels (see the module docstring)."""

    def __init__(self, dim: int, cfg: IndexConfig, capacity_hint: int = 0) -> None:
        import hnswlib

        self.dim = dim
        self.cfg = cfg
        capacity = max(cfg.initial_capacity, int(capacity_hint))
        self.index = hnswlib.Index(space="cosine", dim=dim)
        self.index.init_index(max_elements=capacity, M=cfg.M,
                              ef_construction=cfg.ef_construction, random_seed=100)
        self.index.set_ef(cfg.ef_search)
        self.label_of: dict[int, int] = {}                   # entry id -> live graph label
        self.id_at = np.full(capacity, -1, dtype=np.int64)   # graph label -> entry id (-1: dead)
        self.next_label = 0
        self.tombstones = 0

    @property
    def live(self) -> int:
        return len(self.label_of)

    def add(self, ids: Sequence[int], vecs: np.ndarray, threads: int = 1) -> None:
        """Insert entries; an id already present gets the new vector (its old node dies).

        vecs: float32 [len(ids), dim], unit rows.
        """
        if not len(ids):
            return
        for entry_id in ids:
            if entry_id in self.label_of:
                self._kill(entry_id)
        n = len(ids)
        need = self.next_label + n
        capacity = self.index.get_max_elements()
        if need > capacity:
            capacity = max(2 * capacity, need)
            self.index.resize_index(capacity)
            grown = np.full(capacity, -1, dtype=np.int64)
            grown[: self.id_at.shape[0]] = self.id_at
            self.id_at = grown
        labels = np.arange(self.next_label, need, dtype=np.int64)
        self.index.add_items(np.ascontiguousarray(vecs, dtype=np.float32), labels,
                             num_threads=threads)
        self.id_at[labels] = np.asarray(ids, dtype=np.int64)
        for entry_id, label in zip(ids, labels.tolist()):
            self.label_of[int(entry_id)] = label
        self.next_label = need

    def remove(self, ids: Sequence[int], missing_ok: bool = False) -> None:
        for entry_id in ids:
            if entry_id in self.label_of:
                self._kill(entry_id)
            elif not missing_ok:
                raise KeyError(f"entry {entry_id} is not in this index")

    def _kill(self, entry_id: int) -> None:
        label = self.label_of.pop(entry_id)
        self.index.mark_deleted(label)
        self.id_at[label] = -1
        self.tombstones += 1

    def needs_compaction(self) -> bool:
        return self.tombstones > max(self.cfg.compact_min, self.cfg.compact_ratio * self.live)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def search(self, q: np.ndarray, k: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
        """(entry ids int64 [Q, kk], cosine similarities float32 [Q, kk]); kk = min(k, live)."""
        kk = min(k, self.live)
        if kk == 0:
            return np.empty((q.shape[0], 0), np.int64), np.empty((q.shape[0], 0), np.float32)
        if threads <= 0:
            threads = min(4, os.cpu_count() or 1)
        try:
            labels, dists = self.index.knn_query(q, k=kk, num_threads=threads)
        except RuntimeError:
            # hnswlib could not fill k results past the tombstones: exact search instead.
            return self.search_exact(q, kk)
        return self.id_at[labels.astype(np.int64)], (1.0 - dists).astype(np.float32)

    def search_exact(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.fromiter(self.label_of, dtype=np.int64, count=self.live)
        sims = q @ self.vectors(ids.tolist()).T
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return ids[top], np.take_along_axis(sims, top, axis=1).astype(np.float32)

    def vectors(self, ids: Sequence[int]) -> np.ndarray:
        """Stored vectors of live entries, float32 [len(ids), dim]."""
        if not len(ids):
            return np.empty((0, self.dim), np.float32)
        return np.asarray(self.index.get_items([self.label_of[i] for i in ids]),
                          dtype=np.float32)

    def problems(self) -> list[str]:
        """Internal consistency of the graph and the two maps (O(N); for verify())."""
        out = []
        if self.index.element_count != self.next_label:
            out.append(f"graph holds {self.index.element_count} nodes, expected "
                       f"{self.next_label}")
        alive = int(np.count_nonzero(self.id_at[: self.next_label] >= 0))
        if alive != self.live or self.next_label - alive != self.tombstones:
            out.append(f"{alive} live labels for {self.live} entries and {self.tombstones} "
                       f"tombstones")
        for entry_id, label in self.label_of.items():
            if self.id_at[label] != entry_id:
                out.append(f"label {label} maps to {self.id_at[label]}, not {entry_id}")
        for label in range(self.next_label):
            deleted = _is_deleted(self.index, label)
            if deleted != (self.id_at[label] < 0):
                out.append(f"label {label}: deleted in the graph={deleted}, in the map="
                           f"{self.id_at[label] < 0}")
        return out


def _is_deleted(index: Any, label: int) -> bool:
    try:
        index.get_items([label])
        return False
    except RuntimeError:  # hnswlib: "Label not found" for deleted labels
        return True
