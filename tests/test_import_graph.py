"""The package's import graph runs one way: every import (module level or inside a function) goes
to a lower layer, and no module imports itself back through others (issue 21)."""
import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "reluformer_mt"
# lowest first; a unit is a subpackage or a module of the package root ("" is the root __init__),
# or one of NESTED_UNITS
LAYERS = [
    {"console"},  # progress lines on standard error: imports nothing of the package
    {"fairseq_compat", "data", "attention", "cpu_memory"},
    {"memory"},
    {"models", "criteria", "checkpoints"},
    {"evaluation", "knn", "averaging"},
    {"memory.maintenance"},  # rekeying, memory statistics, bands: they load checkpoints and score BLEU
    {"tasks", "inference"},
    {"plugin"},
    {""},  # the package __init__: registers itself when fairseq's --user-dir imports it
    {"fairseq_runner"},
    {"experiments"},
    {"cli"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(path: Path):
    """The package modules ``path`` imports: ``from pkg import mod`` counts as pkg.mod."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "reluformer_mt":
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if is_module(target) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "reluformer_mt")
    return found


def graph():
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


# subpackages with a layer of their own, above their parent's (issue 35: memory/ owns its upkeep)
NESTED_UNITS = {"memory.maintenance"}


def unit(module: str) -> str:
    parts = module.split(".")
    nested = ".".join(parts[1:3])
    return nested if nested in NESTED_UNITS else parts[1] if len(parts) > 1 else ""


def layer(module: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit(module) in units:
            return i
    raise AssertionError(f"{module}: its unit {unit(module)!r} has no layer in LAYERS")


# upward imports made on purpose, each inside the function that needs it (never at import time)
ALLOWED_UPWARD = {
    # issue 33: loading a checkpoint registers the plugin itself, so DocumentTranslator(...) works
    # in a fresh process without register() (tested in test_translate_tools / the API docs test)
    "reluformer_mt.checkpoints -> reluformer_mt.plugin",
}


def test_every_import_goes_down():
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                    if unit(a) != unit(b) and layer(b) >= layer(a))
    assert set(upward) <= ALLOWED_UPWARD, sorted(set(upward) - ALLOWED_UPWARD)


def test_no_import_cycle():
    edges = graph()
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                raise AssertionError("cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_the_checkpoint_loader_registers_only_when_it_loads():
    """Issue 33: the loader registers the plugin itself (a user's DocumentTranslator needs no
    register() call), inside the function that loads, not at import (importing the loader must not
    import fairseq's registries)."""
    import ast

    tree = ast.parse((PACKAGE / "checkpoints.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any(getattr(n, "module", "") == "reluformer_mt.plugin" for n in top)
    assert "reluformer_mt.plugin" in imports_of(PACKAGE / "checkpoints.py")
