"""Pool kernels (MaxPool, AveragePool, GlobalAveragePool, with and without an epilogue) against onnxruntime.

    python benchmarks/pools.py [--threads 1,2] [--only SUBSTRING] [--json out.json]

Each case is one pool (plus its elementwise chain) on a shape typical of a CNN. onnxopt optimizes it with the speed
check off (every correct kernel is kept), then the original and the fused model run through onnxruntime
(ORT_ENABLE_ALL, the same threads, spinning off). Reported per thread count:
- session: medians of whole `run` calls, interleaved in one process (what a user sees; includes ~5 us of session
  overhead on both sides);
- node: medians of the pool node's own time from onnxruntime's profiler (the kernel against ORT's kernels).
Ratios are onnxruntime / onnxopt: above 1 means onnxopt is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnxopt import optimize
from onnxopt.timing import make_session, time_interleaved

MP3 = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
SPPF = {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]}
CASES = [
    ("MaxPool 3x3 s2 p1", "MaxPool", (1, 64, 112, 112), MP3, []),
    ("MaxPool 3x3 s2 p1 + Relu", "MaxPool", (1, 64, 112, 112), MP3, ["Relu"]),
    ("AveragePool 2x2 s2", "AveragePool", (1, 64, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}, []),
    ("AveragePool 2x2 s2", "AveragePool", (1, 256, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}, []),
    ("AveragePool 3x3 s1 p1 excl-pad", "AveragePool", (1, 192, 28, 28),
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, []),
    ("GlobalAveragePool", "GlobalAveragePool", (1, 2048, 7, 7), {}, []),
    ("GlobalAveragePool", "GlobalAveragePool", (1, 960, 7, 7), {}, []),
    ("GlobalAveragePool + HardSwish", "GlobalAveragePool", (1, 960, 7, 7), {}, ["HardSwish"]),
    ("MaxPool 5x5 s1 p2 (SPPF)", "MaxPool", (1, 256, 20, 20), SPPF, []),
    ("MaxPool 3x3 s1 p1", "MaxPool", (1, 192, 28, 28), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, []),
]


def _model(op, shape, attrs, post):
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs)]
    last = "p"
    for i, p in enumerate(post):
        nodes.append(helper.make_node(p, [last], [f"e{i}"]))
        last = f"e{i}"
    g = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(last, onnx.TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m)  # the output's shape, for the checker
    shape = next(v for v in list(inferred.graph.value_info) + list(inferred.graph.output) if v.name == last)
    m.graph.output[0].CopyFrom(shape)
    return m


def _node_time(model, library, feeds, threads, runs=150):
    """Median per-run sum of node kernel times (us) from onnxruntime's profiler."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
        so.register_custom_ops_library(library)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
    s = ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    for _ in range(runs):
        s.run(None, feeds)
    with open(s.end_profiling()) as f:
        ev = json.load(f)
    nodes = [e for e in ev if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    totals = []
    for r in (e for e in ev if e.get("cat") == "Session" and e["name"] == "model_run"):
        totals.append(sum(n["dur"] for n in nodes if r["ts"] <= n["ts"] <= r["ts"] + r["dur"]))
    return float(np.median(totals[runs // 5:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--only", default="")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, op, shape, attrs, post) in enumerate(CASES):
            if a.only and a.only not in name:
                continue
            src, out = os.path.join(tmp, f"m{i}.onnx"), os.path.join(tmp, f"f{i}.onnx")
            onnx.save(_model(op, shape, attrs, post), src)
            res = optimize(src, out, measure=False, verify=False)
            if not res.library:
                print(f"{name}: not fused ({res.report['rejected']})", file=sys.stderr)
                continue
            feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
            row = {"case": name, "shape": list(shape)}
            line = f"{name:32s} {'x'.join(map(str, shape)):14s}"
            for th in (int(t) for t in a.threads.split(",")):
                s_o, s_f = make_session(src, th), make_session(out, th, library=res.library)
                t_o, t_f = time_interleaved([s_o, s_f], feeds, min_time=0.5, max_blocks=30)
                n_o, n_f = _node_time(src, None, feeds, th), _node_time(out, res.library, feeds, th)
                row[f"{th}t"] = {"session_ort_us": t_o["median"] * 1e6, "session_onnxopt_us": t_f["median"] * 1e6,
                                 "node_ort_us": n_o, "node_onnxopt_us": n_f}
                line += (f" | {th}t session {t_o['median'] * 1e6:6.1f}/{t_f['median'] * 1e6:6.1f} us "
                         f"x{t_o['median'] / t_f['median']:4.2f}  node {n_o:5.0f}/{n_f:5.0f} us x{n_o / n_f:4.2f}")
            print(line, flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
