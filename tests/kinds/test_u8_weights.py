"""u8 weights with a zero point in QDQ convolutions and matmuls (issue 46, item 4): the quantizer's form for a
Paddle export, whose weights are Constant nodes it quantizes at run time as activations (Constant(float W) ->
QuantizeLinear(u8, zero point) -> DequantizeLinear -> Conv). The pipeline folds the quantizer
(graph/quantized_weights.py) and the qconv and qmatmul kinds take the u8 weights exactly: as s8 w - zw where every
difference fits in s8, else as s8 w - 128 with the (128 - zw) x sum(a) row term. The written model is loaded in a
fresh process through the public loader, its kernels must run (the library's own Compute counts) and its outputs
match onnxruntime's on the original model within one output step (exactly, against the exact integer sums)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target

import onnxopt
from onnxopt.graph.fold import fold_constants
from onnxopt.graph.quantized_weights import fold_quantized_weights, signed_weights
from onnxopt.kinds.qconv.find import find_regions
from onnxopt.kinds.qmatmul.find import find_regions as find_matmul_regions
from onnxopt.measure import exact_integer_reference

pytestmark = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")

RUNS = 2
X_SHAPE = (1, 8, 10, 12)
SX, ZX = np.float32(0.05), np.uint8(131)

# The three convolutions, each reading the quantized input on its own and writing its own output (so that each
# output is one rounding away from the exact sums): name -> (cout, group, kernel, stride, the weights' zero points
# (one, or one an output channel), whether a Relu comes before its quantizer, what the kind stores, the bias's form:
# the quantizer's int32, a float Constant it left alone, or a float Constant it quantized as an activation, u8)
CONVS = {
    # per channel, zero points 40..90: w - zw reaches 215, past s8: w - 128 and the row term
    "wide": (16, 1, 3, 1, np.linspace(40, 90, 16).round().astype(np.uint8), True, "row term", "int32"),
    # depthwise, zero point 200: w - zw down to -200; its tile takes int32 w - zw
    "depthwise": (8, 8, 3, 1, np.uint8(200), False, "int32", "float"),
    # zero point 128: every w - 128 fits s8, stored as s8 with zero point 0
    "shifted": (12, 1, 3, 2, np.uint8(128), False, "shifted", "u8"),
}
# Two QDQ MatMuls of the quantized input by B [12, 20] u8: name -> (zero points, the range of the u8 values). The
# int8 GEMM takes s8 B - zw where it fits ("fits": zero points 118..137 a column, values 10..245), else s8 B - 128
# with the (128 - zw) x sum(a - za) row term ("wide_mm": zero point 30, values 0..255).
MATMULS = {
    "fits": (np.arange(118, 138).astype(np.uint8), (10, 245)),
    "wide_mm": (np.uint8(30), (0, 255)),
}


def _model() -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Conv(DequantizeLinear(QuantizeLinear(Constant float W)), int32
    bias) -> [Relu] -> QuantizeLinear -> DequantizeLinear -> output, per entry of CONVS (padding 1 everywhere), and
    likewise a MatMul per entry of MATMULS."""
    rng = np.random.default_rng(46)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"])]
    inits = [numpy_helper.from_array(SX, "sx"), numpy_helper.from_array(ZX, "zx")]
    outputs = []
    cin = X_SHAPE[1]
    for name, (cout, group, k, stride, zw, relu, _, bias_form) in CONVS.items():
        per_channel = np.asarray(zw).size > 1
        sw = (rng.uniform(0.5, 1.5, cout if per_channel else ()) * 0.01).astype(np.float32)
        zb = np.broadcast_to(np.asarray(zw, np.int32).reshape(-1, 1, 1, 1), (cout, cin // group, k, k))
        q = rng.integers(0, 256, (cout, cin // group, k, k))
        q.reshape(-1)[:2] = [0, 255]  # both ends of u8: w - zw spans past s8 unless zw is 128
        w = ((q - zb) * np.broadcast_to(sw.reshape(-1, 1, 1, 1), zb.shape)).astype(np.float32)
        axis = {"axis": 0} if per_channel else {}
        bias = rng.integers(-3000, 3000, cout).astype(np.int32)
        sb = (SX * np.broadcast_to(sw, (cout,))).astype(np.float32)
        sy = np.float32(0.05 * np.sqrt(cin // group * k * k) * 0.3)
        nodes += [helper.make_node("Constant", [], [f"{name}_w"], value=numpy_helper.from_array(w, f"{name}_w")),
                  helper.make_node("QuantizeLinear", [f"{name}_w", f"{name}_sw", f"{name}_zw"], [f"{name}_wq"],
                                   **axis),
                  helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_sw", f"{name}_zw"], [f"{name}_wf"],
                                   **axis),
                  helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], [f"{name}_xf"])]
        # a float bias off the sums' steps: the kind rounds it to them
        float_bias = ((bias + rng.uniform(-0.5, 0.5, cout)) * sb).astype(np.float32)
        if bias_form == "int32":
            nodes.append(helper.make_node("DequantizeLinear", [f"{name}_b", f"{name}_sb"], [f"{name}_bf"], axis=0))
        elif bias_form == "float":
            nodes.append(helper.make_node("Constant", [], [f"{name}_bf"],
                                          value=numpy_helper.from_array(float_bias, f"{name}_bf")))
        else:
            sbq = np.float32((float_bias.max() - min(float_bias.min(), 0)) / 255)
            inits += [numpy_helper.from_array(sbq, f"{name}_sbq"),
                      numpy_helper.from_array(np.uint8(round(-min(float_bias.min(), 0) / sbq)), f"{name}_zbq")]
            nodes += [helper.make_node("Constant", [], [f"{name}_bff"],
                                       value=numpy_helper.from_array(float_bias, f"{name}_bff")),
                      helper.make_node("QuantizeLinear", [f"{name}_bff", f"{name}_sbq", f"{name}_zbq"], [f"{name}_bq"]),
                      helper.make_node("DequantizeLinear", [f"{name}_bq", f"{name}_sbq", f"{name}_zbq"],
                                       [f"{name}_bf"])]
        nodes.append(helper.make_node("Conv", [f"{name}_xf", f"{name}_wf", f"{name}_bf"], [f"{name}_c"], group=group,
                                      kernel_shape=[k, k], pads=[1] * 4, strides=[stride] * 2))
        conv_out = f"{name}_c"
        if relu:
            nodes.append(helper.make_node("Relu", [conv_out], [f"{name}_r"]))
            conv_out = f"{name}_r"
        nodes += [helper.make_node("QuantizeLinear", [conv_out, f"{name}_sy", f"{name}_zy"], [f"{name}_yq"]),
                  helper.make_node("DequantizeLinear", [f"{name}_yq", f"{name}_sy", f"{name}_zy"], [name])]
        inits += [numpy_helper.from_array(sw, f"{name}_sw"), numpy_helper.from_array(np.asarray(zw), f"{name}_zw"),
                  numpy_helper.from_array(bias, f"{name}_b"), numpy_helper.from_array(sb, f"{name}_sb"),
                  numpy_helper.from_array(sy, f"{name}_sy"), numpy_helper.from_array(np.uint8(100), f"{name}_zy")]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    for name, (zw, (lo, hi)) in MATMULS.items():
        per_column = np.asarray(zw).size > 1
        sw = (rng.uniform(0.5, 1.5, 20 if per_column else ()) * 0.01).astype(np.float32)
        q = rng.integers(lo, hi + 1, (12, 20))
        q.reshape(-1)[:2] = [lo, hi]
        w = ((q - np.asarray(zw, np.int32)) * sw).astype(np.float32)
        axis = {"axis": 1} if per_column else {}
        nodes += [helper.make_node("Constant", [], [f"{name}_w"], value=numpy_helper.from_array(w, f"{name}_w")),
                  helper.make_node("QuantizeLinear", [f"{name}_w", f"{name}_sw", f"{name}_zw"], [f"{name}_wq"],
                                   **axis),
                  helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_sw", f"{name}_zw"], [f"{name}_wf"],
                                   **axis),
                  helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], [f"{name}_xf"]),
                  helper.make_node("MatMul", [f"{name}_xf", f"{name}_wf"], [f"{name}_m"]),
                  helper.make_node("QuantizeLinear", [f"{name}_m", f"{name}_sy", f"{name}_zy"], [f"{name}_yq"]),
                  helper.make_node("DequantizeLinear", [f"{name}_yq", f"{name}_sy", f"{name}_zy"], [name])]
        inits += [numpy_helper.from_array(sw, f"{name}_sw"), numpy_helper.from_array(np.asarray(zw), f"{name}_zw"),
                  numpy_helper.from_array(np.float32(0.05), f"{name}_sy"),
                  numpy_helper.from_array(np.uint8(128), f"{name}_zy")]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "u8_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
                          outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _feeds() -> dict:
    return {"x": np.random.default_rng(3).uniform(-6, 6, X_SHAPE).astype(np.float32)}


