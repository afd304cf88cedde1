"""The run directory: append-only records, status, checkpoints.

Layout (read by ``crl-bench report``)::

    RUN_DIR/
      config.json        resolved RunConfig + agent spec + environment facts
      status.json        {"state": "running"|"done"|"failed", "step": int, "error": str|None,
                          "provenance": {"commit", "dirty", "config_sha256", "started_at",
                          "started_utc", "ended_at", "ended_utc", "attempts"}}
      metrics.jsonl      one line per step: {"step", "charts/...", "losses/...", "bank/...", "timing_s/..."}
      episodes.jsonl     one line per episode (train and eval), append-only
      eval.jsonl         one line per (eval step, task, with/without experience)
      trajectories/      step_XXXXX.jsonl.gz: full trajectories (token ids, log-probs) per step
      bank.sqlite        the experience bank (SQLite, WAL)
      checkpoints/last/  every part's state (state.pt: RNG, optimisers, the track, the
                         manager's RNG/counters), the adapters, the bank, the loop's
                         state (loop_state.json), written by atomic rename, and
                         checksums.json: size and SHA-256 of each of these files
      checkpoints/bank_at_start.sqlite (or .none)  the bank as the run found it
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

RECORD_FILES = ("metrics.jsonl", "episodes.jsonl", "eval.jsonl", "extractor.jsonl")
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


class RecordError(RuntimeError):
    """A run's file is damaged; the message names the file (and line) and the way out."""


REPAIR_HINT = ("continue with `crl-bench run --resume --repair --out {run}`, which moves the bad "
               "lines aside to {name}.bad and keeps the rest")


