"""Sandboxes that hold one repository workspace and run the agent's shell commands in it.

One interface (:class:`Sandbox`), two backends:

``local`` (:class:`LocalSandbox`)
    A workspace directory on this machine. Every command runs in a fresh subprocess, confined:

    * **namespaces** (Linux, as root or with unprivileged user namespaces): its own mount, PID,
      network, IPC and UTS namespaces and a fresh root filesystem that holds only read-only
      toolchain paths (``/usr``, ``/etc``, the interpreter and the task's venv), the workspace
      read-write at ``/testbed`` and a private ``/tmp``. No network (only a loopback device),
      no other process visible, nothing outside the workspace writable, and the rest of the
      machine (the task data with the gold patches included) not visible at all. When the host
      is root the command also runs under a uid of its own, so ``RLIMIT_NPROC`` stops a fork
      bomb.
    * **rlimits** (fallback when the OS refuses namespaces): working directory, scrubbed
      environment, rlimits and a uid drop when root. Weaker: files outside the workspace stay
      readable, and world-writable places (``/tmp``) writable. :meth:`LocalSandbox.describe`
      says which mode is in effect.

    Always: a wall-clock limit (the whole process group, or the whole PID namespace, is killed),
    rlimits on CPU seconds, address space, processes and file size, and an output cap (only the
    head and tail are kept; a command that floods past the hard cap is stopped).

``docker`` (:class:`crl_bench.envs.swe.docker_sandbox.DockerSandbox`)
    A container of the SWE-bench harness image of the instance; see that module.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
SETUP_ERROR_PREFIX = "crl-sandbox setup error: "  # same text as in _sandbox_launcher.py
SETUP_ERROR_EXIT = 250
WORKDIR = "/testbed"  # where the repository appears to commands (as in SWE-bench's images)

MiB = 1024 * 1024


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the agent's command); the message says what to fix."""


class SandboxPathError(ValueError):
    """A path the agent gave points outside the workspace or cannot be used."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to every command.

    Attributes:
        timeout_s: wall-clock seconds per command; then every process of the command is killed.
        cpu_s: CPU seconds per process (``RLIMIT_CPU``); ``None`` = ``timeout_s`` + 5.
        memory_mb: address space per process in MiB (``RLIMIT_AS``).
        max_processes: processes and threads a command may add (``RLIMIT_NPROC``). As root the
            command runs under a uid of its own with exactly this limit; a non-root user gets
            this many on top of the processes they already run. Root commands (see
            ``LocalSandbox``'s ``uid_note``) are not limited: the kernel exempts root.
        max_file_mb: largest file a command may write, MiB (``RLIMIT_FSIZE``).
        output_keep_bytes: bytes of output kept per command (head and tail halves).
        output_hard_bytes: a command that writes more output than this is stopped.
        network: allow network access (only meaningful in namespaces mode; off by default).
        shm_mb: size of the private ``/dev/shm`` tmpfs, MiB.
    """

    timeout_s: float = 60.0
    cpu_s: float | None = None
    memory_mb: int = 4096
    max_processes: int = 256
    max_file_mb: int = 256
    output_keep_bytes: int = 2 * MiB
    output_hard_bytes: int = 32 * MiB
    network: bool = False
    shm_mb: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_file_mb",
                     "output_keep_bytes", "output_hard_bytes", "shm_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got "
                                 f"{getattr(self, name)}.")
        if self.output_hard_bytes < self.output_keep_bytes:
            raise ValueError("SandboxLimits.output_hard_bytes must be >= output_keep_bytes "
                             "(the hard cap stops a command; the keep size is what is shown).")


@dataclass
class CommandResult:
    """What one command did.

    Attributes:
        output: stdout and stderr interleaved, decoded as UTF-8 (undecodable bytes replaced). If
            more than ``output_keep_bytes`` were written, the middle is replaced by a marker.
        exit_code: the shell's exit status (128 + N when killed by signal N); ``None`` when the
            sandbox killed the command (timeout or output flood).
        timed_out: the wall-clock limit was hit.
        output_bytes: total bytes the command wrote.
        output_truncated: the middle of the output was dropped.
        output_flood: the command was stopped for exceeding ``output_hard_bytes``.
        duration_s: wall-clock seconds.
    """

    output: str
    exit_code: int | None
    timed_out: bool = False
    output_bytes: int = 0
    output_truncated: bool = False
    output_flood: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def status_line(self, limits: SandboxLimits | None = None) -> str:
        """One line that says how the command ended (for the agent's observation)."""
        if self.timed_out:
            limit = f" after {limits.timeout_s:g} s" if limits else ""
            return (f"[command timed out{limit}: it and every process it started were killed]")
        if self.output_flood:
            cap = f" (the limit is {limits.output_hard_bytes:,})" if limits else ""
            return (f"[command stopped after {self.output_bytes:,} bytes of output{cap}; "
                    "redirect large output to a file and look at parts of it]")
        code = self.exit_code
        if code is not None and code > 128 and code - 128 in _SIGNAL_NOTES:
            return f"[exit code {code}: killed by {_SIGNAL_NOTES[code - 128]}]"
        return f"[exit code {code}]"