def _steps(model) -> dict:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {name: float(inits[f"{name}_sy"]) for name in list(CONVS) + list(MATMULS)}


def test_signed_weights_are_exact():
    w = np.array([[0, 255, 7], [200, 3, 90]], np.uint8).reshape(2, 3, 1, 1)
    s, z, shifted = signed_weights(w, np.uint8(128))
    assert shifted and s.dtype == np.int8 and int(z) == 0
    np.testing.assert_array_equal(s.astype(np.int32), w.astype(np.int32) - 128)
    same, z, shifted = signed_weights(w, np.uint8(40))  # 255 - 40 is past s8: kept, with their zero point
    assert not shifted and same is w and int(z) == 40
    per_channel = np.array([100, 150], np.uint8)  # rows [0, 255, 7] - 100 and [200, 3, 90] - 150: 155 is past s8
    assert not signed_weights(w, per_channel)[2]
    narrow = np.array([[100, 120, 110], [150, 160, 140]], np.uint8).reshape(2, 3, 1, 1)
    s, z, shifted = signed_weights(narrow, per_channel)
    assert shifted
    np.testing.assert_array_equal(s.reshape(2, 3), [[0, 20, 10], [0, 10, -10]])
    s8 = np.array([1, -2], np.int8).reshape(2, 1, 1, 1)
    same, z, shifted = signed_weights(s8, np.int8(0))
    assert same is s8 and int(z) == 0 and not shifted


