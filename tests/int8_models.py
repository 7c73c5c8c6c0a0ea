"""Small int8 models and their exact integer results, shared by the int8 kinds' tests (x86 and aarch64 under
qemu): ConvInteger and QDQ conv units, MatMulInteger, each with a numpy reference that sums exactly."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_int(x, w, zx, zw, strides, pads, dil, group: int = 1) -> np.ndarray:
    """sum (x - zx)(w - zw) over each window, exact (int64); x [N, C, H, W], w [K, C / group, R, S], pads (t, l, b,
    r), channels in `group` independent groups."""
    if group > 1:
        cin_g, cout_g = w.shape[1], w.shape[0] // group
        zw = np.broadcast_to(np.asarray(zw).reshape(-1), (w.shape[0],))
        return np.concatenate([conv_int(x[:, g * cin_g:(g + 1) * cin_g], w[g * cout_g:(g + 1) * cout_g], zx,
                                        zw[g * cout_g:(g + 1) * cout_g], strides, pads, dil)
                               for g in range(group)], axis=1)
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xs = np.pad(x.astype(np.int64) - int(zx), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ws = w.astype(np.int64) - np.broadcast_to(np.asarray(zw, np.int64).reshape(-1), (k,)).reshape(-1, 1, 1, 1)
    oh = (h + pads[0] + pads[2] - dil[0] * (r - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (s - 1) - 1) // strides[1] + 1
    out = np.zeros((n, k, oh, ow), np.int64)
    for i in range(r):
        for j in range(s):
            win = xs[:, :, i * dil[0]:i * dil[0] + strides[0] * (oh - 1) + 1:strides[0],
                     j * dil[1]:j * dil[1] + strides[1] * (ow - 1) + 1:strides[1]]
            out += np.einsum("nchw,kc->nkhw", win, ws[:, :, i, j])
    return out


def grouping(kind: str, cin: int, cout: int) -> tuple[int, int, int]:
    """(cin, cout, group) for a drawn grouping: "one" (group 1), "depthwise" (one channel a group), "depthwise_x2"
    (two output channels per input channel) or "two" (two groups)."""
    if kind == "depthwise":
        return cin, cin, cin
    if kind == "depthwise_x2":
        return cin, 2 * cin, cin
    if kind == "two":
        return 2 * -(-cin // 2), 2 * -(-cout // 2), 2
    return cin, cout, 1


def small_model(nodes, ins, out_type, inits):
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", out_type, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def conv_integer_model(w, wz, attrs, xshape, x_type=TensorProto.UINT8):
    """x u8 [N, C, H, W] -> ConvInteger(W, x's zero point an input, W's zero point) -> Cast -> Mul(scale) ->
    Add(bias per channel): the dynamic form, with x given directly so that tests choose its values."""
    k = w.shape[0]
    ins = [helper.make_tensor_value_info("x", x_type, list(xshape)),
           helper.make_tensor_value_info("zx", x_type, []),
           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(wz, "wz"),
             numpy_helper.from_array(np.linspace(-1, 1, k).astype(np.float32).reshape(k, 1, 1), "bias")]
    nodes = [helper.make_node("ConvInteger", ["x", "W", "zx", "wz"], ["acc"], **attrs),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "scale"], ["s"]), helper.make_node("Add", ["s", "bias"], ["y"])]
    return small_model(nodes, ins, TensorProto.FLOAT, inits)


def qdq_conv_model(w, sw, bias, sx, zx, sy, zy, attrs, xshape, relu):
    """DequantizeLinear(x u8) -> Conv(DequantizeLinear(W s8, per channel), DequantizeLinear(bias int32)) -> [Relu]
    -> QuantizeLinear(u8 or s8): the QDQ form onnxruntime's quantize_static writes, x given as u8."""
    k = w.shape[0]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(sw, "sw"),
             numpy_helper.from_array(np.zeros(k, np.int8), "wz"), numpy_helper.from_array(bias, "B"),
             numpy_helper.from_array((np.float32(sx) * sw).astype(np.float32), "sb"),
             numpy_helper.from_array(np.zeros(k, np.int32), "bz"),
             numpy_helper.from_array(np.float32(sx), "sx"), numpy_helper.from_array(zx, "zx"),
             numpy_helper.from_array(np.float32(sy), "sy"), numpy_helper.from_array(zy, "zy")]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             helper.make_node("DequantizeLinear", ["W", "sw", "wz"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["B", "sb", "bz"], ["bf"], axis=0),
             helper.make_node("Conv", ["x", "wf", "bf"], ["c"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    nodes.append(helper.make_node("QuantizeLinear", ["r" if relu else "c", "sy", "zy"], ["y"]))
    ins = [helper.make_tensor_value_info("xq", helper.np_dtype_to_tensor_dtype(zx.dtype), list(xshape))]
    return small_model(nodes, ins, TensorProto.INT8 if zy.dtype == np.int8 else TensorProto.UINT8, inits)


def conv_attrs(r, s, stride, pad, dil, h, w, group: int = 1):
    """Conv attributes, or None where the window does not fit the padded input."""
    if h + 2 * pad < dil * (r - 1) + 1 or w + 2 * pad < dil * (s - 1) + 1:
        return None
    attrs = dict(kernel_shape=[r, s], strides=[stride, stride], pads=[pad, pad, pad, pad], dilations=[dil, dil])
    if group > 1:
        attrs["group"] = group
    return attrs


def matmul_integer_model(k, n, w, lead, za_input=True):
    """A u8 [*lead, M, K] x W s8 -> Cast -> Mul(scale, an input) -> Add(bias): the kernel's pattern, with A given
    directly so that tests choose its values."""
    dims = [f"d{i}" for i in range(len(lead))] + ["m", k]
    ins = [helper.make_tensor_value_info("a", TensorProto.UINT8, dims),
           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.zeros((), np.int8), "wz"),
             numpy_helper.from_array(np.linspace(-1, 1, n).astype(np.float32), "bias")]
    if za_input:
        ins.append(helper.make_tensor_value_info("za", TensorProto.UINT8, []))
    else:
        inits.append(numpy_helper.from_array(np.array(0, np.uint8), "za"))
    nodes = [helper.make_node("MatMulInteger", ["a", "W", "za", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "scale"], ["s"]), helper.make_node("Add", ["s", "bias"], ["y"])]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def matmul_exact(a, w, za, scale, n):
    acc = (a.astype(np.int64) - int(za)) @ w.astype(np.int64)
    return acc.astype(np.int32).astype(np.float32) * np.float32(scale) + np.linspace(-1, 1, n).astype(np.float32)


def matmul_operands(rng, k: int, n: int, lead: list, m: int, extreme: bool) -> tuple[np.ndarray, np.ndarray]:
    """(A u8 [*lead, m, k], W s8 [k, n]): uniform, or at the corners of their ranges (where onnxruntime's AVX2
    kernel saturates its 16-bit pair sums)."""
    if extreme:
        return (rng.choice(np.array([0, 254, 255], np.uint8), (*lead, m, k)),
                rng.choice(np.array([-128, -127, 127, 100, -100], np.int8), (k, n)))
    return rng.integers(0, 256, (*lead, m, k)).astype(np.uint8), rng.integers(-128, 128, (k, n)).astype(np.int8)


def quantize_static_defaults(model: onnx.ModelProto, folder, xshape) -> onnx.ModelProto:
    """`model` (one float input "x" of `xshape`) quantized by onnxruntime's quantize_static with its defaults (QDQ),
    calibrated on 4 random inputs; the float model is saved as f.onnx and the quantized one as q.onnx in `folder`."""
    import os

    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": np.random.default_rng(i).standard_normal(xshape).astype(np.float32)}
                              for i in range(4)])

        def get_next(self):
            return next(self.data, None)

    onnx.save(model, os.path.join(folder, "f.onnx"))
    quantize_static(os.path.join(folder, "f.onnx"), os.path.join(folder, "q.onnx"), Reader())
    return onnx.load(os.path.join(folder, "q.onnx"))


