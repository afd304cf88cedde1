"""The ``local`` sandbox backend: a confined workspace directory on this machine.

See :mod:`crl_bench.envs.swe.sandbox` for what each isolation mode confines.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from crl_bench.envs.swe.sandbox_base import (MiB, SETUP_ERROR_EXIT, SETUP_ERROR_PREFIX, WORKDIR,
                                             CommandResult, Sandbox, SandboxError,
                                             SandboxLimits, SandboxPathError)
from crl_bench.envs.swe.sandbox_proc import (_base_config, _is_root, _kill_uid, _launch,
                                             _remove_tree, _uid_counter, _world_traversable,
                                             collect_output, default_ro_binds,
                                             namespaces_available)

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