def test_the_kind_takes_the_folded_u8_weights():
    """After the fold, each convolution is a qconv region, the report's note saying how its weights were stored;
    both MatMuls are qmatmul regions: the one whose B - zw fits in s8 stores that, the other B - 128 with the row
    term."""
    model = _model()
    assert fold_quantized_weights(model) == len(CONVS) + len(MATMULS) + 1  # the u8 bias's quantizer too
    fold_constants(model)  # the float bias's Constant node, as the pipeline folds it first
    model = onnx.shape_inference.infer_shapes(model)
    rejected = []
    regions = find_regions(model, set(), rejected)
    assert not rejected, rejected
    by_output = {r.outputs[0]: r for r in regions}
    for name, (cout, group, *_, stored, bias_form) in CONVS.items():
        p = by_output[f"{name}_yq"].params
        assert p.cout == cout and p.group == group and p.pads == (1, 1, 1, 1)
        assert ("bias" in p.weights_note) == p.bias_rest == (bias_form != "int32"), p.weights_note
        if stored == "shifted":
            assert not p.has_asum and "stored as s8 w - zw" in p.weights_note
        elif stored == "int32":
            assert p.depthwise and "int32 w - zw" in p.weights_note
        else:
            assert p.has_asum and not p.implicit and "w - 128" in p.weights_note
    rejected = []
    mms = {r.outputs[0]: r.params for r in find_matmul_regions(model, set(), rejected)}
    assert not rejected, rejected
    assert set(mms) == {"fits_yq", "wide_mm_yq"}
    assert not mms["fits_yq"].has_asum and mms["wide_mm_yq"].has_asum


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxruntime as ort
    import onnxopt.runtime as rt
    from onnxopt.runtime.kernel_calls import kernel_calls

    model, feeds_file, got_file, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    feeds = dict(np.load(feeds_file))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = rt.InferenceSession(model, so)
    names = [o.name for o in sess.get_outputs()]
    got = {}
    for r in range(runs):
        for name, y in zip(names, sess.run(None, feeds)):
            got[f"{r}_{name}"] = y
    np.savez(got_file, **got)
    loadable = rt.registered_library(sess, loadable=True)
    print("RESULT " + json.dumps({"library": rt.registered_library(sess),
                                  "calls": kernel_calls(loadable) if loadable else None}))
