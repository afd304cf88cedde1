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
    * **unsafe-rlimits** (only when asked for by this name; ``auto`` refuses to start without
      namespaces and says how to fix it): working directory, scrubbed environment, rlimits and
      a uid drop when root. Weaker: files outside the workspace stay readable, world-writable
      places (``/tmp``) writable, the network reachable.

    Always: a wall-clock limit (the whole process group, or the whole PID namespace, is killed),
    rlimits on CPU seconds, address space, processes and file size, an output cap (only the
    head and tail are kept; a command that floods past the hard cap is stopped), a memory cap
    for the whole sandbox (a cgroup, or a processes x memory budget) and a disk quota.

``docker`` (:class:`crl_bench.envs.swe.docker_sandbox.DockerSandbox`)
    A container of the SWE-bench harness image of the instance; see that module.
"""

from __future__ import annotations

from typing import Any

from crl_bench.envs.swe.sandbox_base import (  # noqa: F401  (the public names live here)
    SETUP_ERROR_EXIT, SETUP_ERROR_PREFIX, WORKDIR, MiB, CommandResult, PatchTooLargeError, Sandbox,
    SandboxError, SandboxLimits, SandboxPathError, omission_marker, truncate_middle)
from crl_bench.envs.swe.sandbox_proc import (  # noqa: F401
    EXIT_GRACE_S, LAUNCHER, collect_output, default_ro_binds, namespaces_available)
from crl_bench.envs.swe.local_sandbox import THREAD_ENV, LocalSandbox  # noqa: F401


def make_sandbox(backend: str = "local", **kwargs: Any) -> Sandbox:
    """Build a sandbox by backend name (``"local"`` or ``"docker"``)."""
    if backend == "local":
        return LocalSandbox(**kwargs)
    if backend == "docker":
        from crl_bench.envs.swe.docker_sandbox import DockerSandbox

        return DockerSandbox(**kwargs)
    raise ValueError(f"Unknown sandbox backend {backend!r}. Available: local, docker.")
