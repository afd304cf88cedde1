"""The ``docker`` sandbox backend: one container of an SWE-bench harness image per episode.

**Not tested here**: the development machines have no Docker engine. The code is kept small and
uses only the ``docker`` command line. It expects the SWE-bench instance images (built by the
SWE-bench harness, or pulled from Docker Hub as ``swebench/sweb.eval.x86_64.<id>``, where the
``__`` of the instance id is written ``_1776_``): the repository at ``/testbed`` at its base
commit, the conda env ``testbed`` with the test requirements, and git.

Limits: the container has no network (``--network none``), a memory cap and a process cap; each
command runs under ``timeout -s KILL`` inside the container and the ``docker exec`` client is
killed on the host after the same deadline; output is capped like the local backend's.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Mapping

from crl_bench.envs.swe.sandbox_base import (MiB, WORKDIR, CommandResult, Sandbox, SandboxError,
                                             SandboxLimits, SandboxPathError)
from crl_bench.envs.swe.sandbox_proc import collect_output

DEFAULT_IMAGE = "swebench/sweb.eval.x86_64.{docker_id}:latest"
ACTIVATE = "source /opt/miniconda3/bin/activate && conda activate testbed"


@dataclass
class DockerSandbox(Sandbox):
    """A container per episode; ``prepare(image)`` starts it, ``reset()`` starts a fresh one.

    Args:
        limits: per-command limits (``memory_mb`` and ``max_processes`` apply to the container).
        image_template: image name with ``{instance_id}`` / ``{docker_id}`` placeholders.
        docker: the docker CLI.
        activate: shell prefix run before every command (the harness's conda env).
    """

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    image_template: str | None = None
    docker: str = "docker"
    activate: str = ACTIVATE

    def __post_init__(self) -> None:
        self.image_template = self.image_template or DEFAULT_IMAGE
        if shutil.which(self.docker) is None:
            raise SandboxError(f"backend='docker' needs the `{self.docker}` command; install "
                               "Docker or use backend='local'.")
        probe = subprocess.run([self.docker, "info", "--format", "{{.ServerVersion}}"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            raise SandboxError("backend='docker': no Docker engine is reachable "
                               f"({probe.stderr.strip()[:300]}). Start the engine, or use "
                               "backend='local'.")
        self._image: str | None = None
        self._container: str | None = None

    def image_for(self, instance_id: str) -> str:
        return str(self.image_template).format(instance_id=instance_id,
                                               docker_id=instance_id.replace("__", "_1776_"))

    def prepare(self, source: Any) -> None:
        self._image = str(source)
        self.reset()

    def reset(self) -> None:
        if self._image is None:
            raise SandboxError("reset() before prepare(): give the sandbox an image first")
        self._remove()
        cmd = [self.docker, "run", "-d", "--rm", "--network", "none",
               "--memory", f"{self.limits.memory_mb}m", "--pids-limit",
               str(self.limits.max_processes), "-w", WORKDIR, self._image, "sleep", "infinity"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(f"docker run {self._image} failed: {proc.stderr.strip()[:500]}. "
                               "Build or pull the SWE-bench instance image first.")
        self._container = proc.stdout.strip()

    def run(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None,
            env: Mapping[str, str] | None = None,
            output_keep_bytes: int | None = None) -> CommandResult:
        if self._container is None:
            raise SandboxError("run() before prepare()")
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        keep = int(output_keep_bytes or self.limits.output_keep_bytes)
        env_flags = [f"--env={k}={v.replace('{workdir}', WORKDIR)}"
                     for k, v in (env or {}).items()]
        inner = f"{self.activate} >/dev/null 2>&1; {command}"
        cmd = [self.docker, "exec", "-i", "-w", WORKDIR, *env_flags, self._container,
               "timeout", "-s", "KILL", str(int(timeout) + 1), "bash", "-c", inner]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        result = collect_output(proc, stdin, timeout + 5, keep,
                                max(self.limits.output_hard_bytes, keep))
        if result.exit_code == 137 and time.monotonic() - start >= timeout:
            result.timed_out, result.exit_code = True, None
        result.duration_s = time.monotonic() - start
        return result

    def _abs(self, path: str) -> str:
        rel = self.inside_path(path)
        return str(PurePosixPath(WORKDIR) / rel)

    def read_file(self, path: str, max_bytes: int = 4 * MiB) -> str:
        target = shlex.quote(self._abs(path))
        r = self.run(f"if [ -d {target} ]; then exit 3; fi; "
                     f"[ -f {target} ] || exit 2; "
                     f"[ $(stat -c %s {target}) -le {max_bytes} ] || exit 4; cat {target}",
                     timeout_s=60, output_keep_bytes=max_bytes + 1024)
        if r.exit_code == 2:
            raise FileNotFoundError(f"{path}: no such file")
        if r.exit_code == 3:
            raise IsADirectoryError(f"{path} is a directory")
        if r.exit_code == 4:
            raise SandboxPathError(f"{path} is larger than {max_bytes:,} bytes")
        return r.output

    def write_file(self, path: str, text: str) -> None:
        target = shlex.quote(self._abs(path))
        r = self.run(f"mkdir -p \"$(dirname {target})\" && cat > {target}", stdin=text,
                     timeout_s=60)
        if r.exit_code != 0:
            raise SandboxPathError(f"could not write {path}: {r.output.strip()[:300]}")

    def describe(self) -> dict[str, Any]:
        return {"backend": "docker", "image": self._image, "container": self._container,
                "network": False, "workdir": WORKDIR}

    def _remove(self) -> None:
        if self._container:
            subprocess.run([self.docker, "rm", "-f", self._container], capture_output=True)
            self._container = None

    def close(self) -> None:
        self._remove()
