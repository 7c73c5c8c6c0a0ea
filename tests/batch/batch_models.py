"""Tiny models for the batch tests (each optimizes in a few seconds on one thread), and a hash of a folder."""

import hashlib
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def add_relu_mul(path, n=64, batch=1):
    """x + b -> Relu -> * c: one elementwise region. `batch=None`: a symbolic batch dim "N"."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N" if batch is None else batch, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N" if batch is None else batch, n])
    inits = [numpy_helper.from_array(np.linspace(-1, 1, n, dtype=np.float32), "b"),
             numpy_helper.from_array(np.full((n,), 2.0, np.float32), "c")]
    nodes = [helper.make_node("Add", ["x", "b"], ["t1"]), helper.make_node("Relu", ["t1"], ["t2"]),
             helper.make_node("Mul", ["t2", "c"], ["y"])]
    _save(nodes, [x], [y], inits, path)


def conv_relu(path, c=8, hw=8):
    """A 3x3 Conv with bias -> Relu on a 1 x c x hw x hw image."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.2, "w"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "bias")]
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["t"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    _save(nodes, [x], [y], inits, path)


def transpose_only(path):
    """Nothing onnxopt fuses: the optimizer writes it unchanged and says why."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    _save([helper.make_node("Transpose", ["x"], ["y"])], [x], [y], [], path)


def _save(nodes, inputs, outputs, inits, path):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    os.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
    onnx.save(m, os.fspath(path))


def tree_hashes(root) -> dict[str, str]:
    """sha256 of every file under `root`: the sources must be the same after a batch."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out
