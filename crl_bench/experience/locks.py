"""Locks for the experience system: a readers-writer lock between the threads of one process
(``RWLock``) and an OS lock that makes one process the only writer of a bank (``ProcessFileLock``).

RWLock: retrieval (many rollout threads) only reads the bank, so reads run side by side; adds, updates,
deletes and merges change the table and the ANN index together, so a write waits until no read is
in progress and blocks new reads while it runs. Waiting writers are preferred over new readers:
without that, a steady stream of retrievals from 8+ rollout threads would starve the extractor.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


class RWLock:
    """Writer-preferring readers-writer lock (not reentrant: do not nest two acquisitions)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            if self._readers <= 0:
                raise RuntimeError("release_read() without a matching acquire_read()")
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            if not self._writer:
                raise RuntimeError("release_write() without a matching acquire_write()")
            self._writer = False
            self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()


class ProcessFileLock:
    """An exclusive ``flock`` on a sidecar file, held from :meth:`try_acquire` to :meth:`release`.

    The kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a
    dead holder never blocks the next one and there is nothing stale to clean up. flock locks
    belong to an open file, not to a process: a second ``ProcessFileLock`` on the same path in
    the *same* process is refused too (two bank objects writing one file would disagree just as
    two processes do). The holder writes its pid, host, start time and command line into the
    file so that the refused one can say who holds it. The file is never deleted (deleting a lock
    file races with a process that has just opened it).
    """

    def __init__(self, path: str | Path, info: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.info = dict(info or {})
        """Written into the file beside the holder's pid (e.g. the bank path it guards)."""
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def try_acquire(self) -> bool:
        """Take the lock without waiting; False when another open file holds it."""
        import fcntl

        if self._file is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        f = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        except OSError as exc:  # a file system without locks (some network/FUSE mounts)
            warnings.warn(f"cannot lock {self.path} ({exc}): one writer per bank is not "
                          f"enforced on this file system; keep banks on a local disk",
                          RuntimeWarning, stacklevel=3)
        f.truncate(0)
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "since": time.time(), "argv": sys.argv[:6], **self.info}) + "\n")
        f.flush()
        self._file = f
        return True

    def holder(self) -> dict[str, Any]:
        """What the holder wrote (pid, host, since, argv); {} when unknown (e.g. it is just
        starting, or the file is unreadable)."""
        try:
            text = self.path.read_text(encoding="utf-8").strip()
            info = json.loads(text) if text else {}
            return info if isinstance(info, dict) else {}
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        """Give the lock up (safe to call twice)."""
        import fcntl

        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.truncate(0)  # no stale holder shown after release
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        except OSError:
            pass
        finally:
            f.close()


def identity_lock_dir() -> Path:
    """Where the locks keyed by a file's identity live: ``$CRL_BENCH_LOCK_DIR``, else a folder of
    this user's in the temporary directory (created 0700)."""
    import tempfile

    env = os.environ.get("CRL_BENCH_LOCK_DIR", "").strip()
    folder = Path(env) if env else Path(tempfile.gettempdir()) / f"crl-bench-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def identity_lock(path: str | Path, info: dict[str, Any] | None = None) -> ProcessFileLock:
    """A :class:`ProcessFileLock` keyed by the identity of the file at ``path`` (device and
    inode, symbolic links followed), not by its name: every name of one file (hard links,
    symbolic links, ``a/../a``) gets the same lock. The file must exist."""
    st = os.stat(path)
    return ProcessFileLock(identity_lock_dir() / f"file-{st.st_dev}-{st.st_ino}.lock", info)


class LockSet:
    """Several held :class:`ProcessFileLock` s given up together (last taken, first released);
    ``path`` is the first one's."""

    def __init__(self, *locks: ProcessFileLock) -> None:
        self.locks = locks

    @property
    def path(self) -> Path:
        return self.locks[0].path

    @property
    def held(self) -> bool:
        return all(lock.held for lock in self.locks)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