""")


def test_written_model_runs_u8_weight_kernels_in_a_fresh_process(tmp_path):
    model = _model()
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(model, src)
    before = (tmp_path / "m.onnx").read_bytes()
    # one node a kernel (no Sequence node around them), so that the library's counts name each kernel
    res = onnxopt.optimize(src, out, measure=False, threads=2, sequences=False)
    assert (tmp_path / "m.onnx").read_bytes() == before  # the user's file is read, never written
    report = res.report
    if report.get("kernels_not_run"):
        pytest.skip(f"this host cannot run the target's kernels: {report['kernels_not_run']}")
    assert report["rewrites"]["quantized_weights_folded"] == len(CONVS) + len(MATMULS) + 1
    notes = sorted(r.get("weights", "") for r in report["regions"])
    assert [sum(word in n for n in notes) for word in ("w - 128", "int32 w - zw", "s8 w - zw")] == [1, 1, 1], notes
    written = onnx.load(out)
    custom = Counter(n.op_type for n in written.graph.node if n.domain == "onnxopt")
    assert sum(v for op, v in custom.items() if op.startswith("qconv_")) == len(CONVS), custom
    assert not any(n.op_type == "Conv" for n in written.graph.node), "a convolution was left to onnxruntime"
    assert sum(v for op, v in custom.items() if op.startswith("qmatmul_")) == len(MATMULS), custom
    assert not any(n.op_type == "MatMul" for n in written.graph.node), "a matmul was left to onnxruntime"

    feeds = _feeds()
    np.savez(tmp_path / "feeds.npz", **feeds)
    p = subprocess.run([sys.executable, "-c", CHILD, out, str(tmp_path / "feeds.npz"), str(tmp_path / "got.npz"),
                        str(RUNS)], capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["library"] == os.path.realpath(out + ".so"), result
    calls = result["calls"]
    assert {op: n for op, n in calls.items() if n} == {op: n * RUNS for op, n in custom.items()}, (calls, custom)

    got = np.load(tmp_path / "got.npz")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    names = list(CONVS) + list(MATMULS)
    want = dict(zip(names, ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(names, feeds)))
    # the exact integer sums, requantized: what the kernels compute bit for bit (the fold is onnxruntime's own
    # quantization, tests/graph/test_quantized_weights.py)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    fold_quantized_weights(folded)
    exact = dict(zip(names, ort.InferenceSession(exact_integer_reference(folded).SerializeToString(), so,
                                                 providers=["CPUExecutionProvider"]).run(names, feeds)))
    steps = _steps(model)
    for r in range(RUNS):
        for name in names:
            y = got[f"{r}_{name}"]
            assert y.shape == want[name].shape
            # one output step from onnxruntime's float reference (a value on a rounding edge of the float sums)
            assert np.abs(y - want[name]).max() <= steps[name] * 1.001, name
            if name in CONVS:  # the exact reference computes QDQ convolutions in integers, as the kernel (measure.py)
                np.testing.assert_allclose(y, exact[name], rtol=0, atol=steps[name] * 1e-3, err_msg=name)
    # the u8 weights really span past s8 for the row-term convolutions, and the outputs are not trivial
    assert all(np.ptp(want[name]) > 10 * steps[name] for name in names)


def test_qlinearconv_with_u8_weights_is_exact(tmp_path):
    """The QOperator form with u8 weights and a zero point per output channel (kept u8: the row term), padded and
    strided, against onnxruntime's own QLinearConv (integer sums, the same requantization)."""
    from kind_harness import fuse_kind

    from onnxopt.kinds.qconv import KIND
    from onnxopt.timing import make_session

    rng = np.random.default_rng(11)
    cout, cin = 10, 6
    w = rng.integers(0, 256, (cout, cin, 3, 3)).astype(np.uint8)
    zw = rng.integers(20, 60, cout).astype(np.uint8)  # w - zw reaches 235: past s8
    sw = (rng.uniform(0.5, 1.5, cout) * 0.01).astype(np.float32)
    bias = rng.integers(-2000, 2000, cout).astype(np.int32)
    inits = [numpy_helper.from_array(v, n) for v, n in (
        (SX, "sx"), (ZX, "zx"), (w, "w"), (sw, "sw"), (zw, "zw"), (np.float32(0.2), "sy"), (np.uint8(90), "zy"),
        (bias, "b"))]
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"], ["y"],
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 1])
    g = helper.make_graph([node], "qlinear_u8", [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, cin, 9, 11])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                                                                ir_version=8))
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert region.params.has_asum and "w - 128" in region.params.weights_note
    feeds = {"x": rng.integers(0, 256, (2, cin, 9, 11)).astype(np.uint8)}
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    want = make_session(model, 1, optimization="none").run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
    alone = make_session(fused, 1, optimization="none").run(None, feeds)[0]  # the fallback: rebuilt u8 weights
    np.testing.assert_array_equal(alone, want)
