"""QuantizeLinear of constant weights, folded offline into the integers it computes.

onnxruntime's quantize_static quantizes a weight that is not an initializer (a Paddle export's `Constant` node) as
if it were an activation: Constant(float W) -> QuantizeLinear(scale, u8 zero point, per tensor) -> DequantizeLinear
-> Conv. onnxruntime then quantizes W again on every run, and a rule that wants constant integer weights (the int8
kinds' find.py) sees none. The QuantizeLinear's result is a constant: this pass computes it once, exactly as
onnxruntime's QuantizeLinear does (MLAS: x / scale in float32, rounded half to even, saturated to the output type,
plus the zero point; per tensor or per axis), and puts it in the graph as an initializer of the same name, so the
DequantizeLinear reads integer weights as in the quantizer's usual form. The values are the ones onnxruntime
computes at run time, so the model's results do not move.

The weights this leaves are u8 with a zero point (the activations' type), and a bias the quantizer took for an
activation is u8 too, or was left float. `signed_weights`, `dequantized_bias` and `bias_in_sum_steps` are how the
int8 kinds (onnxopt/kinds/qconv, qmatmul) and their exact reference (measure.py) take those, exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import _constant_node_value, remove_dead_nodes
from .large import add_messages

_ONNX = ("", "ai.onnx")
# The integer types QuantizeLinear writes that this pass computes (float8 and int4 outputs are left as they are).
_OUTPUT_TYPES = {onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8,
                 onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.INT16: np.int16}


def quantize_like_onnxruntime(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int = 1) -> np.ndarray:
    """QuantizeLinear of float32 `x` as onnxruntime computes it: saturate(round_half_even(x / scale) + zero_point),
    the division in float32; `scale` and `zero_point` one value (per tensor) or one per index of `axis`. The result
    has the zero point's type."""
    x = np.asarray(x, np.float32)
    scale = np.asarray(scale, np.float32)
    out_type = np.asarray(zero_point).dtype
    if scale.size > 1:  # per axis: the scales run along `axis`
        along = [1] * x.ndim
        along[axis % x.ndim] = -1
        scale = scale.reshape(along)
        zero_point = np.asarray(zero_point).reshape(along)
    info = np.iinfo(out_type)
    q = np.rint(x / scale).astype(np.float64) + np.asarray(zero_point, np.float64)
    return np.clip(q, info.min, info.max).astype(out_type)


def fold_quantized_weights(model: onnx.ModelProto) -> int:
    """Replace, in place, each QuantizeLinear of the main graph whose input is a constant float32 tensor (an
    initializer, a Constant node's value, either through Identity nodes) and whose scale and zero point are
    constant by an initializer holding its result; the float weights and the nodes that only fed it go. Returns how
    many were folded."""
    graph = model.graph
    overridable = {i.name for i in graph.input}  # initializers that are inputs too can be replaced at run time
    inits = {t.name: t for t in graph.initializer if t.name not in overridable}
    producer = {o: n for n in graph.node for o in n.output if o}
    outputs = {o.name for o in graph.output}
    values: dict[str, np.ndarray | None] = {}

    def constant(name: str, depth: int = 0) -> np.ndarray | None:
        if name not in values:
            v = None
            if name in inits:
                v = numpy_helper.to_array(inits[name])
            elif name in producer and depth < 8:
                n = producer[name]
                if n.domain in _ONNX and n.op_type == "Constant":
                    v = _constant_node_value(n)
                elif n.domain in _ONNX and n.op_type == "Identity" and n.input:
                    v = constant(n.input[0], depth + 1)
            values[name] = v
        return values[name]

    folded: list[onnx.TensorProto] = []
    gone: set[str] = set()
    for n in graph.node:
        if n.op_type != "QuantizeLinear" or n.domain not in _ONNX or not n.output or n.output[0] in outputs:
            continue
        q = _quantized_value(n, constant)
        if q is not None:
            folded.append(numpy_helper.from_array(q, n.output[0]))
            gone.add(n.output[0])
    if not folded:
        return 0
    nodes = [n for n in graph.node if not (n.output and n.output[0] in gone)]
    del graph.node[:]
    graph.node.extend(nodes)
    add_messages(graph.initializer, folded)
    remove_dead_nodes(model)  # the float weights, and the Constant and Identity nodes that only fed them
    return len(folded)


