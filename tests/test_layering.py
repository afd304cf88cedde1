"""The code reads top-down: no module imports a module of a higher layer, and no import cycle.

Every import counts, also those inside functions (a lazy import is still a dependency); only
``if TYPE_CHECKING:`` blocks are left out. The layers, lowest first (a module belongs to the most
specific entry that names it or a package above it):
"""

from __future__ import annotations

import ast
import functools
import re
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
    ("config: what a run is (schema, presets, validation, errors)", ("crl_bench.config",)),
    ("records: what a run writes", ("crl_bench.records",)),
    ("training: a role's trainer, its update loop, precision", ("crl_bench.training",)),
    ("extractor: distil, credit, merge, train; Search-and-Ask; the gate", ("crl_bench.extractor",)),
    ("builds: named models trained by crl-bench", ("crl_bench.builds",)),
    ("run: the agent interface, the run's parts and the run loop",
     ("crl_bench.agent", "crl_bench.run")),
    ("agents", ("crl_bench.baselines",)),
    ("distributed: the run's parts on Ray", ("crl_bench.distributed",)),
    ("report", ("crl_bench.report",)),
    ("entry points: the Python API and the commands", ("crl_bench.runner", "crl_bench.data_fetch",
                                                       "crl_bench.cli")),
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


LAZY_REF = re.compile(r"crl_bench(\.\w+)+:\w+(\.\w+)*")
"""A registry's lazy reference to an object, ``"crl_bench.baselines.grpo:AGENT"``: an import."""


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def imports(path: Path, mods: set[str], refs: bool = True) -> set[str]:
    """The project modules ``path`` imports anywhere (``if TYPE_CHECKING:`` blocks excepted): import
    statements, ``importlib.import_module("...")`` with a literal name, and lazy
    ``"module:attr"`` references (what the registries load; ``refs=False`` leaves them out: a
    reference is loaded on use, never at import, so it cannot close an import cycle)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Call) and _called(node) in ("import_module", "load_object"):
            # importlib.import_module("crl_bench.x") and a registry's "module:attr" reference
            names = [a.value.split(":")[0] for a in node.args[:1]
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif refs and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and LAZY_REF.fullmatch(node.value):
            names = [node.value.split(":")[0]]  # a lazy "module:attr" reference (registries)
        elif isinstance(node, ast.Import):
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
def graph(refs: bool = True) -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods), refs) - {name} for name, path in mods.items()}


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
    g = {m: {t for t in targets if t not in FACADES} for m, targets in graph(refs=False).items()
         if m not in FACADES}
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_lazy_imports_and_cycles():
    """The checks can fail: a function-level import is an edge, and a loop is found."""
    src = ROOT / "crl_bench" / "run" / "parts" / "experience.py"
    assert "crl_bench.extractor.track" in imports(src, set(modules()))  # imported inside a method
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("crl_bench.training.role_trainer") < layer_of("crl_bench.extractor.track") \
        < layer_of("crl_bench.run.loop") < layer_of("crl_bench.runner.api")


# -- the same at package level ----------------------------------------------------------------------

def package_of(module: str) -> str:
    """The unit of the package-level check: ``crl_bench.<package>`` for a module in a package,
    the module itself for a top-level module (``crl_bench.registry``); ``crl_bench.envs`` and
    ``crl_bench.baselines`` whole."""
    parts = module.split(".")
    path = modules()[module]
    if len(parts) == 2 and path.name != "__init__.py" and path.parent == PACKAGES["crl_bench"]:
        return module
    return ".".join(parts[:2])


def package_graph(refs: bool = True) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph(refs).items():
        if m in FACADES:
            continue
        a = package_of(m)
        out.setdefault(a, set()).update(package_of(t) for t in targets
                                        if t not in FACADES and package_of(t) != a)
    return out


def test_every_package_sits_in_one_layer():
    """A package is one unit: every module in it is in the package's own layer."""
    split = sorted(f"{m} (layer {layer_of(m)}) in {package_of(m)} (layer {layer_of(package_of(m))})"
                   for m in modules() if m not in FACADES
                   and layer_of(m) != layer_of(package_of(m)))
    assert not split, "packages spanning layers:\n" + "\n".join(split)


def test_no_package_imports_a_higher_layer():
    g = package_graph()
    upward = sorted(f"{a} -> {b}" for a, targets in g.items() for b in targets
                    if layer_of(b) > layer_of(a))
    assert not upward, "upward imports between packages:\n" + "\n".join(upward)


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph(refs=False))
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_checks_see_importlib_and_registry_references(tmp_path):
    """``importlib.import_module("...")`` and ``"module:attr"`` strings are edges, so a hidden
    upward import (a low module loading a high one by name) is seen."""
    src = tmp_path / "m.py"
    src.write_text('import importlib\n'
                   'def f():\n    return importlib.import_module("crl_bench.run.loop")\n'
                   'REF = "crl_bench.baselines.grpo:AGENT"\n')
    assert {"crl_bench.run.loop", "crl_bench.baselines.grpo"} <= imports(src, set(modules()))
