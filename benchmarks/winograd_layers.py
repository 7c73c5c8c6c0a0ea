"""Winograd against the direct blocked kernel, and against onnxruntime, on single layers (onnxopt/fusion/winograd.py).

Each case is a 1x1 -> KxK' -> 1x1 chain (so the middle layer reads and writes blocked tensors, as inside a network),
optimized with `--plan compute-blocked` and `--winograd off` and with each tile length its kernel offers; the middle
node's kernel time is the median of onnxruntime's profiler over the runs, after a warm-up, and onnxruntime's own
time for that convolution comes from the original model the same way. Prints microseconds per form and the gains
over our direct kernel. The profiler's time for a custom op includes some of onnxruntime's dispatch, so the
comparison with onnxruntime's own kernel is, if anything, unfavourable to ours.

    python benchmarks/winograd_layers.py --threads 2 --runs 200 --kernel 3x3 1x7 7x1 5x5 1x3 3x1
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
from onnxopt.fusion import winograd

# (input channels, output channels, image) per kernel: ResNet-50's and UNet's 3x3 layers, Inception-v3's 5x5 (Mixed_5),
# 1x7 / 7x1 (Mixed_6b-6e) and 1x3 / 3x1 (Mixed_7b-7c) layers.
CASES = {
    (3, 3): [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7), (32, 32, 112), (16, 16, 112)],
    (5, 5): [(48, 64, 35)],
    (1, 7): [(128, 128, 17), (160, 160, 17), (192, 192, 17)],
    (7, 1): [(128, 128, 17), (160, 160, 17), (192, 192, 17), (192, 320, 17)],
    (1, 3): [(384, 384, 8)],
    (3, 1): [(384, 384, 8)],
}


def chain(cin: int, cout: int, h: int, kernel: tuple[int, int], seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(seed)
    nodes, inits, x, c = [], [], "x", cin
    for name, (kh, kw), oc in (("a", (1, 1), cin), ("b", kernel, cout), ("c", (1, 1), cout)):
        w = (rng.standard_normal((oc, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}_w"),
                  numpy_helper.from_array(np.zeros(oc, np.float32), f"{name}_b")]
        nodes += [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_pre"], name=name,
                                   kernel_shape=[kh, kw], pads=[kh // 2, kw // 2, kh // 2, kw // 2]),
                  helper.make_node("Relu", [f"{name}_pre"], [name], name=f"{name}_relu")]
        x, c = name, oc
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, h])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, cout, h, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime 1.17 and newer load
    return model, {"x": rng.standard_normal((1, cin, h, h)).astype(np.float32)}


def node_time(path: str, library: str | None, feeds: dict, threads: int, runs: int, node: str) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
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
    if not mine:
        raise RuntimeError(f"no profiler events for node {node!r} in {path}")
    return float(np.median(mine[0][runs // 4:]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--kernel", nargs="+", default=["3x3"], choices=[f"{h}x{w}" for h, w in CASES],
                   help="which kernels' layers to time (default 3x3)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.kernel:
            kernel = tuple(int(v) for v in name.split("x"))
            ms = winograd.sizes(kernel)
            labels = [winograd.label(kernel, m) for m in ms]
            print(f"\n{name}: {'in':>4s} {'out':>4s} {'image':>5s} {'ORT us':>8s} {'direct us':>9s} "
                  + " ".join(f"{x:>13s}" for x in labels) + "   gains over direct; best against ORT")
            for cin, cout, h in CASES[kernel]:
                model, feeds = chain(cin, cout, h, kernel)
                orig = os.path.join(tmp, "orig.onnx")
                onnx.save(model, orig)
                ort_us = node_time(orig, None, feeds, a.threads, a.runs, "b")
                us = []
                for mode in ["off"] + [str(m) for m in ms]:
                    out = os.path.join(tmp, f"{cin}_{h}_{mode}.onnx")
                    res = onnxopt.optimize(model, out, plan="compute-blocked", measure=False, verify=False,
                                           winograd=mode)
                    us.append(node_time(out, res.library, feeds, a.threads, a.runs, "b__onnxopt"))
                gains = " ".join(f"{us[0] / u:.2f}x" for u in us[1:])
                print(f"{'':5s} {cin:4d} {cout:4d} {h:5d} {ort_us:8.0f} {us[0]:9.0f} "
                      + " ".join(f"{u:13.0f}" for u in us[1:]) + f"   {gains}; {ort_us / min(us):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