def _rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace a record file by ``records``, one JSON line each, atomically (write, fsync,
    rename): a crash leaves the old file or the new one, never half of it."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for r in records:
            fh.write(json.dumps(r, default=_json_default) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _held_by_other(path: Path) -> bool:
    holder = run_holder(path.parent) if (path.parent / LOCK_FILE).exists() else None
    return holder is not None and holder != os.getpid()


def scan_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str, str]]]:
    """Parse a JSONL records file: ``(records, bad)`` with ``bad`` as ``(line number, raw line,
    why)`` for every line that is not one JSON object. A last line without its newline in a run
    another live process is writing is an append in progress, not damage: it is left out."""
    if not path.exists():
        return [], []
    records: list[dict[str, Any]] = []
    bad: list[tuple[int, str, str]] = []
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        lines = fh.readlines()
    for i, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if i == len(lines) and not raw.endswith("\n") and _held_by_other(path):
            break  # being appended right now
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            why = "torn last line (no newline: a crash while writing)" if (
                i == len(lines) and not raw.endswith("\n")) else f"not JSON ({exc.msg})"
            bad.append((i, raw.rstrip("\n"), why))
            continue
        if not isinstance(record, dict):
            bad.append((i, raw.rstrip("\n"), f"not a JSON object ({type(record).__name__})"))
            continue
        records.append(record)
    return records, bad


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL records file.

    Raises:
        RecordError: a damaged line (torn by a crash, or corrupt); names the file and the line
            and the way out (``--resume --repair``). Damage is never dropped silently.
    """
    records, bad = scan_jsonl(path)
    if bad:
        line, _, why = bad[0]
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        raise RecordError(f"{path}, line {line}: {why}{more}. To "
                          + REPAIR_HINT.format(run=path.parent, name=path.name) + ".")
    return records


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

    @property
    def start_bank_path(self) -> Path:
        """A copy of the bank as it was when the run started (absent: it had none, see
        :attr:`no_start_bank_path`); a crash before the first checkpoint restores it."""
        return self.path / "checkpoints" / "bank_at_start.sqlite"

    @property
    def no_start_bank_path(self) -> Path:
        """Marker: the run started without a bank (a crash before the first checkpoint removes
        the bank the dead attempt wrote)."""
        return self.path / "checkpoints" / "bank_at_start.none"

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
        """Write ``status.json``. It also keeps the run's provenance (:func:`provenance`): the
        code's commit and the config's hash when an attempt starts ("running" after anything
        else), the wall-clock start of the first attempt and the end of the run ("done"), so that
        the order of a plan's commit and its runs can be checked from the files."""
        now = time.time()
        try:
            previous = self.status()
        except RecordError:
            previous = {}
        prov = dict(previous.get("provenance") or {})
        if state == "running" and previous.get("state") != "running":
            attempt = {"at": now, "utc": _utc(now), **code_version(),
                       "config_sha256": _sha256(self.config_path)}
            prov.setdefault("started_at", now)
            prov.setdefault("started_utc", _utc(now))
            prov["attempts"] = list(prov.get("attempts", [])) + [attempt]
            prov.update({k: attempt[k] for k in ("commit", "dirty", "config_sha256")})
        if state == "done" and previous.get("state") != "done":
            prov.update(ended_at=now, ended_utc=_utc(now))
        data = {"state": state, "step": step, "error": error, "time": now, **extra}
        if prov:
            data["provenance"] = prov
        write_json_atomic(self.path / "status.json", data)

    def status(self) -> dict[str, Any]:
        p = self.path / "status.json"
        if not p.exists():
            return {"state": "missing", "step": -1}
        try:
            data = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            data = exc
        if not isinstance(data, dict):
            raise RecordError(f"{p} is damaged (not a JSON object: {data}). It only records the "
                              f"run's state: delete it and continue with `crl-bench run --resume "
                              f"--out {self.path}`.")
        return data

    def truncate_after(self, step: int) -> dict[str, int]:
        """Drop records of steps > ``step`` (work done after the last checkpoint); returns counts.

        Raises:
            RecordError: a damaged line (see :func:`read_jsonl`); nothing is rewritten then. Run
                :meth:`repair_records` first to move such lines aside.
        """
        if step >= 0:
            for name in RECORD_FILES:
                read_jsonl(self.path / name)  # every file checked before any is rewritten
        dropped: dict[str, int] = {}
        for name in RECORD_FILES:
            path = self.path / name
            records = read_jsonl(path) if step >= 0 else scan_jsonl(path)[0]
            keep = [r for r in records if _record_step(r) <= step]
            dropped[name] = len(records) - len(keep)
            if not path.exists() and not keep:
                continue
            _rewrite_jsonl(path, keep)
        for f in (self.path / "trajectories").glob("*_step_*.jsonl.gz"):
            try:
                file_step = int(f.name.split("_step_")[1].split(".")[0])
            except ValueError:
                continue  # not one of ours
            if file_step > step:
                f.unlink()
        return dropped

    def check_records(self) -> None:
        """Raise :class:`RecordError` (file, line, way out) if any record file is damaged."""
        for name in RECORD_FILES:
            read_jsonl(self.path / name)

    def repair_records(self) -> dict[str, list[int]]:
        """Move every damaged record line aside to ``<file>.bad`` (appended: line number, then
        the raw line) and rewrite the file without it. Returns the moved line numbers by file."""
        moved: dict[str, list[int]] = {}
        for name in RECORD_FILES:
            path = self.path / name
            records, bad = scan_jsonl(path)
            if not bad:
                continue
            with open(path.with_name(name + ".bad"), "a", encoding="utf-8",
                      errors="surrogateescape") as fh:
                for line, raw, why in bad:
                    fh.write(f"# {name} line {line}: {why}\n{raw}\n")
                fh.flush()
                os.fsync(fh.fileno())
            _rewrite_jsonl(path, records)
            moved[name] = [line for line, _, _ in bad]
        return moved

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove what a killed process left half-written: ``checkpoints/.tmp-*`` folders,
        ``trajectories/*.tmp``, records' ``*.tmp`` and ``.<file>.json.*`` temporaries. Call only
        while holding the run (:meth:`acquire`): then no other process writes them."""
        removed: list[Path] = []
        patterns = [(self.path / "checkpoints", ".tmp-*"), (self.path / "trajectories", "*.tmp"),
                    (self.path, "*.tmp"), (self.path, ".*.json.*")]
        for folder, pattern in patterns:
            if not folder.is_dir():
                continue
            for p in folder.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
        return removed

    # -- checkpoints ---------------------------------------------------------------------------
    def new_checkpoint_tmp(self) -> Path:
        tmp = self.path / "checkpoints" / f".tmp-{os.getpid()}-{time.time_ns()}"
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path) -> None:
        """Atomically make ``tmp`` the last checkpoint (rename; the old one is removed after)."""
        last = self.checkpoint_dir
        old = last.with_name("old")
        from crl_bench.records.checksums import write_manifest

        write_manifest(tmp)  # checked by verify_checkpoint before a resume uses any of it
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

    def verify_checkpoint(self, path: Path) -> int:
        """Check a checkpoint's files before anything is loaded from them; return its step.

        Raises:
            CheckpointError: a missing, empty, truncated or garbled file, named, with the way out.
        """
        import zipfile

        way_out = (f"Move the checkpoint aside (mv {path} {path.parent / 'broken'}) and run "
                   "--resume again to restart the run from step 0, or start a new run with "
                   "another --out.")
        state_path = path / "loop_state.json"
        try:
            state = json.loads(state_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{state_path} cannot be read ({type(exc).__name__}: {exc}). "
                                  + way_out) from None
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"{state_path} holds no valid step (got {step!r}). " + way_out)
        if not (path / "state.pt").exists() and (path / "trainers.pt").exists():
            raise CheckpointError(
                f"{path} is a checkpoint of an older layout (trainers.pt and rng.pt; this version "
                "keeps every part's state in state.pt): resume it with the version that wrote it, "
                "or restart. " + way_out)
        for name in ("state.pt",):
            p = path / name
            try:  # torch.save writes a zip archive: a truncated or empty file has no directory
                with zipfile.ZipFile(p) as zf:
                    if not any(n.endswith("data.pkl") for n in zf.namelist()):
                        raise zipfile.BadZipFile("no data.pkl inside")
            except (OSError, zipfile.BadZipFile) as exc:
                raise CheckpointError(f"{p} is damaged or missing ({type(exc).__name__}: {exc}). "
                                      + way_out) from None
        if not (path / "adapters").is_dir():
            raise CheckpointError(f"{path / 'adapters'} is missing. " + way_out)
        check_checkpoint_contents(path, way_out)
        return step


class CheckpointError(RuntimeError):
    """A checkpoint file is missing or damaged; the message names it and the way out."""


def check_checkpoint_contents(path: Path, way_out: str) -> None:
    """Every file of the checkpoint against the checksums written with it, then its bank copy as
    a database, before anything is loaded or copied over the run's live state. A checkpoint
    without checksums (written before they were kept) is accepted with a warning: its files are
    then checked for format only."""
    import sys

    from crl_bench.experience.bank_files import bank_file_problem
    from crl_bench.records.checksums import CHECKSUMS, ChecksumError, verify_manifest

    try:
        checked = verify_manifest(path)
    except ChecksumError as exc:
        raise CheckpointError(f"{exc}. " + way_out) from None
    if not checked:
        print(f"[resume] warning: {path} has no {CHECKSUMS} (a checkpoint written before "
              "checkpoints carried checksums): its files are checked for format, not content.",
              file=sys.stderr)
    bank = path / "bank.sqlite"
    if bank.is_file():
        problem = bank_file_problem(bank)
        if problem is not None:
            raise CheckpointError(f"{bank} {problem}. " + way_out)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _sha256(path: Path) -> str | None:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def code_version() -> dict[str, Any]:
    """The git commit of the crl_bench code this process runs, and whether its tracked files
    differ from it (``dirty``); ``{"commit": None, "dirty": None}`` outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                     "--untracked-files=no", "--", "crl_bench", "envs",
                                     "baselines"], capture_output=True, text=True, timeout=60,
                                    check=True).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": dirty}


def _record_step(record: dict[str, Any]) -> int:
    step = record.get("step", -1)
    return step if isinstance(step, int) and not isinstance(step, bool) else -1
