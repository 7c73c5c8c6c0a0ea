"""Models from onnxruntime's own quantizer keep the structure its int8 fusions match (graph/quantized.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.quantized import QUANTIZATION_OPS, quantized_nodes

quantization = pytest.importorskip("onnxruntime.quantization")


def _cnn(path):
    """conv -> relu -> conv -> +3 -> SiLU -> global pool -> classifier, float32."""
    rng = np.random.default_rng(0)
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.1).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((10, 16)) * 0.1).astype(np.float32), "wg"),
             numpy_helper.from_array(np.full((1, 16, 1, 1), 3.0, np.float32), "three")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "three"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["m"]),
             helper.make_node("GlobalAveragePool", ["m"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wg"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "cnn", [vi("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [vi("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


class _Reader(quantization.CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.data = iter([{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.data, None)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    _cnn(str(d / "cnn.onnx"))
    quantization.quantize_static(str(d / "cnn.onnx"), str(d / "qdq.onnx"), _Reader(),
                                 quant_format=quantization.QuantFormat.QDQ)
    quantization.quantize_dynamic(str(d / "cnn.onnx"), str(d / "dyn.onnx"), weight_type=quantization.QuantType.QInt8)
    return d


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _quant_counts(model):
    return Counter(n.op_type for n in model.graph.node if n.op_type in QUANTIZATION_OPS)


@pytest.mark.parametrize("name", ["qdq", "dyn"])
def test_quantized_structure_passes_through(quantized, name, tmp_path):
    src = quantized / f"{name}.onnx"
    try:
        ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - older onnxruntimes lack ConvInteger for int8 weights
        pytest.skip(f"this onnxruntime cannot run its own quantizer's {name} model: {str(e)[:120]}")
    original = onnx.load(src)
    out = tmp_path / "f.onnx"
    res = onnxopt.optimize(str(src), str(out), measure=False)
    fused = onnx.load(out)
    # Every quantization op is still there, as many as before: no DequantizeLinear of a weight folded to float.
    assert _quant_counts(fused) == _quant_counts(original) and _quant_counts(original)
    # The weights, scales and zero points the quantization ops read are still initializers of their dtypes.
    read = {x for n in original.graph.node if n.op_type in QUANTIZATION_OPS for x in n.input}
    want = {t.name: t.data_type for t in original.graph.initializer if t.name in read}
    assert want and {t.name: t.data_type for t in fused.graph.initializer if t.name in want} == want
    # No fused region took a node of a quantized pattern, and the answers are the quantized model's.
    keep = quantized_nodes(original.graph)
    for e in res.report["regions"]:
        assert not any(n in keep for n in e["outputs"]), e
    x = np.random.default_rng(2).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(src, x), rtol=1e-5, atol=1e-5)


def test_quantized_nodes_cover_qdq_units_and_integer_rescaling(quantized):
    qdq = onnx.load(quantized / "qdq.onnx")
    keep = quantized_nodes(qdq.graph)
    convs = [n for n in qdq.graph.node if n.op_type == "Conv"]
    assert convs and all(n.output[0] in keep for n in convs)  # DQ -> Conv -> Q: a node unit
    dyn = onnx.load(quantized / "dyn.onnx")
    keep = quantized_nodes(dyn.graph)
    after_int = [n for n in dyn.graph.node if any(p.op_type in ("MatMulInteger", "ConvInteger") and p.output[0] in n.input
                                                   for p in dyn.graph.node)]
    assert after_int and all(n.output[0] in keep for n in after_int)
