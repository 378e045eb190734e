"""The package's import graph runs one way: every import (module level or inside a function,
absolute or relative) goes to a lower layer, and no module imports itself back through others."""
import ast
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "reluformer_mt"
# A unit is a subpackage of reluformer_mt or a module of the package root ("" is the root __init__):
# the package's own structure, with no unit split across layers (a subpackage given two layers once
# hid inference/translator.py -> plugin, which climbs back over tasks/ into guidance/).
# Lowest first; each unit imports only units of lower layers.
LAYERS = [
    {"console", "families", "extension", "model_args"},  # progress lines on standard error; the families' attention options; the C++ kernels' loader; the model options' defaults: import nothing of the package
    {"fairseq_compat", "data", "attention", "cpu_memory"},  # fairseq's fixes; corpora and files; the attention functions
    {"checkpoints"},  # the one checkpoint loader: below the plugin (entry points register)
    {"evaluation", "averaging"},  # metrics and reports; checkpoint averaging: they load checkpoints
    {"memory"},  # translation and FFN memories with their upkeep (rekeying scores BLEU, statistics load checkpoints)
    {"models", "criteria", "knn"},  # what reads the memories: the model, its loss, kNN-MT's datastores
    {"guidance"},  # the guidance parts of beam search and their options: below the task and the translator, which both build them
    {"tasks"},  # the fairseq task: its generator builds the guidance parts
    {"plugin"},  # registration: imports the task, the models and the criteria
    {"inference"},  # the translator: loads checkpoints through the registered task and models
    {""},  # the package __init__: registers itself when fairseq's --user-dir imports it
    {"fairseq_runner"},
    {"experiments"},
    {"cli"},
]
# Arrows that still climb: each names where it is being removed. No other arrow may.
KNOWN_UPWARD: set = set()  # arrows back up allowed for now (none today)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative ones (``from . import x``, ``from .x import y``)
    resolved against ``path``'s package."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]  # a module's relative imports start at its package
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path):
    """The package modules ``path`` imports, at module level or inside a function (a lazy import
    hides a circle from Python, not from a reader), absolute or relative: ``from pkg import mod``
    counts as pkg.mod."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = absolute(path, node)
            if module.split(".")[0] != "reluformer_mt":
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}"
                found.add(target if is_module(target) else module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "reluformer_mt")
    return found


def graph():
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(module: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit(module) in units:
            return i
    raise AssertionError(f"{module}: its unit {unit(module)!r} has no layer in LAYERS")


def upward_arrows(edges=None):
    """``a -> b`` for every import of a module ``b`` in the same or a higher layer than ``a``'s unit."""
    edges = graph() if edges is None else edges
    return {f"{a} -> {b}" for a, targets in edges.items() for b in targets
            if unit(a) != unit(b) and layer(b) >= layer(a)}


def test_every_import_goes_down():
    upward = sorted(upward_arrows() - KNOWN_UPWARD)
    assert not upward, upward


def test_the_known_upward_arrows_are_still_there():
    """One removed is taken off KNOWN_UPWARD, so that it cannot come back unnoticed."""
    gone = sorted(KNOWN_UPWARD - upward_arrows())
    assert not gone, f"no longer climbing, take them off KNOWN_UPWARD: {gone}"


def test_an_import_into_a_higher_layer_counts_as_upward():
    assert layer("reluformer_mt.inference.translator") > layer("reluformer_mt.plugin") \
        > layer("reluformer_mt.tasks.document_translation") > layer("reluformer_mt.guidance.knn")
    # the translator importing the plugin goes down; the guidance importing the translator would climb
    edges = {"reluformer_mt.inference.translator": {"reluformer_mt.plugin"},
             "reluformer_mt.guidance.knn": {"reluformer_mt.inference.translator", "reluformer_mt.knn.search"}}
    assert upward_arrows(edges) == {"reluformer_mt.guidance.knn -> reluformer_mt.inference.translator"}


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


def test_relative_and_lazy_imports_count():
    """``from . import x`` in a package, ``from .x import y`` and an import inside a function are
    edges of the graph (a relative import once hid a circle from this test)."""
    assert "reluformer_mt.tasks.document_translation" in imports_of(PACKAGE / "tasks" / "__init__.py")
    assert "reluformer_mt.fairseq_compat" in imports_of(PACKAGE / "plugin.py")  # inside register()
    tree = ast.parse("from .readout import READOUTS\nfrom .. import checkpoints\n")
    relative = [absolute(PACKAGE / "knn" / "search.py", node) for node in tree.body]
    assert relative == ["reluformer_mt.knn.readout", "reluformer_mt"]


def test_the_checkpoint_loader_imports_nothing_above_it():
    """The loader is below the plugin: registration is the entry points' (the CLIs, the translator)."""
    assert not any(m.startswith("reluformer_mt.plugin") for m in imports_of(PACKAGE / "checkpoints.py"))
