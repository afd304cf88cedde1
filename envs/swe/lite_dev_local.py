"""The ``lite-dev-local`` recipe: SWE-bench Lite dev instances rebuilt from PyPI sdists.

Follows ``../shared/data/swe/README.md``: one shared Python 3.9 venv (the recipe's exact
``tested_freeze`` pins) runs all 11 instances; each workspace is the instance's sdist, unpacked
(CRLF converted where the recipe says so) and committed as the base. Tests import the workspace
through ``PYTHONPATH`` (``<ws>/src`` for marshmallow, ``<ws>`` otherwise).

Network: the first build downloads the venv's packages (~150 MB) and the sdists (~250 MB)
from the package index with pip; both are cached under ``cache_dir()/swe/lite-dev-local``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from crl_bench.envs.swe import workspaces as ws

if TYPE_CHECKING:
    from crl_bench.envs.swe.tasks import LiteDevLocalTaskSet, SWETask


def root_dir() -> Path:
    path = ws.swe_cache_dir() / "lite-dev-local"
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared_venv(task_set: "LiteDevLocalTaskSet") -> Path:
    """The Python 3.9 venv with the recipe's pinned test requirements (built once)."""
    env = task_set.recipes["shared_env"]
    version = env["python"]
    python = ws.find_python(version, task_set.python)
    pins = list(env.get("tested_freeze") or env["requirements"])
    key = hashlib.sha256("\n".join([python, *pins]).encode()).hexdigest()[:12]
    return ws.make_venv(python, root_dir() / f"venv-py{version}-{key}", pins)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sdist(recipe: dict[str, Any]) -> Path:
    """The instance's sdist, downloaded once with ``pip download`` and checked by sha256."""
    dl = root_dir() / "sdists"
    dl.mkdir(exist_ok=True)
    target = dl / recipe["sdist_file"]
    if target.exists() and _sha256(target) == recipe["sdist_sha256"]:
        return target
    with tempfile.TemporaryDirectory(dir=dl) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, recipe["sdist"]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / recipe["sdist_file"]
        if proc.returncode != 0 and not got.exists():
            raise ws.WorkspaceBuildError(f"pip download {recipe['sdist']} failed (the package "
                                         f"index must be reachable once):\n{proc.stderr[-2000:]}")
        if not got.exists():
            found = sorted(p.name for p in Path(tmp).iterdir())
            raise ws.WorkspaceBuildError(f"pip download {recipe['sdist']} did not produce "
                                         f"{recipe['sdist_file']}: {found}")
        digest = _sha256(got)
        if digest != recipe["sdist_sha256"]:
            raise ws.WorkspaceBuildError(f"{recipe['sdist_file']}: sha256 {digest} differs from "
                                         f"the recipe's {recipe['sdist_sha256']}")
        shutil.move(str(got), target)
    return target


def _extract_stripped(tarball: Path, dest: Path) -> None:
    """Unpack a source tarball without its top directory (``tar --strip-components=1``)."""
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts[1:]
            if not parts or any(p == ".." for p in parts) or member.name.startswith("/"):
                continue
            if not (member.isfile() or member.isdir()):
                continue  # sdists need no links or devices
            out = dest.joinpath(*parts)
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            out.write_bytes(src.read())
            out.chmod(0o755 if member.mode & 0o111 else 0o644)


def template(task_set: "LiteDevLocalTaskSet", task: "SWETask") -> Path:
    recipe = task_set.recipe_by_id[task.instance_id]
    tarball = sdist(recipe)

    def build(target: Path) -> None:
        _extract_stripped(tarball, target)
        if recipe.get("crlf_to_lf"):
            for py in target.rglob("*.py"):
                data = py.read_bytes()
                if b"\r\n" in data:
                    py.write_bytes(data.replace(b"\r\n", b"\n"))
        ws.commit_tree(target, f"{task.repo} {recipe['sdist']} (near {task.base_commit[:10]})")

    return ws.build_cached(root_dir() / "templates" / task.instance_id, build)


def runtime_fields(task_set: "LiteDevLocalTaskSet", task: "SWETask") -> dict[str, Any]:
    """The fields of ``task``'s :class:`~crl_bench.envs.swe.tasks.LocalRuntime`."""
    recipe = task_set.recipe_by_id[task.instance_id]
    venv = shared_venv(task_set)
    pythonpath = recipe.get("pythonpath", ".")
    pp = "{workdir}" if pythonpath in (".", "") else "{workdir}/" + pythonpath
    return dict(template=template(task_set, task), venv=venv,
                ro_binds=(ws.interpreter_prefix_of_venv(venv),),
                env={"PYTHONPATH": pp}, test_command=recipe["test_command"])
