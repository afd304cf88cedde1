"""The persistent experience bank: SQLite (WAL) for the entries, hnswlib for nearest neighbours.

The SQLite file is the truth. Every entry row carries its text, provenance, usage counters and its
embedding (float32 blob), so the in-memory hnswlib graphs can always be rebuilt from the file;
they are rebuilt on open and then kept in step incrementally: each write changes the table in
one transaction, commits, then applies the same change to the graphs while readers are held off
by a readers-writer lock. A process killed at any moment therefore leaves a file that reopens
with every committed entry and nothing half-written.

One process owns a bank for writing (the co-training loop's ExperienceManager). Others may open
it read-only (``crl-bench bank ...``) while it runs; WAL lets them read without blocking it.

Layout: one cosine graph per env family (``ann.FamilyIndex``), because retrieval is almost
always restricted to the family of the task at hand and a filtered search over a mixed graph
wastes most of its candidate budget on other families. Graphs are insert-only: deletions and
re-embeddings leave tombstones, and a graph with too many is rebuilt in the background.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from crl_bench.experience.ann import FamilyIndex, IndexConfig  # noqa: F401 (re-exported)
from crl_bench.experience.locks import RWLock

SCHEMA_VERSION = 1
DEFAULT_CAPACITY = 20_000

# Keys an entry dict given to add()/replace() may carry; title, content and family are required.
ENTRY_KEYS = frozenset({
    "title", "content", "family", "task_ids", "run", "source_trajectories", "origin",
    "parent_ids", "times_retrieved", "last_retrieved", "times_trained", "last_trained_step",
    "n_used", "reward_sum",
})
# Keys update() may change. Usage counters have their own methods (record_*, mark_trained); the
# family is fixed at creation (an entry of another family is another entry: add it).
UPDATE_KEYS = frozenset({
    "title", "content", "task_ids", "run", "source_trajectories", "origin", "parent_ids",
})
_JSON_LIST_KEYS = ("task_ids", "source_trajectories", "parent_ids")
_MAX_SQL_VARS = 900  # stay far below SQLite's bound on host parameters per statement

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    content TEXT NOT NULL,
    family TEXT NOT NULL,
    task_ids TEXT NOT NULL DEFAULT '[]',
    run TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL DEFAULT 'add',
    parent_ids TEXT NOT NULL DEFAULT '[]',
    source_trajectories TEXT NOT NULL DEFAULT '[]',
    created_step INTEGER NOT NULL,
    updated_step INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    times_retrieved INTEGER NOT NULL DEFAULT 0,
    last_retrieved REAL,
    times_trained INTEGER NOT NULL DEFAULT 0,
    last_trained_step INTEGER,
    n_used INTEGER NOT NULL DEFAULT 0,
    reward_sum REAL NOT NULL DEFAULT 0,
    embedding BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_family ON entries(family);
"""
_COLUMNS = ("id", "title", "content", "family", "task_ids", "run", "origin", "parent_ids",
            "source_trajectories", "created_step", "updated_step", "created_at", "updated_at",
            "version", "times_retrieved", "last_retrieved", "times_trained", "last_trained_step",
            "n_used", "reward_sum")


class BankCompatibilityError(ValueError):
    """The file is not a bank this code can open as asked (format, schema version, embedder)."""


class StaleEntriesError(RuntimeError):
    """A write expected entries (or entry versions) that another write has changed meanwhile."""


class ReadOnlyBankError(RuntimeError):
    """A write was attempted on a bank opened with ``read_only=True``."""


@dataclass
class ExperienceEntry:
    """One stored piece of experience: a reusable, conditional strategy (title + content).

    ``mean_outcome`` is the extractor's reward r(m): the mean, over the trajectories that used the
    entry, of (score if score > 0 else -1); None until some trajectory has used it. Times are Unix
    seconds; steps are actor training steps.
    """

    id: int
    title: str
    content: str
    family: str
    task_ids: list[str]
    run: str
    created_step: int
    updated_step: int
    source_trajectories: list[str]
    times_retrieved: int
    last_retrieved: float | None
    times_trained: int
    n_used: int
    mean_outcome: float | None
    reward_sum: float = 0.0
    last_trained_step: int | None = None
    version: int = 0
    origin: str = "add"
    parent_ids: list[int] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    def render(self) -> str:
        """The block injected into the actor's prompt (and the text that is embedded)."""
        return render_entry_text(self.title, self.content)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def render_entry_text(title: str, content: str) -> str:
    """``"title: content"`` — the one text form of an entry, shown to the actor and embedded."""
    return f"{title.strip()}: {content.strip()}"


