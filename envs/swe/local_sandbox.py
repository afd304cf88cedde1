"""The ``local`` sandbox backend: a confined workspace directory on this machine.

See :mod:`crl_bench.envs.swe.sandbox` for what each isolation mode confines.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from crl_bench.envs.swe.sandbox_base import (MiB, SETUP_ERROR_EXIT, SETUP_ERROR_PREFIX, WORKDIR,
                                             CommandResult, PatchTooLargeError, Sandbox,
                                             SandboxError, SandboxLimits, SandboxPathError,
                                             process_reserve_mb)
from crl_bench.envs.swe.sandbox_fs import (QuotaWatch, changed_bytes, chown_tree, fs_usage,
                                           mount_quota_fs, remove_tree, tree_usage)
from crl_bench.envs.swe.sandbox_proc import (OWNER_FILE, WORKSPACE_PREFIX, _base_config,
                                             _is_root, _kill_uid, _launch, _uid_counter,
                                             _world_traversable, clean_stale_workspaces,
                                             collect_output, default_ro_binds,
                                             make_memory_cgroup, memory_events, memory_usage,
                                             namespaces_available, owner_record, remove_cgroup,
                                             sandbox_parent_cgroup, task_data_paths)

ISOLATIONS = ("auto", "namespaces", "unsafe-rlimits")

THREAD_ENV = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                     "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS")}


@dataclass
class LocalSandbox(Sandbox):
    """A workspace directory on this machine; commands confined as the module docstring says.

    Args:
        limits: per-command limits.
        isolation: ``"auto"`` or ``"namespaces"`` (both: namespaces, and a
            :class:`SandboxError` that names the fixes when the OS refuses them; ``auto`` never
            falls back silently), or ``"unsafe-rlimits"``: no namespaces, only rlimits, a
            scrubbed environment and a uid drop when root (host files stay readable, the
            network reachable; for trusted code or hosts without namespaces, by explicit
            choice).
        venv: a virtual environment (or any interpreter prefix) whose ``bin`` goes first on
            ``PATH``; it is bound read-only into the sandbox.
        ro_binds: more host paths to make visible read-only (e.g. a base interpreter prefix).
        env: extra environment variables for every command (``PYTHONPATH``, ...).
        base_dir: where workspaces are created (default: the system temp dir).
        uid: the uid commands run under when the host is root (default: one per sandbox, from
            a high range that no login user has).
        use_cgroup: cap the sandbox's memory with a cgroup where the host allows it (else, or
            when False, the process budget of :class:`SandboxLimits` applies).
        hide: host paths covered with an empty folder inside the sandbox, on top of
            crl-bench's own package folders, which are always covered (the task data with the
            gold patches lives there when crl-bench is installed from a wheel).

    Workspaces live in ``<base_dir>/crl-swe-<pid>-*`` with an owner file; a new sandbox removes
    those of processes that are gone (a killed run).
    """

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: str = "auto"
    venv: str | None = None
    ro_binds: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    base_dir: str | None = None
    uid: int | None = None
    use_cgroup: bool = True
    hide: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.isolation == "rlimits":
            raise ValueError("isolation='rlimits' was renamed isolation='unsafe-rlimits': without "
                             "namespaces commands can read the host's files (the task data with "
                             "its gold patches included) and use the network.")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got "
                             f"{self.isolation!r}.")
        self.namespace_problem = ""
        if self.isolation == "unsafe-rlimits":
            self.mode = "unsafe-rlimits"
        else:
            ok, why = namespaces_available()
            if not ok:
                raise SandboxError(
                    f"isolation={self.isolation!r}: namespaces are not available here ({why}), "
                    "and without them agent commands would run unconfined (host files readable, "
                    "network on). Fix: run as root or enable unprivileged user namespaces "
                    "(sysctl kernel.unprivileged_userns_clone=1 / "
                    "kernel.apparmor_restrict_unprivileged_userns=0), or use backend='docker', "
                    "or accept the risk explicitly with isolation='unsafe-rlimits'.")
            self.mode = "namespaces"
        self.uid_note = ""
        if _is_root() and self.uid is None:
            self.uid = 2_000_000 + (os.getpid() % 100_000) * 16 + next(_uid_counter) % 16
        if not _is_root():
            self.uid = None  # only root can switch uid
        elif self.mode == "unsafe-rlimits":
            # Without a fresh root the sandbox uid sees the host's permissions: a venv under a
            # private home (/root is 0700) would not even start. Keep root then, and say so.
            hidden = [p for p in (self.venv, *self.ro_binds) if p and not _world_traversable(p)]
            if hidden:
                self.uid = None
                self.uid_note = (f"commands run as root: {hidden[0]} is not reachable by "
                                 "other users, so the sandbox uid could not use it")
        self.stale_removed = clean_stale_workspaces(self.base_dir)
        owner = owner_record()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{owner['pid']}-",
                                          dir=self.base_dir))
        lim = self.limits
        self._setup_memory(owner)
        # A tmpfs quota is RAM: only where the sandbox's memory cgroup (inside the parent that
        # bounds all sandboxes of the host) is charged for its pages. The owner file and the
        # empty mount skeleton take a few inodes and blocks of their own.
        why = (mount_quota_fs(self._dir, lim.disk_mb * MiB + 64 * 1024, lim.max_inodes + 8)
               if self._cgroup is not None else
               "no memory cgroup to charge a tmpfs to, so the files stay on disk")
        self.quota_fs = not why
        self.quota_note = (f"tmpfs of {lim.disk_mb:,} MiB and {lim.max_inodes:,} inodes, "
                           "charged to the sandbox's memory" if self.quota_fs
                           else f"checked while commands run ({why})")
        (self._dir / OWNER_FILE).write_text(json.dumps(owner))
        self.ws = self._dir / "testbed"
        self.tmp = self._dir / "tmp"
        self.root = self._dir / "root"
        for d in (self.ws, self.tmp, self.root):
            d.mkdir()
        self._source: Path | None = None
        self._ro = default_ro_binds(tuple(self.ro_binds) + ((self.venv,) if self.venv else ()))
        self._hide = task_data_paths(tuple(self.hide))
        self._own(self._dir)
        if self.uid is not None:
            os.lchown(self._dir / OWNER_FILE, os.getuid(), os.getgid())

    def _setup_memory(self, owner: dict[str, Any]) -> None:
        """A memory cgroup for the whole sandbox, else a process budget (see SandboxLimits)."""
        lim = self.limits
        self._cgroup: Path | None = None
        self._max_processes = lim.max_processes
        self.budget_mb = 0
        if self.use_cgroup:
            name = f"{WORKSPACE_PREFIX}{owner['pid']}-{owner['start']}-{self._dir.name[-8:]}"
            self._cgroup, why = make_memory_cgroup(name, lim.sandbox_memory_mb * MiB)
        else:
            why = "use_cgroup=False"
        if self._cgroup is not None:
            self.budget_mb = sandbox_parent_cgroup()[2] // MiB
            self.memory_note = (f"memory cgroup {self._cgroup}: {lim.sandbox_memory_mb} MiB for "
                                f"the whole sandbox (its workspace files included), "
                                f"{lim.memory_mb} MiB address space per process; all sandboxes "
                                f"of this host together: {self.budget_mb:,} MiB "
                                f"({self._cgroup.parent})")
            return
        budget = max(1, lim.sandbox_memory_mb // lim.memory_mb)
        self._max_processes = min(lim.max_processes, budget)
        self.memory_note = (f"no memory cgroup ({why}): at most {self._max_processes} processes "
                            f"x {lim.memory_mb} MiB address space <= {lim.sandbox_memory_mb} MiB")
        if self.uid is None and _is_root():
            self.memory_note += " (NOT enforced: commands run as root, which RLIMIT_NPROC exempts)"

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
            remove_tree(d)
        shutil.copytree(self._source, self.ws, symlinks=True)
        self.tmp.mkdir()
        self._own(self.ws)
        self._own(self.tmp)

    def _own(self, top: Path) -> None:
        if self.uid is not None:
            chown_tree(top, self.uid)

    def host_path(self, path: str) -> Path:
        """The host path of an agent path, after checking it stays inside the workspace.

        Symlinks are resolved, so a link that points outside is refused too.
        """
        if self.mode == "unsafe-rlimits" and path.startswith(str(self.ws)):
            path = WORKDIR + path[len(str(self.ws)):]  # the host path commands see here
        rel = self.inside_path(path)
        if len(rel.parts) > self.limits.max_path_depth:
            raise SandboxPathError(f"{path[:200]} is {len(rel.parts)} levels deep; the limit is "
                                   f"{self.limits.max_path_depth}")
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
        lim = self.limits
        quota = lim.disk_mb * MiB
        used_before = fs_usage(self._dir)[0] if self.quota_fs else \
            tree_usage(self.ws, self.tmp).bytes
        left = max(0, quota - used_before)
        watch = None if self.quota_fs else QuotaWatch((self.ws, self.tmp), quota, lim.max_inodes)
        cfg = _base_config(self.mode, str(self.root), str(self.ws), str(self.tmp), self._ro,
                           self.limits, uid=self.uid, command=command,
                           env=self.command_env(env), timeout_s=timeout,
                           fsize_bytes=min(self.limits.max_file_mb * MiB,
                                           quota if self.quota_fs else left),
                           max_processes=self._max_processes,
                           cgroup_procs=str(self._cgroup / "cgroup.procs") if self._cgroup
                           else None, hide=self._hide)
        events = self._memory_events()
        start = time.monotonic()
        try:
            proc = _launch(cfg)
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox launcher: {exc}") from exc
        result = collect_output(proc, stdin, timeout, keep, hard, watch=watch)
        if self.mode == "unsafe-rlimits" and self.uid is not None:
            _kill_uid(self.uid)  # what setsid/double-fork took out of the process group
        result.duration_s = time.monotonic() - start
        notes = (result.note, self._memory_note(events), self._after_command(left))
        result.note = "; ".join(n for n in notes if n)
        if result.exit_code == SETUP_ERROR_EXIT and result.output.startswith(SETUP_ERROR_PREFIX):
            raise SandboxError(f"the sandbox could not start the command: {result.output.strip()}")
        return result

    def _memory_events(self) -> tuple[dict[str, int], dict[str, int]] | None:
        if self._cgroup is None:
            return None
        return memory_events(self._cgroup), memory_events(self._cgroup.parent)

    def _memory_note(self, before: tuple[dict[str, int], dict[str, int]] | None) -> str:
        """Why a process of the command was killed for memory, if one was (else '')."""
        if before is None or self._cgroup is None:
            return ""
        own = memory_events(self._cgroup)
        if own["oom_kill"] <= before[0]["oom_kill"]:
            return ""
        files = fs_usage(self._dir)[0] if self.quota_fs else 0
        held = f" (the workspace's files hold {files / MiB:,.1f} MiB of it)" if files else ""
        # (cgroup v1 counts neither hit in memory.failcnt here: the parent's use tells)
        in_use = memory_usage(self._cgroup.parent)
        reserve = process_reserve_mb(self.limits.sandbox_memory_mb) * MiB
        if in_use >= self.budget_mb * MiB - reserve:
            return (f"a process was killed: the memory of all sandboxes on this host together "
                    f"({self.budget_mb:,} MiB; {in_use / MiB:,.0f} MiB in use) ran out{held}; "
                    "other sandboxes' files count too: commands may fail until files are "
                    "removed or episodes end")
        return (f"a process was killed: this sandbox's memory ({self.limits.sandbox_memory_mb:,} "
                f"MiB for all its processes and files) ran out{held}")

    def _after_command(self, left_before: int) -> str:
        """Remove folders nested past ``max_path_depth``; say how the quotas stand."""
        lim = self.limits
        walk = tree_usage(self.ws, self.tmp, max_depth=lim.max_path_depth)
        notes = []
        if walk.too_deep:
            for folder in walk.too_deep:
                remove_tree(folder)
            notes.append(f"folders nested more than {lim.max_path_depth} levels deep were "
                         f"removed ({len(walk.too_deep)}, e.g. "
                         f"{os.path.relpath(walk.too_deep[0], self._dir)[:120]}...)")
        used, inodes = fs_usage(self._dir) if self.quota_fs else (walk.bytes, walk.inodes)
        full = used >= lim.disk_mb * MiB - 64 * 1024 or inodes >= lim.max_inodes
        if full:
            notes.append(f"the workspace holds {used / MiB:,.1f} MiB in {inodes:,} files and "
                         f"folders; its quota is {lim.disk_mb:,} MiB and {lim.max_inodes:,}: "
                         "nothing more can be written until you remove files")
        elif left_before == 0:
            notes.append("no disk quota was left for this command: files could not grow")
        return "; ".join(notes)

    def workspace_diff(self, timeout_s: float = 120.0, max_bytes: int = 16 * MiB) -> str:
        """The workspace's changes against the template it was made from, as a binary git diff.

        Memory stays bounded by ``max_bytes`` whatever the workspace holds: a workspace whose
        new or changed files hold more than ``4 * max_bytes`` is refused before git reads any
        of it, and the diff is read from git in pieces and refused once it passes
        ``2 * max_bytes`` (the caller's own patch limit then applies to what it keeps).

        Runs host git with a git folder of its own (the template's objects as alternates, no
        hooks, no config from the workspace) on the workspace as work tree, with every file
        added, ignored ones included: ``.git/info/exclude``, ``.gitignore`` or the agent's own
        commits cannot hide a file, and nothing in the workspace's ``.git`` runs on the host.
        """
        if self._source is None:
            raise SandboxError("workspace_diff() before prepare()")
        from crl_bench.envs.swe.workspaces import GIT_ENV, GIT_OPTS

        walk = tree_usage(self.ws, max_depth=self.limits.max_path_depth, git_top=self.ws)
        if walk.nested_git:
            rel = os.path.relpath(walk.nested_git[0], self.ws)
            raise SandboxError(f"the workspace holds a nested .git ({rel[:200]}); host git does "
                               "not read repositories inside the workspace. Remove it "
                               f"(run rm -rf {rel[:200]}).")
        if walk.too_deep:
            raise SandboxError(f"folders are nested more than {self.limits.max_path_depth} "
                               "levels deep; remove them")
        input_cap, output_cap = 4 * max_bytes, 2 * max_bytes
        changed = changed_bytes(self.ws, Path(self._source), input_cap,
                                max_depth=self.limits.max_path_depth)
        if changed > input_cap:
            raise PatchTooLargeError(
                f"the workspace's new and changed files hold over {input_cap:,} bytes "
                f"({changed / MiB:,.1f} MiB counted so far); not diffed", changed,
                f"Your patch would be over the {max_bytes:,}-byte limit: your new and changed "
                f"files hold {changed:,} bytes or more (over four times the limit), so they were "
                "not diffed. Remove large files you made (find /testbed -size +1M -newer "
                "/testbed/.git/HEAD) and submit again.")
        with tempfile.TemporaryDirectory(prefix="crl-swe-diff-") as tmp:
            gitdir = Path(tmp) / "git"
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, **GIT_ENV,
                   "GIT_DIR": str(gitdir), "GIT_CEILING_DIRECTORIES": str(self._dir),
                   "GIT_DISCOVERY_ACROSS_FILESYSTEM": "0"}
            opts = [*GIT_OPTS, "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
                    "-c", "core.untrackedCache=false", "-c", "core.symlinks=true",
                    "-c", "core.excludesFile=/dev/null", "-c", "status.showUntrackedFiles=all"]
            deadline = time.monotonic() + timeout_s

            def git(*args: str, tree: Path, index: str) -> str:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"computing the patch took over {timeout_s:g} s")
                try:
                    proc = subprocess.run(["git", *opts, f"--work-tree={tree}", *args], cwd=tree,
                                          env={**env, "GIT_INDEX_FILE": str(Path(tmp) / index)},
                                          capture_output=True, timeout=left)
                except subprocess.TimeoutExpired:
                    raise SandboxError(f"computing the patch took over {timeout_s:g} s") from None
                if proc.returncode != 0:
                    raise SandboxError(f"git {args[0]} failed while computing the patch: "
                                       + proc.stderr.decode("utf-8", "replace")[-500:])
                return proc.stdout.decode("utf-8", "surrogateescape")

            subprocess.run(["git", "init", "-q", "--bare", str(gitdir)], env=env, check=True,
                           capture_output=True)
            objects = Path(self._source) / ".git" / "objects"
            if objects.is_dir():
                (gitdir / "objects" / "info" / "alternates").write_text(f"{objects}\n")
            trees = []
            for tree, index in ((Path(self._source), "base.index"), (self.ws, "ws.index")):
                git("add", "-A", "-f", "--", ".", tree=tree, index=index)
                trees.append(git("write-tree", tree=tree, index=index).strip())
            return _capped_output(
                ["git", *opts, f"--work-tree={self.ws}", "diff-tree", "-r", "-p", "--binary",
                 "--no-renames", "--full-index", trees[0], trees[1]], cwd=self.ws,
                env={**env, "GIT_INDEX_FILE": str(Path(tmp) / "ws.index")},
                deadline=deadline, timeout_s=timeout_s, cap=output_cap, max_bytes=max_bytes)

    def describe(self) -> dict[str, Any]:
        return {"backend": "local", "budget_mb": self.budget_mb or None,
                "isolation": self.mode, "uid": self.uid,
                "network": self.limits.network if self.mode == "namespaces" else True,
                "workdir": self.command_workdir, "uid_note": self.uid_note or None,
                "namespace_problem": self.namespace_problem or None,
                "memory": self.memory_note, "disk_mb": self.limits.disk_mb,
                "max_inodes": self.limits.max_inodes, "quota": self.quota_note}

    def close(self) -> None:
        # the files first: tmpfs pages stay charged to the cgroup (and its parent) until freed
        if getattr(self, "_dir", None) is not None and self._dir.exists():
            remove_tree(self._dir)
        if getattr(self, "_cgroup", None) is not None:
            remove_cgroup(self._cgroup)  # type: ignore[arg-type]
            self._cgroup = None

    def __del__(self) -> None:  # best effort; close() is the real API
        try:
            self.close()
        except Exception:
            pass


def _capped_output(cmd: list[str], *, cwd: Path, env: dict[str, str], deadline: float,
                   timeout_s: float, cap: int, max_bytes: int) -> str:
    """Run ``cmd`` and return its stdout, read in pieces: over ``cap`` bytes it is killed and
    refused, so the whole output is never held (the workspace diff's byte cap). stderr goes
    to a file (a pipe nobody reads while stdout is read would stop the command once full), of
    which the tail is kept for the error."""
    errfile = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=errfile)
    assert proc.stdout is not None
    out = bytearray()
    try:
        fd = proc.stdout.fileno()
        while True:
            if time.monotonic() > deadline:
                raise SandboxError(f"computing the patch took over {timeout_s:g} s")
            ready, _w, _x = select.select([fd], [], [], min(1.0, max(0.0, deadline -
                                                                     time.monotonic())))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out += chunk
            if len(out) > cap:
                raise PatchTooLargeError(
                    f"the patch is over {cap:,} bytes; not read further", len(out),
                    f"Your patch is more than {cap:,} bytes, over the {max_bytes:,}-byte limit: "
                    "it was not graded (large generated or binary files? remove them and "
                    "submit again).")
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise SandboxError(f"computing the patch took over {timeout_s:g} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        errfile.seek(max(0, errfile.seek(0, os.SEEK_END) - 500))
        err = errfile.read()
        errfile.close()
    if code != 0:
        raise SandboxError("git diff-tree failed while computing the patch: "
                           + err.decode("utf-8", "replace"))
    return out.decode("utf-8", "surrogateescape")
