"""Small int8 models and their exact integer results, shared by the int8 kinds' tests (x86 and aarch64 under
qemu): ConvInteger and QDQ conv units, MatMulInteger, each with a numpy reference that sums exactly."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_int(x, w, zx, zw, strides, pads, dil) -> np.ndarray:
    """sum (x - zx)(w - zw) over each window, exact (int64); x [N, C, H, W], w [K, C, R, S], pads (t, l, b, r)."""
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


def conv_attrs(r, s, stride, pad, dil, h, w):
    """Conv attributes, or None where the window does not fit the padded input."""
    if h + 2 * pad < dil * (r - 1) + 1 or w + 2 * pad < dil * (s - 1) + 1:
        return None
    return dict(kernel_shape=[r, s], strides=[stride, stride], pads=[pad, pad, pad, pad], dilations=[dil, dil])


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
