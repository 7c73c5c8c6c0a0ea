"""The cost rules per op type (`RULES`): the FLOPs of each op, in the conventions cost.py's docstring states, and
the context a rule works in."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from .shapes import TensorInfo, concrete, unbound

TRANSCENDENTAL_FLOPS = 10
T = TRANSCENDENTAL_FLOPS

# FLOPs per output element of unary elementwise ops.
UNARY_FLOPS: dict[str, int] = {
    "Relu": 1, "Abs": 1, "Neg": 1, "Sign": 1, "Floor": 1, "Ceil": 1, "Round": 1, "Not": 1, "BitwiseNot": 1,
    "IsNaN": 1, "IsInf": 1, "Sqrt": 1, "Reciprocal": 1, "ThresholdedRelu": 1,
    "LeakyRelu": 2, "Shrink": 2, "Softsign": 3, "HardSigmoid": 4, "HardSwish": 5,
    "Exp": T, "Log": T, "Tanh": T, "Erf": T, "Sin": T, "Cos": T, "Tan": T, "Asin": T, "Acos": T, "Atan": T,
    "Sinh": T, "Cosh": T, "Asinh": T, "Acosh": T, "Atanh": T,
    "Sigmoid": T + 2, "Elu": T + 2, "Selu": T + 3, "Celu": T + 3, "Gelu": T + 4, "FastGelu": T + 6,
    "Softplus": 2 * T + 1, "Mish": 3 * T + 2, "QuickGelu": T + 3,
    "Dropout": 0,  # identity at inference (a copy)
    "QuantizeLinear": 4,  # divide, round, add zero point, saturate
    "DequantizeLinear": 2,  # subtract zero point, multiply
}

# FLOPs per output element of binary (broadcasting) ops; variadic Sum/Max/Min/Mean use (inputs - 1) of them.
BINARY_FLOPS: dict[str, int] = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Mod": 1, "Pow": T, "PRelu": 2,
    "Equal": 1, "Less": 1, "Greater": 1, "LessOrEqual": 1, "GreaterOrEqual": 1,
    "And": 1, "Or": 1, "Xor": 1, "BitShift": 1, "BitwiseAnd": 1, "BitwiseOr": 1, "BitwiseXor": 1,
    "Where": 1, "Clip": 2,
}
VARIADIC = {"Sum", "Max", "Min", "Mean"}

# One op per input element (ReduceSumSquare/ReduceL2 square first: 2; ReduceLogSumExp: exp then add).
REDUCE_FLOPS: dict[str, int] = {
    "ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceProd": 1, "ReduceL1": 2,
    "ReduceL2": 2, "ReduceSumSquare": 2, "ReduceLogSum": 1, "ReduceLogSumExp": T + 1, "ArgMax": 1, "ArgMin": 1,
}

NORM_FLOPS: dict[str, int] = {
    "LayerNormalization": 8, "GroupNormalization": 8, "InstanceNormalization": 8, "MeanVarianceNormalization": 7,
    "SimplifiedLayerNormalization": 5, "RMSNormalization": 5, "SkipLayerNormalization": 9, "LpNormalization": 3,
}

SOFTMAX_FLOPS = 5
VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
MOVE_OPS = {
    "Transpose", "Concat", "Split", "Pad", "Expand", "Tile", "Cast", "CastLike", "DepthToSpace", "SpaceToDepth",
    "ReverseSequence", "Compress", "ScatterND", "ScatterElements", "Scatter", "OneHot", "Range", "ConstantOfShape",
    "Trilu", "NonZero", "TopK", "Unique", "EyeLike", "SplitToSequence", "SequenceAt", "SequenceConstruct",
    "SequenceInsert", "ConcatFromSequence",
}
CONTROL_FLOW = {"If", "Loop", "Scan"}


# --------------------------------------------------------------------------------------------------------------
# The context a rule works in


class _Ctx:
    def __init__(self, node: onnx.NodeProto, info: Mapping[str, TensorInfo], bindings: dict[str, int] | None):
        self.node = node
        self.info = info
        self.bindings = bindings or {}
        self.notes: list[str] = []
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.out_override: dict[int, list[int]] = {}  # output index -> shape computed by the rule
        self.read_override: dict[str, int] = {}  # tensor name -> elements actually read (Slice, Gather)
        self.no_read: set[str] = set()
        self.no_write = False
        self.is_view = False

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def attr(self, name: str, default=None):
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def inp(self, i: int) -> str:
        return self.node.input[i] if i < len(self.node.input) else ""

    def has(self, i: int) -> bool:
        return bool(self.inp(i))

    def _shape(self, name: str, quiet: bool = False) -> list[int] | None:
        ti = self.info.get(name)
        if ti is None or ti.shape is None:
            return None
        if not quiet:
            for d in unbound(ti.shape, self.bindings):
                self.note(f"dim {d!r} of '{name}' unbound; assumed 1" if d is not None
                          else f"a dim of '{name}' is unknown; assumed 1")
        return concrete(ti.shape, self.bindings)

    def ishape(self, i: int) -> list[int] | None:
        """Concrete shape of input i (None if absent or unknown)."""
        name = self.inp(i)
        return self._shape(name) if name else None

    def oshape(self, i: int = 0) -> list[int] | None:
        """Concrete shape of output i: the rule's own computation wins over an inferred shape with guessed dims."""
        if i in self.out_override:
            return self.out_override[i]
        if i >= len(self.node.output) or not self.node.output[i]:
            return None
        return self._shape(self.node.output[i])

    def out_known(self, i: int = 0) -> bool:
        """Whether output i's inferred shape is fully known (no unbound symbols, no unknown dims)."""
        if i >= len(self.node.output):
            return False
        ti = self.info.get(self.node.output[i])
        return ti is not None and ti.shape is not None and not unbound(ti.shape, self.bindings)

    def set_out(self, i: int, shape: list[int] | None) -> None:
        """Offer a computed shape for output i; used where inference left the shape unknown or symbolic."""
        if shape is not None and not self.out_known(i):
            self.out_override[i] = [max(0, int(d)) for d in shape]

    def dtype(self, name: str) -> str | None:
        ti = self.info.get(name)
        return ti.dtype if ti else None


