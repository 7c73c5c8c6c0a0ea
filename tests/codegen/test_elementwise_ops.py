"""Every elementwise op we lower, on every dtype we claim, against onnxruntime running the same node, built by each
CPU backend: LLVM IR (codegen/elementwise) and plain C (onnxopt/backends/c).

Inputs mix random values with the special ones (0, -0, +-inf, NaN, tiny, huge), a row of 37 elements so the vector
loop and its masked tail both run, and a broadcast operand so the splat path runs too.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernel_harness import assert_close, fuse, make_model, run_both
from onnxopt.backends import parse_target
from onnxopt.fusion.elementwise_ops import SUPPORTED


@pytest.fixture(params=["native", "c"], ids=["llvm", "c"])
def target(request):
    """The target of every kernel this module builds: this host through the LLVM backend, or through the C one."""
    return parse_target(request.param)

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 88.5, -88.5, 100.0, -100.0,
                    1e-8, 0.5, -0.5, 3.0, -3.0, 6.0, 2.5, -2.5], dtype=np.float64)

UNARY = ["Neg", "Abs", "Sign", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "HardSigmoid",
         "HardSwish", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Softplus", "Softsign", "Mish", "Sqrt", "Reciprocal",
         "Floor", "Ceil", "Round", "Identity", "Gelu", "Not"]
BINARY = ["Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"]
OPSET = {"Gelu": 20, "Mish": 18}
# Ops whose result for NaN inputs onnxruntime itself leaves implementation-defined: compared on finite inputs.
NAN_UNDEFINED = {"Relu", "Sign", "HardSigmoid", "HardSwish", "ThresholdedRelu", "Max", "Min", "Clip", "LeakyRelu"}


def _values(dtype, n, rng, special=True):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -100), min(info.max, 100)
        v = rng.integers(lo, hi + 1, size=n).astype(dt)
        v[:2] = [info.min, info.max] if dt.itemsize < 8 else v[:2]
        return v
    v = (rng.standard_normal(n) * 3).astype(dt)
    if special:
        k = min(len(SPECIAL), n)
        v[:k] = SPECIAL[:k].astype(dt)
    return v


def _cases():
    for op in UNARY:
        for dt in sorted(SUPPORTED[op]):
            yield op, dt
    for op in BINARY:
        for dt in sorted(SUPPORTED[op]):
            yield op, dt


def _tp(dt):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


@pytest.mark.parametrize("op,dtype", list(_cases()))
def test_op_matches_onnxruntime(op, dtype, tmp_path, target):
    rng = np.random.default_rng(0)
    shape = [3, 37]
    out_dt = "bool" if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual") else dtype
    special = op not in NAN_UNDEFINED
    if op in BINARY:
        nodes = [helper.make_node(op, ["x", "y"], ["z"])]
        inputs = [helper.make_tensor_value_info("x", _tp(dtype), shape),
                  helper.make_tensor_value_info("y", _tp(dtype), [1, 37])]
        feeds = {"x": _values(dtype, 3 * 37, rng, special).reshape(shape),
                 "y": _values(dtype, 37, rng, special).reshape(1, 37)}
        if op == "Div" and np.dtype(dtype).kind == "f":
            feeds["y"][0, :3] = [0.0, -0.0, np.inf]
    else:
        attrs = {"alpha": 0.3} if op in ("LeakyRelu", "Elu", "Celu", "ThresholdedRelu") else {}
        if op == "Gelu":
            attrs = {"approximate": "none"}
        nodes = [helper.make_node(op, ["x"], ["z"], **attrs)]
        inputs = [helper.make_tensor_value_info("x", _tp(dtype), shape)]
        feeds = {"x": _values(dtype, 3 * 37, rng, special).reshape(shape)}
    outputs = [helper.make_tensor_value_info("z", _tp(out_dt), shape)]
    model = make_model(nodes, inputs, outputs, opset=OPSET.get(op, 17))
    fused, lib, regions = fuse(model, tmp_path, target=target)
    assert len(regions) == 1 and regions[0].program.ops[0].op == op
    want, got = run_both(model, fused, lib, feeds)
    # Our transcendental functions are within a few ulp; onnxruntime's are too, so compare at 4e-6.
    assert_close(want, got, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("variant", ["gelu_tanh"])
def test_gelu_tanh(variant, tmp_path, target):
    model = make_model([helper.make_node("Gelu", ["x"], ["z"], approximate="tanh")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 40])],
                       [helper.make_tensor_value_info("z", TensorProto.FLOAT, [5, 40])], opset=20)
    fused, lib, _ = fuse(model, tmp_path, target=target)
    x = (np.random.default_rng(1).standard_normal((5, 40)) * 4).astype(np.float32)
    assert_close(*run_both(model, fused, lib, {"x": x}), rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("exponent", [2.0, 3.0, -1.0, 0.5, 1.5, 0.0, -2.0])
def test_pow_constant_exponent(exponent, tmp_path, target):
    e = numpy_helper.from_array(np.array(exponent, dtype=np.float32), "e")
    model = make_model([helper.make_node("Pow", ["x", "e"], ["z"]), helper.make_node("Neg", ["z"], ["w"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
                       [helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 33])], [e])
    fused, lib, regions = fuse(model, tmp_path, target=target)
    assert [o.op for o in regions[0].program.ops] == ["Pow", "Neg"]
    x = (np.random.default_rng(2).random((4, 33)) * 5 + 0.01).astype(np.float32)
    assert_close(*run_both(model, fused, lib, {"x": x}), rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8"])
def test_clip_min_max_variadic(dtype, tmp_path, target):
    rng = np.random.default_rng(3)
    lo = numpy_helper.from_array(np.array(-2, dtype=dtype) if np.dtype(dtype).kind != "u" else np.array(2, dtype),
                                 "lo")
    hi = numpy_helper.from_array(np.array(5, dtype=dtype), "hi")
    tp = _tp(dtype)
    model = make_model(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Max", ["c", "y", "x"], ["m"]),
         helper.make_node("Min", ["m", "y"], ["z"])],
        [helper.make_tensor_value_info("x", tp, [2, 3, 19]), helper.make_tensor_value_info("y", tp, [3, 1])],
        [helper.make_tensor_value_info("z", tp, [2, 3, 19])], [lo, hi])
    fused, lib, regions = fuse(model, tmp_path, min_ops=2, target=target)
    assert len(regions) == 1 and len(regions[0].program.ops) == 3
    feeds = {"x": _values(dtype, 114, rng, False).reshape(2, 3, 19), "y": _values(dtype, 3, rng, False).reshape(3, 1)}
    assert_close(*run_both(model, fused, lib, feeds))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "int64"), ("int64", "float32"),
                                     ("float32", "float64"), ("float64", "float32"), ("int32", "int8"),
                                     ("uint8", "float32"), ("float32", "bool"), ("bool", "float32"),
                                     ("int64", "int32"), ("int8", "int64")])
def test_cast(src, dst, tmp_path, target):
    rng = np.random.default_rng(4)
    model = make_model([helper.make_node("Cast", ["x"], ["c"], to=_tp(dst)), helper.make_node("Identity", ["c"], ["z"])],
                       [helper.make_tensor_value_info("x", _tp(src), [3, 21])],
                       [helper.make_tensor_value_info("z", _tp(dst), [3, 21])])
    fused, lib, _ = fuse(model, tmp_path, min_ops=2, target=target)
    x = _values(src, 63, rng, False).reshape(3, 21)
    if np.dtype(src).kind == "f" and np.dtype(dst).kind in "iu":
        x = np.clip(x, -100, 100)  # out-of-range float->int casts are undefined in onnxruntime too
    assert_close(*run_both(model, fused, lib, {"x": x}))


def test_where_with_bool_condition(tmp_path, target):
    rng = np.random.default_rng(5)
    model = make_model(
        [helper.make_node("Greater", ["x", "y"], ["c"]), helper.make_node("Where", ["c", "x", "y"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, 23]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 3, 23])])
    fused, lib, regions = fuse(model, tmp_path, min_ops=2, target=target)
    assert len(regions) == 1
    feeds = {"x": rng.standard_normal((4, 1, 23)).astype(np.float32),
             "y": rng.standard_normal((3, 1)).astype(np.float32)}
    assert_close(*run_both(model, fused, lib, feeds))


@pytest.mark.parametrize("out_type", ["uint8", "int8", "default"])
def test_quantized_chain_steps_exact(out_type, tmp_path, target):
    """A QDQ model's elementwise unit as one kernel: DequantizeLinear of a uint8 and an int8 tensor (one without a zero
    point), Add, HardSigmoid, Mul, QuantizeLinear. Every step as the spec's (onnxruntime without its int8 fusions):
    bit-exact, the halfway cases rounded to even and NaN to the type's least value included."""
    s = lambda v, name, dt=np.float32: numpy_helper.from_array(np.array(v, dt), name)  # noqa: E731
    q_args = ["m", "sq"] + ([] if out_type == "default" else ["zq"])
    zq = np.array(7 if out_type == "uint8" else -5, "uint8" if out_type == "uint8" else "int8")
    inits = [s(0.05, "sa"), s(131, "za", np.uint8), s(0.0731, "sb"), s(0.0123457, "sq"),
             numpy_helper.from_array(zq, "zq"), s(2.0, "two")]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["sum"]),
             helper.make_node("HardSigmoid", ["sum"], ["h"], alpha=0.3),
             helper.make_node("Div", ["sum", "two"], ["half"]),
             helper.make_node("Mul", ["half", "h"], ["m"]),
             helper.make_node("QuantizeLinear", q_args, ["y"])]
    y_type = TensorProto.UINT8 if out_type != "int8" else TensorProto.INT8
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 8, 33]),
                               helper.make_tensor_value_info("b", TensorProto.INT8, [8, 1])],
                       [helper.make_tensor_value_info("y", y_type, [2, 8, 33])], inits, opset=13)
    fused, lib, regions = fuse(model, tmp_path, target=target)
    assert len(regions) == 1 and regions[0].program.ops[0].op == "DequantizeLinear"
    assert regions[0].program.ops[-1].op == "QuantizeLinear"
    rng = np.random.default_rng(4)
    feeds = {"a": rng.integers(0, 256, (2, 8, 33)).astype(np.uint8),
             "b": rng.integers(-128, 128, (8, 1)).astype(np.int8)}
    want, got = run_both(model, fused, lib, feeds)
    assert_close(want, got)

    # QuantizeLinear alone on the values that decide its rounding: halfway cases, NaN, infinities, the range's ends.
    steps = np.arange(-300, 300, dtype=np.float32)
    x = np.concatenate([(steps + 0.5) * np.float32(0.0123457), steps * np.float32(0.0123457),
                        rng.standard_normal(500).astype(np.float32) * 4,
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)]).astype(np.float32)
    q_model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sub", ["x", "r"], ["n"]),
                          helper.make_node("Add", ["n", "r"], ["back"]),  # x again, through two ops: min_ops
                          helper.make_node("QuantizeLinear", ["back"] + q_args[1:], ["y"])],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                         [helper.make_tensor_value_info("y", y_type, [x.size])], inits, opset=13)
    (tmp_path / "q").mkdir()
    fused, lib, regions = fuse(q_model, tmp_path / "q", target=target)
    assert len(regions) == 1 and regions[0].program.ops[-1].op == "QuantizeLinear"
    want, got = run_both(q_model, fused, lib, {"x": x})
    assert_close(want, got)


