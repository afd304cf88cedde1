"""benchmarks/gpu_check.py runs on the GPU device's image, which has torch (CUDA), transformers
and peft but no gymnasium, Ray or vLLM. Statically: every module gpu_check.py imports (at module
level or inside its sections), and every ``crl_bench`` module those pull in at their own import
time (package ``__init__`` files included, recursively), imports nothing outside the standard
library, torch, transformers, peft, numpy, safetensors and tokenizers (transformers' own
dependencies).

``benchmarks/gpu_check_venv.sh`` checks the same thing by running the smoke mode in a clean venv
with only those packages (minutes to build, so not in the default test run)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"torch", "transformers", "peft", "numpy", "safetensors", "tokenizers"}


def imports_of(tree: ast.AST, module: str, *, top_level_only: bool) -> set[str]:
    """Absolute names imported by ``tree`` (relative imports resolved against ``module``);
    ``top_level_only``: not inside functions (what runs when the module is imported)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.Lambda)):
                continue
            if isinstance(child, ast.If) and _is_guarded(child.test):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = module.split(".")[: -child.level]
                    base = ".".join(parts + ([base] if base else []))
                out.add(base)
                out.update(f"{base}.{a.name}" for a in child.names)  # may be submodules
            visit(child)
    visit(tree)
    return out


def _is_guarded(test: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` and ``if importlib.util.find_spec(PKG) is not None:`` for a package
    outside :data:`ALLOWED` (a block that runs only where that package is installed)."""
    if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
        return True
    for node in ast.walk(test):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "find_spec"
                and node.args and isinstance(node.args[0], ast.Constant)):
            return str(node.args[0].value).split(".")[0] not in ALLOWED
    return False


def called_at_import(tree: ast.Module) -> set[str]:
    """Module-level functions the module calls while it is imported (their bodies run then)."""
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    called: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and _is_guarded(child.test):
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                if child.func.id in defs:
                    called.add(child.func.id)
            visit(child)
    visit(tree)
    return called


def source_of(module: str) -> Path | None:
    """The file of a ``crl_bench`` module or package (None: not a module, e.g. a class)."""
    rel = Path(*module.split("."))
    for cand in (ROOT / rel / "__init__.py", ROOT / rel.with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def closure(script: Path) -> tuple[set[str], dict[str, str]]:
    """(crl_bench modules loaded, external top-level packages -> the module importing them)."""
    external: dict[str, str] = {}
    seen: set[str] = set()
    todo = [(name, "gpu_check") for name in
            imports_of(ast.parse(script.read_text()), "gpu_check", top_level_only=False)]
    while todo:
        name, by = todo.pop()
        top = name.split(".")[0]
        if top != "crl_bench":
            if top not in sys.stdlib_module_names and top != "__future__":
                external.setdefault(top, f"{by} ({name})")
            continue
        # importing a.b.c runs a/__init__, a/b/__init__ and a/b/c
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            mod = ".".join(parts[:i])
            path = source_of(mod)
            if path is None or mod in seen:
                continue
            seen.add(mod)
            tree = ast.parse(path.read_text())
            where = mod if path.name != "__init__.py" else mod + ".__init__"
            found = imports_of(tree, where, top_level_only=True)
            for node in tree.body:  # functions run at import time import for real
                if getattr(node, "name", None) in called_at_import(tree):
                    found |= imports_of(node, where, top_level_only=False)
            todo.extend((sub, mod) for sub in found)
    return seen, external


def test_gpu_check_imports_only_what_the_device_image_has():
    seen, external = closure(ROOT / "benchmarks" / "gpu_check.py")
    bad = {k: v for k, v in external.items() if k not in ALLOWED}
    assert not bad, f"gpu_check.py pulls in {bad} (the device image has only {sorted(ALLOWED)})"
    # it does run the project's learner, not a copy of it
    assert {"crl_bench.distributed.fsdp", "crl_bench.training.role_trainer"} <= seen


def test_the_closure_check_catches_a_forbidden_import(tmp_path):
    """The check itself: a script whose section imports a module that imports gymnasium."""
    script = tmp_path / "check.py"
    script.write_text("def section():\n    import crl_bench.text_env\n")
    _, external = closure(script)
    assert "gymnasium" in external
    # the package's env side is guarded by gymnasium's presence: skipped
    script.write_text("import crl_bench\n")
    seen, external = closure(script)
    assert "gymnasium" not in external and "crl_bench.text_env" not in seen
    # a function a module runs while it is imported counts, one it only defines does not
    tree = ast.parse("def a():\n    import x\ndef b():\n    import y\na()\n")
    assert called_at_import(tree) == {"a"}