def _prod(xs: Iterable[int]) -> int:
    return int(math.prod(xs))


# --------------------------------------------------------------------------------------------------------------
# Shape arithmetic shared by conv and pooling


def _pads(ctx: _Ctx, nsp: int) -> list[int]:
    p = list(ctx.attr("pads", [0] * (2 * nsp)) or [0] * (2 * nsp))
    return p if len(p) == 2 * nsp else [0] * (2 * nsp)


def window_output(in_sp: Sequence[int], kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                  dilations: Sequence[int], auto_pad: str = "NOTSET", ceil_mode: bool = False) -> list[int]:
    """Output spatial size of a sliding window (Conv, pooling), with ONNX's auto_pad and ceil_mode rules."""
    n = len(in_sp)
    out = []
    for a in range(n):
        ek = (kernel[a] - 1) * dilations[a] + 1
        s = strides[a]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-in_sp[a] // s))
        elif auto_pad == "VALID":
            out.append(max(0, -(-(in_sp[a] - ek + 1) // s)))
        else:
            span = in_sp[a] + pads[a] + pads[a + n] - ek
            if span < 0:
                out.append(0)
                continue
            o = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (o - 1) * s >= in_sp[a] + pads[a]:
                o -= 1  # the last window would start inside the end padding
            out.append(o)
    return out


def _spatial_attrs(ctx: _Ctx, nsp: int) -> tuple[list[int], list[int], list[int], str]:
    strides = list(ctx.attr("strides", None) or [1] * nsp)
    dil = list(ctx.attr("dilations", None) or [1] * nsp)
    return strides, dil, _pads(ctx, nsp), ctx.attr("auto_pad", "NOTSET") or "NOTSET"


# --------------------------------------------------------------------------------------------------------------
# Rules. Each returns the FLOPs and may adjust what is read or written.


def _conv(ctx: _Ctx) -> int:
    op = ctx.node.op_type
    xi, wi, bi = {"QLinearConv": (0, 3, 8), "ConvInteger": (0, 1, None)}.get(op, (0, 1, 2))
    x, w = ctx.ishape(xi), ctx.ishape(wi)
    if x is None or w is None or len(x) < 3:
        ctx.note("input or weight shape unknown; FLOPs not counted")
        return 0
    nsp = len(x) - 2
    n, c = x[0], x[1]
    k = w[0]
    kernel = list(ctx.attr("kernel_shape", None) or w[2:])
    group = int(ctx.attr("group", 1) or 1)
    strides, dil, pads, auto_pad = _spatial_attrs(ctx, nsp)
    out_sp = window_output(x[2:], kernel, strides, pads, dil, auto_pad)
    ctx.set_out(0, [n, k] + out_sp)
    y = ctx.oshape(0)
    if y is not None and len(y) == nsp + 2:
        out_sp = y[2:]
    outs = n * k * _prod(out_sp)
    flops = 2 * outs * (c // group) * _prod(kernel)
    if bi is not None and ctx.has(bi):
        flops += outs  # the bias add (Eq.3 has no bias; see the module docstring)
    return flops


def _conv_transpose(ctx: _Ctx) -> int:
    x, w = ctx.ishape(0), ctx.ishape(1)
    if x is None or w is None or len(x) < 3:
        ctx.note("input or weight shape unknown; FLOPs not counted")
        return 0
    nsp = len(x) - 2
    n, c = x[0], x[1]
    group = int(ctx.attr("group", 1) or 1)
    k = w[1] * group
    kernel = list(ctx.attr("kernel_shape", None) or w[2:])
    strides, dil, pads, auto_pad = _spatial_attrs(ctx, nsp)
    out_pad = list(ctx.attr("output_padding", None) or [0] * nsp)
    out_shape = ctx.attr("output_shape", None)
    if out_shape:
        out_sp = list(out_shape)[-nsp:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_sp = [x[2 + a] * strides[a] for a in range(nsp)]
    else:
        out_sp = [strides[a] * (x[2 + a] - 1) + out_pad[a] + (kernel[a] - 1) * dil[a] + 1 - pads[a] - pads[a + nsp]
                  for a in range(nsp)]
    ctx.set_out(0, [n, k] + out_sp)
    # every input element is multiplied into (K/G)*R*S output positions
    flops = 2 * n * c * _prod(x[2:]) * (k // group) * _prod(kernel)
    if ctx.has(2):
        y = ctx.oshape(0)
        flops += _prod(y) if y else 0
    return flops


def _gemm(ctx: _Ctx) -> int:
    qgemm = ctx.node.op_type == "QGemm"  # com.microsoft: a, a_scale, a_zero_point, b, b_scale, b_zero_point, C
    a, b = ctx.ishape(0), ctx.ishape(3 if qgemm else 1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        ctx.note("input shapes unknown; FLOPs not counted")
        return 0
    m, k = (a[1], a[0]) if ctx.attr("transA", 0) else (a[0], a[1])
    n = b[0] if ctx.attr("transB", 0) else b[1]
    ctx.set_out(0, [m, n])
    flops = 2 * m * n * k
    if float(ctx.attr("alpha", 1.0)) != 1.0:
        flops += m * n
    if ctx.has(6 if qgemm else 2):
        flops += m * n * (2 if float(ctx.attr("beta", 1.0)) != 1.0 else 1)
    return flops


def _matmul_dims(a: list[int], b: list[int]) -> tuple[int, int, int, int, list[int]]:
    """(batch, M, N, K, output shape) of numpy-style matmul with broadcast batch dims and 1-D operands."""
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    n = b2[-1]
    batch = list(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
    out = batch + ([m] if len(a) > 1 else []) + ([n] if len(b) > 1 else [])
    return _prod(batch), m, n, k, out


def _matmul(ctx: _Ctx) -> int:
    ai, bi = (0, 3) if ctx.node.op_type == "QLinearMatMul" else (0, 1)
    a, b = ctx.ishape(ai), ctx.ishape(bi)
    if a is None or b is None or not a or not b:
        ctx.note("input shapes unknown; FLOPs not counted")
        return 0
    if ctx.node.op_type == "FusedMatMul":  # com.microsoft: MatMul with transposes and alpha
        if ctx.attr("transA", 0) and len(a) >= 2:
            a = a[:-2] + [a[-1], a[-2]]
        if ctx.attr("transB", 0) and len(b) >= 2:
            b = b[:-2] + [b[-1], b[-2]]
    try:
        batch, m, n, k, out = _matmul_dims(a, b)
    except ValueError:
        ctx.note("batch dims do not broadcast; FLOPs not counted")
        return 0
    ctx.set_out(0, out)
    return 2 * batch * m * n * k


def _einsum(ctx: _Ctx) -> int:
    eq = (ctx.attr("equation", "") or "").replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    shapes = [ctx.ishape(i) for i in range(len(ctx.node.input))]
    if any(s is None for s in shapes) or len(lhs) != len(shapes):
        ctx.note("einsum operand shapes unknown; FLOPs not counted")
        return 0
    dims: dict[str, int] = {}
    ell: list[tuple[int, ...]] = []
    for term, shape in zip(lhs, shapes):
        if "..." in term:
            pre, post = term.split("...")
            nell = len(shape) - len(pre) - len(post)
            ell.append(tuple(shape[len(pre):len(pre) + nell]))
            letters = list(pre) + list(post)
            shape = shape[:len(pre)] + shape[len(pre) + nell:]
        else:
            letters = list(term)
        for ch, d in zip(letters, shape):
            dims[ch] = max(dims.get(ch, 1), d)
    points = _prod(dims.values()) * (_prod(np.broadcast_shapes(*ell)) if ell else 1)
    ctx.note("einsum: one multiply per operand pair and one add per point of the full index space")
    return points * len(shapes) if len(shapes) > 1 else points


def _pool(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    if x is None or len(x) < 3:
        ctx.note("input shape unknown; FLOPs not counted")
        return 0
    nsp = len(x) - 2
    kernel = list(ctx.attr("kernel_shape", None) or [1] * nsp)
    strides, dil, pads, auto_pad = _spatial_attrs(ctx, nsp)
    out_sp = window_output(x[2:], kernel, strides, pads, dil, auto_pad, bool(ctx.attr("ceil_mode", 0)))
    ctx.set_out(0, x[:2] + out_sp)
    if len(ctx.node.output) > 1:
        ctx.set_out(1, x[:2] + out_sp)
    y = ctx.oshape(0)
    outs = _prod(y) if y else x[0] * x[1] * _prod(out_sp)
    win = _prod(kernel)
    op = ctx.node.op_type
    if op == "MaxPool":
        return outs * win  # one compare per window element
    if op == "AveragePool":
        return outs * (win + 1)  # adds, then one divide
    ctx.note(f"LpPool: |x|^p and add per window element (3), a root per output ({T})")
    return outs * (3 * win + T)


def _global_pool(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    if x is None or len(x) < 2:
        ctx.note("input shape unknown; FLOPs not counted")
        return 0
    ctx.set_out(0, x[:2] + [1] * (len(x) - 2))
    n_in, n_out = _prod(x), x[0] * x[1]
    op = ctx.node.op_type
    if op == "GlobalMaxPool":
        return n_in
    if op == "GlobalAveragePool":
        return n_in + n_out
    return 3 * n_in + T * n_out


def _broadcast_out(ctx: _Ctx, inputs: Sequence[int]) -> list[int] | None:
    shapes = [ctx.ishape(i) for i in inputs if ctx.has(i)]
    if any(s is None for s in shapes) or not shapes:
        return None
    try:
        return list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        return None


def _out_elems(ctx: _Ctx, i: int = 0) -> int:
    y = ctx.oshape(i)
    if y is None:
        ctx.note("output shape unknown; FLOPs not counted")
        return 0
    return _prod(y)


def _unary(ctx: _Ctx) -> int:
    op = ctx.node.op_type
    ctx.set_out(0, ctx.ishape(0))
    if op == "Dropout" and len(ctx.node.output) > 1:
        ctx.set_out(1, ctx.ishape(0))  # the mask
    per = UNARY_FLOPS[op]
    if per >= T:
        ctx.note(f"transcendental: counted {per} FLOPs per element")
    return per * _out_elems(ctx)


def _binary(ctx: _Ctx) -> int:
    op = ctx.node.op_type
    if op == "Clip":
        ctx.set_out(0, ctx.ishape(0))
        bounds = sum(1 for i in (1, 2) if ctx.has(i)) if len(ctx.node.input) > 1 else \
            sum(1 for a in ("min", "max") if a in ctx.attrs)
        return max(bounds, 1) * _out_elems(ctx)
    ctx.set_out(0, _broadcast_out(ctx, range(len(ctx.node.input))))
    per = BINARY_FLOPS[op]
    if per >= T:
        ctx.note(f"transcendental: counted {per} FLOPs per element")
    return per * _out_elems(ctx)


def _variadic(ctx: _Ctx) -> int:
    ctx.set_out(0, _broadcast_out(ctx, range(len(ctx.node.input))))
    n = sum(1 for i in ctx.node.input if i)
    per = max(n - 1, 0) + (1 if ctx.node.op_type == "Mean" else 0)
    return per * _out_elems(ctx)


def _reduce(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    if x is None:
        ctx.note("input shape unknown; FLOPs not counted")
        return 0
    per = REDUCE_FLOPS[ctx.node.op_type]
    flops = per * _prod(x)
    if ctx.node.op_type in ("ReduceMean", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"):
        y = ctx.oshape(0)
        if y is not None:
            flops += _prod(y) * (1 if ctx.node.op_type == "ReduceMean" else T)  # divide, or sqrt/log per output
    return flops


def _softmax(ctx: _Ctx) -> int:
    ctx.set_out(0, ctx.ishape(0))
    x = ctx.ishape(0)
    if ctx.node.op_type == "Hardmax":
        return 2 * _prod(x) if x else 0
    ctx.note(f"softmax: {SOFTMAX_FLOPS} FLOPs per element (max, subtract, exp, sum, divide)")
    return SOFTMAX_FLOPS * _prod(x) if x else 0


def _norm(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    ctx.set_out(0, x)
    if x is None:
        ctx.note("input shape unknown; FLOPs not counted")
        return 0
    per = NORM_FLOPS[ctx.node.op_type]
    ctx.note(f"{ctx.node.op_type}: about {per} FLOPs per element")
    return per * _prod(x)


def _batchnorm(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    ctx.set_out(0, x)
    if x is None:
        ctx.note("input shape unknown; FLOPs not counted")
        return 0
    if ctx.attr("training_mode", 0):
        ctx.note("training mode: mean and variance computed, about 8 FLOPs per element")
        return 8 * _prod(x)
    return 2 * _prod(x)  # inference: y = x*scale' + shift' per channel


def _lrn(ctx: _Ctx) -> int:
    x = ctx.ishape(0)
    ctx.set_out(0, x)
    size = int(ctx.attr("size", 1) or 1)
    ctx.note(f"LRN: 2 per window element, a pow ({T}) and 2 more per element")
    return (2 * size + T + 2) * _prod(x) if x else 0


def _resize(ctx: _Ctx) -> int:
    y = ctx.oshape(0)
    x = ctx.ishape(0)
    if y is None:
        ctx.note("output shape unknown; FLOPs not counted")
        return 0
    mode = (ctx.attr("mode", "nearest") or "nearest").lower()
    axes = sum(1 for a, b in zip(x or [], y) if a != b) if x is not None and len(x) == len(y) else 2
    if mode == "nearest":
        ctx.note("nearest: a gather, no arithmetic")
        return 0
    if mode in ("linear", "bilinear", "trilinear"):
        per = 3 * (2 ** axes - 1)  # one lerp (sub, mul, add) per pair of neighbours
        ctx.note(f"linear over {axes} axes: {per} FLOPs per output element")
        return per * _prod(y)
    per = 2 * 4 ** axes  # cubic: a multiply-add per tap of a 4^axes stencil
    ctx.note(f"cubic over {axes} axes: {per} FLOPs per output element")
    return per * _prod(y)


def _rnn(ctx: _Ctx) -> int:
    x, w = ctx.ishape(0), ctx.ishape(1)
    if x is None or w is None:
        ctx.note("input or weight shape unknown; FLOPs not counted")
        return 0
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[ctx.node.op_type]
    dirs, gh, inp = w[0], w[1], w[2]
    hidden = gh // gates
    seq, batch = (x[1], x[0]) if ctx.attr("layout", 0) else (x[0], x[1])
    per_step = 2 * gh * (inp + hidden) + gh * 2  # matmuls against W and R, plus the biases
    per_step += hidden * {"LSTM": 5 * T + 5, "GRU": 3 * T + 6, "RNN": T}[ctx.node.op_type]
    ctx.note("recurrent: matmuls per step plus gate activations at the transcendental rate")
    return dirs * seq * batch * per_step


def _view(ctx: _Ctx) -> int:
    ctx.is_view = True
    ctx.note("view: ONNX Runtime aliases the output to the input; no bytes move")
    return 0


def _move(ctx: _Ctx) -> int:
    return 0


def _slice(ctx: _Ctx) -> int:
    """Only the sliced elements are read."""
    y = ctx.oshape(0)
    if y is not None and ctx.has(0):
        ctx.read_override[ctx.inp(0)] = _prod(y)
    return 0


def _gather(ctx: _Ctx) -> int:
    """Only the gathered rows are read (output-many elements of data), plus the indices."""
    y = ctx.oshape(0)
    if y is not None and ctx.has(0):
        ctx.read_override[ctx.inp(0)] = _prod(y)
    return 0


def _shape(ctx: _Ctx) -> int:
    ctx.no_read.update(i for i in ctx.node.input if i)
    ctx.note("reads metadata only")
    return 0


def _constant(ctx: _Ctx) -> int:
    ctx.no_write = True
    ctx.note("a constant: ONNX Runtime stores it as an initializer")
    return 0


def _control(ctx: _Ctx) -> int:
    ctx.no_write = True
    ctx.no_read.update(i for i in ctx.node.input if i)
    ctx.note("control flow: the cost is in the body graph(s), annotated separately")
    return 0


RULES: dict[str, Callable[[_Ctx], int]] = {
    "Conv": _conv, "QLinearConv": _conv, "ConvInteger": _conv, "ConvTranspose": _conv_transpose,
    "Gemm": _gemm, "QGemm": _gemm, "MatMul": _matmul, "MatMulInteger": _matmul, "QLinearMatMul": _matmul,
    "FusedMatMul": _matmul,
    "Einsum": _einsum,
    "MaxPool": _pool, "AveragePool": _pool, "LpPool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool, "GlobalLpPool": _global_pool,
    "Softmax": _softmax, "LogSoftmax": _softmax, "Hardmax": _softmax,
    "BatchNormalization": _batchnorm, "LRN": _lrn,
    "Resize": _resize, "Upsample": _resize,
    "LSTM": _rnn, "GRU": _rnn, "RNN": _rnn,
    "Slice": _slice, "Gather": _gather, "GatherElements": _gather, "GatherND": _gather,
    "Shape": _shape, "Size": _shape, "Constant": _constant,
}
RULES.update({op: _unary for op in UNARY_FLOPS})
RULES.update({op: _binary for op in BINARY_FLOPS})
RULES.update({op: _variadic for op in VARIADIC})
RULES.update({op: _reduce for op in REDUCE_FLOPS})
RULES.update({op: _norm for op in NORM_FLOPS})
RULES.update({op: _view for op in VIEW_OPS})
RULES.update({op: _move for op in MOVE_OPS})
RULES.update({op: _control for op in CONTROL_FLOW})