def test_quantizer_refusals():
    """Per-channel scales and a scale that is not constant stay onnxruntime's, with a reason."""
    import onnx

    from onnxopt.fusion.elementwise import ElementwiseRule

    vi = helper.make_tensor_value_info
    inits = [numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "per_channel"),
             numpy_helper.from_array(np.array(0.1, np.float32), "s")]
    cases = [(helper.make_node("DequantizeLinear", ["x", "per_channel"], ["y"], axis=1), "its scale"),
             (helper.make_node("DequantizeLinear", ["x", "scale_in"], ["y"]), "its scale")]
    for node, why in cases:
        m = make_model([node], [vi("x", TensorProto.UINT8, [2, 3]), vi("scale_in", TensorProto.FLOAT, [])],
                       [vi("y", TensorProto.FLOAT, [2, 3])], inits, opset=13)
        rule = ElementwiseRule(onnx.shape_inference.infer_shapes(m))
        assert why in rule.admits(m.graph.node[0])
    ok = make_model([helper.make_node("DequantizeLinear", ["x", "s"], ["y"])], [vi("x", TensorProto.INT8, [2, 3])],
                    [vi("y", TensorProto.FLOAT, [2, 3])], inits, opset=13)
    assert ElementwiseRule(onnx.shape_inference.infer_shapes(ok)).admits(ok.graph.node[0]) is None


