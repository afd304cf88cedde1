"""The bank's table: its schema and format checks, the entry types, and the validation of what
a write may store. Pure SQLite and Python (no index, no files, no locks): ``bank.py`` composes it.

Schema history: version 1 is the only one so far. A change of the table bumps
``SCHEMA_VERSION``; :func:`check_schema_version` then refuses older files with the way out
(the crl-bench version that wrote them, or a new bank), until a migration is written here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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
JSON_LIST_KEYS = ("task_ids", "source_trajectories", "parent_ids")
MAX_SQL_VARS = 900  # stay far below SQLite's bound on host parameters per statement

SCHEMA_SQL = """
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
COLUMNS = ("id", "title", "content", "family", "task_ids", "run", "origin", "parent_ids",
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
    """``"title: content"`` — the one text form of an entry, shown to the actor and embedded;
    an entry without a title is its content alone (an official memory with an empty text:
    ``""``)."""
    if not title.strip():
        return content.strip()
    return f"{title.strip()}: {content.strip()}"


@dataclass
class BankCommit:
    """What one write transaction did (ids in the order they were given)."""

    added_ids: list[int] = field(default_factory=list)
    updated_ids: list[int] = field(default_factory=list)
    deleted_ids: list[int] = field(default_factory=list)
    evicted_ids: list[int] = field(default_factory=list)



def read_meta_rows(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The meta table; BankCompatibilityError when the file is not a bank."""
    tables = table_names(conn, path)
    if "meta" not in tables or "entries" not in tables:
        raise BankCompatibilityError(
            f"{path} is a SQLite file but not an experience bank (no 'meta'/'entries' tables). "
            f"Pass the path of a bank file, or a new path to start an empty bank.")
    return {k: v for k, v in conn.execute("SELECT key, value FROM meta")}


def check_schema_version(meta: dict[str, str], path: Path) -> None:
    version = meta.get("schema_version")
    if version != str(SCHEMA_VERSION):
        raise BankCompatibilityError(
            f"{path} has bank schema version {version}, this crl-bench reads version "
            f"{SCHEMA_VERSION}. Open it with the crl-bench version that wrote it, or move it "
            f"aside and start a new bank at this path (the run will refill it).")


def check_fields(fields: dict[str, Any], what: str) -> dict[str, Any]:
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


def row_to_entry(row: tuple[Any, ...]) -> ExperienceEntry:
    r = dict(zip(COLUMNS, row))
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


class BankInUseError(RuntimeError):
    """The bank is open for writing elsewhere (another process, or another ExperienceBank
    object in this one): one writer per bank."""


def create_schema(conn: sqlite3.Connection, dim: int, embedder_name: str) -> None:
    """Create the tables and the meta rows of a new bank in one transaction."""
    from crl_bench import __version__

    conn.execute("BEGIN IMMEDIATE")
    try:
        for stmt in SCHEMA_SQL.strip().split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [
            ("schema_version", str(SCHEMA_VERSION)), ("dim", str(dim)),
            ("embedder", embedder_name), ("created_at", repr(time.time())),
            ("crl_bench_version", __version__)])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def table_names(conn: sqlite3.Connection, path: Path) -> set[str]:
    """The tables of the file; BankCompatibilityError when it is not a SQLite database."""
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise BankCompatibilityError(
            f"{path} is not an experience bank ({exc}). Pass the path of a bank file, or a new "
            f"path to start an empty bank.") from None


def check_embedder(meta: dict[str, str], path: Path, dim: int, embedder_name: str) -> str:
    """Refuse a bank whose vectors come from another embedder; returns the embedder name to use
    (the stored one when none was given)."""
    stored_dim = int(meta.get("dim", "0"))
    stored_name = meta.get("embedder", "")
    if stored_dim != dim:
        raise BankCompatibilityError(
            f"{path} holds {stored_dim}-dimensional embeddings"
            f"{f' from embedder {stored_name!r}' if stored_name else ''}, but this bank was "
            f"opened with dim={dim}. Open it with the embedder that built it"
            f"{f' ({stored_name})' if stored_name else ''}, or start a new bank at another "
            f"path for the new embedder.")
    if embedder_name and stored_name and embedder_name != stored_name:
        raise BankCompatibilityError(
            f"{path} was built with embedder {stored_name!r}, not {embedder_name!r}: "
            f"their vectors are not comparable. Open it with {stored_name!r}, or start a new "
            f"bank at another path for {embedder_name!r}.")
    return embedder_name or stored_name


def check_embeddings(embeddings: Any, n: int, dim: int, embedder_name: str,
                     what: str) -> np.ndarray:
    """float32 [n, dim] unit rows, or ValueError naming the expected shape and embedder."""
    arr = np.asarray(embeddings, dtype=np.float32)
    if arr.ndim == 1 and n == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape != (n, dim):
        raise ValueError(f"{what}: embeddings must have shape ({n}, {dim}), got "
                         f"{tuple(arr.shape)}; embed the entries with the bank's embedder "
                         f"({embedder_name or 'dim ' + str(dim)})")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if not np.all(np.isfinite(arr)) or np.any(norms == 0):
        raise ValueError(f"{what}: embeddings must be finite and non-zero")
    return np.ascontiguousarray(arr / norms, dtype=np.float32)


def check_entry(entry: dict[str, Any], i: int, allow_empty_text: bool = False) -> dict[str, Any]:
    """A new entry dict: known keys only, non-empty title/content/family, typed lists.
    ``allow_empty_text``: the title and content may be empty strings (an official memory with
    an empty text)."""
    if not isinstance(entry, dict):
        raise TypeError(f"entry {i} must be a dict, got {type(entry).__name__}")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise ValueError(f"entry {i} has unknown keys {sorted(unknown)}; allowed: "
                         f"{sorted(ENTRY_KEYS)}")
    for key in ("title", "content", "family"):
        if not isinstance(entry.get(key), str) or (
                not entry[key].strip() and not (allow_empty_text and key != "family")):
            raise ValueError(f"entry {i} needs a non-empty string {key!r}")
    return check_fields(entry, f"entry {i}")


def check_update_fields(entry_id: int, fields: Any, allow_empty_text: bool = False
                        ) -> dict[str, Any]:
    """The fields an update may set (UPDATE_KEYS), checked; text changes need an embedding
    (checked by the caller, which has it)."""
    if not isinstance(fields, dict):
        raise TypeError("update fields must be a dict")
    unknown = set(fields) - UPDATE_KEYS
    if unknown:
        raise ValueError(f"update of entry {entry_id}: cannot set {sorted(unknown)}; "
                         f"settable: {sorted(UPDATE_KEYS)} (usage counters have their "
                         f"own methods)")
    for key in ("title", "content", "family"):
        if key in fields and (not isinstance(fields[key], str) or (
                not fields[key].strip() and not (allow_empty_text and key != "family"))):
            raise ValueError(f"update of entry {entry_id}: {key!r} must be a non-empty "
                             f"string")
    return check_fields(fields, f"update of entry {entry_id}")


def check_commit(adds: Any, add_embeddings: Any, updates: Any, deletes: Any, dim: int,
                 embedder_name: str, allow_empty_text: bool = False
                 ) -> tuple[list[dict[str, Any]], np.ndarray,
                            list[tuple[int, dict[str, Any], Any]], list[int]]:
    """Everything one commit would write, checked before the transaction starts: (adds,
    their unit vectors, updates as (id, fields, unit vector or None), distinct delete ids).
    ``allow_empty_text``: titles and contents may be empty."""
    adds = [check_entry(e, i, allow_empty_text) for i, e in enumerate(adds)]
    add_vecs = (check_embeddings(add_embeddings, len(adds), dim, embedder_name, "add") if adds
                else np.empty((0, dim), np.float32))
    checked_updates = []
    for entry_id, fields, emb in updates:
        fields = check_update_fields(entry_id, fields, allow_empty_text)
        vec = None
        if emb is not None:
            vec = check_embeddings(emb, 1, dim, embedder_name, f"update of entry {entry_id}")[0]
        elif "title" in fields or "content" in fields:
            raise ValueError(f"update of entry {entry_id} changes its text: pass the new "
                             f"embedding too, or the index would keep the old meaning")
        checked_updates.append((int(entry_id), fields, vec))
    delete_ids = list(dict.fromkeys(int(i) for i in deletes))
    if set(delete_ids) & {u[0] for u in checked_updates}:
        raise ValueError("the same entry cannot be updated and deleted in one commit")
    return adds, add_vecs, checked_updates, delete_ids


def decode_vec(blob: bytes, entry_id: int, dim: int, path: Path) -> np.ndarray:
    vec = np.frombuffer(blob, dtype="<f4")
    if vec.shape[0] != dim:
        raise BankCompatibilityError(
            f"{path}: entry {entry_id} has a {vec.shape[0]}-dim embedding, expected "
            f"{dim}; the file is damaged. Start a new bank at another path.")
    return vec

