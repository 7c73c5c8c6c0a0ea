"""`onnxopt bench ORIGINAL OPTIMIZED` where the optimized model was built with --input-shape: the original's dims
are symbolic (or -1, as Paddle writes them), the optimized one's fixed; both are fed arrays of the fixed shape."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxopt
from onnxopt.runtime.bench import bench


def test_bench_feeds_the_optimized_models_fixed_shapes(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4, "h", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, "h", 8])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(m, src)
    onnxopt.optimize(src, out, input_shape=["x:2,4,16,8"], measure=False, threads=1)
    r = bench(src, out, threads=1, min_time=0.05)
    assert r["outputs_match"] and np.isfinite(r["speedup"])