_SIGNAL_NOTES = {
    int(signal.SIGXCPU): "SIGXCPU (CPU time limit)",
    int(signal.SIGXFSZ): "SIGXFSZ (file size limit)",
    int(signal.SIGKILL): "SIGKILL",
    int(signal.SIGSEGV): "SIGSEGV (crash; possibly the memory limit)",
    int(signal.SIGABRT): "SIGABRT",
}


def omission_marker(omitted: int, unit: str = "bytes") -> str:
    return f"\n[... {omitted:,} {unit} of output omitted ...]\n"


def truncate_middle(text: str, limit: int) -> str:
    """Keep the first and last ``limit // 2`` characters, with a marker in between.

    The tail is kept because the end of a log (a test summary, the last traceback) is usually
    what matters.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + omission_marker(len(text) - 2 * half, "characters") + text[-half:]


class Sandbox(ABC):
    """A repository workspace plus a way to run commands in it.

    Paths given to :meth:`read_file` / :meth:`write_file` are the paths commands see: relative to
    :attr:`workdir`, or absolute under it.
    """

    workdir: str = WORKDIR
    limits: SandboxLimits

    @abstractmethod
    def prepare(self, source: Any) -> None:
        """Start from a fresh copy of ``source`` (a template directory, or an image)."""

    @abstractmethod
    def reset(self) -> None:
        """Go back to the state right after :meth:`prepare`."""

    @abstractmethod
    def run(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None,
            env: Mapping[str, str] | None = None,
            output_keep_bytes: int | None = None) -> CommandResult:
        """Run ``command`` with ``bash -c`` in :attr:`workdir` under the limits."""

    @abstractmethod
    def read_file(self, path: str, max_bytes: int = 4 * MiB) -> str:
        """Return a text file's content (UTF-8; undecodable bytes kept as surrogate escapes)."""

    @abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Create or overwrite a text file (parent directories are created)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Backend and confinement in effect (for logs and ``info``)."""

    def close(self) -> None:  # noqa: B027 - optional hook, not every backend holds anything
        """Release the workspace."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def inside_path(self, path: str) -> PurePosixPath:
        """Normalise an agent path to a path relative to :attr:`workdir`.

        Raises:
            SandboxPathError: the path leaves the workspace (``..``, another absolute path).
        """
        if not isinstance(path, str) or not path.strip():
            raise SandboxPathError("no path given")
        if "\x00" in path:
            raise SandboxPathError("the path contains a NUL character")
        p = PurePosixPath(path.strip())
        if p.is_absolute():
            try:
                p = p.relative_to(self.workdir)
            except ValueError:
                raise SandboxPathError(f"{path} is outside the repository {self.workdir}; use a "
                                       f"path relative to it or under {self.workdir}/") from None
        parts: list[str] = []
        for part in p.parts:
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise SandboxPathError(f"{path} leaves the repository {self.workdir}")
                parts.pop()
            else:
                parts.append(part)
        return PurePosixPath(*parts) if parts else PurePosixPath(".")


# ---------------------------------------------------------------------------------------------
# Host capabilities (probed once per process)
# ---------------------------------------------------------------------------------------------

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


def _launch(cfg: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True, env={})


def namespaces_available() -> tuple[bool, str]:
    """Whether namespaced sandboxes work here, and why not when they do not (cached)."""
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
                 env: dict[str, str], timeout_s: float | None = None) -> dict[str, Any]:
    cpu = limits.cpu_s if limits.cpu_s is not None else (timeout_s or limits.timeout_s) + 5
    rlimits: dict[str, float] = {
        "cpu": max(1, int(cpu)),
        "as": limits.memory_mb * MiB,
        "fsize": limits.max_file_mb * MiB,
        "core": 0,
        "nofile": 4096,
    }
    if uid is not None:
        rlimits["nproc"] = limits.max_processes
    elif not _is_root():
        # RLIMIT_NPROC counts every process of the real uid, the user's own included, so the
        # budget is added to what the user already runs. (Root ignores RLIMIT_NPROC.)
        rlimits["nproc"] = _count_processes(os.getuid()) + limits.max_processes
    return {
        "mode": mode,
        "user_ns": mode == "namespaces" and not _is_root(),
        "host_uid": os.getuid(),
        "host_gid": os.getgid(),
        "root": root,
        "ro_binds": ro_binds,
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


# ---------------------------------------------------------------------------------------------
# The local backend
# ---------------------------------------------------------------------------------------------

THREAD_ENV = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                     "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS")}


