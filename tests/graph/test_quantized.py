"""Models from onnxruntime's own quantizer keep the structure its int8 fusions match (graph/quantized.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.quantized import (QUANTIZATION_OPS, dedicate_unit_dequantizers, integer_product_units,
                                     qdq_conv_units, qdq_pool_units, quantized_nodes)

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
    # Every quantization op is still there, as many as before, but for those of the units our int8 kinds run
    # (onnxopt/kinds/qmatmul, qconv, qgap): no DequantizeLinear of a weight folded to float. Dequantizers copied so that
    # each convolution has its own (graph/quantized.py, dedicate_unit_dequantizers) stay where no kernel took them.
    types = {}
    for n in original.graph.node:
        types[n.name or n.output[0]] = types[n.output[0]] = n.op_type
    taken = Counter(types[x] for e in res.report["regions"] if e["op_type"].startswith(("qmatmul_", "qconv_", "qgap_"))
                    for x in e["nodes"] if types.get(x) in QUANTIZATION_OPS)
    want_counts = _quant_counts(original) - taken
    got = _quant_counts(fused)
    copies = res.report["rewrites"].get("dequantizers_per_unit", 0)
    assert not (want_counts - got) and got - want_counts <= Counter(DequantizeLinear=copies)
    assert _quant_counts(original) and taken  # the int8 kinds took this model's units
    # The weights, scales and zero points the remaining quantization ops read are still initializers of their
    # dtypes.
    read = {x for n in fused.graph.node if n.op_type in QUANTIZATION_OPS for x in n.input}
    want = {t.name: t.data_type for t in original.graph.initializer if t.name in read}
    assert {t.name: t.data_type for t in fused.graph.initializer if t.name in want} == want
    # No fused region took a node of a quantized pattern other than an integer matmul with its rescaling, or a
    # convolution unit with the elementwise tail its tables run as onnxruntime's nodes (kinds/qconv/lookup.py), and
    # the answers are the quantized model's.
    keep = quantized_nodes(original.graph) - integer_product_units(original.graph) - qdq_conv_units(original.graph) \
        - qdq_pool_units(original.graph)
    for e in res.report["regions"]:
        assert not any(n in keep for n in e["outputs"] if n not in e.get("tail", ())), e
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


def _dynamic_mlp(path):
    """x -> Add -> Sigmoid -> Mul (a SiLU, upstream of the quantizer) -> MatMul -> Add -> Tanh, for quantize_dynamic."""
    rng = np.random.default_rng(3)
    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b2")]
    nodes = [helper.make_node("Add", ["x", "b1"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["silu"]), helper.make_node("MatMul", ["silu", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b2"], ["z"]), helper.make_node("Tanh", ["z"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [vi("x", TensorProto.FLOAT, [32, 64])], [vi("y", TensorProto.FLOAT, [32, 64])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_upstream_of_a_dynamic_quantizer_is_fused_within_onnxruntimes_own_spread(tmp_path):
    """A kernel that rounds one ulp differently upstream of DynamicQuantizeLinear moves values across quantization
    steps, as onnxruntime's own graph optimizations do: those ops are not guarded (only a static QuantizeLinear's
    inputs are), and the whole-model check allows twice onnxruntime's own spread between its optimization levels,
    which the report gives."""
    _dynamic_mlp(str(tmp_path / "mlp.onnx"))
    src = tmp_path / "dyn.onnx"
    quantization.quantize_dynamic(str(tmp_path / "mlp.onnx"), str(src), weight_type=quantization.QuantType.QInt8)
    model = onnx.load(src)
    assert any(n.op_type == "DynamicQuantizeLinear" for n in model.graph.node)
    keep = quantized_nodes(model.graph)
    upstream = [n.output[0] for n in model.graph.node if n.op_type in ("Sigmoid",) or n.output[0] in ("a", "silu")]
    assert len(upstream) == 3 and not any(o in keep for o in upstream)
    out = tmp_path / "f.onnx"
    res = onnxopt.optimize(str(src), str(out), measure=False)
    fused = {x for e in res.report["regions"] for x in e["outputs"]}
    assert fused & set(upstream) or not res.report["regions"]
    assert res.report["verification"]["ok"] and "y" in res.report["verification"]["onnxruntime_spread"]
    # On other inputs, the same rule: within the default tolerance plus twice onnxruntime's own spread there.
    x = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32) * 3
    want = _run(src, x)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    spread = float(np.abs(want - plain).max())
    from onnxopt.timing import make_session

    kernels = make_session(onnx.load(out), 1, library=res.library).run(None, {"x": x})[0]
    for got in (kernels, _run(out, x)):  # with the library, and the function fallback without it
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 + 2 * spread)


def test_a_model_written_unchanged_keeps_its_declared_input_dims(tmp_path):
    """--input-shape fixes dims for the analysis; a model written unchanged is the model as given, since onnxruntime
    optimizes a shape-fixed quantized model differently (a dynamically quantized BERT-base moved by 0.08)."""
    _dynamic_mlp(str(tmp_path / "mlp.onnx"))
    m = onnx.load(tmp_path / "mlp.onnx")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "rows"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "rows"
    onnx.save(m, tmp_path / "sym.onnx")
    src = tmp_path / "dyn.onnx"
    quantization.quantize_dynamic(str(tmp_path / "sym.onnx"), str(src), weight_type=quantization.QuantType.QInt8)
    out = tmp_path / "f.onnx"
    res = onnxopt.optimize(str(src), str(out), measure=False, input_shape=["x:32,64"],
                           skip_fusion=["elementwise", "compute", "pool", "afusion", "horizontal", "copy", "qmatmul"])
    assert res.report.get("unchanged")
    written, given = onnx.load(out), onnx.load(src)
    assert written.graph.input[0].type == given.graph.input[0].type
    assert written.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "rows"
    x = np.random.default_rng(5).standard_normal((7, 64)).astype(np.float32)  # another row count still runs
    np.testing.assert_array_equal(_run(out, x), _run(src, x))


def test_each_qdq_convolution_gets_dequantizers_of_its_own(quantized):
    """A DequantizeLinear that a convolution shares with another reader, or reads through Identity nodes, is copied
    for it (dedicate_unit_dequantizers): the same values, and every convolution a whole QDQ unit. So is one that two
    other readers share (the model's Mul and the op after it), for all of them but the first."""
    model = onnx.load(quantized / "qdq.onnx")
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    dq = next(n for n in model.graph.node if n.output[0] == conv.input[0])
    # a second reader of the conv's dequantized input, and the weights' dequantizer behind an Identity
    model.graph.node.append(helper.make_node("Relu", [dq.output[0]], ["also"]))
    model.graph.output.append(helper.make_tensor_value_info("also", TensorProto.FLOAT, None))
    w = conv.input[1]
    model.graph.node.insert(list(model.graph.node).index(conv), helper.make_node("Identity", [w], ["w_via"]))
    conv.input[1] = "w_via"
    x = np.random.default_rng(4).standard_normal((1, 8, 16, 16)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert dedicate_unit_dequantizers(model) == 3  # the conv's input and weights, and the Mul's shared input
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = Counter(i for n in model.graph.node for i in n.input)
    outputs = {o.name for o in model.graph.output}
    assert all(readers[n.output[0]] == 1 for n in model.graph.node if n.op_type == "DequantizeLinear"
               and n.output[0] not in outputs)
    for c in (n for n in model.graph.node if n.op_type == "Conv"):
        for i in c.input:
            assert producer[i].op_type == "DequantizeLinear" and readers[i] == 1
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert dedicate_unit_dequantizers(model) == 0
