"""Grading a workspace so that the agent's own code cannot fake the result.

What the SWE-bench harness does (``run_evaluation``): take the model's patch, apply it to a
*fresh* copy of the repository at the base commit, reset the test files, apply the test patch,
run the test command. Here too, plus what the harness leaves open:

1. **The patch** is computed on the host against the template the workspace was made from,
   every file included (ignored ones too: ``.git/info/exclude`` or the agent's commits hide
   nothing), by git with a git folder of its own (nothing in the workspace's ``.git`` runs).
   Over ``max_patch_bytes`` it is reported as too large and graded as failing, never cut.
2. **Files that can hook the test run** are left out of what is applied (and listed in
   ``info["grading"]["excluded"]``; the stored patch still shows them): ``conftest.py``
   anywhere, ``sitecustomize``/``usercustomize``, ``*.pth``, pytest's config files
   (``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``), byte-code caches, and new
   top-level modules on the import path (the repository root and ``PYTHONPATH`` folders) named
   like pytest, its dependencies or the standard library (``pytest.py``, ``_pytest/``, ...).
3. **A fresh tree**: the sandbox is reset to the template, the remaining patch applied; nothing
   the agent left behind (processes, caches, ``.git`` changes) is there.
4. **A fresh process**: the tests run with an explicit environment (no inherited variables,
   ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, ``PYTHONNOUSERSITE=1``, a private byte-code cache
   prefix, ``PYTHONPATH`` only the repository's source folders).
5. **Results not from the log**: a small driver (``python -c``) imports pytest before any code
   of the repository, runs ``pytest.main`` with a collector plugin that records each test's
   setup/call/teardown outcomes (the worst wins; ``SKIPPED`` never passes), then writes one line
   ``CRL-GRADE <nonce> <json>`` straight to fd 1 and leaves with ``os._exit`` (no ``atexit``
   handler of the agent runs after it). The nonce comes on stdin, is never in ``argv`` or the
   environment, and exactly one line must carry it. The driver also reports pytest plugins
   registered from files the patch changed, and pytest internals (report classes, the runner)
   that were replaced during the run; either makes the grade fail.

Residual threat (documented, not solved): the repository's code runs inside the test process.
Code written to target this driver specifically (finding the nonce in memory, patching pytest
in ways the checks above do not see, or a repository that *is* pytest) can still forge a pass.
The harness of SWE-bench has the same exposure, without the checks above.
"""

from __future__ import annotations

import codecs
import json
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Iterable

from crl_bench.envs.swe.grading import GradeReport, grade, parse_pytest_log
from crl_bench.envs.swe.sandbox import MiB, Sandbox, SandboxError

HOOK_FILES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                        "pyproject.toml"})
CACHE_PARTS = frozenset({"__pycache__", ".pytest_cache"})
SHADOWED = frozenset({"pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging",
                      "exceptiongroup", "tomli", "colorama", "attr", "attrs", "six",
                      "typing_extensions", "importlib_metadata", "zipp", "more_itertools",
                      "atomicwrites", "wcwidth", "sitecustomize", "usercustomize"}
                     | set(getattr(sys, "stdlib_module_names", ())))
DEFAULT_MAX_PATCH_BYTES = 16 * MiB

DRIVER = r'''
import os, sys, json
def _driver():
    w, leave, dumps = os.write, os._exit, json.dumps
    nonce = sys.stdin.readline().strip()
    changed = set(json.loads(sys.stdin.readline() or "[]"))
    import pytest, _pytest.runner, _pytest.reports, _pytest.skipping, _pytest.main
    main = pytest.main
    watch = [_pytest.runner, _pytest.reports, _pytest.skipping, _pytest.main,
             _pytest.reports.TestReport, _pytest.reports.BaseReport, _pytest.runner.CallInfo]
    skip = ("__dict__", "__weakref__", "__doc__", "__builtins__", "__warningregistry__",
            "__cached__", "__loader__", "__spec__", "__abstractmethods__", "_abc_impl")
    def snap():
        return {(getattr(o, "__name__", "?"), k, type(o) is type(os)): id(v) for o in watch
                for k, v in list(vars(o).items()) if k not in skip}
    before = snap()
    rank = {"ERROR": 0, "FAILED": 1, "XPASS": 1, "SKIPPED": 2, "XFAIL": 3, "PASSED": 4}
    tests, plugins = {}, []
    class Collector:
        def pytest_runtest_logreport(self, report):
            own = vars(report)
            xfail = "wasxfail" in own
            outcome, when = own.get("outcome"), own.get("when")
            if when == "call":
                if outcome == "passed":
                    st = "XPASS" if xfail else "PASSED"
                elif outcome == "skipped":
                    st = "XFAIL" if xfail else "SKIPPED"
                else:
                    st = "FAILED"
            elif outcome == "passed":
                return
            else:
                st = "SKIPPED" if outcome == "skipped" else "ERROR"
            prev = tests.get(report.nodeid)
            if prev is None or rank.get(st, -1) < rank.get(prev, -1):
                tests[report.nodeid] = st
        def pytest_sessionfinish(self, session):
            root = os.path.realpath(os.getcwd())
            for name, p in session.config.pluginmanager.list_name_plugin():
                if p is None or p is self:
                    continue
                mod = p if type(p) is type(os) else sys.modules.get(type(p).__module__)
                f = getattr(mod, "__file__", None) or ""
                if not f or os.path.basename(f) == "conftest.py":
                    continue
                rel = os.path.relpath(os.path.realpath(f), root)
                if rel in changed or rel.replace(".pyc", ".py") in changed:
                    plugins.append(rel)
    try:
        rc = int(main(sys.argv[1:], plugins=[Collector()]))
    except BaseException as exc:
        rc = -1
    after = snap()
    internals = sorted("%s.%s" % k[:2] for k in set(before) | set(after)
                       if before.get(k) != after.get(k) and (not k[2] or k in before and k in after))
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    data = ("\nCRL-GRADE " + nonce + " " + dumps({"rc": rc, "tests": tests, "plugins": plugins,
            "internals": internals}) + "\n").encode()
    while data:
        data = data[w(1, data):]
    leave(0)
_driver()
'''


