"""The code reads top-down: no module imports a module of a higher layer, and no import cycle.

Every import counts, also those inside functions (a lazy import is still a dependency); only
``if TYPE_CHECKING:`` blocks are left out. The layers, lowest first (a module belongs to the most
specific entry that names it or a package above it):
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"crl_bench": ROOT / "crl_bench", "crl_bench.envs": ROOT / "envs",
            "crl_bench.baselines": ROOT / "baselines"}

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: registries, the env contract, data paths, the algorithms (pure functions)",
     ("crl_bench.registry", "crl_bench.text_env", "crl_bench.data", "crl_bench.mixes",
      "crl_bench.memory", "crl_bench.algorithms", "crl_bench.env_check")),
    ("envs", ("crl_bench.envs",)),
    ("llm: models, backends, prompting, the rollout engine", ("crl_bench.llm",)),
    ("experience: the bank and retrieval", ("crl_bench.experience",)),
    ("config and records: what a run is and what it writes",
     ("crl_bench.runner.errors", "crl_bench.runner.config", "crl_bench.runner.validation",
      "crl_bench.runner.records", "crl_bench.runner.checksums",
      "crl_bench.runner.progress")),
    ("trainer: policy-gradient updates of one role", ("crl_bench.runner.trainer", "crl_bench.runner.precision")),
    ("extractor: distil, credit, merge, train; Search-and-Ask; the gate", ("crl_bench.extractor",)),
    ("run: the agent interface, the run's parts and the loop",
     ("crl_bench.agent", "crl_bench.runner", "crl_bench.tiny_sft")),
    ("agents", ("crl_bench.baselines",)),
    ("distributed: the run's parts on Ray", ("crl_bench.distributed",)),
    ("report", ("crl_bench.report",)),
    ("the report and bank command lines", ("crl_bench.report.cli", "crl_bench.experience.cli")),
    ("entry points: the Python API and the commands that train",
     ("crl_bench.runner.api", "crl_bench.runner.cli", "crl_bench.runner.reproduce",
      "crl_bench.runner.eval_api", "crl_bench.data_fetch", "crl_bench.cli")),
]
__doc__ += "\n" + "\n".join(f"{i}. {name}: {', '.join(mods)}" for i, (name, mods) in enumerate(LAYERS))
FACADES = {"crl_bench"}
"""Package front doors that register the built-ins by import (above every layer they name)."""


@functools.lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    mods = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "data" in path.relative_to(folder).parts:  # SWE task repositories, not our code
                continue
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if prefix == "crl_bench" and parts and parts[0] in ("envs", "baselines"):
                continue
            mods[".".join([prefix, *parts])] = path
    return mods


def imports(path: Path, mods: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere (``if TYPE_CHECKING:`` blocks excepted)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name not in mods and "." in name:  # `from pkg import name`: the module it names
                name = name.rsplit(".", 1)[0]
            if name in mods:
                out.add(name)
                break
    return out


def layer_of(module: str) -> int:
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


@functools.lru_cache(maxsize=None)
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if m not in FACADES and layer_of(m) < 0)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{m} ({LAYERS[layer_of(m)][0].split(':')[0]}) -> {t} "
                    f"({LAYERS[layer_of(t)][0].split(':')[0]})"
                    for m, targets in graph().items() if m not in FACADES
                    for t in targets if t not in FACADES and layer_of(t) > layer_of(m))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(g):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_no_import_cycle_between_modules():
    g = {m: {t for t in targets if t not in FACADES} for m, targets in graph().items()
         if m not in FACADES}
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_lazy_imports_and_cycles():
    """The checks can fail: a function-level import is an edge, and a loop is found."""
    src = ROOT / "crl_bench" / "runner" / "parts" / "experience.py"
    assert "crl_bench.extractor.track" in imports(src, set(modules()))  # imported inside a method
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("crl_bench.runner.trainer") < layer_of("crl_bench.extractor.track") \
        < layer_of("crl_bench.runner.loop") < layer_of("crl_bench.runner.api")
