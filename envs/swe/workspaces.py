"""Building what a local sandbox needs: workspace templates (git repositories at the task's base)
and the Python environments the tests run in.

Everything built here is cached under ``crl_bench.data.cache_dir() / "swe"`` and built
atomically (into a temporary sibling, then renamed), so parallel processes can share it.

A template is a git repository with **one** commit, the task's base: no history that could
leak the fix (``git log -p`` shows nothing but the base).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

GIT_ENV = {
    "GIT_AUTHOR_NAME": "crl-bench", "GIT_AUTHOR_EMAIL": "swe@crl-bench.invalid",
    "GIT_COMMITTER_NAME": "crl-bench", "GIT_COMMITTER_EMAIL": "swe@crl-bench.invalid",
    # Fixed dates make the base commit hash a function of the tree alone.
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
}
GIT_OPTS = ("-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "commit.gpgsign=false",
            "-c", "init.defaultBranch=main", "-c", "safe.directory=*")


class WorkspaceBuildError(RuntimeError):
    """A template or environment could not be built; the message says what failed."""


def swe_cache_dir() -> Path:
    from crl_bench.data import cache_dir

    path = cache_dir() / "swe"
    path.mkdir(parents=True, exist_ok=True)
    return path


def git(args: list[str], cwd: Path, stdin: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run host git with a fixed identity and no user/system config."""
    if shutil.which("git") is None:
        raise WorkspaceBuildError("git is not installed; the SWE env needs it "
                                  "(e.g. apt-get install git)")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV}
    proc = subprocess.run(["git", *GIT_OPTS, *args], cwd=cwd, input=stdin, text=True,
                          capture_output=True, env=env)
    if check and proc.returncode != 0:
        raise WorkspaceBuildError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stderr.strip()}")
    return proc


def commit_tree(directory: Path, message: str = "base") -> str:
    """Make ``directory`` a git repository with one commit of its content; return the hash."""
    if (directory / ".git").exists():
        shutil.rmtree(directory / ".git")
    git(["init", "-q"], directory)
    git(["add", "-A", "."], directory)
    git(["commit", "-q", "--no-verify", "-m", message], directory)
    return git(["rev-parse", "HEAD"], directory).stdout.strip()


def apply_patch(directory: Path, patch: str, reverse: bool = False) -> None:
    """``git apply`` (optionally ``-R``) a patch to a directory (a repository or not)."""
    args = ["apply", "--whitespace=nowarn"] + (["-R"] if reverse else []) + ["-"]
    proc = git(args, directory, stdin=patch, check=False)
    if proc.returncode != 0:
        raise WorkspaceBuildError(f"git apply {'-R ' if reverse else ''}failed in {directory}:\n"
                                  f"{proc.stderr.strip()}")


def build_cached(final: Path, build: Callable[[Path], None]) -> Path:
    """Build ``final`` once, in place, under a file lock shared by all processes.

    ``build(final)`` gets an empty directory. A ``.ready`` marker next to ``final`` says the
    build completed; a half-built directory (a crash) is removed and rebuilt. Built in place
    because venvs embed their own path (script shebangs, ``activate``).
    """
    import fcntl

    marker = final.with_name(final.name + ".ready")
    if marker.exists() and final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and final.exists():
            return final
        if final.exists():
            shutil.rmtree(final)
        final.mkdir()
        try:
            build(final)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        marker.write_text("ok\n")
    return final


def tree_digest(root: Path, patterns: Iterable[str] = ("**/*",)) -> str:
    """A short sha256 over the relative paths and bytes of the files under ``root``."""
    h = hashlib.sha256()
    files = sorted({p for pat in patterns for p in root.glob(pat) if p.is_file()
                    and "__pycache__" not in p.parts})
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Python environments
# ---------------------------------------------------------------------------------------------

