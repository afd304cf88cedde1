"""The SQL of the bank: one write transaction (``ExperienceBank.commit``), the usage counters,
and the queries behind get / list / stats.

A write runs inside one ``BEGIN IMMEDIATE ... COMMIT`` on the writer's connection, so it is all
or nothing, and it reads the table (not the in-memory mirrors) for what it checks: the versions
a caller expects, the entries to delete, and the number of live entries that decides FIFO
eviction.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import numpy as np

from crl_bench.experience.bank_index import IndexChange
from crl_bench.experience.bank_schema import (
    COLUMNS, JSON_LIST_KEYS, MAX_SQL_VARS, BankCommit, StaleEntriesError)


def write_transaction(conn: sqlite3.Connection, *, adds: list[dict[str, Any]],
                      add_vecs: np.ndarray,
                      updates: list[tuple[int, dict[str, Any], np.ndarray | None]],
                      delete_ids: list[int], step: int, now: float, capacity: int,
                      expect_versions: dict[int, int] | None, missing_ok: bool,
                      ) -> tuple[BankCommit, list[IndexChange]]:
    """Apply checked adds, updates and deletes (then FIFO eviction beyond ``capacity``) in one
    transaction; returns what was done and the matching index changes. Raises (after ROLLBACK:
    nothing written) KeyError for an update of a missing entry, StaleEntriesError for a failed
    expectation."""
    result = BankCommit()
    index_changes: list[IndexChange] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        check_expectations(conn, expect_versions, delete_ids, missing_ok)
        for entry_id, fields, vec in updates:
            row = conn.execute("SELECT family FROM entries WHERE id=?",
                               (entry_id,)).fetchone()
            if row is None:
                raise KeyError(f"no experience entry with id {entry_id}")
            sets = {k: (json.dumps(v) if k in JSON_LIST_KEYS else v)
                    for k, v in fields.items()}
            sets.update(updated_step=step, updated_at=now)
            if vec is not None:
                sets["embedding"] = vec.astype("<f4").tobytes()
                index_changes.append(("update", entry_id, row[0], vec))
            assign = ", ".join(f"{k}=?" for k in sets) + ", version=version+1"
            conn.execute(f"UPDATE entries SET {assign} WHERE id=?",
                         (*sets.values(), entry_id))
            result.updated_ids.append(entry_id)
        for chunk_start in range(0, len(delete_ids), MAX_SQL_VARS):
            chunk = delete_ids[chunk_start:chunk_start + MAX_SQL_VARS]
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
        live = conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        if adds and live > capacity:
            evict = [r[0] for r in conn.execute(
                "SELECT id, family FROM entries ORDER BY id LIMIT ?",
                (live - capacity,))]
            for chunk_start in range(0, len(evict), MAX_SQL_VARS):
                chunk = evict[chunk_start:chunk_start + MAX_SQL_VARS]
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
    return result, index_changes


def check_expectations(conn: sqlite3.Connection, expect_versions: dict[int, int] | None,
                       delete_ids: list[int], missing_ok: bool) -> None:
    wanted = dict(expect_versions or {})
    must_exist = set(wanted) | (set() if missing_ok else set(delete_ids))
    if not must_exist:
        return
    ids = sorted(must_exist)
    have = dict(select_by_ids(conn, "id, version", ids))
    missing = [i for i in ids if i not in have]
    changed = [i for i, v in wanted.items() if i in have and have[i] != v]
    if missing or changed:
        raise StaleEntriesError(
            f"entries changed since they were read: missing {missing}, newer version "
            f"{changed}; nothing was written")


def in_transaction(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """``executemany(sql, rows)`` as one write transaction (usage counters)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def select_by_ids(conn: sqlite3.Connection, columns: str, ids: list[int]) -> list[tuple[Any, ...]]:
    """``SELECT columns FROM entries WHERE id IN ids`` (chunked; any order; missing ids absent)."""
    out: list[tuple[Any, ...]] = []
    for start in range(0, len(ids), MAX_SQL_VARS):
        chunk = ids[start:start + MAX_SQL_VARS]
        marks = ",".join("?" * len(chunk))
        out += conn.execute(f"SELECT {columns} FROM entries WHERE id IN ({marks})",
                            chunk).fetchall()
    return out


LIST_ORDERS = {"id": "id", "recent": "updated_at DESC, id DESC",
               "retrieved": "times_retrieved DESC, id",
               "outcome": "CASE WHEN n_used=0 THEN 1 ELSE 0 END, "
                          "reward_sum * 1.0 / MAX(n_used, 1) DESC, id"}


def select_page(conn: sqlite3.Connection, family: str | None, order: str, limit: int,
                offset: int) -> list[tuple[Any, ...]]:
    """A page of entry rows (COLUMNS) in one of LIST_ORDERS."""
    if order not in LIST_ORDERS:
        raise ValueError(f"order must be one of {sorted(LIST_ORDERS)}, got {order!r}")
    where, params = ("WHERE family=?", [family]) if family else ("", [])
    return conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries {where} "
                        f"ORDER BY {LIST_ORDERS[order]} LIMIT ? OFFSET ?",
                        (*params, int(limit), int(offset))).fetchall()


def select_totals(conn: sqlite3.Connection) -> dict[str, float]:
    """Sums over the table (for stats): entries, retrievals, uses, trained, mean outcome."""
    n, retrieved, used, trained, rsum, with_use = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(times_retrieved),0), COALESCE(SUM(n_used),0), "
        "COALESCE(SUM(times_trained),0), COALESCE(SUM(reward_sum),0), "
        "COALESCE(SUM(n_used > 0),0) FROM entries").fetchone()
    return {"entries": n, "times_retrieved": retrieved, "n_used": used,
            "times_trained": trained, "entries_used": with_use,
            "mean_outcome": (rsum / used) if used else float("nan")}


def select_snapshot(conn: sqlite3.Connection, known_versions: dict[int, int], vectors: str
                    ) -> tuple[list[tuple[Any, ...]], dict[int, bytes]]:
    """From one read snapshot: every entry's (id, family, times_retrieved, last_retrieved,
    version), oldest first, and the stored embeddings of ``vectors``: "all" entries, those
    "changed" (new, or another version than in ``known_versions``), or "none"."""
    conn.execute("BEGIN")
    try:
        rows = conn.execute("SELECT id, family, times_retrieved, last_retrieved, version "
                            "FROM entries ORDER BY id").fetchall()
        want = ([r[0] for r in rows] if vectors == "all" else
                [r[0] for r in rows if known_versions.get(r[0]) != r[4]]
                if vectors == "changed" else [])
        return rows, dict(select_by_ids(conn, "id, embedding", want))
    finally:
        conn.execute("COMMIT")
