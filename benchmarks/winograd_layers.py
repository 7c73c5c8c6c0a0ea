"""Winograd against the direct blocked kernel on single 3x3 layers (onnxopt/fusion/winograd.py).

Each case is a 1x1 -> 3x3 -> 1x1 chain (so the 3x3 layer reads and writes blocked tensors, as inside a network),
optimized three times with `--plan compute-blocked` and `--winograd off|2|4`; the 3x3 node's kernel time is the
median of onnxruntime's profiler over the runs, after a warm-up. Prints microseconds per form and the gains.

    python benchmarks/winograd_layers.py --threads 2 --runs 200
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxopt

CASES = [(64, 56), (128, 28), (256, 14), (512, 7), (32, 112), (16, 112)]


def chain(c: int, h: int, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for name, k in (("a", 1), ("b", 3), ("c", 1)):
        w = (rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(np.zeros(c, np.float32), f"{name}_b")]
        nodes += [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_pre"], name=name,
                                   kernel_shape=[k, k], pads=[k // 2] * 4),
                  helper.make_node("Relu", [f"{name}_pre"], [name], name=f"{name}_relu")]
        x = name
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, c, h, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime 1.17 and newer load
    return model, {"x": rng.standard_normal((1, c, h, h)).astype(np.float32)}


def node_time(path: str, library: str, feeds: dict, threads: int, runs: int, node: str) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.register_custom_ops_library(library)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        s.run(None, feeds)
    with open(s.end_profiling()) as f:
        events = json.load(f)
    times = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["name"]].append(e["dur"])
    mine = [v for k, v in times.items() if k.startswith(node)]
    return float(np.median(mine[0][runs // 4:]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args()
    print(f"{'channels':>8s} {'image':>6s} {'direct us':>10s} {'F(2x2) us':>10s} {'F(4x4) us':>10s}  gains")
    with tempfile.TemporaryDirectory() as tmp:
        for c, h in CASES:
            model, feeds = chain(c, h)
            us = []
            for mode in ("off", "2", "4"):
                out = os.path.join(tmp, f"{c}_{h}_{mode}.onnx")
                res = onnxopt.optimize(model, out, plan="compute-blocked", measure=False, verify=False, winograd=mode)
                us.append(node_time(out, res.library, feeds, a.threads, a.runs, "b__onnxopt"))
            print(f"{c:8d} {h:6d} {us[0]:10.0f} {us[1]:10.0f} {us[2]:10.0f}  {us[0] / us[1]:.2f}x {us[0] / us[2]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