@dataclass
class LocalSandbox(Sandbox):
    """A workspace directory on this machine; commands confined as the module docstring says.

    Args:
        limits: per-command limits.
        isolation: ``"auto"`` (namespaces when the OS allows, else rlimits), ``"namespaces"``
            (raise if unavailable) or ``"rlimits"``.
        venv: a virtual environment (or any interpreter prefix) whose ``bin`` goes first on
            ``PATH``; it is bound read-only into the sandbox.
        ro_binds: more host paths to make visible read-only (e.g. a base interpreter prefix).
        env: extra environment variables for every command (``PYTHONPATH``, ...).
        base_dir: where workspaces are created (default: the system temp dir).
        uid: the uid commands run under when the host is root (default: one per sandbox, from
            a high range that no login user has).
    """

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: str = "auto"
    venv: str | None = None
    ro_binds: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    uid: int | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ("auto", "namespaces", "rlimits"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'rlimits', got "
                             f"{self.isolation!r}.")
        if self.isolation == "rlimits":
            self.mode = "rlimits"
        else:
            ok, why = namespaces_available()
            if not ok and self.isolation == "namespaces":
                raise SandboxError(f"isolation='namespaces' is not available here: {why}. Run as "
                                   "root, enable unprivileged user namespaces "
                                   "(sysctl kernel.unprivileged_userns_clone=1), or pass "
                                   "isolation='rlimits' (weaker: see LocalSandbox's docs).")
            self.mode = "namespaces" if ok else "rlimits"
            self.namespace_problem = why
        self.uid_note = ""
        if _is_root() and self.uid is None:
            self.uid = 2_000_000 + (os.getpid() % 100_000) * 16 + next(_uid_counter) % 16
        if not _is_root():
            self.uid = None  # only root can switch uid
        elif self.mode == "rlimits":
            # Without a fresh root the sandbox uid sees the host's permissions: a venv under a
            # private home (/root is 0700) would not even start. Keep root then, and say so.
            hidden = [p for p in (self.venv, *self.ro_binds) if p and not _world_traversable(p)]
            if hidden:
                self.uid = None
                self.uid_note = (f"commands run as root: {hidden[0]} is not reachable by "
                                 "other users, so the sandbox uid could not use it")
        self._dir = Path(tempfile.mkdtemp(prefix="crl-swe-", dir=self.base_dir))
        self.ws = self._dir / "testbed"
        self.tmp = self._dir / "tmp"
        self.root = self._dir / "root"
        for d in (self.ws, self.tmp, self.root):
            d.mkdir()
        self._source: Path | None = None
        self._ro = default_ro_binds(tuple(self.ro_binds) + ((self.venv,) if self.venv else ()))
        self._own(self._dir)

    # -- workspace -----------------------------------------------------------------------------
    @property
    def command_workdir(self) -> str:
        """The working directory commands see (``/testbed``, or the host path in rlimits mode)."""
        return WORKDIR if self.mode == "namespaces" else str(self.ws)

    def prepare(self, source: Any) -> None:
        source = Path(source)
        if not source.is_dir():
            raise SandboxError(f"workspace template {source} is not a directory")
        self._source = source
        self.reset()

    def reset(self) -> None:
        if self._source is None:
            raise SandboxError("reset() before prepare(): give the sandbox a template first")
        for d in (self.ws, self.tmp):
            _remove_tree(d)
        shutil.copytree(self._source, self.ws, symlinks=True)
        self.tmp.mkdir()
        self._own(self.ws)
        self._own(self.tmp)

    def _own(self, top: Path) -> None:
        if self.uid is None:
            return
        os.lchown(top, self.uid, self.uid)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), self.uid, self.uid)

    def host_path(self, path: str) -> Path:
        """The host path of an agent path, after checking it stays inside the workspace.

        Symlinks are resolved, so a link that points outside is refused too.
        """
        if self.mode == "rlimits" and path.startswith(str(self.ws)):
            path = WORKDIR + path[len(str(self.ws)):]  # the host path commands see here
        rel = self.inside_path(path)
        host = self.ws / rel
        real = Path(os.path.realpath(host))
        ws_real = Path(os.path.realpath(self.ws))
        if real != ws_real and ws_real not in real.parents:
            raise SandboxPathError(f"{path} resolves outside the repository (a symlink?)")
        return real

    def read_file(self, path: str, max_bytes: int = 4 * MiB) -> str:
        host = self.host_path(path)
        if not host.exists():
            raise FileNotFoundError(f"{path}: no such file")
        if host.is_dir():
            raise IsADirectoryError(f"{path} is a directory")
        if not host.is_file():
            raise SandboxPathError(f"{path} is not a regular file")
        size = host.stat().st_size
        if size > max_bytes:
            raise SandboxPathError(f"{path} is {size:,} bytes; files over {max_bytes:,} bytes "
                                   "cannot be opened this way (use `run` with head/sed)")
        data = host.read_bytes()
        if b"\x00" in data[:8192]:
            raise SandboxPathError(f"{path} looks binary (it contains NUL bytes)")
        return data.decode("utf-8", errors="surrogateescape")

    def write_file(self, path: str, text: str) -> None:
        host = self.host_path(path)
        if host.is_dir():
            raise IsADirectoryError(f"{path} is a directory")
        created: list[Path] = []
        parent = host.parent
        while not parent.exists():
            created.append(parent)
            parent = parent.parent
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        if self.uid is not None:
            for p in [host, *created]:
                os.lchown(p, self.uid, self.uid)

    # -- commands ------------------------------------------------------------------------------
    def command_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The scrubbed environment a command gets (nothing is inherited from the host)."""
        tmp = "/tmp" if self.mode == "namespaces" else str(self.tmp)
        path = "/usr/local/bin:/usr/bin:/bin"
        env = {"PATH": path, "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "TERM": "dumb", "USER": "sandbox", "LOGNAME": "sandbox", "PAGER": "cat",
               "GIT_PAGER": "cat", "PYTHONDONTWRITEBYTECODE": "1",
               "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@sandbox.invalid",
               "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@sandbox.invalid",
               "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               **THREAD_ENV}
        if self.venv:
            env["PATH"] = f"{os.path.realpath(self.venv)}/bin:{path}"
            env["VIRTUAL_ENV"] = os.path.realpath(self.venv)
        for source in (self.env, extra or {}):
            for key, value in source.items():
                env[key] = str(value).replace("{workdir}", self.command_workdir)
        return env

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None,
            env: Mapping[str, str] | None = None,
            output_keep_bytes: int | None = None) -> CommandResult:
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        keep = int(output_keep_bytes or self.limits.output_keep_bytes)
        hard = max(self.limits.output_hard_bytes, keep)
        cfg = _base_config(self.mode, str(self.root), str(self.ws), str(self.tmp), self._ro,
                           self.limits, uid=self.uid, command=command,
                           env=self.command_env(env), timeout_s=timeout)
        start = time.monotonic()
        try:
            proc = _launch(cfg)
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox launcher: {exc}") from exc
        result = collect_output(proc, stdin, timeout, keep, hard)
        if self.mode == "rlimits" and self.uid is not None:
            _kill_uid(self.uid)  # what setsid/double-fork took out of the process group
        result.duration_s = time.monotonic() - start
        if result.exit_code == SETUP_ERROR_EXIT and result.output.startswith(SETUP_ERROR_PREFIX):
            raise SandboxError(f"the sandbox could not start the command: {result.output.strip()}")
        return result

    def describe(self) -> dict[str, Any]:
        return {"backend": "local", "isolation": self.mode, "uid": self.uid,
                "network": self.limits.network if self.mode == "namespaces" else True,
                "workdir": self.command_workdir, "uid_note": self.uid_note or None,
                "namespace_problem": getattr(self, "namespace_problem", "") or None}

    def close(self) -> None:
        if getattr(self, "_dir", None) is not None and self._dir.exists():
            _remove_tree(self._dir)

    def __del__(self) -> None:  # best effort; close() is the real API
        try:
            self.close()
        except Exception:
            pass


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return

    def onerror(func: Any, p: str, _exc: Any) -> None:
        # a command may have removed write permission from its own directories
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


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
             hard: int) -> CommandResult:
    """Read the merged output of ``proc`` under a deadline, keeping only its head and tail."""
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
    try:
        while True:
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
    if timed_out or flood or exited_at is not None:
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
                         output_bytes=total, output_truncated=truncated, output_flood=flood)


def make_sandbox(backend: str = "local", **kwargs: Any) -> Sandbox:
    """Build a sandbox by backend name (``"local"`` or ``"docker"``)."""
    if backend == "local":
        return LocalSandbox(**kwargs)
    if backend == "docker":
        from crl_bench.envs.swe.docker_sandbox import DockerSandbox

        return DockerSandbox(**kwargs)
    raise ValueError(f"Unknown sandbox backend {backend!r}. Available: local, docker.")