@dataclass
class BankCommit:
    """What one write transaction did (ids in the order they were given)."""

    added_ids: list[int] = field(default_factory=list)
    updated_ids: list[int] = field(default_factory=list)
    deleted_ids: list[int] = field(default_factory=list)
    evicted_ids: list[int] = field(default_factory=list)


def read_meta(path: str | Path) -> dict[str, str]:
    """The ``meta`` table of a bank file (schema_version, dim, embedder, ...) without opening it
    for writing; raises BankCompatibilityError when the file is not a bank."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no experience bank at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _read_meta_rows(conn, path)
    finally:
        conn.close()


def _read_meta_rows(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise BankCompatibilityError(
            f"{path} is not an experience bank ({exc}). Pass the path of a bank file, or a new "
            f"path to start an empty bank.") from None
    if "meta" not in tables or "entries" not in tables:
        raise BankCompatibilityError(
            f"{path} is a SQLite file but not an experience bank (no 'meta'/'entries' tables). "
            f"Pass the path of a bank file, or a new path to start an empty bank.")
    return {k: v for k, v in conn.execute("SELECT key, value FROM meta")}


def restore_bank(backup: str | Path, path: str | Path) -> None:
    """Replace the (closed) bank at ``path`` with ``backup`` (from :meth:`ExperienceBank.backup`).

    The live file's WAL and shared-memory files go too: they belong to the replaced file.
    """
    backup, path = Path(backup), Path(path)
    if not backup.is_file():
        raise FileNotFoundError(f"no bank backup at {backup}")
    tmp = path.with_name(path.name + ".restore")
    shutil.copyfile(backup, tmp)
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    os.replace(tmp, path)


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
        read_only: open without write access (for inspection while a run writes).
        build_index: build the ANN index on open (False for stats/listing only; search then
            builds it on first use).
        synchronous: SQLite ``PRAGMA synchronous``; NORMAL keeps every committed transaction
            across a killed process (WAL), FULL also across power loss.
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
        self.index_config = replace(index) if index else IndexConfig()  # own copy: tunable
        self._lock = RWLock()
        self._sql_lock = threading.Lock()  # the one write connection is used by one thread at a time
        self._closed = False
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._all_conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self.evicted_total = 0

        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no experience bank at {self.path}")
            self._conn = self._connect(read_only=True)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._connect(read_only=False)
        self.meta = self._open_schema(synchronous.upper())

        # In-memory mirrors of the table, rebuilt on open (see _load_state).
        self._family_of: dict[int, str] = {}
        self._times: dict[int, int] = {}
        self._last: dict[int, float | None] = {}
        self._index: dict[str, FamilyIndex] = {}
        self._index_built = False
        # family -> changes made while its graph is being rebuilt (replayed before the swap)
        self._compacting: dict[str, list[tuple[str, list[int], np.ndarray | None]]] = {}
        self._compaction_threads: list[threading.Thread] = []
        self.compactions = 0
        self.compaction_errors: list[str] = []
        self._load_state(build_index)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, **kwargs: Any) -> "ExperienceBank":
        """Open an existing bank with the dimension and embedder name stored in it."""
        meta = read_meta(path)
        _check_schema_version(meta, Path(path))
        return cls(path, dim=int(meta["dim"]), embedder_name=meta.get("embedder", ""), **kwargs)

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        if read_only:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False,
                                   isolation_level=None, timeout=30.0)
        else:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                   timeout=30.0)
        with self._conns_lock:
            self._all_conns.append(conn)
        return conn

    def _open_schema(self, synchronous: str) -> dict[str, str]:
        try:
            tables = {r[0] for r in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            self._close_conns()
            raise BankCompatibilityError(
                f"{self.path} is not an experience bank ({exc}). Pass the path of a bank file, "
                f"or a new path to start an empty bank.") from None
        if not self.read_only:
            # WAL: readers never block the writer and a killed writer loses no committed
            # transaction; NORMAL syncs at checkpoints only (safe against process crashes).
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
        if not tables and not self.read_only:
            now = time.time()
            with self._sql_lock:
                self._conn.execute("BEGIN IMMEDIATE")
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        self._conn.execute(stmt)
                from crl_bench import __version__
                self._conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [
                    ("schema_version", str(SCHEMA_VERSION)), ("dim", str(self.dim)),
                    ("embedder", self.embedder_name), ("created_at", repr(now)),
                    ("crl_bench_version", __version__)])
                self._conn.execute("COMMIT")
        try:
            meta = _read_meta_rows(self._conn, self.path)
        except BankCompatibilityError:
            self._close_conns()
            raise
        try:
            _check_schema_version(meta, self.path)
            self._check_embedder(meta)
        except BankCompatibilityError:
            self._close_conns()
            raise
        return meta

    def _check_embedder(self, meta: dict[str, str]) -> None:
        stored_dim = int(meta.get("dim", "0"))
        stored_name = meta.get("embedder", "")
        if stored_dim != self.dim:
            raise BankCompatibilityError(
                f"{self.path} holds {stored_dim}-dimensional embeddings"
                f"{f' from embedder {stored_name!r}' if stored_name else ''}, but this bank was "
                f"opened with dim={self.dim}. Open it with the embedder that built it"
                f"{f' ({stored_name})' if stored_name else ''}, or start a new bank at another "
                f"path for the new embedder.")
        if self.embedder_name and stored_name and self.embedder_name != stored_name:
            raise BankCompatibilityError(
                f"{self.path} was built with embedder {stored_name!r}, not {self.embedder_name!r}: "
                f"their vectors are not comparable. Open it with {stored_name!r}, or start a new "
                f"bank at another path for {self.embedder_name!r}.")
        if not self.embedder_name:
            self.embedder_name = stored_name

    def _load_state(self, build_index: bool) -> None:
        rows = self._conn.execute(
            "SELECT id, family, times_retrieved, last_retrieved FROM entries ORDER BY id")
        for entry_id, family, times, last in rows:
            self._family_of[entry_id] = family
            self._times[entry_id] = times
            self._last[entry_id] = last
        if build_index:
            self._build_index()

    def _build_index(self) -> None:
        """(Re)build every family's graph from the embeddings stored in the table."""
        threads = self.index_config.build_threads or (os.cpu_count() or 1)
        by_family: dict[str, list[int]] = {}
        for entry_id, family in self._family_of.items():
            by_family.setdefault(family, []).append(entry_id)
        self._index = {}
        for family, ids in by_family.items():
            index = FamilyIndex(self.dim, self.index_config, capacity_hint=2 * len(ids))
            index.add(ids, self.get_embeddings(ids), threads=threads)
            self._index[family] = index
        self._index_built = True

    def _decode_vec(self, blob: bytes, entry_id: int) -> np.ndarray:
        vec = np.frombuffer(blob, dtype="<f4")
        if vec.shape[0] != self.dim:
            raise BankCompatibilityError(
                f"{self.path}: entry {entry_id} has a {vec.shape[0]}-dim embedding, expected "
                f"{self.dim}; the file is damaged. Start a new bank at another path.")
        return vec

    # ------------------------------------------------------------------ validation
    def _check_open(self, write: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"experience bank {self.path} is closed")
        if write and self.read_only:
            raise ReadOnlyBankError(f"experience bank {self.path} was opened read-only")

    def _check_embeddings(self, embeddings: Any, n: int, what: str) -> np.ndarray:
        arr = np.asarray(embeddings, dtype=np.float32)
        if arr.ndim == 1 and n == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape != (n, self.dim):
            raise ValueError(f"{what}: embeddings must have shape ({n}, {self.dim}), got "
                             f"{tuple(arr.shape)}; embed the entries with the bank's embedder "
                             f"({self.embedder_name or 'dim ' + str(self.dim)})")
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        if not np.all(np.isfinite(arr)) or np.any(norms == 0):
            raise ValueError(f"{what}: embeddings must be finite and non-zero")
        return np.ascontiguousarray(arr / norms, dtype=np.float32)

    @staticmethod
    def _check_entry(entry: dict[str, Any], i: int) -> dict[str, Any]:
        if not isinstance(entry, dict):
            raise TypeError(f"entry {i} must be a dict, got {type(entry).__name__}")
        unknown = set(entry) - ENTRY_KEYS
        if unknown:
            raise ValueError(f"entry {i} has unknown keys {sorted(unknown)}; allowed: "
                             f"{sorted(ENTRY_KEYS)}")
        for key in ("title", "content", "family"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ValueError(f"entry {i} needs a non-empty string {key!r}")
        return _check_fields(entry, f"entry {i}")

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
               missing_ok: bool = False) -> BankCommit:
        """The general write: adds, updates and deletes in ONE SQLite transaction, then the same
        change in the ANN index. All or nothing: an error before COMMIT changes nothing.

        ``updates``: (id, fields, embedding [dim] or None). ``deletes`` must exist unless
        ``missing_ok``. ``expect_versions``: id -> version the caller read; a mismatch (or a
        missing id) raises StaleEntriesError.
        """
        self._check_open(write=True)
        if not isinstance(step, int):
            raise TypeError(f"step must be an int (the actor training step), got {step!r}")
        adds = [self._check_entry(e, i) for i, e in enumerate(adds)]
        add_vecs = (self._check_embeddings(add_embeddings, len(adds), "add") if adds
                    else np.empty((0, self.dim), np.float32))
        checked_updates = []
        for entry_id, fields, emb in updates:
            if not isinstance(fields, dict):
                raise TypeError("update fields must be a dict")
            unknown = set(fields) - UPDATE_KEYS
            if unknown:
                raise ValueError(f"update of entry {entry_id}: cannot set {sorted(unknown)}; "
                                 f"settable: {sorted(UPDATE_KEYS)} (usage counters have their "
                                 f"own methods)")
            for key in ("title", "content", "family"):
                if key in fields and (not isinstance(fields[key], str) or not fields[key].strip()):
                    raise ValueError(f"update of entry {entry_id}: {key!r} must be a non-empty "
                                     f"string")
            fields = _check_fields(fields, f"update of entry {entry_id}")
            vec = None
            if emb is not None:
                vec = self._check_embeddings(emb, 1, f"update of entry {entry_id}")[0]
            elif "title" in fields or "content" in fields:
                raise ValueError(f"update of entry {entry_id} changes its text: pass the new "
                                 f"embedding too, or the index would keep the old meaning")
            checked_updates.append((int(entry_id), fields, vec))
        delete_ids = list(dict.fromkeys(int(i) for i in deletes))
        if set(delete_ids) & {u[0] for u in checked_updates}:
            raise ValueError("the same entry cannot be updated and deleted in one commit")

        now = time.time()
        result = BankCommit()
        index_changes: list[tuple[str, int, str, np.ndarray | None]] = []
        with self._lock.write(), self._sql_lock:
            self._check_open(write=True)
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_expectations(conn, expect_versions, delete_ids, missing_ok)
                for entry_id, fields, vec in checked_updates:
                    row = conn.execute("SELECT family FROM entries WHERE id=?",
                                       (entry_id,)).fetchone()
                    if row is None:
                        raise KeyError(f"no experience entry with id {entry_id}")
                    sets = {k: (json.dumps(v) if k in _JSON_LIST_KEYS else v)
                            for k, v in fields.items()}
                    sets.update(updated_step=step, updated_at=now)
                    if vec is not None:
                        sets["embedding"] = vec.astype("<f4").tobytes()
                        index_changes.append(("update", entry_id, row[0], vec))
                    assign = ", ".join(f"{k}=?" for k in sets) + ", version=version+1"
                    conn.execute(f"UPDATE entries SET {assign} WHERE id=?",
                                 (*sets.values(), entry_id))
                    result.updated_ids.append(entry_id)
                for chunk_start in range(0, len(delete_ids), _MAX_SQL_VARS):
                    chunk = delete_ids[chunk_start:chunk_start + _MAX_SQL_VARS]
                    marks = ",".join("?" * len(chunk))
                    found = conn.execute(f"SELECT id, family FROM entries WHERE id IN ({marks})",
                                         chunk).fetchall()
                    conn.execute(f"DELETE FROM entries WHERE id IN ({marks})", chunk)
                    for entry_id, family in found:
                        index_changes.append(("del", entry_id, family, None))
                        result.deleted_ids.append(entry_id)
                for entry, vec in zip(adds, add_vecs):
                    cur = conn.execute(
                        "INSERT INTO entries(title, content, family, task_ids, run, origin, "
                        "parent_ids, source_trajectories, created_step, updated_step, created_at, "
                        "updated_at, times_retrieved, last_retrieved, times_trained, "
                        "last_trained_step, n_used, reward_sum, embedding) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (entry["title"].strip(), entry["content"].strip(), entry["family"],
                         json.dumps(entry.get("task_ids", [])), entry.get("run", ""),
                         entry.get("origin", "add"), json.dumps(entry.get("parent_ids", [])),
                         json.dumps(entry.get("source_trajectories", [])), step, step, now, now,
                         int(entry.get("times_retrieved", 0)), entry.get("last_retrieved"),
                         int(entry.get("times_trained", 0)), entry.get("last_trained_step"),
                         int(entry.get("n_used", 0)), float(entry.get("reward_sum", 0.0)),
                         vec.astype("<f4").tobytes()))
                    new_id = int(cur.lastrowid)
                    index_changes.append(("add", new_id, entry["family"], vec))
                    result.added_ids.append(new_id)
                live = len(self._family_of) + len(result.added_ids) - len(result.deleted_ids)
                if adds and live > self.capacity:
                    evict = [r[0] for r in conn.execute(
                        "SELECT id, family FROM entries ORDER BY id LIMIT ?",
                        (live - self.capacity,))]
                    for chunk_start in range(0, len(evict), _MAX_SQL_VARS):
                        chunk = evict[chunk_start:chunk_start + _MAX_SQL_VARS]
                        marks = ",".join("?" * len(chunk))
                        found = conn.execute(
                            f"SELECT id, family FROM entries WHERE id IN ({marks})",
                            chunk).fetchall()
                        conn.execute(f"DELETE FROM entries WHERE id IN ({marks})", chunk)
                        for entry_id, family in found:
                            index_changes.append(("del", entry_id, family, None))
                            result.evicted_ids.append(entry_id)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            # Committed: bring the mirrors and the index in step (readers are still held off).
            added = {i: e for i, e in zip(result.added_ids, adds)}
            for entry_id in result.added_ids:
                self._family_of[entry_id] = added[entry_id]["family"]
                self._times[entry_id] = int(added[entry_id].get("times_retrieved", 0))
                self._last[entry_id] = added[entry_id].get("last_retrieved")
            for entry_id in (*result.deleted_ids, *result.evicted_ids):
                self._family_of.pop(entry_id, None)
                self._times.pop(entry_id, None)
                self._last.pop(entry_id, None)
            self.evicted_total += len(result.evicted_ids)
            if self._index_built:
                try:
                    self._apply_index_changes(index_changes)
                except BaseException:
                    # The table is committed and right; the graphs may be half-changed. Drop
                    # them: the next search rebuilds them from the table.
                    self._index, self._compacting, self._index_built = {}, {}, False
                    raise
        return result

    @staticmethod
    def _check_expectations(conn: sqlite3.Connection, expect_versions: dict[int, int] | None,
                            delete_ids: list[int], missing_ok: bool) -> None:
        wanted = dict(expect_versions or {})
        must_exist = set(wanted) | (set() if missing_ok else set(delete_ids))
        if not must_exist:
            return
        ids = sorted(must_exist)
        have: dict[int, int] = {}
        for start in range(0, len(ids), _MAX_SQL_VARS):
            chunk = ids[start:start + _MAX_SQL_VARS]
            marks = ",".join("?" * len(chunk))
            have.update(conn.execute(f"SELECT id, version FROM entries WHERE id IN ({marks})",
                                     chunk).fetchall())
        missing = [i for i in ids if i not in have]
        changed = [i for i, v in wanted.items() if i in have and have[i] != v]
        if missing or changed:
            raise StaleEntriesError(
                f"entries changed since they were read: missing {missing}, newer version "
                f"{changed}; nothing was written")

    def _apply_index_changes(self, changes: list[tuple[str, int, str, np.ndarray | None]]) -> None:
        """Apply one committed transaction to the family graphs (readers are held off)."""
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
            self._index[family].remove(ids)
            if family in self._compacting:
                self._compacting[family].append(("del", ids, None))
        for family, items in inserts.items():
            index = self._index.get(family)
            if index is None:
                index = self._index[family] = FamilyIndex(self.dim, self.index_config)
            ids = [i for i, _ in items]
            vecs = np.stack([v for _, v in items]).astype(np.float32)
            index.add(ids, vecs)
            if family in self._compacting:
                self._compacting[family].append(("add", ids, vecs))
        for family in set(removals) | set(inserts):
            if self._index[family].needs_compaction():
                self._start_compaction(family)

    # ------------------------------------------------------------------ compaction
    def _start_compaction(self, family: str) -> None:
        """Rebuild ``family``'s graph without its tombstones (caller holds the write lock).

        The new graph is built from a snapshot of the live vectors in a background thread while
        searches go on in the old one; writes made meanwhile are journaled and replayed onto the
        new graph under the write lock, then it replaces the old one.
        """
        if family in self._compacting:
            return
        old = self._index[family]
        ids = list(old.label_of)
        vecs = old.vectors(ids)
        self._compacting[family] = []
        if not self.index_config.background_compaction:
            self._finish_compaction(family, self._build_graph(ids, vecs))
            return
        thread = threading.Thread(target=self._compaction_worker, args=(family, ids, vecs),
                                  name=f"bank-compact-{family}", daemon=True)
        self._compaction_threads.append(thread)
        thread.start()

    def _build_graph(self, ids: list[int], vecs: np.ndarray) -> FamilyIndex:
        graph = FamilyIndex(self.dim, self.index_config, capacity_hint=2 * len(ids))
        graph.add(ids, vecs, threads=self.index_config.build_threads or (os.cpu_count() or 1))
        return graph

    def _compaction_worker(self, family: str, ids: list[int], vecs: np.ndarray) -> None:
        try:
            graph = self._build_graph(ids, vecs)
        except BaseException as exc:  # keep the old graph; the bank stays correct
            with self._lock.write():
                self._compacting.pop(family, None)
                self.compaction_errors.append(f"{family}: {type(exc).__name__}: {exc}")
            return
        with self._lock.write():
            if not self._closed:
                self._finish_compaction(family, graph)

    def _finish_compaction(self, family: str, graph: FamilyIndex) -> None:
        for op, ids, vecs in self._compacting.pop(family, []):
            if op == "add":
                graph.add(ids, vecs)
            else:
                graph.remove(ids, missing_ok=True)
        graph.set_ef(self.index_config.ef_search)  # in case it changed during the rebuild
        self._index[family] = graph
        self.compactions += 1

    def index_stats(self) -> dict[str, dict[str, int]]:
        """Per family: live entries and tombstones in its graph (empty before the index is
        built)."""
        with self._lock.read():
            return {f: {"live": i.live, "tombstones": i.tombstones}
                    for f, i in sorted(self._index.items())}

    def compact(self, wait: bool = True) -> None:
        """Rebuild every family graph that has tombstones now (normally automatic)."""
        self._check_open(write=True)
        self.ensure_index()
        with self._lock.write():
            for family, index in list(self._index.items()):
                if index.tombstones:
                    self._start_compaction(family)
        if wait:
            self.wait_for_compaction()

    def wait_for_compaction(self, timeout: float | None = None) -> None:
        """Block until background rebuilds started so far have been swapped in."""
        for thread in list(self._compaction_threads):
            thread.join(timeout)
        self._compaction_threads = [t for t in self._compaction_threads if t.is_alive()]

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
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "UPDATE entries SET times_retrieved=times_retrieved+?, last_retrieved=? "
                    "WHERE id=?", [(c, when, i) for i, c in counts.items()])
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            for i, c in counts.items():
                if i in self._times:
                    self._times[i] += c
                    self._last[i] = when

    def record_outcomes(self, entry_ids: Sequence[int], reward: float) -> None:
        """A trajectory that used ``entry_ids`` ended with extractor reward ``reward`` (the value
        (score if score > 0 else -1), see ``extraction.usage_reward``): n_used += 1 and
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
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(sql, rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def usage(self, ids: Iterable[int]) -> tuple[dict[int, int], dict[int, float | None]]:
        """(times_retrieved, last_retrieved) for the ids that exist, from the in-memory mirror."""
        times, last = {}, {}
        for i in ids:
            t = self._times.get(i)
            if t is not None:
                times[i] = t
                last[i] = self._last.get(i)
        return times, last

    # ------------------------------------------------------------------ reads
    def _reader(self) -> sqlite3.Connection:
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            conn = self._connect(read_only=self.read_only)
            if not self.read_only:
                conn.execute("PRAGMA query_only=1")
            return conn

    def get(self, ids: Iterable[int]) -> list[ExperienceEntry]:
        """The entries with these ids, in the given order; ids that do not exist are skipped."""
        self._check_open()
        ids = [int(i) for i in ids]
        if not ids:
            return []
        conn = self._reader()
        try:
            rows: dict[int, tuple[Any, ...]] = {}
            unique = list(dict.fromkeys(ids))
            for start in range(0, len(unique), _MAX_SQL_VARS):
                chunk = unique[start:start + _MAX_SQL_VARS]
                marks = ",".join("?" * len(chunk))
                for row in conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries "
                                        f"WHERE id IN ({marks})", chunk):
                    rows[row[0]] = row
        finally:
            self._readers.put(conn)
        return [_row_to_entry(rows[i]) for i in ids if i in rows]

    def get_embeddings(self, ids: Sequence[int]) -> np.ndarray:
        """Stored (normalised) embeddings, float32 [len(ids), dim]; KeyError for a missing id."""
        self._check_open()
        ids = [int(i) for i in ids]
        conn = self._reader()
        try:
            got: dict[int, bytes] = {}
            for start in range(0, len(ids), _MAX_SQL_VARS):
                chunk = ids[start:start + _MAX_SQL_VARS]
                marks = ",".join("?" * len(chunk))
                got.update(conn.execute(
                    f"SELECT id, embedding FROM entries WHERE id IN ({marks})", chunk).fetchall())
        finally:
            self._readers.put(conn)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for j, i in enumerate(ids):
            if i not in got:
                raise KeyError(f"no experience entry with id {i}")
            out[j] = self._decode_vec(got[i], i)
        return out

    def all_ids(self, family: str | None = None) -> list[int]:
        """Ids of all entries (oldest first), optionally of one family."""
        self._check_open()
        items = list(self._family_of.items())
        return sorted(i for i, f in items if family is None or f == family)

    def family_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in list(self._family_of.values()):
            counts[f] = counts.get(f, 0) + 1
        return dict(sorted(counts.items()))

    def __len__(self) -> int:
        return len(self._family_of)

    def list_entries(self, *, family: str | None = None, order: str = "id", limit: int = 20,
                     offset: int = 0) -> list[ExperienceEntry]:
        """A page of entries for people to read; ``order``: id | recent | retrieved | outcome."""
        self._check_open()
        orders = {"id": "id", "recent": "updated_at DESC, id DESC",
                  "retrieved": "times_retrieved DESC, id",
                  "outcome": "CASE WHEN n_used=0 THEN 1 ELSE 0 END, "
                             "reward_sum * 1.0 / MAX(n_used, 1) DESC, id"}
        if order not in orders:
            raise ValueError(f"order must be one of {sorted(orders)}, got {order!r}")
        where, params = ("WHERE family=?", [family]) if family else ("", [])
        conn = self._reader()
        try:
            rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries {where} "
                                f"ORDER BY {orders[order]} LIMIT ? OFFSET ?",
                                (*params, int(limit), int(offset))).fetchall()
        finally:
            self._readers.put(conn)
        return [_row_to_entry(r) for r in rows]

    def totals(self) -> dict[str, float]:
        """Sums over the table (for stats): retrievals, uses, trained, mean outcome."""
        self._check_open()
        conn = self._reader()
        try:
            n, retrieved, used, trained, rsum, with_use = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(times_retrieved),0), COALESCE(SUM(n_used),0), "
                "COALESCE(SUM(times_trained),0), COALESCE(SUM(reward_sum),0), "
                "COALESCE(SUM(n_used > 0),0) FROM entries").fetchone()
        finally:
            self._readers.put(conn)
        return {"entries": n, "times_retrieved": retrieved, "n_used": used,
                "times_trained": trained, "entries_used": with_use,
                "mean_outcome": (rsum / used) if used else float("nan")}

    # ------------------------------------------------------------------ search
    def ensure_index(self) -> None:
        """Build the ANN index now if the bank was opened with build_index=False."""
        if not self._index_built:
            with self._lock.write():
                if not self._index_built:
                    self._build_index()

    def set_search_params(self, *, ef_search: int | None = None,
                          search_threads: int | None = None) -> None:
        """Change the recall/latency knobs of a live index (e.g. for a benchmark sweep)."""
        with self._lock.write():
            if ef_search is not None:
                if ef_search < 1:
                    raise ValueError(f"ef_search must be >= 1, got {ef_search}")
                self.index_config.ef_search = ef_search
                for index in self._index.values():
                    index.set_ef(ef_search)
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
        self.ensure_index()
        out: list[list[tuple[int, float]]] = [[] for _ in range(q.shape[0])]
        with self._lock.read():
            families = [family] if family is not None else list(self._index)
            for fam in families:
                index = self._index.get(fam)
                if index is None or index.live == 0:
                    continue
                ids, sims = index.search(q, k, self.index_config.search_threads)
                for row, (row_ids, row_sims) in enumerate(zip(ids.tolist(), sims.tolist())):
                    out[row].extend(zip(row_ids, row_sims))
        if len(families) > 1:
            out = [sorted(hits, key=lambda h: -h[1])[:k] for hits in out]
        return out

    def search_exact(self, queries: np.ndarray, k: int, family: str | None = None
                     ) -> list[list[tuple[int, float]]]:
        """Exact top-k by brute-force cosine over the stored embeddings (slow; for checks)."""
        q = np.asarray(queries, dtype=np.float32).reshape(-1, self.dim)
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        ids = self.all_ids(family)
        if not ids:
            return [[] for _ in range(q.shape[0])]
        sims = q @ self.get_embeddings(ids).T
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return [[(ids[j], float(sims[r, j])) for j in row] for r, row in enumerate(top)]

    # ------------------------------------------------------------------ consistency
    def verify(self) -> list[str]:
        """Compare the SQLite table, the in-memory mirrors and the ANN index; returns the
        problems found (empty list = consistent). O(N); for tests and ``bank stats --verify``."""
        self._check_open()
        problems: list[str] = []
        with self._lock.read():
            conn = self._reader()
            try:
                rows = conn.execute("SELECT id, family, embedding FROM entries").fetchall()
            finally:
                self._readers.put(conn)
            table = {i: f for i, f, _ in rows}
            if table != self._family_of:
                problems.append(f"table ({len(table)} entries) and mirror "
                                f"({len(self._family_of)}) differ")
            if not self._index_built:
                return problems
            for fam, index in self._index.items():
                want = {i for i, f in table.items() if f == fam}
                have = set(index.label_of)
                if have != want:
                    problems.append(f"index[{fam}] holds {len(have)} entries, table "
                                    f"{len(want)}: missing {sorted(want - have)[:10]}, "
                                    f"extra {sorted(have - want)[:10]}")
                problems += [f"index[{fam}]: {p}" for p in index.problems()]
            for fam in set(table.values()) - set(self._index):
                problems.append(f"family {fam!r} has entries but no index")
            for entry_id, fam, blob in rows:
                index = self._index.get(fam)
                if index is None or entry_id not in index.label_of:
                    continue  # already reported as missing
                got = index.vectors([entry_id])[0]
                if not np.allclose(got, self._decode_vec(blob, entry_id), atol=1e-5):
                    problems.append(f"entry {entry_id}: index vector differs from the table's")
        return problems

    # ------------------------------------------------------------------ lifecycle
    def backup(self, dest: str | Path) -> Path:
        """Write a consistent copy of the bank to ``dest`` (SQLite online backup).

        Taken between two write transactions (readers go on meanwhile); the copy is complete
        or absent (written to a temporary name, then renamed). Run checkpoints keep one, so a
        resumed run starts from the bank as it was at its checkpoint.
        """
        if self._closed:
            raise RuntimeError(f"the bank at {self.path} is closed")
        dest = Path(dest)
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.unlink(missing_ok=True)
        target = sqlite3.connect(str(tmp))
        try:
            with self._sql_lock:
                self._conn.backup(target)
        finally:
            target.close()
        os.replace(tmp, dest)
        return dest

    def close(self) -> None:
        """Close every connection (further use raises). Safe to call twice."""
        if self._closed:
            return
        with self._lock.write(), self._sql_lock:
            self._closed = True
            self._close_conns()
            self._index.clear()
            self._compacting.clear()
        self.wait_for_compaction()  # a rebuild that finishes now sees the bank closed

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
        return (f"ExperienceBank({str(self.path)!r}, dim={self.dim}, entries={len(self)}, "
                f"capacity={self.capacity}, embedder={self.embedder_name!r})")


def _check_schema_version(meta: dict[str, str], path: Path) -> None:
    version = meta.get("schema_version")
    if version != str(SCHEMA_VERSION):
        raise BankCompatibilityError(
            f"{path} has bank schema version {version}, this crl-bench reads version "
            f"{SCHEMA_VERSION}. Open it with the crl-bench version that wrote it, or move it "
            f"aside and start a new bank at this path (the run will refill it).")


def _check_fields(fields: dict[str, Any], what: str) -> dict[str, Any]:
    out = dict(fields)
    for key in ("task_ids", "source_trajectories"):
        if key in out:
            value = out[key]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{what}: {key!r} must be a list of strings")
            out[key] = list(value)
    if "parent_ids" in out:
        value = out["parent_ids"]
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{what}: 'parent_ids' must be a list of ints")
        out["parent_ids"] = [int(v) for v in value]
    for key in ("run", "origin"):
        if key in out and not isinstance(out[key], str):
            raise ValueError(f"{what}: {key!r} must be a string")
    return out


def _row_to_entry(row: tuple[Any, ...]) -> ExperienceEntry:
    r = dict(zip(_COLUMNS, row))
    n_used = r["n_used"]
    return ExperienceEntry(
        id=r["id"], title=r["title"], content=r["content"], family=r["family"],
        task_ids=json.loads(r["task_ids"]), run=r["run"], created_step=r["created_step"],
        updated_step=r["updated_step"], source_trajectories=json.loads(r["source_trajectories"]),
        times_retrieved=r["times_retrieved"], last_retrieved=r["last_retrieved"],
        times_trained=r["times_trained"], n_used=n_used,
        mean_outcome=(r["reward_sum"] / n_used) if n_used else None, reward_sum=r["reward_sum"],
        last_trained_step=r["last_trained_step"], version=r["version"], origin=r["origin"],
        parent_ids=json.loads(r["parent_ids"]), created_at=r["created_at"],
        updated_at=r["updated_at"])