def test_broadcast_dequantizer_keeps_its_quantizer_apart(tmp_path, target):
    """A QuantizeLinear -> DequantizeLinear pair whose DequantizeLinear is broadcast into a larger op (an attention
    mask's Where, quantized, added to the scores): the DequantizeLinear joins the larger region and the small
    region keeps its QuantizeLinear, so no region mixes two iteration spaces (MiniLM's QDQ export made one)."""
    s = lambda v, name, dt=np.float32: numpy_helper.from_array(np.array(v, dt), name)  # noqa: E731
    inits = [s(0.05, "sm"), s(10, "zm", np.uint8), s(0.1, "ss"), s(128, "zs", np.uint8), s(0.2, "so"),
             s(100, "zo", np.uint8), s(-1.0, "neg"), s(0.5, "half")]
    nodes = [helper.make_node("Not", ["keep"], ["drop"]),
             helper.make_node("Where", ["drop", "neg", "half"], ["bias"]),
             helper.make_node("QuantizeLinear", ["bias", "sm", "zm"], ["bias_q"]),
             helper.make_node("DequantizeLinear", ["bias_q", "sm", "zm"], ["bias_f"]),
             helper.make_node("DequantizeLinear", ["scores", "ss", "zs"], ["scores_f"]),
             helper.make_node("Add", ["scores_f", "bias_f"], ["sum"]),
             helper.make_node("QuantizeLinear", ["sum", "so", "zo"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 1, 1, 8]),
                               helper.make_tensor_value_info("scores", TensorProto.UINT8, [1, 2, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 2, 8, 8])], inits, opset=13)
    fused, lib, regions = fuse(model, tmp_path, target=target)
    for r in regions:
        ops = [o.op for o in r.program.ops]
        assert not ("Where" in ops and "Add" in ops), ops  # the two iteration spaces stay apart
    rng = np.random.default_rng(6)
    feeds = {"keep": rng.random((1, 1, 1, 8)) > 0.5, "scores": rng.integers(0, 256, (1, 2, 8, 8)).astype(np.uint8)}
    assert_close(*run_both(model, fused, lib, feeds))
