"""The persistent experience bank: SQLite (WAL) for the entries, hnswlib for nearest neighbours.

The SQLite file is the truth. Every entry row carries its text, provenance, usage counters and its
embedding (float32 blob), so the in-memory hnswlib graphs can always be rebuilt from the file;
they are rebuilt on open and then kept in step incrementally: each write changes the table in
one transaction, commits, then applies the same change to the graphs while readers are held off
by a readers-writer lock. A process killed at any moment therefore leaves a file that reopens
with every committed entry and nothing half-written.

One writer per bank, enforced: opening a bank for writing takes an OS lock on ``NAME.lock``
beside it and one keyed by the file's device and inode (held until ``close()``; the kernel drops
them when the process dies), and a second writer, in another process or this one, under this
name or through a hard or symbolic link, gets BankInUseError naming the holder's pid and the way
out. Any number of readers open it with ``read_only=True`` (``crl-bench bank ...``) while it
runs, without the lock; WAL lets them read without blocking the writer, and a reader catches up
with the writer's commits (SQLite's ``data_version``) before each search or listing, so it never
returns entries deleted before the call.

Layout: one cosine graph per env family (``ann.FamilyIndex``), because retrieval is almost
always restricted to the family of the task at hand and a filtered search over a mixed graph
wastes most of its candidate budget on other families. Graphs are insert-only: deletions and
re-embeddings leave tombstones, and a graph with too many is rebuilt in the background.

Modules: this one (the ExperienceBank: opening, transactions, reads, search); ``bank_schema``
(table, format checks, entry types, validation); ``bank_files`` (connections, writer lock,
backup/restore); ``bank_index`` (ANN upkeep and compaction); ``ann`` (one hnswlib graph).
"""

from __future__ import annotations

import math
import queue
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from crl_bench.experience import bank_files
from crl_bench.experience.ann import FamilyIndex, IndexConfig  # noqa: F401 (re-exported)
from crl_bench.experience.bank_files import lock_path, read_meta, restore_bank  # noqa: F401
from crl_bench.experience.bank_index import BankIndex, IndexChange
from crl_bench.experience.bank_schema import (  # noqa: F401 (the public names are re-exported)
    COLUMNS, DEFAULT_CAPACITY, ENTRY_KEYS, JSON_LIST_KEYS, MAX_SQL_VARS, SCHEMA_VERSION,
    UPDATE_KEYS, BankCommit, BankCompatibilityError, BankInUseError, ExperienceEntry,
    ReadOnlyBankError, StaleEntriesError, check_embedder, check_embeddings, check_entry,
    check_commit, check_schema_version, create_schema, decode_vec,
    read_meta_rows, render_entry_text, row_to_entry, table_names)
from crl_bench.experience.bank_sql import (
    in_transaction, select_by_ids, select_page, select_snapshot, select_totals,
    write_transaction)
from crl_bench.experience.locks import LockSet, RWLock