def last_step(q: onnx.ModelProto, output: str = "y") -> float:
    """The scale of the DequantizeLinear that makes a quantized model's output: one step of it."""
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == output)
    return float(numpy_helper.to_array(next(t for t in q.graph.initializer if t.name == dq.input[1])))


def assert_written_runs_within_a_step(out, q: onnx.ModelProto, x: np.ndarray, op_type: str, folder) -> None:
    """The written model `out` run in a fresh process through the public loader: its kernel `op_type` ran, and its
    output is within one step of onnxruntime's on the quantized model `q` (a value at a rounding midpoint may go
    either way), equal almost everywhere."""
    from fresh_process import kernel_ran, run_written

    from onnxopt.timing import make_session

    got, loader = run_written(out, x, folder)
    assert kernel_ran(onnx.load(str(out)), op_type, loader["calls"]) >= 1, loader["calls"]
    want = make_session(q, 1).run(None, {"x": x})[0]
    assert np.max(np.abs(got - want)) <= last_step(q) * 1.001
    assert np.mean(got == want) > 0.99


def quantized_cnn(folder, nodes, weights: dict, xshape, rng, qoperator: bool = False) -> str:
    """A float model of `nodes` (input "x" of `xshape`, output "y", `weights` by name) quantized by onnxruntime's
    quantize_static (u8 activations, per-channel s8 weights, 4 random calibration inputs; QDQ, or the QOperator
    format); returns the quantized model's path."""
    import os

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    fpath, qpath = os.path.join(folder, "f.onnx"), os.path.join(folder, "q.onnx")
    onnx.save(m, fpath)

    class Reader(CalibrationDataReader):
        left = 4

        def get_next(self):
            self.left -= 1
            return {"x": rng.standard_normal(xshape).astype(np.float32)} if self.left >= 0 else None

    quantize_static(fpath, qpath, Reader(), quant_format=QuantFormat.QOperator if qoperator else QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    return qpath


def conv_integer_operands(rng, wshape, xshape, unsigned_w: bool, extreme: bool):
    """(weights, their zero point, u8 activations) for ConvInteger: u8 weights with a drawn zero point or s8 ones
    with none, uniform or at the corners of their ranges."""
    if unsigned_w:
        wt = rng.choice(np.array([0, 1, 255, 254], np.uint8), wshape) if extreme else \
            rng.integers(0, 256, wshape).astype(np.uint8)
        wz = np.array(rng.integers(0, 256), np.uint8)
    else:
        wt = rng.choice(np.array([-128, -127, 127, 100], np.int8), wshape) if extreme else \
            rng.integers(-128, 128, wshape).astype(np.int8)
        wz = np.zeros((), np.int8)
    x = rng.choice(np.array([0, 255, 254], np.uint8), xshape) if extreme else \
        rng.integers(0, 256, xshape).astype(np.uint8)
    return wt, wz, x


def qlinear_matmul_case(rng, k: int, n: int, lead: list, per_column: bool):
    """(a QLinearMatMul model, its feeds, the spec's result): A u8 [*lead, k] x B s8 [k, n] constant, u8 output."""
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    sw = (rng.uniform(0.5, 2, n if per_column else 1) * 0.01).astype(np.float32)
    sa, za, sy, zy = np.float32(0.02), np.uint8(9), np.float32(0.04 * np.sqrt(k)), np.uint8(120)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(sw, "sw"),
             numpy_helper.from_array(np.zeros(sw.shape, np.int8), "zw"), numpy_helper.from_array(sa, "sa"),
             numpy_helper.from_array(np.array(za), "za"), numpy_helper.from_array(sy, "sy"),
             numpy_helper.from_array(np.array(zy), "zy")]
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "W", "sw", "zw", "sy", "zy"], ["y"])
    model = small_model([node], [helper.make_tensor_value_info("a", TensorProto.UINT8, list(lead) + [k])],
                        TensorProto.UINT8, inits)
    a = rng.integers(0, 256, list(lead) + [k]).astype(np.uint8)
    s = (a.astype(np.int64) - int(za)) @ w.astype(np.int64)
    scale = (sa * np.broadcast_to(sw, (n,)) / sy).astype(np.float32)
    want = np.clip(np.rint(s.astype(np.int32).astype(np.float32) * scale) + int(zy), 0, 255).astype(np.uint8)
    return model, {"a": a}, want


