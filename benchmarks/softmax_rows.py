"""The softmax kind's row kernel (onnxopt/kinds/softmax) against onnxruntime's Softmax, on transformer shapes.

    python benchmarks/softmax_rows.py [--threads 2] [--min-time 2]

Per shape: a one-node model run by onnxruntime and the same model with the node as our kernel, timed interleaved in
one process. Prints the medians, the ratio and the bandwidth each reached (read the input once, write the output
once: the least a softmax moves).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target
from onnxopt.emit.model import build_fused_model
from onnxopt.kinds.softmax import KIND
from onnxopt.timing import make_session, time_interleaved

SHAPES = [("Softmax", [1, 12, 128, 128]), ("Softmax", [8, 12, 128, 128]), ("Softmax", [1, 12, 384, 384]),
          ("Softmax", [1, 8, 1500, 1500]), ("Softmax", [1, 12, 128, 100]), ("LogSoftmax", [64, 32000])]


def _models(op, shape, folder):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=-1)], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    target = host_target()
    regions = KIND.find(model, set(), [])
    regions[0].compute_op_type(target.name + target.llvm_features)
    obj, desc, _ = KIND.build(regions[0], target)
    lib = os.path.join(folder, f"{op}_{'x'.join(map(str, shape))}.so")
    sha = link_library([desc], [obj], target, lib)
    fused = build_fused_model(model, regions, os.path.basename(lib), sha, target.to_dict(), target.required_cpu_flags)
    return model, fused, lib


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=2.0)
    a = ap.parse_args(argv)
    print("| op | shape | onnxruntime us | onnxopt us | speedup | onnxopt GB/s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for op, shape in SHAPES:
            model, fused, lib = _models(op, shape, folder)
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            sessions = [make_session(model, a.threads), make_session(fused, a.threads, library=lib)]
            t = [r["median"] for r in time_interleaved(sessions, {"x": x}, min_time=a.min_time, max_blocks=100000)]
            gbs = 2 * x.nbytes / t[1] / 1e9
            print(f"| {op} | {shape} | {t[0] * 1e6:.1f} | {t[1] * 1e6:.1f} | {t[0] / t[1]:.3f}x | {gbs:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