class ExperienceBank:
    """Entries in SQLite + an in-memory hnswlib cosine index per family; FIFO capacity.

    Thread-safe: searches run in parallel; writes are exclusive (readers-writer lock) and each is
    one SQLite transaction. Usage counters (``record_retrievals`` etc.) do not touch the index and
    only serialise with other writes on the SQLite connection.

    Args:
        path: the SQLite file (created with its parent folders when missing).
        dim: embedding dimension; must match the file's.
        capacity: maximum number of entries; adding beyond it deletes the oldest (lowest id).
        embedder_name: recorded on creation and checked on open, so that vectors from two
            different embedders never share an index ("" = do not check).
        read_only: open without write access and without the writer lock (for inspection while
            a run writes; also works on a folder this user cannot write).
        build_index: build the ANN index on open (False for stats/listing only; search then
            builds it on first use).
        synchronous: SQLite ``PRAGMA synchronous``; NORMAL keeps every committed transaction
            across a killed process (WAL), FULL also across power loss.

    Raises BankInUseError when opened for writing while another writer has the bank open.
    """

    def __init__(self, path: str | Path, dim: int, capacity: int = DEFAULT_CAPACITY,
                 embedder_name: str = "", *, read_only: bool = False, build_index: bool = True,
                 index: IndexConfig | None = None, synchronous: str = "NORMAL") -> None:
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int (the embedder's dimension), got {dim!r}")
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        self.dim = dim
        self.capacity = capacity
        self.embedder_name = embedder_name
        self.read_only = read_only
        self._build_index = build_index
        self._synchronous = synchronous
        self.index_config = dc_replace(index) if index else IndexConfig()  # own copy: tunable
        self._lock = RWLock()
        self._sql_lock = threading.Lock()  # the one write connection is used by one thread at a time
        self._closed = False
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._all_conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self.evicted_total = 0
        # In-memory mirrors of the table (see _sync_from_table)
        self._family_of: dict[int, str] = {}
        self._times: dict[int, int] = {}
        self._last: dict[int, float | None] = {}
        self._version_of: dict[int, int] = {}
        self._data_version: int | None = None  # SQLite's data_version when last synced
        self._ann = BankIndex(dim, self.index_config, self._lock)
        self._writer_lock: LockSet | None = None
        try:
            if read_only:
                if not self.path.is_file():
                    raise FileNotFoundError(f"no experience bank at {self.path}")
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._writer_lock = bank_files.acquire_writer(self.path)
            self._conn = self._connect()
            self.meta = self._open_schema(synchronous.upper())
            self._sync_from_table(self._table_version(), build=build_index)
        except BaseException:
            self._close_conns()
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, **kwargs: Any) -> "ExperienceBank":
        """Open an existing bank with the dimension and embedder name stored in it."""
        meta = read_meta(path)
        check_schema_version(meta, Path(path))
        return cls(path, dim=int(meta["dim"]), embedder_name=meta.get("embedder", ""), **kwargs)

    def _connect(self) -> sqlite3.Connection:
        conn = bank_files.connect(self.path, read_only=self.read_only)
        with self._conns_lock:
            self._all_conns.append(conn)
        return conn

    def _open_schema(self, synchronous: str) -> dict[str, str]:
        tables = table_names(self._conn, self.path)
        if not self.read_only:
            # WAL: readers never block the writer and a killed writer loses no committed
            # transaction; NORMAL syncs at checkpoints only (safe against process crashes).
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            if not tables:
                with self._sql_lock:
                    create_schema(self._conn, self.dim, self.embedder_name)
        meta = read_meta_rows(self._conn, self.path)
        check_schema_version(meta, self.path)
        self.embedder_name = check_embedder(meta, self.path, self.dim, self.embedder_name)
        return meta

    # ------------------------------------------------------------------ mirrors
    def _table_version(self) -> int:
        """SQLite's ``data_version`` of the main connection: it changes when another connection
        (the writer, for a reader) commits."""
        with self._sql_lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _sync_from_table(self, data_version: int, build: bool = False) -> None:
        """Bring the mirrors (and the graphs) in step with the table, from one snapshot: all of
        it on open; for a read-only bank, what the writer committed since the last sync.
        ``build``: (re)build the graphs from scratch. Caller holds the write lock, or is
        __init__."""
        with self._sql_lock:
            rows, blobs = select_snapshot(self._conn, self._version_of, vectors=(
                "all" if build else "changed" if self._ann.built else "none"))
            seen = {r[0] for r in rows}
            gone = [i for i in self._family_of if i not in seen]
            changes: list[IndexChange] = [("del", i, self._family_of[i], None) for i in gone]
            changes += [("update" if i in self._family_of else "add", i, fam, None)
                        for i, fam, *_ in rows if i in blobs]
            # mirrors updated under the SQL lock: usage counters committed meanwhile are not lost
            for i in gone:
                for mirror in (self._family_of, self._times, self._last, self._version_of):
                    mirror.pop(i, None)
            for entry_id, fam, times, last, version in rows:
                self._family_of[entry_id] = fam
                self._times[entry_id] = times
                self._last[entry_id] = last
                self._version_of[entry_id] = version
        if build:
            self._ann.build(self._family_of, lambda ids: np.stack(
                [self._decode_vec(blobs[i], i) for i in ids]) if ids else
                np.empty((0, self.dim), np.float32))
        elif self._ann.built and changes:
            changes = [(op, i, fam, None if op == "del" else self._decode_vec(blobs[i], i))
                       for op, i, fam, _ in changes]
            try:
                self._ann.apply(changes)
            except BaseException:
                self._ann.drop()  # rebuilt from the table by the next search
                raise
        self._data_version = data_version

    def _refresh(self) -> None:
        """A read-only bank catches up with the writer's commits (cheap when there are none)."""
        if not self.read_only or self._closed:
            return
        if self._table_version() == self._data_version:
            return
        with self._lock.write():
            self._check_open()
            version = self._table_version()
            if version != self._data_version:
                self._sync_from_table(version)

    def _decode_vec(self, blob: bytes, entry_id: int) -> np.ndarray:
        return decode_vec(blob, entry_id, self.dim, self.path)

    # ------------------------------------------------------------------ validation
    def _check_open(self, write: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"experience bank {self.path} is closed")
        if write and self.read_only:
            raise ReadOnlyBankError(f"experience bank {self.path} was opened read-only")

    # ------------------------------------------------------------------ writes
    def add(self, entries: list[dict[str, Any]], embeddings: np.ndarray, *, step: int) -> list[int]:
        """Store new entries (one transaction); evicts the oldest beyond capacity.

        ``embeddings``: float32 [len(entries), dim] (normalised here). Returns the new ids.
        """
        return self.commit(adds=entries, add_embeddings=embeddings, step=step).added_ids

    def update(self, entry_id: int, fields: dict[str, Any], embedding: np.ndarray | None, *,
               step: int, expect_version: int | None = None) -> None:
        """Change fields of one entry; bumps its version. Changing title or content needs the new
        ``embedding`` [dim]. Raises KeyError if the entry does not exist (any more)."""
        self.commit(updates=[(entry_id, fields, embedding)], step=step,
                    expect_versions=None if expect_version is None else {entry_id: expect_version})

    def delete(self, ids: Iterable[int]) -> None:
        """Delete entries (ids that do not exist are ignored)."""
        self.commit(deletes=list(ids), step=0, missing_ok=True)

    def replace(self, delete_ids: list[int], new_entries: list[dict[str, Any]],
                embeddings: np.ndarray | None, *, step: int,
                expect_versions: dict[int, int] | None = None) -> list[int]:
        """Delete ``delete_ids`` and add ``new_entries`` in one transaction (merges, rewrites).

        Every id in ``delete_ids`` must still exist (and have the version in ``expect_versions``
        when given), else nothing changes and StaleEntriesError is raised: a merge never deletes
        originals whose replacement was not stored, and never overwrites a concurrent update.
        """
        return self.commit(adds=new_entries, add_embeddings=embeddings, deletes=delete_ids,
                           step=step, expect_versions=expect_versions).added_ids

    def commit(self, *, adds: Sequence[dict[str, Any]] = (), add_embeddings: Any = None,
               updates: Sequence[tuple[int, dict[str, Any], Any]] = (),
               deletes: Sequence[int] = (), step: int,
               expect_versions: dict[int, int] | None = None,
               missing_ok: bool = False, allow_empty_text: bool = False) -> BankCommit:
        """The general write: adds, updates and deletes in ONE SQLite transaction, then the same
        change in the ANN index. All or nothing: an error before COMMIT changes nothing.

        ``updates``: (id, fields, embedding [dim] or None). ``deletes`` must exist unless
        ``missing_ok``. ``expect_versions``: id -> version the caller read; a mismatch (or a
        missing id) raises StaleEntriesError. ``allow_empty_text``: titles and contents may be
        empty (an official memory with an empty text); else an empty one is refused.
        """
        self._check_open(write=True)
        if not isinstance(step, int):
            raise TypeError(f"step must be an int (the actor training step), got {step!r}")
        adds, add_vecs, checked_updates, delete_ids = check_commit(
            adds, add_embeddings, updates, deletes, self.dim, self.embedder_name,
            allow_empty_text)

        now = time.time()
        with self._lock.write(), self._sql_lock:
            self._check_open(write=True)
            result, index_changes = write_transaction(
                self._conn, adds=adds, add_vecs=add_vecs, updates=checked_updates,
                delete_ids=delete_ids, step=step, now=now, capacity=self.capacity,
                expect_versions=expect_versions, missing_ok=missing_ok)
            # Committed: bring the mirrors and the index in step (readers are still held off).
            added = {i: e for i, e in zip(result.added_ids, adds)}
            for entry_id in result.added_ids:
                self._family_of[entry_id] = added[entry_id]["family"]
                self._times[entry_id] = int(added[entry_id].get("times_retrieved", 0))
                self._last[entry_id] = added[entry_id].get("last_retrieved")
                self._version_of[entry_id] = 0
            for entry_id in result.updated_ids:
                self._version_of[entry_id] = self._version_of.get(entry_id, 0) + 1
            for entry_id in (*result.deleted_ids, *result.evicted_ids):
                for mirror in (self._family_of, self._times, self._last, self._version_of):
                    mirror.pop(entry_id, None)
            self.evicted_total += len(result.evicted_ids)
            if self._ann.built:
                try:
                    self._ann.apply(index_changes)
                except BaseException:
                    # The table is committed and right; the graphs may be half-changed. Drop
                    # them: the next search rebuilds them from the table.
                    self._ann.drop()
                    raise
        return result

    # ------------------------------------------------------------------ usage accounting
    def record_retrievals(self, ids: Sequence[int], when: float) -> None:
        """Count one retrieval per occurrence of each id (repeats count twice); ``when`` is the
        Unix time of the retrieval. Ids that no longer exist are skipped."""
        self._check_open(write=True)
        counts: dict[int, int] = {}
        for i in ids:
            counts[int(i)] = counts.get(int(i), 0) + 1
        if not counts:
            return
        with self._sql_lock:
            in_transaction(self._conn, "UPDATE entries SET times_retrieved=times_retrieved+?, "
                           "last_retrieved=? WHERE id=?", [(c, when, i) for i, c in counts.items()])
            for i, c in counts.items():
                if i in self._times:
                    self._times[i] += c
                    self._last[i] = when

    def record_outcomes(self, entry_ids: Sequence[int], reward: float) -> None:
        """A trajectory that used ``entry_ids`` ended with extractor reward ``reward`` (the value
        (score if score > 0 else -1), see ``algorithms.credit.entry_outcome``): n_used += 1 and
        reward_sum += reward for each distinct id."""
        self._check_open(write=True)
        ids = sorted({int(i) for i in entry_ids})
        if not ids:
            return
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        self._simple_update("UPDATE entries SET n_used=n_used+1, reward_sum=reward_sum+? "
                            "WHERE id=?", [(float(reward), i) for i in ids])

    def mark_trained(self, entry_ids: Sequence[int], step: int) -> None:
        """The extractor samples that produced ``entry_ids`` were trained on at ``step``."""
        self._check_open(write=True)
        ids = sorted({int(i) for i in entry_ids})
        if ids:
            self._simple_update("UPDATE entries SET times_trained=times_trained+1, "
                                "last_trained_step=? WHERE id=?", [(int(step), i) for i in ids])

    def _simple_update(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        with self._sql_lock:
            in_transaction(self._conn, sql, rows)

    def usage(self, ids: Iterable[int]) -> tuple[dict[int, int], dict[int, float | None]]:
        """(times_retrieved, last_retrieved) for the ids that exist, from the in-memory mirror."""
        self._refresh()
        times, last = {}, {}
        for i in ids:
            t = self._times.get(i)
            if t is not None:
                times[i] = t
                last[i] = self._last.get(i)
        return times, last

    # ------------------------------------------------------------------ reads
    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection of the reader pool (query-only), returned to it afterwards."""
        try:
            conn = self._readers.get_nowait()
        except queue.Empty:
            conn = self._connect()
            if not self.read_only:
                conn.execute("PRAGMA query_only=1")
        try:
            yield conn
        finally:
            self._readers.put(conn)

    def get(self, ids: Iterable[int]) -> list[ExperienceEntry]:
        """The entries with these ids, in the given order; ids that do not exist are skipped."""
        self._check_open()
        ids = [int(i) for i in ids]
        if not ids:
            return []
        with self._reading() as conn:
            rows = {r[0]: r for r in select_by_ids(conn, ", ".join(COLUMNS),
                                                    list(dict.fromkeys(ids)))}
        return [row_to_entry(rows[i]) for i in ids if i in rows]

    def get_embeddings(self, ids: Sequence[int]) -> np.ndarray:
        """Stored (normalised) embeddings, float32 [len(ids), dim]; KeyError for a missing id."""
        self._check_open()
        ids = [int(i) for i in ids]
        with self._reading() as conn:
            got: dict[int, bytes] = dict(select_by_ids(conn, "id, embedding", ids))
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for j, i in enumerate(ids):
            if i not in got:
                raise KeyError(f"no experience entry with id {i}")
            out[j] = self._decode_vec(got[i], i)
        return out

    def all_ids(self, family: str | None = None) -> list[int]:
        """Ids of all entries (oldest first), optionally of one family."""
        self._check_open()
        self._refresh()
        items = list(self._family_of.items())
        return sorted(i for i, f in items if family is None or f == family)

    def family_counts(self) -> dict[str, int]:
        self._refresh()
        counts: dict[str, int] = {}
        for f in list(self._family_of.values()):
            counts[f] = counts.get(f, 0) + 1
        return dict(sorted(counts.items()))

    def __len__(self) -> int:
        self._refresh()
        return len(self._family_of)

    def list_entries(self, *, family: str | None = None, order: str = "id", limit: int = 20,
                     offset: int = 0) -> list[ExperienceEntry]:
        """A page of entries for people to read; ``order``: id | recent | retrieved | outcome."""
        self._check_open()
        with self._reading() as conn:
            return [row_to_entry(r) for r in select_page(conn, family, order, limit, offset)]

    def totals(self) -> dict[str, float]:
        """Sums over the table (for stats): retrievals, uses, trained, mean outcome."""
        self._check_open()
        with self._reading() as conn:
            return select_totals(conn)

    # ------------------------------------------------------------------ search
    def ensure_index(self) -> None:
        """Build the ANN index now if the bank was opened with build_index=False."""
        self._refresh()
        if not self._ann.built:
            with self._lock.write():
                if not self._ann.built:
                    self._check_open()
                    self._sync_from_table(self._table_version(), build=True)

    def set_search_params(self, *, ef_search: int | None = None,
                          search_threads: int | None = None) -> None:
        """Change the recall/latency knobs of a live index (e.g. for a benchmark sweep)."""
        with self._lock.write():
            if ef_search is not None:
                if ef_search < 1:
                    raise ValueError(f"ef_search must be >= 1, got {ef_search}")
                self.index_config.ef_search = ef_search
                self._ann.set_ef(ef_search)
            if search_threads is not None:
                self.index_config.search_threads = search_threads

    def search(self, queries: np.ndarray, k: int, family: str | None = None
               ) -> list[list[tuple[int, float]]]:
        """Approximate top-k by cosine similarity.

        Args:
            queries: float32 [Q, dim] (normalised here).
            k: neighbours per query (fewer when the bank or family holds fewer entries).
            family: only entries of this env family; None = all families.
        Returns:
            per query, [(entry_id, cosine similarity in [-1, 1])] best first.
        """
        self._check_open()
        if not isinstance(k, int) or k <= 0:
            raise ValueError(f"k must be a positive int, got {k!r}")
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (Q, {self.dim}), got {tuple(q.shape)}; "
                             f"embed them with the bank's embedder "
                             f"({self.embedder_name or 'dim ' + str(self.dim)})")
        if q.shape[0] == 0:
            return []
        norms = np.linalg.norm(q, axis=1, keepdims=True)
        q = np.ascontiguousarray(q / np.where(norms == 0, 1, norms), dtype=np.float32)
        self.ensure_index()  # (a read-only bank also catches up with the writer here)
        with self._lock.read():
            self._check_open()
            return self._ann.search(q, k, family)


    # ------------------------------------------------------------------ index upkeep
    @property
    def compactions(self) -> int:
        """Graph rebuilds swapped in so far."""
        return self._ann.compactions

    @property
    def compaction_errors(self) -> list[str]:
        """Rebuilds that failed (the old graph was kept; the bank stays correct)."""
        return self._ann.errors

    @property
    def _compacting(self) -> dict[str, list[Any]]:
        """Families whose graph is being rebuilt now (-> the changes journaled meanwhile)."""
        return self._ann.compacting

    def index_stats(self) -> dict[str, dict[str, int]]:
        """Per family: live entries and tombstones in its graph (empty before the index is
        built)."""
        with self._lock.read():
            return self._ann.stats()

    def compact(self, wait: bool = True) -> None:
        """Rebuild every family graph that has tombstones now (normally automatic)."""
        self._check_open(write=True)
        self.ensure_index()
        with self._lock.write():
            self._ann.compact_all()
        if wait:
            self.wait_for_compaction()

    def wait_for_compaction(self, timeout: float | None = None) -> None:
        """Block until background rebuilds started so far have been swapped in."""
        self._ann.wait(timeout)

    # ------------------------------------------------------------------ consistency
    def verify(self) -> list[str]:
        """Compare the SQLite table, the in-memory mirrors and the ANN index; returns the
        problems found (empty list = consistent). O(N); for tests and ``bank stats --verify``."""
        self._check_open()
        self._refresh()
        problems: list[str] = []
        with self._lock.read():
            with self._reading() as conn:
                rows = conn.execute("SELECT id, family, embedding FROM entries").fetchall()
            table = {i: f for i, f, _ in rows}
            if table != self._family_of:
                problems.append(f"table ({len(table)} entries) and mirror "
                                f"({len(self._family_of)}) differ")
            if self._ann.built:
                problems += self._ann.problems(rows, self._decode_vec)
        return problems

    # ------------------------------------------------------------------ lifecycle
    @property
    def writer_lock_path(self) -> Path | None:
        """The lock file this bank holds (None for a read-only bank)."""
        return self._writer_lock.path if self._writer_lock is not None else None

    def backup(self, dest: str | Path) -> Path:
        """Write a consistent copy of the bank to ``dest`` (SQLite online backup).

        Taken between two write transactions (readers go on meanwhile); the copy is complete
        or absent (written to a temporary name, then renamed). Run checkpoints keep one, so a
        resumed run starts from the bank as it was at its checkpoint (:meth:`restore`, or
        :func:`restore_bank` before the bank is opened).
        """
        if self._closed:
            raise RuntimeError(f"the bank at {self.path} is closed")
        return bank_files.backup(self._conn, self._sql_lock, dest)

    def restore(self, backup: str | Path) -> None:
        """Replace this bank's contents with ``backup`` (a copy from :meth:`backup`, e.g. a
        checkpoint's) as if it had been restored before the bank was opened: the bank is closed,
        the file replaced (:func:`restore_bank`) and opened again with the same settings, its
        mirrors and index built afresh from the restored table. For a run resuming from a
        checkpoint (its experience part's state); nothing else may use the bank meanwhile."""
        self._check_open(write=True)
        self.close()
        restore_bank(backup, self.path)
        self.__init__(self.path, self.dim, self.capacity, self.embedder_name,  # type: ignore[misc]
                      build_index=self._build_index, index=self.index_config,
                      synchronous=self._synchronous)

    def close(self) -> None:
        """Close every connection and give the writer lock up (further use raises). Safe to
        call twice."""
        if self._closed:
            return
        with self._lock.write(), self._sql_lock:
            self._closed = True
            self._close_conns()
            self._ann.close()
        self.wait_for_compaction()  # a rebuild that finishes now sees the bank closed
        if self._writer_lock is not None:
            self._writer_lock.release()

    def _close_conns(self) -> None:
        with self._conns_lock:
            for conn in self._all_conns:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all_conns.clear()

    def __enter__(self) -> "ExperienceBank":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ExperienceBank({str(self.path)!r}, dim={self.dim}, "
                f"entries={len(self._family_of)}, capacity={self.capacity}, "
                f"embedder={self.embedder_name!r}{', read-only' if self.read_only else ''})")