def base_interpreter() -> str:
    """The interpreter this process's venv (if any) was made from."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def interpreter_prefix(python: str) -> str:
    """``sys.base_prefix`` of another interpreter (the directory to bind into a sandbox)."""
    proc = subprocess.run([python, "-I", "-c", "import sys; print(sys.base_prefix)"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise WorkspaceBuildError(f"{python} does not run: {proc.stderr.strip()}")
    return os.path.realpath(proc.stdout.strip())


@functools.lru_cache(maxsize=None)
def interpreter_prefix_of_venv(venv: Path) -> str:
    """The base interpreter prefix a venv runs on (bound read-only next to the venv)."""
    return interpreter_prefix(str(Path(venv) / "bin" / "python"))


def _requirement_closure(roots: Iterable[str]) -> list[importlib.metadata.Distribution]:
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise WorkspaceBuildError(f"{name} is needed in the SWE test venv but is not installed "
                                      f"here; pip install {name}") from None
        found[key] = dist
        for req_text in dist.requires or []:
            req = Requirement(req_text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def pytest_venv() -> Path:
    """A small venv of this interpreter holding only pytest and its dependencies.

    The files are copied from this process's environment (no network). The ``mini`` tasks run
    their tests in it; it is bound read-only into each sandbox.
    """
    dists = _requirement_closure(["pytest"])
    base = base_interpreter()
    key = hashlib.sha256("|".join([base, *sorted(f"{d.metadata['Name']}=={d.version}"
                                                  for d in dists)]).encode()).hexdigest()[:12]
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    final = swe_cache_dir() / "venvs" / f"pytest-py{ver}-{key}"

    def build(target: Path) -> None:
        proc = subprocess.run([base, "-m", "venv", "--without-pip", "--clear", str(target)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise WorkspaceBuildError(f"could not create a venv with {base}: {proc.stderr}")
        site = Path(subprocess.run(
            [str(target / "bin" / "python"), "-I", "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True).stdout.strip())
        for dist in dists:
            root = Path(str(dist.locate_file(""))).resolve()
            for rel in dist.files or []:
                src = Path(str(dist.locate_file(rel))).resolve()
                if root not in src.parents or not src.is_file() or src.suffix == ".pyc":
                    continue
                dest = site / src.relative_to(root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)

    return build_cached(final, build)


def find_python(version: str, explicit: str | None = None) -> str:
    """Find an interpreter of ``version`` ("3.9"): ``explicit``, ``pythonX.Y`` on PATH (pyenv
    shims resolved), or a pyenv install. Returns the real executable path.

    Raises:
        WorkspaceBuildError: none found; the message says how to install one.
    """
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in
                         (pyenv_root / "versions").glob(f"{version}.*/bin/python{version}"))
    candidates.append(f"/usr/bin/python{version}")
    for cand in candidates:
        if not cand or not os.path.exists(cand):
            continue
        proc = subprocess.run([cand, "-I", "-c", "import sys; print(sys.executable); "
                               "print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
        lines = proc.stdout.split()
        if proc.returncode == 0 and len(lines) == 2 and lines[1] == version:
            return os.path.realpath(lines[0])
        if explicit and cand == explicit:
            raise WorkspaceBuildError(f"python={explicit} is not Python {version}")
    raise WorkspaceBuildError(
        f"No Python {version} found (tried python{version} on PATH, pyenv under {pyenv_root}, "
        f"/usr/bin). Install one (e.g. `pyenv install {version}` or `uv python install "
        f"{version}`), or pass python=/path/to/python{version}.")


def make_venv(python: str, final: Path, requirements: list[str]) -> Path:
    """A venv of ``python`` at ``final`` with ``requirements`` installed from the package index."""
    def build(target: Path) -> None:
        for cmd in ([python, "-m", "venv", "--clear", str(target)],
                    [str(target / "bin" / "python"), "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", *requirements]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise WorkspaceBuildError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-3000:]}")

    return build_cached(final, build)


def copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