def qgemm_case(rng, m: int, k: int, n: int, trans_b: bool, per_column: bool, bias: bool, alpha: float,
               signed_out: bool = False):
    """(a com.microsoft QGemm model, its feeds, the exact result as QGemm defines it): A u8 [m, k] x B s8 constant
    ([n, k] where `trans_b`), an int32 bias a column, u8 or s8 output; scales alpha * a_scale * b_scale / y_scale
    in float32, in that order, and the bias added to the int32 sums."""
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    sw = (rng.uniform(0.5, 2, n if per_column else 1) * 0.01).astype(np.float32)
    sa, za, sy = np.float32(0.02), np.uint8(9), np.float32(0.04 * np.sqrt(k))
    zy = np.array(-7 if signed_out else 120, np.int8 if signed_out else np.uint8)
    c = rng.integers(-3000, 3000, n).astype(np.int32)
    inits = [numpy_helper.from_array(np.ascontiguousarray(w.T) if trans_b else w, "W"),
             numpy_helper.from_array(sw, "sw"), numpy_helper.from_array(np.zeros(sw.shape, np.int8), "zw"),
             numpy_helper.from_array(sa, "sa"), numpy_helper.from_array(np.array(za), "za"),
             numpy_helper.from_array(sy, "sy"), numpy_helper.from_array(zy, "zy"), numpy_helper.from_array(c, "C")]
    node = helper.make_node("QGemm", ["a", "sa", "za", "W", "sw", "zw", "C" if bias else "", "sy", "zy"], ["y"],
                            domain="com.microsoft", transB=int(trans_b), alpha=alpha)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8 if signed_out else TensorProto.UINT8,
                                                         [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    s = (a.astype(np.int64) - int(za)) @ w.astype(np.int64) + (c if bias else 0)
    scale = (np.float32(alpha) * sa * np.broadcast_to(sw, (n,)) / sy).astype(np.float32)
    lo, hi = (-128, 127) if signed_out else (0, 255)
    want = np.clip(np.rint(s.astype(np.int32).astype(np.float32) * scale) + int(zy), lo, hi)
    return model, {"a": a}, want.astype(zy.dtype)


def drop_shapes(model: onnx.ModelProto, names) -> None:
    """The declared shapes of these graph inputs and outputs removed: passed in a blocked layout, they are 5-D."""
    for v in list(model.graph.input) + list(model.graph.output):
        if v.name in names:
            v.type.tensor_type.ClearField("shape")


def qdq_tail(kind: str, c: int, rng, signed_out: bool) -> tuple[list, list]:
    """(nodes from "y" (a QDQ unit's quantized output, sy and zy its scale and zero point) to "z", their
    initializers): "bn_hardswish" (BatchNormalization, then HardSwish, each requantized: the orientation
    classifier's) or "silu" (x * Sigmoid(x), the Sigmoid's output requantized, x read twice)."""
    zt = np.int8 if signed_out else np.uint8
    inits = [numpy_helper.from_array(np.float32(0.07), "s1"), numpy_helper.from_array(np.array(3, np.uint8), "z1"),
             numpy_helper.from_array(np.float32(0.05), "s2"), numpy_helper.from_array(np.array(-4 if signed_out else 9,
                                                                                                  zt), "z2")]
    nodes = [helper.make_node("DequantizeLinear", ["y", "sy", "zy"], ["t0"])]
    if kind == "bn_hardswish":
        inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
                  (("g", rng.uniform(0.5, 2, c)), ("b", rng.normal(0, 0.5, c)), ("m", rng.normal(0, 0.3, c)),
                   ("v", rng.uniform(0.5, 2, c)))]
        nodes += [helper.make_node("BatchNormalization", ["t0", "g", "b", "m", "v"], ["t1"]),
                  helper.make_node("QuantizeLinear", ["t1", "s1", "z1"], ["q1"]),
                  helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["t2"]),
                  helper.make_node("HardSwish", ["t2"], ["t3"])]
    else:
        nodes += [helper.make_node("Sigmoid", ["t0"], ["t1"]),
                  helper.make_node("QuantizeLinear", ["t1", "s1", "z1"], ["q1"]),
                  helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["t2"]),
                  helper.make_node("Mul", ["t0", "t2"], ["t3"])]
    nodes.append(helper.make_node("QuantizeLinear", ["t3", "s2", "z2"], ["z"]))
    return nodes, inits


def qdq_unit_operands(rng, cin: int, cout: int, r: int) -> tuple:
    """(s8 weights [cout, cin, r, r], per-channel weight scales, int32 bias, x's scale, y's scale) of a QDQ unit."""
    wt = rng.integers(-127, 128, (cout, cin, r, r)).astype(np.int8)
    sw = (rng.uniform(0.5, 2.0, cout) * 0.01).astype(np.float32)
    bias = rng.integers(-3000, 3000, cout).astype(np.int32)
    return wt, sw, bias, np.float32(0.02), np.float32(0.05 * np.sqrt(cin * r * r))


def requantized(exact, bias, sx, sw, sy, zy, relu: bool) -> np.ndarray:
    """The exact sums requantized as QLinearConv does: float(S + bias) * (x_scale * w_scale / y_scale), rounded half
    to even, plus the zero point, [Relu,] saturated to zy's type (int64)."""
    scale = (sx * sw / sy).astype(np.float32).reshape(1, -1, 1, 1)
    q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale).astype(np.int64)
    q = q + int(zy)
    if relu:
        q = np.maximum(q, int(zy))
    return np.clip(q, *((-128, 127) if np.dtype(zy.dtype) == np.int8 else (0, 255)))

