"""Single layers built by the default optimize of two trees of onnxopt, timed against each other (issue 48's first bar).

    python benchmarks/tuned_layers.py OLD_REV --out DIR [--corpus DIR] [--top 20] [--min-time 3] [--threads 2]
        [--only NAME,...] [--skip-build]

The layers: Heron's GEMM and C2D tables as its DL Boost runs use them (batch 1; G3 and G5 with N = 1008), in
float32, and the corpus's `--top` heaviest distinct Conv/ConvTranspose/MatMul/Gemm layers with constant weights
(by FLOPs, each cut out of its float32 model with its own weights at the manifest's input shapes). Each layer is a
model of one node; OLD_REV's tree and the installed tree each optimize it with their defaults (measurements, tile
search and the tuning budget on, each tree with a fresh cost cache of its own, so no record is reused), then the
original through onnxruntime, the old build and the new build run interleaved in one process, each written model
loaded as a user loads it. Prints per layer the times, new / old and each over onnxruntime, and the geomeans;
`--json` keeps them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from tree_ab import _lay_out, _old_tree  # noqa: E402

# Heron's DL Boost operator ladders at batch 1 (the notes' section 4); G2 (4096^3) is left out: 137 GFLOP a run
# makes one layer's timing as long as the rest together, and G4 has the same K and N.
HERON_GEMMS = {"heron_g1": (1024, 1024, 1024), "heron_g3": (32, 2048, 1008), "heron_g4": (32, 4096, 4096),
               "heron_g5": (32, 4096, 1008)}
# (H = W, CI, CO, kernel, stride); pads keep 'same' for 3x3
HERON_CONVS = {"heron_c1": (56, 64, 64, 3, 1), "heron_c2": (56, 64, 64, 1, 1), "heron_c3": (28, 128, 128, 3, 1),
               "heron_c4": (28, 128, 256, 1, 2), "heron_c5": (14, 256, 256, 3, 1), "heron_c6": (14, 256, 512, 1, 2)}
LAYER_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
OPTIMIZE = """
import json, sys, time, onnxopt
src, out, cache = sys.argv[1:4]
t0 = time.perf_counter()
onnxopt.optimize(src, out, threads=2, cost_cache=cache)
print(json.dumps({"file": onnxopt.__file__, "seconds": time.perf_counter() - t0}))
"""


def _model(node, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph([node], node.name or "layer", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def heron_layers() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    out = {}
    for name, (m, k, n) in HERON_GEMMS.items():
        w = numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32), "w")
        out[name] = _model(helper.make_node("MatMul", ["x", "w"], ["y"], name=name),
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    for name, (hw, ci, co, r, s) in HERON_CONVS.items():
        p = r // 2
        w = numpy_helper.from_array((rng.standard_normal((co, ci, r, r)) / math.sqrt(ci * r * r)).astype(np.float32),
                                    "w")
        b = numpy_helper.from_array(rng.standard_normal(co).astype(np.float32) * 0.1, "b")
        ho = (hw + 2 * p - r) // s + 1
        out[name] = _model(helper.make_node("Conv", ["x", "w", "b"], ["y"], name=name, kernel_shape=[r, r],
                                            strides=[s, s], pads=[p] * 4),
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ci, hw, hw])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, ho, ho])], [w, b])
    return out


def _manifest(corpus: str) -> list[dict]:
    with open(os.path.join(corpus, "manifest.json")) as f:
        return json.load(f)


def corpus_layers(corpus: str, top: int) -> dict[str, onnx.ModelProto]:
    """The `top` heaviest distinct layers with constant weights over the corpus's float32 models."""
    from onnxopt.annotate.graph import annotate
    from onnxopt.graph.infer import infer, static_shapes
    from onnxopt.tune.heron.tune_model import prepared_model

    found = {}
    for e in _manifest(corpus):
        name = e["name"]
        path = os.path.join(corpus, f"{name}.onnx")
        if any(t in name for t in ("_int8", "_qdq", "_qop")) or not os.path.exists(path):
            continue
        shapes = {s.split(":")[0]: [int(v) for v in s.split(":")[1].split(",")] for s in e.get("input_shape") or []}
        try:
            model = infer(prepared_model(path, shapes or None))
        except Exception as ex:  # noqa: BLE001 - a model the loader refuses adds no layers
            print(f"{name}: skipped ({type(ex).__name__}: {str(ex)[:120]})")
            continue
        static = static_shapes(model)
        inits = {i.name: i for i in model.graph.initializer}
        for a in annotate(model).nodes:
            n = a.node
            if n is None or a.graph or n.op_type not in LAYER_OPS or n.input[0] not in static:
                continue
            weights = [i for i in n.input[1:] if i]
            if not weights or any(i not in inits for i in weights) or not n.output[0] in static:
                continue
            if static[n.input[0]][0] != 1:
                continue  # batch 1 only, as the bar's
            key = (n.op_type, tuple(static[n.input[0]]), tuple(tuple(inits[w].dims) for w in weights),
                   tuple(sorted(str(x) for x in n.attribute)))
            if key in found and found[key][0] >= a.flops:
                continue
            node = helper.make_node(n.op_type, ["x"] + [f"w{i}" if w else "" for i, w in enumerate(n.input[1:])],
                                    ["y"], name=f"{name}/{n.name}")
            node.attribute.extend(n.attribute)
            ws = []
            for i, w in enumerate(n.input[1:]):
                if w:
                    t = onnx.TensorProto()
                    t.CopyFrom(inits[w])
                    t.name = f"w{i}"
                    ws.append(t)
            dtype = TensorProto.FLOAT
            layer = _model(node, [helper.make_tensor_value_info("x", dtype, static[n.input[0]])],
                           [helper.make_tensor_value_info("y", dtype, static[n.output[0]])], ws)
            found[key] = (a.flops, name, n.name, layer)
    heaviest = sorted(found.values(), key=lambda v: -v[0])[:top]
    out = {}
    for i, (flops, model_name, node_name, layer) in enumerate(heaviest):
        out[f"corpus{i + 1:02d}_{model_name}"] = layer
        print(f"corpus{i + 1:02d}_{model_name}: {node_name} ({layer.graph.node[0].op_type}, "
              f"{flops / 1e6:.1f} MFLOP)")
    return out


