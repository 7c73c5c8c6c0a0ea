"""The package reads as the pipeline: a module imports only from its own stage, from earlier stages and from the
shared lower layers, never from a later stage, and no imports form a cycle. Imports inside functions count too."""

from __future__ import annotations

import ast
import os

import onnxopt
from onnxopt.fusion.search.backtrack import _sccs  # iterative Tarjan, tested with the search

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where each package of the distribution lives in the tree (pyproject.toml's package-dir).
FOLDERS = {"onnxopt": "onnxopt", "onnxopt.codegen": "codegen", "onnxopt.runtime": "runtime", "onnxopt.cli": "cli",
           "onnxopt.models": "models"}

# Lower numbers are imported by higher ones; the longest matching prefix decides a module's layer.
LAYERS = {
    # shared lower layers: errors, checks, the CPU target and LLVM, vector math, the glue's C contract
    "onnxopt.errors": 0, "onnxopt.verify": 0, "onnxopt.dtypes": 0,
    "onnxopt.codegen": 1, "onnxopt.codegen.target": 1, "onnxopt.codegen.compile": 1, "onnxopt.codegen.vmath": 1,
    "onnxopt.codegen.instructions": 1,
    "onnxopt.codegen.parallel": 1, "onnxopt.codegen.glue.kinds": 1, "onnxopt.codegen.glue.descs": 1,
    "onnxopt.codegen.glue.contract": 1,
    "onnxopt.models": 1,
    # the stages, in the order the driver runs them
    "onnxopt.graph": 2, "onnxopt.hardware": 2, "onnxopt.timing": 2, "onnxopt.cost_cache": 2, "onnxopt.report": 2,
    "onnxopt.annotate": 3,
    "onnxopt.fusion": 4,
    "onnxopt.codegen.microkernel": 5, "onnxopt.codegen.elementwise": 5, "onnxopt.codegen.pool": 5,
    "onnxopt.codegen.copy": 5, "onnxopt.codegen.compute": 5,
    "onnxopt.codegen.glue": 6,  # the library: the kinds' tables linked with the runtime
    "onnxopt.backends": 6,  # what lowers, compiles and links for a target (the protocol and each backend)
    "onnxopt.kinds": 7,
    "onnxopt.emit": 8,
    "onnxopt.measure": 9,
    "onnxopt.tune": 10,
    # the loader and the kernel-call counts: the driver checks the files it writes through them, as a user loads them
    "onnxopt.runtime": 10,
    "onnxopt.driver": 11, "onnxopt.driver.policy": 10,  # the driver's stages
    "onnxopt.pipeline": 11,
    # what users call
    "onnxopt.batch": 12, "onnxopt.cli": 13, "onnxopt.__main__": 14,
}


def _modules() -> dict[str, str]:
    mods = {}
    for pkg, folder in FOLDERS.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(ROOT, folder))[:-3]
                    rel = rel.replace(os.sep, ".")
                    name = pkg if rel == "__init__" else pkg + "." + rel.removesuffix(".__init__")
                    mods[name] = os.path.join(dirpath, f)
    return mods


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
        out = set()
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [s for s in subs if s in mods] or [base]  # `from . import worker` imports the submodule
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            out.update(n for n in names if n in mods and n != mod)
        edges[mod] = out
    return edges


def _layer(mod: str) -> int:
    best = max((p for p in LAYERS if mod == p or mod.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{mod} is in no layer: add it to LAYERS in tests/test_layers.py"
    return LAYERS[best]


def test_the_tree_is_what_this_test_walks():
    mods = _modules()
    assert os.path.realpath(mods["onnxopt"]) == os.path.realpath(onnxopt.__file__)
    assert "onnxopt.pipeline" in mods and "onnxopt.codegen.glue.library" in mods and "onnxopt.kinds.softmax" in mods


def test_no_import_from_a_later_stage():
    mods = _modules()
    wrong = []
    for mod, targets in _imports(mods).items():
        if mod == "onnxopt":  # the facade: optimize() imports the driver when called
            continue
        for t in targets:
            if t != "onnxopt" and _layer(t) > _layer(mod):
                wrong.append(f"{mod} ({_layer(mod)}) imports {t} ({_layer(t)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles():
    mods = _modules()
    edges = _imports(mods)
    edges["onnxopt"] = set()  # the facade imports the driver only inside optimize()
    for m in edges:
        edges[m].discard("onnxopt")  # for __version__
    components = _sccs(sorted(edges), {m: sorted(t) for m, t in edges.items()})
    cycles = [c for c in components if len(c) > 1]
    assert not cycles, cycles
