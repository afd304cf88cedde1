"""The bank's files: SQLite connections, the one-writer lock, backup and restore.

A bank is ``NAME`` (the SQLite database, WAL mode) with SQLite's ``NAME-wal`` / ``NAME-shm``
beside it, and ``NAME.lock``: the writer's OS lock, with a second one keyed by the file's device
and inode (see :func:`acquire_writer`). Readers never touch the lock files.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from pathlib import Path
from urllib.parse import quote

from crl_bench.experience.bank_schema import BankCompatibilityError, BankInUseError, read_meta_rows
from crl_bench.experience.locks import LockSet, ProcessFileLock, identity_lock


def lock_path(path: str | Path) -> Path:
    """The writer lock file of the bank at ``path`` (``NAME.lock`` beside it)."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


def acquire_writer(path: str | Path) -> LockSet:
    """Take the bank's writer locks or raise BankInUseError naming the holder and the way out.

    Two locks: ``NAME.lock`` beside the bank (its holder is readable there), and one keyed by
    the file's identity (device + inode, :func:`~crl_bench.experience.locks.identity_lock`), so
    that a second writer reaching the same file through a hard link or a symbolic link is
    refused too (each name would otherwise get its own WAL, and committed entries would be
    lost). A missing bank file is created empty first, to have an identity.
    """
    path = Path(path)
    lock = ProcessFileLock(lock_path(path))
    if not lock.try_acquire():
        raise _in_use(path, lock.holder(), lock.path, other_name=None)
    try:
        if not path.exists():
            with open(path, "ab"):
                pass  # an empty file is an empty SQLite database: the bank writes its schema
        ident = identity_lock(path, {"bank": str(path.absolute())})
        if not ident.try_acquire():
            info = ident.holder()
            raise _in_use(path, info, ident.path, other_name=info.get("bank", "another name"))
    except BaseException:
        lock.release()
        raise
    return LockSet(lock, ident)


def _in_use(path: Path, info: dict, lock_file: Path, other_name: str | None) -> BankInUseError:
    pid = info.get("pid")
    same = ("" if other_name is None else
            f" under another name, {other_name} (a hard link or symbolic link to the same file)")
    if pid == os.getpid():
        who = (f"this process (pid {pid}) already has it open for writing through another "
               f"ExperienceBank object{same}")
        way_out = "use that object, or close it before opening the bank again"
    else:
        who = (f"process {pid if pid is not None else '(pid not recorded yet)'}"
               f"{' on ' + info['host'] if info.get('host') else ''}"
               f"{' (' + ' '.join(map(str, info['argv'])) + ')' if info.get('argv') else ''}"
               f" has it open for writing{same}")
        way_out = (f"open it read-only instead (ExperienceBank.open(path, read_only=True), or "
                   f"`crl-bench bank stats|show|search {path}`), wait for that process to end"
                   f"{f' (or stop it: kill {pid})' if pid is not None else ''}, or give this "
                   f"one another bank path")
    return BankInUseError(f"experience bank {path} is in use: {who}. One process writes a bank "
                          f"at a time (lock file {lock_file}); {way_out}.")


def _uri(path: Path, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"file:{quote(str(path.absolute()))}?{query}"


def connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    """A connection for the bank's threads (autocommit; transactions are explicit).

    ``read_only`` opens with ``mode=ro``. SQLite then still needs the ``-shm`` file of a WAL
    database, and creates it when missing; in a folder this user cannot write it cannot, and
    the open fails. Then, when no ``-wal`` file holds changes (the writer is gone and closed
    cleanly), the file alone is the whole bank and is opened ``immutable``.
    """
    if not read_only:
        return sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                               timeout=30.0)
    conn = sqlite3.connect(_uri(path, mode="ro"), uri=True, check_same_thread=False,
                           isolation_level=None, timeout=30.0)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.DatabaseError as exc:
        if not _needs_write_access(exc):
            return conn  # e.g. not a database: the caller's first query says so in its terms
        conn.close()
        error = exc
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise RuntimeError(
            f"cannot read {path}: its latest changes are in {wal.name}, and SQLite needs to "
            f"create {path.name}-shm to read them, but this user cannot write to "
            f"{path.parent} ({error}). Read it as a user who can write to that folder, or copy "
            f"the folder (with {wal.name}) somewhere writable and read the copy.")
    return sqlite3.connect(_uri(path, mode="ro", immutable="1"), uri=True,
                           check_same_thread=False, isolation_level=None, timeout=30.0)


