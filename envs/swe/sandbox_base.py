"""The sandbox interface shared by the backends: limits, command results, path rules.

See :mod:`crl_bench.envs.swe.sandbox` for the backends and what each confines.
"""

from __future__ import annotations

import math
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Mapping

SETUP_ERROR_PREFIX = "crl-sandbox setup error: "  # same text as in _sandbox_launcher.py
SETUP_ERROR_EXIT = 250
WORKDIR = "/testbed"  # where the repository appears to commands (as in SWE-bench's images)

MiB = 1024 * 1024

class SandboxError(RuntimeError):
    """The sandbox itself failed (not the agent's command); the message says what to fix."""


class PatchTooLargeError(SandboxError):
    """The workspace's changes are too large to diff or grade (checked before they are held)."""

    def __init__(self, message: str, bytes_seen: int, note: str) -> None:
        super().__init__(message)
        self.bytes_seen = bytes_seen  # what was counted before stopping
        self.note = note  # for the agent: what was too large, and the fix


class SandboxPathError(ValueError):
    """A path the agent gave points outside the workspace or cannot be used."""


def default_sandbox_memory_mb(meminfo: str = "/proc/meminfo") -> int:
    """16 GiB, or a quarter of the host's memory (``MemTotal``) if that is less (at least 1 GiB).

    Several sandboxes run side by side (one per env); a fixed 16 GiB each would let two of them
    take a 24 GiB host down.
    """
    try:
        with open(meminfo) as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 16384
    return max(1024, min(16384, kib // 1024 // 4))


DEFAULT_DISK_MB = 4096


def process_reserve_mb(sandbox_memory_mb: int) -> int:
    """Memory of a sandbox kept for its commands whatever its files take (a quarter, >= 64)."""
    return max(64, sandbox_memory_mb // 4)


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
        sandbox_memory_mb: memory of the whole sandbox (all processes of a command together),
            MiB. Enforced by a memory cgroup where the host allows one; otherwise by a process
            budget: at most ``sandbox_memory_mb // memory_mb`` processes, each capped at
            ``memory_mb`` (``LocalSandbox.describe()["memory"]`` says which).
            The default is 16 GiB or a quarter of the host's memory, whichever is less.
        disk_mb: bytes the workspace and the sandbox's ``/tmp`` may hold together, MiB. Files
            on the quota tmpfs are memory charged to the sandbox, so they must leave room for
            commands: ``disk_mb + shm_mb`` may take at most ``sandbox_memory_mb`` less a
            reserve (:func:`process_reserve_mb`: a quarter of it, at least 64 MiB), or a full
            workspace would leave no memory to run even ``rm``. ``None`` (the default): 4096
            or what that rule leaves, whichever is less.
        max_inodes: files, folders and links they may hold together.
            Both quotas hold while a command runs: where the host lets this process mount
            (root), the sandbox folder is a tmpfs of exactly that size and inode count and the
            kernel refuses the write that would go over; elsewhere the tree is measured while
            the command runs and the command is stopped when it is over
            (:mod:`crl_bench.envs.swe.sandbox_fs`). ``RLIMIT_FSIZE`` is also lowered to what is
            left, so one file cannot pass it.
        max_path_depth: folders nested deeper than this below the workspace are removed after
            the command (and the command's note says so): host tools and git stay within
            their path limits.
    """

    timeout_s: float = 60.0
    cpu_s: float | None = None
    memory_mb: int = 2048
    max_processes: int = 256
    max_file_mb: int = 256
    output_keep_bytes: int = 2 * MiB
    output_hard_bytes: int = 32 * MiB
    network: bool = False
    shm_mb: int = 64
    sandbox_memory_mb: int = field(default_factory=default_sandbox_memory_mb)
    disk_mb: int | None = None
    max_inodes: int = 200_000
    max_path_depth: int = 128

    def __post_init__(self) -> None:
        names = ("timeout_s", "memory_mb", "max_processes", "max_file_mb", "output_keep_bytes",
                 "output_hard_bytes", "shm_mb", "sandbox_memory_mb", "max_inodes",
                 "max_path_depth") + (("disk_mb",) if self.disk_mb is not None else ())
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive (a finite number), got "
                                 f"{str(value)[:80]}.")
        reserve = process_reserve_mb(int(self.sandbox_memory_mb))
        room = int(self.sandbox_memory_mb) - reserve - int(self.shm_mb)
        if room < 1:
            raise ValueError(
                f"SandboxLimits.sandbox_memory_mb={self.sandbox_memory_mb} leaves no room for "
                f"files: {reserve} MiB are kept for commands and shm_mb={self.shm_mb} for "
                "/dev/shm. Raise sandbox_memory_mb or lower shm_mb.")
        if self.disk_mb is None:
            object.__setattr__(self, "disk_mb", min(DEFAULT_DISK_MB, room))
        elif self.disk_mb > room:
            raise ValueError(
                f"SandboxLimits.disk_mb={self.disk_mb} with shm_mb={self.shm_mb} would let the "
                f"sandbox's files take its whole memory (sandbox_memory_mb="
                f"{self.sandbox_memory_mb}): a full workspace would leave no room to run even "
                f"rm. Files may take at most {max(room, 0)} MiB here (the memory less "
                f"{reserve} MiB kept for commands, less the /dev/shm size): lower disk_mb or "
                "shm_mb, or raise sandbox_memory_mb.")
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
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def status_line(self, limits: SandboxLimits | None = None) -> str:
        """One line that says how the command ended (for the agent's observation)."""
        line = self._status(limits)
        return f"{line}\n[{self.note}]" if self.note else line

    def _status(self, limits: SandboxLimits | None) -> str:
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

