"""The code stays readable: no module over 600 lines, no import cycle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"crl_bench": ROOT / "crl_bench", "crl_bench.envs": ROOT / "envs",
            "crl_bench.baselines": ROOT / "baselines"}
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    mods = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "data" in path.relative_to(folder).parts:  # SWE task repositories, not our code
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if prefix == "crl_bench" and parts and parts[0] in ("envs", "baselines"):
                continue
            mods[name] = path
    return mods


def test_no_module_over_the_line_limit():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def _top_level_imports(path: Path, mods: set[str]) -> set[str]:
    """Modules imported when ``path`` is imported (imports inside functions do not count)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                names = [sub.module] + [f"{sub.module}.{a.name}" for a in sub.names]
            else:
                continue
            out.update(n for n in names if n in mods)
    return out


def test_no_import_cycle_between_modules():
    mods = _modules()
    graph = {name: _top_level_imports(path, set(mods)) - {name} for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