@dataclass
class Grading:
    """How one grading went (``info["grading"]``)."""

    timeout_s: float
    channel: str = "driver"
    duration_s: float = 0.0
    timed_out: bool = False
    patch_bytes: int = 0
    patch_too_large: bool = False
    excluded: dict[str, str] = field(default_factory=dict)
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def split_diff(diff: str) -> list[tuple[str | None, str]]:
    """Split a git diff into ``(path, chunk)`` per file; ``path`` is None when unreadable."""
    chunks: list[tuple[str | None, str]] = []
    for chunk in re.split(r"(?m)^(?=diff --git )", diff):
        if not chunk.startswith("diff --git "):
            continue
        chunks.append((_chunk_path(chunk.split("\n", 1)[0][len("diff --git "):]), chunk))
    return chunks


def _chunk_path(rest: str) -> str | None:
    if rest.startswith('"'):
        m = re.match(r'"a/((?:[^"\\]|\\.)*)" ', rest)
        if not m:
            return None
        raw = codecs.escape_decode(m.group(1).encode("utf-8", "surrogateescape"))[0]
        return raw.decode("utf-8", "surrogateescape")
    half = (len(rest) - 1) // 2
    path = rest[2:half]
    return path if rest == f"a/{path} b/{path}" else None


def exclusion(path: str | None, base_files: frozenset[str],
              import_roots: Iterable[str] = ("",)) -> str | None:
    """Why a changed file is left out of the graded tree, or None to keep it."""
    if path is None:
        return "path not understood"
    parts = PurePosixPath(path).parts
    name = parts[-1]
    if any(p in CACHE_PARTS for p in parts) or name.endswith((".pyc", ".pyo")):
        return "byte-code cache"
    if name in HOOK_FILES or name.startswith(("sitecustomize", "usercustomize")) \
            or name.endswith(".pth"):
        return "can hook the test run"
    for root in import_roots:
        rp = PurePosixPath(root).parts if root else ()
        if tuple(parts[:len(rp)]) != rp or len(parts) <= len(rp):
            continue
        top = parts[len(rp)]
        prefix = "/".join((*rp, top))
        if top.split(".")[0] in SHADOWED and not any(
                f == prefix or f.startswith(prefix + "/") for f in base_files):
            return f"new module {top!r} on the import path shadows an installed one"
    return None


def import_roots(env: dict[str, str]) -> list[str]:
    """Folders (relative to the workspace) on the test run's import path: the root and
    ``PYTHONPATH`` entries under ``{workdir}``."""
    roots = [""]
    for entry in env.get("PYTHONPATH", "").split(":"):
        if entry.startswith("{workdir}"):
            rel = entry[len("{workdir}"):].strip("/")
            if rel not in roots:
                roots.append(rel)
    return roots


def driver_command(test_command: str) -> str | None:
    """``python -c DRIVER <args>`` for a ``python -m pytest``/``pytest`` command, else None."""
    try:
        words = shlex.split(test_command)
    except ValueError:
        return None
    if words[:3] == ["python", "-m", "pytest"]:
        args = words[3:]
    elif words[:1] == ["pytest"]:
        args = words[1:]
    else:
        return None
    if "-p" not in args or "no:cacheprovider" not in args:
        args = ["-p", "no:cacheprovider", *args]
    return "python -B -c " + shlex.quote(DRIVER) + " " + " ".join(map(shlex.quote, args))


