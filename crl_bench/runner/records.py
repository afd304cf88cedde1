"""The run directory: append-only records, status, checkpoints.

Layout (read by ``crl-bench report``)::

    RUN_DIR/
      config.json        resolved RunConfig + agent spec + environment facts
      status.json        {"state": "running"|"done"|"failed", "step": int, "error": str|None}
      metrics.jsonl      one line per step: {"step", "charts/...", "losses/...", "bank/...", "timing_s/..."}
      episodes.jsonl     one line per episode (train and eval), append-only
      eval.jsonl         one line per (eval step, task, with/without experience)
      trajectories/      step_XXXXX.jsonl.gz: full trajectories (token ids, log-probs) per step
      bank.sqlite        the experience bank (SQLite, WAL)
      checkpoints/last/  adapters, optimiser states, RNG states, loop state (atomic rename)
      .lock              held (flock) by the process training the run; holds its pid

Every record carries ``step``. A step's records are written *before* its checkpoint; on
``--resume`` the records of steps after the last checkpoint are cut, so a crash anywhere
leaves neither duplicated nor missing records.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

RECORD_FILES = ("metrics.jsonl", "episodes.jsonl", "eval.jsonl")
LOCK_FILE = ".lock"


class RunInUseError(RuntimeError):
    """Another live process is training this run directory."""

    def __init__(self, path: str | os.PathLike[str], holder: int | str) -> None:
        super().__init__(f"{path} is being trained by another process (pid {holder}); wait for it "
                         f"to finish, or stop it (kill {holder}) and continue with --resume.")


def _try_flock(fh: Any) -> bool:
    """Take an exclusive flock on the open file without waiting; False when another holds it."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _recorded_pid(fh: Any) -> str:
    fh.seek(0)
    return fh.read().strip()


def run_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid of the process training the run in ``path``, or None when no process holds it.

    The lock is an ``flock`` on ``RUN_DIR/.lock``: the kernel drops it when its holder exits,
    SIGKILL included, so a crashed run never stays locked.
    """
    lock = Path(path) / LOCK_FILE
    if not lock.exists():
        return None
    with open(lock, "a+") as fh:
        if not _try_flock(fh):
            pid = _recorded_pid(fh)
            return int(pid) if pid.isdigit() else -1
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:
        pass
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, default=_json_default)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file; a torn last line (crash mid-write) is ignored."""
    if not path.exists():
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class RunDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "trajectories").mkdir(exist_ok=True)
        self._lock_fh: Any = None  # the open .lock while this process holds the run

    # -- ownership -----------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the run for this process; :class:`RunInUseError` when another one trains it.

        Two processes appending to the same records would duplicate steps and race on the
        checkpoint, so a second ``crl-bench run --resume`` (or a second ``reproduce`` over the
        same folder) is refused instead.
        """
        if self._lock_fh is not None:
            return
        fh = open(self.path / LOCK_FILE, "a+")
        if not _try_flock(fh):
            holder = _recorded_pid(fh) or "?"
            fh.close()
            raise RunInUseError(self.path, holder)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._lock_fh = fh

    def release(self) -> None:
        fh = self._lock_fh
        if fh is not None:
            self._lock_fh = None
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    # -- files ---------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def bank_path(self) -> Path:
        return self.path / "bank.sqlite"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints" / "last"

    def append(self, name: str, records: Iterable[dict[str, Any]]) -> None:
        """Append records and fsync, so that a SIGKILL cannot lose a line we reported written."""
        lines = "".join(json.dumps(r, default=_json_default) + "\n" for r in records)
        if not lines:
            return
        with open(self.path / name, "a") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def write_trajectories(self, step: int, phase: str, trajectories: list[dict[str, Any]]) -> None:
        path = self.path / "trajectories" / f"{phase}_step_{step:05d}.jsonl.gz"
        tmp = path.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as fh:
            for t in trajectories:
                fh.write(json.dumps(t, default=_json_default) + "\n")
        os.replace(tmp, path)

    def set_status(self, state: str, step: int, error: str | None = None, **extra: Any) -> None:
        write_json_atomic(self.path / "status.json",
                          {"state": state, "step": step, "error": error, "time": time.time(), **extra})

    def status(self) -> dict[str, Any]:
        p = self.path / "status.json"
        return json.loads(p.read_text()) if p.exists() else {"state": "missing", "step": -1}

    def truncate_after(self, step: int) -> dict[str, int]:
        """Drop records of steps > ``step`` (work done after the last checkpoint); returns counts."""
        dropped: dict[str, int] = {}
        for name in RECORD_FILES:
            path = self.path / name
            records = read_jsonl(path)
            keep = [r for r in records if int(r.get("step", -1)) <= step]
            dropped[name] = len(records) - len(keep)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                for r in keep:
                    fh.write(json.dumps(r, default=_json_default) + "\n")
            os.replace(tmp, path)
        for f in (self.path / "trajectories").glob("*_step_*.jsonl.gz"):
            if int(f.name.split("_step_")[1].split(".")[0]) > step:
                f.unlink()
        return dropped

    # -- checkpoints ---------------------------------------------------------------------------
    def new_checkpoint_tmp(self) -> Path:
        tmp = self.path / "checkpoints" / f".tmp-{os.getpid()}-{time.time_ns()}"
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path) -> None:
        """Atomically make ``tmp`` the last checkpoint (rename; the old one is removed after)."""
        last = self.checkpoint_dir
        old = last.with_name("old")
        if old.exists():
            shutil.rmtree(old)
        if last.exists():
            os.replace(last, old)
        os.replace(tmp, last)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)

    def last_checkpoint(self) -> Path | None:
        last = self.checkpoint_dir
        if (last / "loop_state.json").exists():
            return last
        old = last.with_name("old")  # crash between the two renames
        if (old / "loop_state.json").exists():
            return old
        return None