def _build(trees: dict, out: str, name: str) -> dict:
    info = {}
    for label, pkg in trees.items():
        src = os.path.join(out, "layers", f"{name}.onnx")
        dst = os.path.join(out, label, f"{name}_default.onnx")
        cache = os.path.join(out, label, "costs.sqlite")
        r = subprocess.run([sys.executable, "-c", OPTIMIZE, src, dst, cache], capture_output=True, text=True,
                           cwd=pkg, env=dict(os.environ, PYTHONPATH=pkg))
        if r.returncode != 0:
            raise SystemExit(f"{label} tree, {name}:\n{r.stderr[-2000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert res["file"].startswith(pkg), res  # that tree ran
        info[label] = res["seconds"]
    return info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_rev")
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.environ.get("ONNXOPT_CORPUS_DIR",
                                                       os.path.expanduser("~/.cache/onnxopt/corpus")))
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--only", default="")
    ap.add_argument("--min-time", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-build", action="store_true", help="time the builds already under --out")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    from onnxopt.models import random_inputs
    from onnxopt.runtime import written_session
    from onnxopt.timing import make_session, time_interleaved

    for d in ("layers", "old", "new"):
        os.makedirs(os.path.join(a.out, d), exist_ok=True)
    if not a.skip_build:
        layers = heron_layers()
        layers.update(corpus_layers(a.corpus, a.top))
        for name, m in layers.items():
            onnx.save(m, os.path.join(a.out, "layers", f"{name}.onnx"))
    names = sorted(f[:-5] for f in os.listdir(os.path.join(a.out, "layers")) if f.endswith(".onnx"))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    build_s = {}
    if not a.skip_build:
        trees = {"old": _old_tree(a.old_rev, os.path.join(a.out, "old-tree")),
                 "new": _lay_out(ROOT, os.path.join(a.out, "new-tree", "pkg"))}
        for name in names:
            build_s[name] = _build(trees, a.out, name)
            print(f"built {name}: old {build_s[name]['old']:.1f} s, new {build_s[name]['new']:.1f} s", flush=True)
    rows = []
    for name in names:
        orig = os.path.join(a.out, "layers", f"{name}.onnx")
        builds = [os.path.join(a.out, d, f"{name}_default.onnx") for d in ("old", "new")]
        feeds = random_inputs(onnx.load(orig))
        sessions = [make_session(orig, a.threads)] + [written_session(b, a.threads) for b in builds]
        t = [r["median"] for r in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=100000)]
        row = {"layer": name, "ort_s": t[0], "old_s": t[1], "new_s": t[2], "new_over_old": t[1] / t[2],
               "old_over_ort": t[0] / t[1], "new_over_ort": t[0] / t[2], "build_s": build_s.get(name)}
        rows.append(row)
        print(f"{name}: onnxruntime {t[0] * 1e3:.3f} ms, old {t[1] * 1e3:.3f} ms, new {t[2] * 1e3:.3f} ms; "
              f"new / old {row['new_over_old']:.3f}x (over onnxruntime: old {row['old_over_ort']:.3f}x, "
              f"new {row['new_over_ort']:.3f}x)", flush=True)

    def geo(key, sel):
        v = [r[key] for r in rows if sel(r["layer"])]
        return (math.exp(sum(math.log(x) for x in v) / len(v)), len(v)) if v else (float("nan"), 0)

    for label, sel in (("Heron's tables", lambda n: n.startswith("heron_")),
                       ("corpus layers", lambda n: n.startswith("corpus")), ("all", lambda n: True)):
        g, k = geo("new_over_old", sel)
        o, _ = geo("old_over_ort", sel)
        nn, _ = geo("new_over_ort", sel)
        print(f"geomean, {label} ({k}): new / old {g:.3f}x; over onnxruntime old {o:.3f}x, new {nn:.3f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"old_rev": a.old_rev, "threads": a.threads, "min_time": a.min_time, "rows": rows,
                       "written": time.strftime("%Y-%m-%d %H:%M")}, f, indent=1)


if __name__ == "__main__":
    main()