def _needs_write_access(exc: sqlite3.DatabaseError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    if name:
        return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))
    text = str(exc).lower()
    return "readonly" in text or "unable to open" in text


def read_meta(path: str | Path) -> dict[str, str]:
    """The ``meta`` table of a bank file (schema_version, dim, embedder, ...) without opening it
    for writing; raises BankCompatibilityError when the file is not a bank."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no experience bank at {path}")
    conn = connect(path, read_only=True)
    try:
        return read_meta_rows(conn, path)
    finally:
        conn.close()


def bank_file_problem(path: str | Path) -> str | None:
    """What is wrong with the bank copy at ``path`` (a checkpoint's, or a run's start copy), or
    None: it must be an intact SQLite database (SQLite's ``quick_check``) holding a bank's meta
    table. Opened ``immutable`` (a closed copy: no lock, no ``-shm`` file written beside it)."""
    path = Path(path)
    try:
        conn = sqlite3.connect(_uri(path, mode="ro", immutable="1"), uri=True)
    except sqlite3.Error as exc:
        return f"cannot be opened ({type(exc).__name__}: {exc})"
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
        if rows != ["ok"]:
            return f"is a damaged SQLite database (its integrity check says: {'; '.join(rows[:3])})"
        read_meta_rows(conn, path)
    except sqlite3.DatabaseError as exc:
        return f"is not an intact SQLite database ({exc})"
    except BankCompatibilityError:
        return "is a SQLite database but not an experience bank (no 'meta'/'entries' tables)"
    finally:
        conn.close()
    return None


def backup(conn: sqlite3.Connection, sql_lock: threading.Lock, dest: str | Path) -> Path:
    """Copy the database behind ``conn`` to ``dest`` with SQLite's online backup, holding
    ``sql_lock`` (no write transaction in between); complete or absent (temporary name, then
    rename)."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.unlink(missing_ok=True)
    target = sqlite3.connect(str(tmp))
    try:
        with sql_lock:
            conn.backup(target)
    finally:
        target.close()
    os.replace(tmp, dest)
    return dest


def restore_bank(backup: str | Path, path: str | Path) -> None:
    """Replace the (closed) bank at ``path`` with ``backup`` (from :meth:`ExperienceBank.backup`).

    Takes the bank's writer lock for the swap, so a bank open for writing anywhere (this process
    included) is never replaced under its writer: that raises BankInUseError and changes nothing.
    Restore before opening the bank. The live file's WAL and shared-memory files go too: they
    belong to the replaced file.
    """
    backup, path = Path(backup), Path(path)
    if not backup.is_file():
        raise FileNotFoundError(f"no bank backup at {backup}")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = acquire_writer(path)
    try:
        tmp = path.with_name(path.name + ".restore")
        shutil.copyfile(backup, tmp)
        for suffix in ("-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        os.replace(tmp, path)
    finally:
        lock.release()


def snapshot_bank(path: str | Path, dest: str | Path) -> Path:
    """Copy the (closed) bank at ``path``, with what its WAL holds, to ``dest`` (SQLite's online
    backup; complete or absent), holding the bank's writer lock so that no writer changes it
    meanwhile (BankInUseError when one has it open). A run keeps its bank's state at start this
    way, to restore it when a crash comes before the first checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no experience bank at {path}")
    lock = acquire_writer(path)
    try:
        conn = sqlite3.connect(str(path))
        try:
            return backup(conn, threading.Lock(), dest)
        finally:
            conn.close()
    finally:
        lock.release()


def remove_bank(path: str | Path) -> bool:
    """Delete the (closed) bank at ``path`` with its WAL and shared-memory files, holding its
    writer lock (BankInUseError when a writer has it open). Returns whether a bank was there."""
    path = Path(path)
    if not path.exists():
        return False
    lock = acquire_writer(path)
    try:
        for suffix in ("-wal", "-shm", ""):
            Path(str(path) + suffix).unlink(missing_ok=True)
    finally:
        lock.release()
    return True


def file_bytes(path: str | Path) -> int:
    """Size on disk of the database and its WAL."""
    return sum(os.path.getsize(f"{path}{s}") for s in ("", "-wal") if os.path.exists(f"{path}{s}"))