def read_driver_output(output: str, nonce: str) -> tuple[dict[str, str], str]:
    """Per-test statuses from the driver's line, and a problem text ('' when all is well)."""
    lines = [line for line in output.split("\n") if line.startswith(f"CRL-GRADE {nonce} ")]
    if len(lines) != 1:
        return {}, ("the test run did not report its results (it crashed, exited early or "
                    "was killed)" if not lines else "the grading channel was written twice")
    try:
        data = json.loads(lines[0][len(f"CRL-GRADE {nonce} "):])
        tests = {str(k): str(v) for k, v in data["tests"].items()}
    except (ValueError, KeyError, AttributeError, TypeError):
        return {}, "the grading channel held garbage"
    if data.get("plugins"):
        return {}, f"code changed by the patch registered pytest plugins: {data['plugins']}"
    if data.get("internals"):
        return {}, f"pytest internals were replaced during the run: {data['internals'][:5]}"
    return tests, ""


def grade_sandbox(sb: Sandbox, *, patch: str, test_patch: str, test_files: Iterable[str],
                  test_command: str, fail_to_pass: Iterable[str], pass_to_pass: Iterable[str],
                  env: dict[str, str], timeout_s: float,
                  max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES) -> tuple[GradeReport, Grading,
                                                                           str]:
    """Grade ``patch`` on a fresh copy of the sandbox's template (steps in the module doc).

    Returns the report, how grading went, and the test run's output.
    """
    f2p, p2p = list(fail_to_pass), list(pass_to_pass)
    info = Grading(timeout_s=timeout_s)
    start = time.monotonic()

    def left() -> float:
        remaining = timeout_s - (time.monotonic() - start)
        if remaining <= 0:
            info.timed_out = True
            raise SandboxError(f"grading used up its {timeout_s:g} s budget")
        return remaining

    def fail(note: str, log: str = "") -> tuple[GradeReport, Grading, str]:
        info.problem = note
        info.duration_s = time.monotonic() - start
        return grade({}, f2p, p2p, note=note), info, log

    info.patch_bytes = len(patch.encode("utf-8", "surrogateescape"))
    if info.patch_bytes > max_patch_bytes:
        info.patch_too_large = True
        return fail(f"Your patch is {info.patch_bytes:,} bytes, over the {max_patch_bytes:,}-byte "
                    "limit: it was not graded (large generated or binary files?).")
    try:
        sb.reset()
        listing = sb.run("git ls-files -z", timeout_s=min(60, left()),
                         output_keep_bytes=16 * MiB)
        base_files = frozenset(f for f in listing.output.split("\0") if f)
        roots = import_roots(env)
        keep: list[str] = []
        changed: list[str] = []
        for path, chunk in split_diff(patch):
            why = exclusion(path, base_files, roots)
            if why:
                info.excluded[path or chunk.split("\n", 1)[0]] = why
            else:
                keep.append(chunk)
                changed.append(path or "")
        if keep:
            applied = sb.run("git apply --binary --whitespace=nowarn -", stdin="".join(keep),
                             timeout_s=min(120, left()))
            if applied.exit_code != 0:
                return fail("Your patch did not apply to a fresh copy of the repository: "
                            + applied.output.strip()[:500])
        restore = "; ".join(f"git checkout -q HEAD -- {q} 2>/dev/null || rm -rf -- {q}"
                            for q in map(shlex.quote, test_files))
        sb.run(restore or "true", timeout_s=min(60, left()))
        applied = sb.run("git apply --whitespace=nowarn -", stdin=test_patch,
                         timeout_s=min(120, left()))
        if applied.exit_code != 0:
            return fail("The hidden test patch did not apply on top of your changes (did you "
                        "edit the test files?): " + applied.output.strip()[:500])
        run_env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONNOUSERSITE": "1",
                   "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_ADDOPTS": ""}
        command = driver_command(test_command)
        nonce = secrets.token_hex(16)
        if command is None:
            info.channel = "log"
            result = sb.run(test_command, timeout_s=left(), env=run_env,
                            output_keep_bytes=64 * MiB)
            statuses, problem = parse_pytest_log(result.output), ""
        else:
            prefix = f'PYTHONPYCACHEPREFIX="$TMPDIR/crl-pyc-{secrets.token_hex(8)}" '
            result = sb.run(prefix + command, timeout_s=left(), env=run_env,
                            stdin=nonce + "\n" + json.dumps(changed) + "\n",
                            output_keep_bytes=64 * MiB)
            statuses, problem = read_driver_output(result.output, nonce)
        if result.timed_out:
            info.timed_out = True
            problem = f"The test run timed out (grading budget {timeout_s:g} s)."
        if problem:
            return fail(problem[0].upper() + problem[1:], result.output)
        info.duration_s = time.monotonic() - start
        return grade(statuses, f2p, p2p), info, result.output
    except SandboxError as exc:
        return fail(f"Grading failed in the sandbox: {exc}")