def _quantized_value(node: onnx.NodeProto, constant) -> np.ndarray | None:
    """The QuantizeLinear's result when its inputs are constants of the forms onnxruntime's kernel computes the way
    quantize_like_onnxruntime does, else None."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("block_size", 0):  # opset 21's blocked quantization: left to onnxruntime
        return None
    if len(node.input) < 2 or not node.input[0] or not node.input[1]:
        return None
    x, scale = constant(node.input[0]), constant(node.input[1])
    if x is None or scale is None or x.dtype != np.float32 or scale.dtype != np.float32:
        return None
    has_zero = len(node.input) > 2 and bool(node.input[2])
    zero = constant(node.input[2]) if has_zero else None
    if has_zero and zero is None:
        return None
    if zero is None:  # no zero point: the type opset 21's output_dtype names, else uint8
        out_type = _OUTPUT_TYPES.get(attrs.get("output_dtype", onnx.TensorProto.UINT8))
        if out_type is None:
            return None
        zero = np.zeros(scale.shape, out_type)
    if zero.dtype not in [np.dtype(t) for t in _OUTPUT_TYPES.values()] or zero.size != scale.size:
        return None
    if np.any(np.isnan(x)) or np.any(~np.isfinite(scale)) or np.any(scale == 0):
        return None  # what onnxruntime's kernel makes of these is not ours to restate
    if scale.size > 1:  # per axis (a scale of one value, of any rank, is onnxruntime's per tensor)
        axis = attrs.get("axis", 1)
        if scale.ndim != 1 or x.ndim == 0 or not -x.ndim <= axis < x.ndim or x.shape[axis] != scale.size:
            return None
        return quantize_like_onnxruntime(x, scale, zero, axis)
    return quantize_like_onnxruntime(x, scale.reshape(()), zero.reshape(()))


def signed_weights(w: np.ndarray, w_zero: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray, bool]:
    """u8 weights (or s8 ones with a zero point; one, or one per index of `axis`: a conv's output channels, a
    matmul's columns) as the int8 kinds best take them, exactly: s8 w - zw with zero point 0 where every difference
    fits in s8 (the plain s8 path), else as they are (the qconv kind then stores w - 128 and its tile adds the
    (128 - zw) x sum(a) row term). Returns (weights, zero point, shifted)."""
    zw = np.asarray(w_zero)
    if w.dtype == np.int8 and not np.any(zw != 0):
        return w, np.zeros((), np.int8), False
    along = [1] * w.ndim
    if zw.size > 1:
        along[axis] = -1
    diff = w.astype(np.int32) - zw.astype(np.int32).reshape(along)
    if diff.min() >= -128 and diff.max() <= 127:
        return diff.astype(np.int8), np.zeros((), np.int8), True
    return w, zw.reshape(-1) if zw.size > 1 else zw.reshape(()), False


def dequantized_bias(b: np.ndarray, sb: np.ndarray | None, zb: np.ndarray | None) -> np.ndarray | None:
    """A u8 or s8 bias [cout] as onnxruntime's DequantizeLinear computes it, (b - zb) * sb in float32, or None where
    the scale or zero point is not constant per tensor or per channel."""
    cout = b.size
    if sb is None or zb is None or sb.size not in (1, cout) or zb.size not in (1, cout) or zb.dtype != b.dtype:
        return None
    zero = np.broadcast_to(zb.astype(np.int32).reshape(-1), (cout,))
    scale = np.broadcast_to(sb.astype(np.float32).reshape(-1), (cout,))
    return ((b.reshape(-1).astype(np.int32) - zero).astype(np.float32) * scale).astype(np.float32)


def bias_in_sum_steps(value: np.ndarray, step: np.ndarray, y_scale) -> tuple[np.ndarray, np.ndarray] | None:
    """A float bias [cout] (one the quantizer left float, or quantized as an activation) for QUANT's epilogue,
    float(S + bias) * scale + rest: `bias` int32, the bias in steps of the sums (`step`, x_scale * w_scale per
    channel) rounded half to even, and `rest` float32, what is left of it in output steps (the bias less bias *
    step, over y_scale). The bias is then added at float precision, as onnxruntime adds it to its float
    convolution, rather than rounded to the sums' step. None where it does not fit the int32 sums."""
    step64 = step.astype(np.float64)
    units = np.rint(value.astype(np.float64) / step64)
    if not np.all(np.isfinite(units)) or np.abs(units).max(initial=0) >= 2 ** 30:
        return None
    rest = (value.astype(np.float64) - units * step64) / np.float64(y_scale)
    return units.astype(np.int32), rest.astype(np.float32)
