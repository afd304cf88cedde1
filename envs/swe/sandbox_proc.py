"""Host-side process control for the local sandbox: probing namespaces, the launcher's config,
reading a command's output under a deadline, killing what it leaves behind.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from crl_bench.envs.swe.sandbox_base import (MiB, WORKDIR, CommandResult, SandboxLimits,
                                             omission_marker)
from crl_bench.envs.swe.sandbox_fs import remove_tree

LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")

_probe_lock = threading.Lock()
_namespace_probe: dict[str, Any] = {}
_uid_counter = itertools.count()


def _is_root() -> bool:
    return os.geteuid() == 0


def _count_processes(uid: int) -> int:
    """Processes and threads (what RLIMIT_NPROC counts) running under ``uid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    fields = dict(line.split(":", 1) for line in fh if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    count += int(fields.get("Threads", "1"))
            except (OSError, KeyError, ValueError):
                continue
    return count


def _world_traversable(path: str) -> bool:
    """Whether a user with no special rights can reach ``path`` (x on every parent)."""
    current = Path(os.path.realpath(path))
    for directory in [current, *current.parents]:
        try:
            if not directory.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def default_ro_binds(extra: tuple[str, ...] = ()) -> list[str]:
    """Host paths a command needs read-only: the system toolchain and this interpreter."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    # The base interpreter (not a venv: the sandbox gets the task's own venv through ``extra``).
    for p in (sys.base_prefix, *extra):
        real = os.path.realpath(p)
        if not any(real == q or real.startswith(q + "/") for q in paths):
            paths.append(real)
    return paths


def task_data_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Host paths no sandbox may read: crl-bench's own package folders wherever it is installed
    (a wheel ships the ``mini`` tasks with their gold patches inside the package; an editable
    install maps it to the checkout), plus ``extra`` (a task set's data folder). Real paths."""
    import importlib

    found: list[str] = []
    for name in ("crl_bench", "crl_bench.envs"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found += [os.path.realpath(p) for p in getattr(module, "__path__", [])]
    found += [os.path.realpath(p) for p in extra if p]
    return sorted(set(found))


def _launch(cfg: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True, env={})


NO_NAMESPACES_ENV = "CRL_SWE_NO_NAMESPACES"  # "1": behave as if the OS refused namespaces
NO_CGROUP_ENV = "CRL_SWE_NO_CGROUP"  # "1": do not use a memory cgroup (the process budget applies)


def namespaces_available() -> tuple[bool, str]:
    """Whether namespaced sandboxes work here, and why not when they do not (cached)."""
    if os.environ.get(NO_NAMESPACES_ENV) == "1":
        return False, f"disabled by {NO_NAMESPACES_ENV}=1"
    with _probe_lock:
        if "ok" not in _namespace_probe:
            ok, why = _probe_namespaces()
            _namespace_probe.update(ok=ok, why=why)
        return _namespace_probe["ok"], _namespace_probe["why"]


def _probe_namespaces() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"namespaces need Linux (this is {sys.platform})"
    with tempfile.TemporaryDirectory(prefix="crl-sbx-probe-") as tmp:
        ws, tmpdir, root = (Path(tmp) / n for n in ("testbed", "tmp", "root"))
        for d in (ws, tmpdir, root):
            d.mkdir()
        cfg = _base_config("namespaces", str(root), str(ws), str(tmpdir), default_ro_binds(),
                           SandboxLimits(), uid=None, command="echo probe-ok",
                           env={"PATH": "/usr/bin:/bin"})
        try:
            proc = _launch(cfg)
            out, _ = proc.communicate(timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"probe failed: {exc}"
        text = out.decode("utf-8", "replace").strip()
        if proc.returncode == 0 and text == "probe-ok":
            return True, ""
        return False, text or f"probe exited with {proc.returncode}"


def _base_config(mode: str, root: str, ws: str, tmpdir: str, ro_binds: list[str],
                 limits: SandboxLimits, *, uid: int | None, command: str,
                 env: dict[str, str], timeout_s: float | None = None,
                 fsize_bytes: int | None = None, max_processes: int | None = None,
                 cgroup_procs: str | None = None,
                 hide: list[str] | None = None) -> dict[str, Any]:
    cpu = limits.cpu_s if limits.cpu_s is not None else (timeout_s or limits.timeout_s) + 5
    nproc = limits.max_processes if max_processes is None else max_processes
    rlimits: dict[str, float] = {
        "cpu": max(1, int(cpu)),
        "as": limits.memory_mb * MiB,
        "fsize": limits.max_file_mb * MiB if fsize_bytes is None else fsize_bytes,
        "core": 0,
        "nofile": 4096,
    }
    if uid is not None:
        rlimits["nproc"] = nproc
    elif not _is_root():
        # RLIMIT_NPROC counts every process of the real uid, the user's own included, so the
        # budget is added to what the user already runs. (Root ignores RLIMIT_NPROC.)
        rlimits["nproc"] = _count_processes(os.getuid()) + nproc
    return {
        "cgroup_procs": cgroup_procs,
        "mode": mode,
        "user_ns": mode == "namespaces" and not _is_root(),
        "host_uid": os.getuid(),
        "host_gid": os.getgid(),
        "root": root,
        "ro_binds": ro_binds,
        "hide": list(hide or ()),
        "rw_binds": [[ws, WORKDIR], [tmpdir, "/tmp"]] if mode == "namespaces" else [],
        "workdir": WORKDIR if mode == "namespaces" else ws,
        "uid": uid,
        "gid": uid,
        "rlimits": rlimits,
        "network_off": not limits.network,
        "shm_bytes": limits.shm_mb * MiB,
        "env": env,
        "command": command,
        "shell": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
    }


def _kill_uid(uid: int) -> None:
    """Kill every process running under ``uid`` (only used for a sandbox's own uid)."""
    for _round in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as fh:
                    uid_line = next(line for line in fh if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) == uid:
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return
        time.sleep(0.01)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


EXIT_GRACE_S = 0.2  # output still read after the shell exits (rlimits mode; see collect_output)


def collect_output(proc: subprocess.Popen[bytes], stdin: str | None, timeout: float, keep: int,
                   hard: int, watch: Callable[[], str] | None = None) -> CommandResult:
    """Read the merged output of ``proc`` under a deadline, keeping only its head and tail.

    ``watch`` (the checked disk budget) is called in the loop; a non-empty answer stops the
    command and becomes the result's note.
    """
    assert proc.stdout is not None and proc.stdin is not None
    if stdin:
        # Feed stdin from a thread: a command that does not read it must not block us.
        data = stdin.encode("utf-8", errors="surrogateescape")

        def feed() -> None:
            try:
                proc.stdin.write(data)  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass
            finally:
                try:
                    proc.stdin.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        threading.Thread(target=feed, daemon=True).start()
    else:
        proc.stdin.close()
    head = bytearray()
    tail = bytearray()
    half = keep // 2
    total = 0
    timed_out = flood = False
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    exited_at: float | None = None
    stopped = ""
    try:
        while True:
            if watch is not None and exited_at is None:
                stopped = watch()
                if stopped:
                    break
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                break  # the shell is gone; a leftover background process holds the pipe open
            if not sel.select(timeout=min(remaining, 0.1 if exited_at is None else 0.02)):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if len(head) < half:
                take = half - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail += chunk
                if len(tail) > 2 * half:
                    del tail[:len(tail) - half]
            if total > hard:
                flood = True
                break
    finally:
        sel.close()
    if timed_out or flood or stopped or exited_at is not None:
        _kill_group(proc)
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        code = proc.wait()
    proc.stdout.close()
    if len(tail) > half:
        del tail[:len(tail) - half]
    truncated = total > len(head) + len(tail)
    text = head.decode("utf-8", "replace")
    if truncated:
        text += omission_marker(total - len(head) - len(tail))
    text += tail.decode("utf-8", "replace")
    exit_code = None if (timed_out or flood) else (code if code >= 0 else 128 - code)
    return CommandResult(output=text, exit_code=exit_code, timed_out=timed_out,
                         output_bytes=total, output_truncated=truncated, output_flood=flood,
                         note=stopped)



# ---------------------------------------------------------------------------------------------
# Per-sandbox memory (a cgroup) and leftovers of killed runs
# ---------------------------------------------------------------------------------------------

WORKSPACE_PREFIX = "crl-swe-"
OWNER_FILE = "owner.json"


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_record() -> dict[str, Any]:
    return {"pid": os.getpid(), "start": _process_start(os.getpid())}


def owner_alive(record: Any) -> bool:
    try:
        pid = int(record["pid"])
    except (TypeError, KeyError, ValueError):
        return False
    return _process_start(pid) is not None and _process_start(pid) == record.get("start")


def clean_stale_workspaces(base_dir: str | None) -> list[str]:
    """Remove the workspaces (``crl-swe-*`` with an owner file) of processes that are gone.

    A killed run cannot clean up after itself; the next sandbox made in the same place does.
    Folders whose owner still runs, or that have no owner file, are left alone.
    """
    base = Path(base_dir or tempfile.gettempdir())
    removed = []
    try:
        candidates = [p for p in base.iterdir() if p.name.startswith(WORKSPACE_PREFIX)]
    except OSError:
        return removed
    for folder in candidates:
        try:
            record = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not owner_alive(record):
            remove_tree(folder)
            removed.append(str(folder))
    for group in _stale_cgroups():
        remove_cgroup(group)
    return removed


def memory_cgroup_root() -> tuple[Path | None, str]:
    """A memory cgroup folder this process may create children in, and its version ("v1"/"v2").

    ``(None, why)`` when there is none (not root, read-only cgroupfs, or ``CRL_SWE_NO_CGROUP=1``).
    """
    if os.environ.get(NO_CGROUP_ENV) == "1":
        return None, f"disabled by {NO_CGROUP_ENV}=1"
    for root, version in ((Path("/sys/fs/cgroup"), "v2"), (Path("/sys/fs/cgroup/unified"), "v2"),
                          (Path("/sys/fs/cgroup/memory"), "v1")):
        if version == "v2":
            try:
                if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        elif not (root / "memory.limit_in_bytes").exists():
            continue
        if os.access(root, os.W_OK):
            return root, version
    return None, "no writable memory cgroup (needs root and a writable cgroupfs)"


SANDBOX_GROUP_ENV = "CRL_SWE_SANDBOX_GROUP"  # the parent cgroup's name (default below)
SANDBOX_BUDGET_ENV = "CRL_SWE_SANDBOX_BUDGET_MB"  # its memory limit, MiB (default: half the RAM)
DEFAULT_SANDBOX_GROUP = "crl-sandboxes"


def default_sandbox_budget_mb(meminfo: str = "/proc/meminfo") -> int:
    """Half of the host's ``MemTotal`` (at least 1 GiB): what all sandboxes together may use."""
    try:
        with open(meminfo) as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 8192
    return max(1024, kib // 1024 // 2)


def sandbox_budget_mb() -> int:
    """The memory budget of all sandboxes on this host (``CRL_SWE_SANDBOX_BUDGET_MB`` or half
    the RAM)."""
    given = os.environ.get(SANDBOX_BUDGET_ENV)
    if not given:
        return default_sandbox_budget_mb()
    try:
        value = int(given)
        if value <= 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{SANDBOX_BUDGET_ENV}={given[:40]!r} must be a positive whole number "
                         "of MiB (the memory all SWE sandboxes on this host may use together)."
                         ) from None
    return value


def sandbox_parent_cgroup() -> tuple[Path | None, str, int]:
    """The parent memory cgroup every sandbox's own cgroup is made in, its version, its limit.

    One parent per host (``crl-sandboxes``, or ``CRL_SWE_SANDBOX_GROUP``), limited to
    :func:`sandbox_budget_mb`: the processes *and the quota tmpfs files* of all sandboxes on
    the host, of every run and process, are charged to it, so the kernel bounds their sum.
    ``(None, why, 0)`` where no memory cgroup can be made.
    """
    root, version = memory_cgroup_root()
    if root is None:
        return None, version, 0
    name = os.environ.get(SANDBOX_GROUP_ENV) or DEFAULT_SANDBOX_GROUP
    if not all(c.isalnum() or c in "-_." for c in name) or name.startswith((".", WORKSPACE_PREFIX)):
        raise ValueError(f"{SANDBOX_GROUP_ENV}={name[:60]!r}: use a plain name (letters, digits, "
                         f"'-', '_', '.'), not starting with '.' or {WORKSPACE_PREFIX!r}.")
    budget = sandbox_budget_mb() * MiB
    parent = root / name
    try:
        parent.mkdir(exist_ok=True)
        if version == "v2":
            controls = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in controls:
                (parent / "cgroup.subtree_control").write_text("+memory")
        limit_file = parent / ("memory.max" if version == "v2" else "memory.limit_in_bytes")
        if _read_limit(limit_file) != budget:
            limit_file.write_text(str(budget))
        if version == "v1" and (parent / "memory.memsw.limit_in_bytes").exists():
            try:
                (parent / "memory.memsw.limit_in_bytes").write_text(str(budget))
            except OSError:
                pass  # memsw may not go below what its children already hold
    except OSError as exc:
        return None, f"could not set up the sandboxes' parent cgroup {parent}: {exc}", 0
    return parent, version, _read_limit(limit_file) or budget


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def make_memory_cgroup(name: str, limit_bytes: int) -> tuple[Path | None, str]:
    """Create a memory cgroup capped at ``limit_bytes`` (swap included where the kernel can),
    inside the sandboxes' parent (:func:`sandbox_parent_cgroup`)."""
    try:
        parent, version, _budget = sandbox_parent_cgroup()
    except ValueError as exc:
        return None, str(exc)
    if parent is None:
        return None, version
    group = parent / name
    try:
        group.mkdir(exist_ok=True)
        if version == "v2":
            (group / "memory.max").write_text(str(limit_bytes))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
        else:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if (group / "memory.memsw.limit_in_bytes").exists():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return group, version
    except OSError as exc:
        remove_cgroup(group)
        return None, f"could not set up a memory cgroup at {group}: {exc}"


def memory_events(group: Path) -> dict[str, int]:
    """How often ``group`` hit its limit (``max``) and had a process killed for memory
    (``oom_kill``); v2 counts include its descendants."""
    out = {"max": 0, "oom_kill": 0}
    try:
        if (group / "memory.events").exists():  # v2
            for line in (group / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key in out:
                    out[key] = int(value)
        else:
            out["max"] = int((group / "memory.failcnt").read_text())
            for line in (group / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    out["oom_kill"] = int(value)
    except (OSError, ValueError):
        pass
    return out


def memory_usage(group: Path) -> int:
    for name in ("memory.current", "memory.usage_in_bytes"):
        try:
            return int((group / name).read_text())
        except (OSError, ValueError):
            continue
    return 0


def remove_cgroup(group: Path) -> None:
    """Kill what is left in the cgroup, then remove it."""
    for _round in range(50):
        try:
            pids = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _stale_cgroups() -> list[Path]:
    root, _version = memory_cgroup_root()
    if root is None:
        return []
    stale = []
    groups = [*root.glob(WORKSPACE_PREFIX + "*"), *root.glob("*/" + WORKSPACE_PREFIX + "*")]
    for group in groups:
        try:
            pid, start = group.name[len(WORKSPACE_PREFIX):].split("-")[:2]
        except ValueError:
            continue
        if not owner_alive({"pid": pid, "start": start}):
            stale.append(group)
    return stale
