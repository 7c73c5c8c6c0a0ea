"""Which int8 convolutions become an int8 conv kernel, and why the others do not.

The forms onnxruntime's quantizer writes:

    dynamic (quantize_dynamic):  ConvInteger(x u8, W const u8/s8, x_zero u8 scalar, W_zero const)
                                   -> Cast(to float) -> Mul(scale) -> Add(bias) -> ...  (a float epilogue, FLOAT)
    static QDQ (quantize_static): DequantizeLinear(x u8) -> Conv(DequantizeLinear(W s8, per channel), bias as
                                   DequantizeLinear(int32)) -> [Relu | Clip] -> QuantizeLinear(u8 or s8)  (QUANT)
    static QOperator:             QLinearConv(x, its scale and zero point, W s8, its scales, y's scale and zero point,
                                   B int32)  (QUANT, the same requantization)

All are 2-D, any group, with constant weights, on u8 or s8 activations (packed with the instruction's signedness,
their top bit flipped where it differs, with their zero point: the same differences). Grouped convolutions pack
per group; with one input channel a group the K order is the taps; a depthwise one (one input channel per output
channel) runs on its own tile (lower.py), with its weights also as int32 [cout][taps]. The weights are laid out
[cout][k4] (k = (kh, kw, c), channels padded to a multiple of 4), as s8: u8 weights less 128, the 128 coming back
as a row term d[r] times the pixel's sum of activations (lower.py). Pairs that could saturate AVX2's vpmaddubsw are
split (avx2_u8s8.split_pairs) into per-channel corrections (k, residual). The function fallback rebuilds the weights
(Cast, ScatterND of the residuals, Reshape, Slice, Transpose) and runs the original nodes.

A QDQ unit's Relu or Clip folds into the output's clamp, exactly: quantizing is monotone and maps 0 to the zero
point. Its bias is the quantizer's int32 one with scale x_scale * w_scale (then S + bias is QLinearConv's sum), or,
where the quantizer did not see it as a bias (a Paddle export's Constant nodes), a float constant or a u8/s8 one
quantized as an activation: that is added at float precision (an int32 part in steps of the sums, and the rest in
output steps after the scale, `bias_rest`: graph/quantized_weights.py bias_in_sum_steps), as onnxruntime's float
convolution adds it. Its weights are s8, or u8 (or s8 with a zero point), per tensor or per output channel: the
form the quantizer writes for a Constant weight it quantized as an activation, after graph/quantized_weights.py
folds its quantizer (signed_weights: s8 w - zw where that fits in s8, else u8 weights as above, w - 128 and the
row term).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.codegen.glue.kinds import c_define
from onnxopt.codegen.instructions.avx2_u8s8 import split_pairs
from onnxopt.fusion.compute import ComputeRule
from onnxopt.fusion.elementwise import _attr
from onnxopt.fusion.region import EwOp, EwProgram, Region, Value
from onnxopt.graph.quantized import integer_product_units, quantized_nodes, qdq_conv_units
from onnxopt.graph.quantized_weights import bias_in_sum_steps, dequantized_bias, signed_weights
from onnxopt.kinds.qmatmul.lower import splits_weight_pairs

from . import forms
from .amx import choose as amx_choose
from .forms import FORMS, ConvShape
from .lookup import lookup_table, tail_after
from .params import FLOAT, QUANT, QConvParams

_ONNX = ("", "ai.onnx")
_HERE = os.path.dirname(os.path.abspath(__file__))
MAX_EXTRAS = c_define("glue.h", "QC_MAX_EXTRA", _HERE)
MAX_OUTPUTS = c_define("glue.h", "QC_MAX_OUT", _HERE)
MAX_K = 8192  # the exact reference's bound (measure.exact_integer_reference writes the weights in base 8)
IMPLICIT_MAX_TAPS = c_define("glue.h", "QC_MAX_TAPS", _HERE)
TAP_SHIFT = 20  # a group-major correction's k: tap << TAP_SHIFT | channel (channels < 2^20: MAX_K)


_forced_form: str | None = None  # forced_form(): benchmarks/qconv_forms.py times each form of one convolution


@contextlib.contextmanager
def forced_form(form: str | None):
    """Within it, every convolution that may run either form runs `form` ("packed" or "implicit")."""
    global _forced_form
    if form not in FORMS + (None,):
        raise ValueError(f"form {form!r}: one of {FORMS}")
    before, _forced_form = _forced_form, form
    try:
        yield
    finally:
        _forced_form = before


def implicit_refusal(geo, has_asum: bool, out_shape, cin_g: int) -> str | None:
    """Why the implicit tile cannot run this convolution, or None: it reads a tap's window over 16 pixels of an
    output row as 64 contiguous bytes of a channel-grouped copy of the input, so stride 1, an ungrouped convolution
    of more than one input channel (the others' K runs over taps), weights of zero point 0 (no row term), at most
    IMPLICIT_MAX_TAPS taps, and a known output width."""
    kernel, strides = geo[0], geo[1]
    if strides != (1, 1):
        return "a stride above 1"
    if has_asum:
        return "the weights' row term"
    if kernel[0] * kernel[1] > IMPLICIT_MAX_TAPS:
        return f"more than {IMPLICIT_MAX_TAPS} taps"
    if geo[4] != 1 or cin_g == 1:
        return "a grouped convolution"
    ow = out_shape[-1] if out_shape is not None and len(out_shape) == 4 else None
    if not isinstance(ow, int) or ow < 1:
        return "an unknown output width"
    return None


def choose_form(geo, has_asum: bool, out_shape, cout: int, cin_g: int, rates=None) -> tuple[bool, str]:
    """(implicit, why): whether the tile reads the input in channel groups itself rather than packed receptive
    fields (im2col), as AMOS's performance model ranks the two (forms.py, on `rates`: the machine model's, the
    target's vector width), where both run."""
    refusal = implicit_refusal(geo, has_asum, out_shape, cin_g)
    if refusal is not None:
        return False, ""
    if _forced_form is not None:
        return _forced_form == "implicit", f"{_forced_form} (forced)"
    n = out_shape[0] if isinstance(out_shape[0], int) and out_shape[0] > 0 else 1
    shape = ConvShape(cin=cin_g, cout=cout, oh=int(out_shape[2]) if isinstance(out_shape[2], int) else 1,
                      ow=int(out_shape[3]), kh=geo[0][0], kw=geo[0][1], batch=n)
    ranked = forms.rank(shape, rates)
    return ranked[0][0] == "implicit", ranked[0][0] + " (AMOS's model: " + ", ".join(
        f"{f} {t * 1e3:.3g} ms" for f, t in ranked) + ")"


def pack(w: np.ndarray, w_zero: np.ndarray, group_major: bool = False, split: bool = True) -> dict[str, np.ndarray]:
    """Weights [cout, cin, kh, kw] (u8 or s8; cin per group) and their zero point (one value) for the kernel:
    "packed" [cout][k4] s8 with k = tap * cin4 + channel (channels padded to a multiple of 4, so the 4 k of a group
    are 4 channels of one tap and share the window's position: exec.c packs the activations in that order), or with
    one input channel (depthwise) k = tap, taps padded to a multiple of 4; pairs split so none saturates; "vsum"
    int32 [cout] (sum of w - zw), "dvec" int32 [cout] (what each activation adds besides its weight: 128 - zw for
    u8 weights, -zw for s8); the corrections ("fix_offsets" int32 [cout + 1], "fix_entries" int32 [count, 2]: a
    group's first k, its 4 residuals as s8 bytes; group-major: tap << TAP_SHIFT | channel) and the same for the
    fallback's ScatterND ("fix_index" int64 [count, 2]: channel, k; "fix_update" int32). `group_major` (the
    implicit form's): k = (channel group * taps + tap) * 4 + channel % 4 instead, so that the tile's K loop takes a
    channel group's taps one after another."""
    cout, cin, kh, kw = w.shape
    cin4 = -(-cin // 4) * 4
    zw = np.broadcast_to(np.asarray(w_zero, np.int32).reshape(-1), (cout,))
    shift = 128 if w.dtype == np.uint8 else 0
    if cin == 1:  # one input channel (per group: depthwise): k = tap, padded to a multiple of 4
        by_tap = np.zeros((cout, -(-kh * kw // 4) * 4), np.int32)
        by_tap[:, :kh * kw] = w.reshape(cout, -1).astype(np.int32) - shift
    else:
        by_tap = np.zeros((cout, kh, kw, cin4), np.int32)
        by_tap[..., :cin] = w.transpose(0, 2, 3, 1).astype(np.int32) - shift
    if group_major:
        by_tap = by_tap.reshape(cout, kh * kw, cin4 // 4, 4).transpose(0, 2, 1, 3)
    safe, where, residual = split_pairs(np.ascontiguousarray(by_tap).reshape(cout, -1).astype(np.int8), split)
    k4 = by_tap.size // cout
    row, kk = np.divmod(where, k4)
    order = np.lexsort((kk, row))
    row, kk, residual = row[order], kk[order], residual[order]
    flat = w.reshape(cout, -1).astype(np.int32)
    # The kernel's corrections are per (channel, group of 4 k): the residuals as one s8 quad that the tile runs
    # through the instruction itself, as it runs the safe weights (a pair holds at most one residual, |r| <= 126,
    # so a quad cannot saturate either). A group's k: group-major ones as tap << TAP_SHIFT | channel (the tile
    # finds a tap's window without a division); the fallback's fix_index keeps the packed column.
    key = row * (k4 // 4) + kk // 4
    uniq, first = np.unique(key, return_index=True)
    quads = np.zeros((len(uniq), 4), np.int8)
    quads[np.searchsorted(uniq, key), kk % 4] = residual
    group = kk[first] // 4
    k_kernel = (group % (kh * kw)) << TAP_SHIFT | (group // (kh * kw)) * 4 if group_major else group * 4
    return {"packed": safe, "vsum": (flat - zw[:, None]).sum(axis=1).astype(np.int32),
            "dvec": (shift - zw).astype(np.int32),
            "fix_offsets": np.searchsorted(row[first], np.arange(cout + 1)).astype(np.int32),
            "fix_entries": np.stack([k_kernel, quads.view(np.int32).reshape(-1)], axis=1).astype(np.int32
                                                                                                ).reshape(-1, 2),
            "fix_index": np.stack([row, kk], axis=1).astype(np.int64).reshape(-1, 2),
            "fix_update": residual.astype(np.int32)}


def _unpack_body(names: dict, w: np.ndarray, out: str, opset: int, group_major: bool) -> list[onnx.NodeProto]:
    """Nodes that rebuild the weights from their packed form and corrections (the function fallback's)."""
    def const(name, arr, dtype=np.int64):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, dtype), name))

    body = [helper.make_node("Cast", [names["packed"]], [f"{out}_i"], to=onnx.TensorProto.INT32)]
    x = f"{out}_i"
    if "fix_index" in names:
        body += [helper.make_node("Sub", [x, x], [f"{out}_zeros"]),
                 helper.make_node("ScatterND", [f"{out}_zeros", names["fix_index"], names["fix_update"]],
                                  [f"{out}_fix"]),
                 helper.make_node("Add", [x, f"{out}_fix"], [f"{out}_f"])]
        x = f"{out}_f"
    if w.dtype == np.uint8:
        body += [const(f"{out}_128", 128, np.int32), helper.make_node("Add", [x, f"{out}_128"], [f"{out}_u"])]
        x = f"{out}_u"
    cout, cin, kh, kw = w.shape
    cin4 = -(-cin // 4) * 4
    if cin == 1:  # k = tap: the first kh * kw columns are the weights
        body += [const(f"{out}_b", [0]), const(f"{out}_e", [kh * kw]), const(f"{out}_a", [1]),
                 helper.make_node("Slice", [x, f"{out}_b", f"{out}_e", f"{out}_a"], [f"{out}_s"])
                 if opset >= 10 else
                 helper.make_node("Slice", [x], [f"{out}_s"], starts=[0], ends=[kh * kw], axes=[1]),
                 const(f"{out}_shape", [cout, 1, kh, kw]),
                 helper.make_node("Reshape", [f"{out}_s", f"{out}_shape"], [f"{out}_r"]),
                 helper.make_node("Cast", [f"{out}_r"], [out], to=onnx.helper.np_dtype_to_tensor_dtype(w.dtype))]
        return body
    if group_major:  # [cout][group][tap][4] -> [cout][tap][group][4]
        body += [const(f"{out}_groups", [cout, cin4 // 4, kh, kw, 4]),
                 helper.make_node("Reshape", [x, f"{out}_groups"], [f"{out}_g"]),
                 helper.make_node("Transpose", [f"{out}_g"], [f"{out}_gt"], perm=[0, 2, 3, 1, 4])]
        x = f"{out}_gt"
    body += [const(f"{out}_taps", [cout, kh, kw, cin4]),
             helper.make_node("Reshape", [x, f"{out}_taps"], [f"{out}_t"])]
    if opset >= 10:
        body += [const(f"{out}_b", [0]), const(f"{out}_e", [cin]), const(f"{out}_a", [3]),
                 helper.make_node("Slice", [f"{out}_t", f"{out}_b", f"{out}_e", f"{out}_a"], [f"{out}_s"])]
    else:
        body.append(helper.make_node("Slice", [f"{out}_t"], [f"{out}_s"], starts=[0], ends=[cin], axes=[3]))
    body += [helper.make_node("Transpose", [f"{out}_s"], [f"{out}_r"], perm=[0, 3, 1, 2]),
             helper.make_node("Cast", [f"{out}_r"], [out], to=onnx.helper.np_dtype_to_tensor_dtype(w.dtype))]
    return body


def _geometry(rule, node, w) -> tuple | str:
    """(kernel, strides, pads, dilations, group) of a 2-D convolution, or why not."""
    if w.ndim != 4:
        return f"its weights have rank {w.ndim}; the int8 conv kernel is 2-D"
    group = int(_attr(node, "group", 1))
    cin = rule.ew.shape_of(node.input[0])
    cin = cin[1] if cin is not None and len(cin) == 4 and isinstance(cin[1], int) else None
    if group < 1 or w.shape[0] % group or (cin is not None and cin != w.shape[1] * group):
        return f"its group {group} does not divide its channels"
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto not in ("NOTSET", "VALID"):
        return f"auto_pad {auto}"
    pads = tuple(int(p) for p in _attr(node, "pads", [0, 0, 0, 0])) if auto == "NOTSET" else (0, 0, 0, 0)
    strides = tuple(int(s) for s in _attr(node, "strides", [1, 1]))
    dil = tuple(int(d) for d in _attr(node, "dilations", [1, 1]))
    if w.shape[2] * w.shape[3] * (-(-w.shape[1] // 4) * 4) > MAX_K:
        return f"its reduction is longer than {MAX_K}"
    if w.shape[1] == 1 and w.shape[2] * w.shape[3] > IMPLICIT_MAX_TAPS:
        return f"one input channel a group and more than {IMPLICIT_MAX_TAPS} taps (exec.c packs at most that many)"
    return (int(w.shape[2]), int(w.shape[3])), strides, (pads[0], pads[1], pads[2], pads[3]), dil, group


class _Rule(ComputeRule):
    def __init__(self, model):
        super().__init__(model, mi=4)
        self.rates = None  # forms.Rates: find_regions reads them for its target
        graph = model.graph
        # As qmatmul's rule: the epilogue leaves alone the nodes of quantized patterns other than an integer
        # product's rescaling.
        left = quantized_nodes(graph) - integer_product_units(graph) - qdq_conv_units(graph)
        self.protected = {k for k, n in enumerate(self.index.nodes) if n.output and n.output[0] in left}
        # A ConvInteger's epilogue stops at its rescaling (Cast, Mul, Add: the same float ops onnxruntime runs,
        # so the same bits). onnxruntime fuses nothing around a ConvInteger, so its own result does not move
        # between its optimization levels, and an activation (SiLU's Sigmoid) one ulp off feeds the next
        # DynamicQuantizeLinear and moves values across its steps: YOLOv8n's output moved by 1.2% of its scale.
        rescaling = integer_product_units(graph)
        self.beyond_rescaling = {k for k, n in enumerate(self.index.nodes) if n.output and n.output[0] not in rescaling}

    def producer(self, name):
        i = self.index.producer.get(name)
        return (i, self.index.nodes[i]) if i is not None else (None, None)

    def only_consumer(self, name) -> int | None:
        cons = self.index.consumers.get(name, [])
        if len(cons) != 1 or name in self.index.graph_outputs:
            return None
        return cons[0]

    def scalar(self, name, dtype=None):
        v = self._const(name) if name else None
        if v is None or v.size != 1 or (dtype is not None and v.dtype != dtype):
            return None
        return v.reshape(())


def find_regions(model: onnx.ModelProto, claimed: set[int], rejected: list[dict] | None = None,
                 target=None) -> list[Region]:
    """`target`: the weights' pairs are split only where its instruction saturates (splits_weight_pairs)."""
    rule = None
    regions = []
    for i, node in enumerate(model.graph.node):
        if node.domain not in _ONNX or i in claimed or node.op_type not in ("ConvInteger", "Conv", "QLinearConv"):
            continue
        if rule is None:
            rule = _Rule(model)
            rule.split = splits_weight_pairs(target)
            # AMOS's model of the two forms reads the machine model once, at the target's vector width
            rule.rates = forms.rates(lanes=target.float32_lanes if target is not None else 0,
                                     matrix=target is not None and amx_choose(target, "s8", "u8")[0] is not None)
        if node.op_type == "Conv":
            x_i, x_dq = rule.producer(node.input[0])
            if x_dq is None or x_dq.op_type != "DequantizeLinear":
                continue  # a float convolution: the compute rule's
        if rule.ew.shape_of(node.input[0]) is None or rule.ew.shape_of(node.output[0]) is None:
            # (a recognizer's neck reshapes by computed shapes): no feeds to check and time it with
            found = "its input's or output's shape is unknown"
        elif node.op_type == "Conv":
            found = _qdq_region(rule, i, claimed)
        elif node.op_type == "QLinearConv":
            found = _qlinear_region(rule, i, claimed)
        else:
            found = _dynamic_region(rule, i, claimed)
        if isinstance(found, str):
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": f"{node.op_type}: {found}"})
            continue
        regions.append(found)
    return regions


def depthwise(w: np.ndarray, group: int) -> bool:
    """One input channel per output channel: the depthwise tile's (lower.py), not the packed panels'."""
    return w.shape[1] == 1 and w.shape[0] == group


def _tables(rule, uid: str, w: np.ndarray, w_zero, group_major: bool, group: int = 1) -> tuple[dict, dict, bool,
                                                                                                   bool]:
    tables = pack(w, w_zero, group_major, split=rule.split)
    has_fix = len(tables["fix_update"]) > 0
    has_asum = bool(np.any(tables["dvec"] != 0))
    dw = depthwise(w, group)
    if dw:  # the depthwise tile's weights: int32 [cout][taps], less their zero point (the packed ones rebuild W)
        tables["dwtaps"] = (w.reshape(w.shape[0], -1).astype(np.int32) -
                            np.asarray(w_zero, np.int32).reshape(-1, 1)).astype(np.int32)
    keys = ["packed", "vsum"] + (["dwtaps"] if dw else []) + (["dvec"] if has_asum else []) + \
        (["fix_offsets", "fix_entries", "fix_index", "fix_update"] if has_fix else [])
    names = {key: f"{uid}__qc{key}" for key in keys}
    return tables, names, has_fix, has_asum


def _dynamic_region(rule: _Rule, i: int, claimed: set[int]) -> Region | str:
    idx = rule.index
    node = idx.nodes[i]
    x = node.input[0]
    act = rule.ew.dtype_of(x)
    if act not in ("uint8", "int8"):
        return f"its input is {act}, not u8 or s8"
    w = rule._const(node.input[1])
    if w is None or w.dtype not in (np.uint8, np.int8):
        return "its weights are not a constant u8 or s8 tensor"
    geo = _geometry(rule, node, w)
    if isinstance(geo, str):
        return geo
    has_azp = len(node.input) > 2 and bool(node.input[2])
    if has_azp:
        shape = rule.ew.shape_of(node.input[2])
        if rule.ew.dtype_of(node.input[2]) != act or shape is None or int(np.prod(shape or [1])) != 1:
            return "its input's zero point is not one value of its type"
    w_zero = np.zeros((), np.int32)
    if len(node.input) > 3 and node.input[3]:
        w_zero = rule._const(node.input[3])
        if w_zero is None or w_zero.size != 1:
            return ("its weights' zero point is not one constant (onnxruntime's ConvInteger, the fallback, takes "
                    "no other)")
        if w.dtype == np.int8 and np.any(w_zero != 0):
            return "s8 weights with a nonzero zero point"
    # An int32 bias per channel may come first (ConvInteger -> Add(bias) -> Cast: an older quantizer's form).
    members, int_bias = [i], None
    cast_i = rule.only_consumer(node.output[0])
    if cast_i is not None and cast_i not in claimed and idx.nodes[cast_i].op_type == "Add":
        add = idx.nodes[cast_i]
        other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        # The bias is a constant, or computed per call from the input's dynamic scale (quantize_dynamic's
        # Round(bias / (x_scale * w_scale)) -> Cast -> Reshape): an input of the kernel either way.
        cout = w.shape[0]
        shape = rule.ew.shape_of(other)
        full = tuple((1,) * (4 - len(shape)) + tuple(shape)) if shape is not None and len(shape) <= 4 else None
        if rule.ew.dtype_of(other) != "int32" or full != (1, cout, 1, 1):
            return "its int32 result gets an Add that is not an int32 bias per channel"
        int_bias = other
        members.append(cast_i)
        cast_i = rule.only_consumer(add.output[0])
    if cast_i is None or cast_i in claimed:
        return "its int32 result is read by more than a Cast to float"
    cast = idx.nodes[cast_i]
    if cast.op_type != "Cast" or cast.domain not in _ONNX or rule.ew.dtype_of(cast.output[0]) != "float32":
        return "its int32 result is not cast to float"
    out_shape = rule.ew.shape_of(cast.output[0])
    if out_shape is None or len(out_shape) != 4:
        return "its output's shape is unknown"
    bias_i = members[1] if int_bias is not None else None
    members, values, extras, kinds = members + [cast_i], {cast.output[0]}, [], []
    rule.grow_epilogue(i, claimed | rule.protected | rule.beyond_rescaling, members, values, extras, kinds, out_shape,
                       "conv", MAX_EXTRAS)
    group = set(members)
    if bias_i is not None and idx.is_used_outside(idx.nodes[bias_i].output[0], group):
        return "its int32 sum with the bias is read by more than the Cast"
    outputs = [o for m in sorted(members) if m not in (i, bias_i) for o in idx.nodes[m].output
               if idx.is_used_outside(o, group)]
    if not outputs:
        return "no output is used"
    if len(outputs) > MAX_OUTPUTS:
        return f"more than {MAX_OUTPUTS} outputs"
    uid = node.output[0]
    has_asum = w.dtype == np.uint8 or bool(np.any(np.asarray(w_zero) != 0))
    grouped, form_note = choose_form(geo, has_asum, out_shape, int(w.shape[0]), int(w.shape[1]), rule.rates)
    tables, names, has_fix, has_asum = _tables(rule, uid, w, w_zero, grouped, geo[4])
    consts: dict = {}
    head = idx.nodes[bias_i].output[0] if bias_i is not None else node.output[0]  # what the Cast reads
    ops = [rule.ew._to_op(idx.nodes[m], consts) for m in sorted(members) if m not in (i, bias_i)]
    program = EwProgram(inputs=[Value(head, "int32")] + [Value(e, "float32") for e in extras],
                        consts=consts, ops=ops, outputs=[Value(o, "float32") for o in outputs])
    inits = []
    azp = node.input[2] if has_azp else f"{uid}__qczero"
    if not has_azp:
        inits.append(numpy_helper.from_array(np.zeros((), np.dtype(act)), azp))
    unpacked = f"{uid}__unpacked_w"
    conv = onnx.NodeProto()
    conv.CopyFrom(node)
    conv.input[1] = unpacked
    body = _unpack_body(names, w, unpacked, rule.ew.opset, grouped) + [conv]
    body += [_copy(idx.nodes[m]) for m in sorted(members) if m != i]
    params = QConvParams(cin=int(w.shape[1]) * geo[4], cout=int(w.shape[0]), kernel=geo[0], strides=geo[1],
                         pads=geo[2], dilations=geo[3], group=geo[4], k4=int(tables["packed"].shape[1]), mode=FLOAT,
                         has_asum=has_asum,
                         has_fix=has_fix, act_signed=act == "int8", implicit=grouped, form_note=form_note,
                         depthwise=depthwise(w, geo[4]), int_bias=int_bias is not None, extra_kinds=tuple(kinds),
                         body=tuple(body))
    inputs = [x, azp] + list(names.values()) + ([int_bias] if int_bias is not None else []) + extras
    region = Region("qconv", [idx.nodes[m] for m in sorted(members)], inputs, outputs, program, list(out_shape),
                    params=params)
    region.initializers = inits + [numpy_helper.from_array(tables[key], name) for key, name in names.items()]
    claimed.update(members)
    return region


def _weights_note(shifted: bool, w_zero: np.ndarray, depthwise_tile: bool) -> str:
    """The report's word on how u8 weights (or s8 ones with a zero point) reach the kernel, else ""."""
    if shifted:
        return "weights with a zero point stored as s8 w - zw (every difference fits in s8)"
    if not np.any(np.asarray(w_zero) != 0) and np.asarray(w_zero).dtype == np.int8:
        return ""
    if depthwise_tile:
        return "weights with a zero point: the depthwise tile takes them as int32 w - zw"
    if np.asarray(w_zero).dtype == np.uint8:
        return "u8 weights stored as s8 w - 128; the tile adds (128 - zw) x the window's sum of activations"
    return "s8 weights with a zero point: the tile adds -zw x the window's sum of activations"


def _copy(node):
    c = onnx.NodeProto()
    c.CopyFrom(node)
    return c


def _qdq_region(rule: _Rule, i: int, claimed: set[int]) -> Region | str:
    """DequantizeLinear -> Conv -> [Relu | Clip] -> QuantizeLinear, as QUANT."""
    idx = rule.index
    node = idx.nodes[i]
    x_i, x_dq = rule.producer(node.input[0])
    w_i, w_dq = rule.producer(node.input[1])
    if w_dq is None or w_dq.op_type != "DequantizeLinear":
        return "its weights are not a DequantizeLinear of int8"
    xq = x_dq.input[0]
    act = rule.ew.dtype_of(xq)
    if act not in ("uint8", "int8"):
        return f"its input is {act}, not u8 or s8"
    sx = rule.scalar(x_dq.input[1], np.float32)
    zx = rule.scalar(x_dq.input[2], np.dtype(act)) if len(x_dq.input) > 2 and x_dq.input[2] else np.zeros((), act)
    if sx is None or zx is None:
        return "its input's scale or zero point is not a constant scalar"
    w = rule._const(w_dq.input[0])
    sw = rule._const(w_dq.input[1])
    zw = rule._const(w_dq.input[2]) if len(w_dq.input) > 2 and w_dq.input[2] else None
    if w is None or w.dtype not in (np.int8, np.uint8) or sw is None or sw.dtype != np.float32 or \
            (zw is None and len(w_dq.input) > 2 and w_dq.input[2]):
        return "its weights are not constant u8 or s8 with constant scales"
    zw = np.zeros((), w.dtype) if zw is None else zw
    cout = w.shape[0] if w.ndim == 4 else 0
    if sw.size not in (1, cout) or (sw.size > 1 and int(_attr(w_dq, "axis", 1)) != 0):
        return "its weights' scale is not per tensor or per output channel"
    if zw.dtype != w.dtype or zw.size != sw.size:
        return "its weights' zero point is not of their type, one per scale"
    w, zw, shifted = signed_weights(w, zw)
    geo = _geometry(rule, node, w)
    if isinstance(geo, str):
        return geo
    sw = np.broadcast_to(sw.reshape(-1), (cout,)).astype(np.float32)
    members = [i, w_i]
    bias, bias_note, bias_value = np.zeros(cout, np.int32), "", None  # bias_value: a float bias [cout], if any
    if len(node.input) > 2 and node.input[2]:
        b_i, b_dq = rule.producer(node.input[2])
        want = (np.float32(sx) * sw).astype(np.float32)
        float_bias = rule._const(node.input[2])
        if float_bias is not None and float_bias.dtype == np.float32 and float_bias.size == cout:
            # a Constant bias the quantizer left float (a Paddle export's)
            bias_value = float_bias.reshape(-1)
            bias_note = "; its float bias added at float precision"
        else:
            b = rule._const(b_dq.input[0]) if b_dq is not None and b_dq.op_type == "DequantizeLinear" else None
            if b is None or b.dtype not in (np.int32, np.uint8, np.int8) or b.size != cout:
                return "its bias is not the quantizer's int32 DequantizeLinear or a float constant"
            sb = rule._const(b_dq.input[1])
            zb = rule._const(b_dq.input[2]) if len(b_dq.input) > 2 and b_dq.input[2] else np.zeros((), b.dtype)
            if b.dtype != np.int32:  # a Constant bias the quantizer quantized as an activation (u8, a zero point)
                bias_value = dequantized_bias(b, sb, zb)
                if bias_value is None:
                    return "its bias is a u8 or s8 DequantizeLinear whose scale or zero point is not constant per " \
                           "tensor or channel"
                bias_note = "; its u8/s8 bias (quantized as an activation) dequantized, added at float precision"
            elif sb is None or zb is None or np.any(zb != 0) or \
                    (np.any(b != 0) and not np.allclose(np.broadcast_to(sb.reshape(-1), (cout,)), want, rtol=1e-6,
                                                        atol=0)):  # a zero bias: any scale
                return "its bias's scale is not x_scale * w_scale"
            else:
                bias = b.reshape(-1).astype(np.int32)
            if rule.only_consumer(b_dq.output[0]) != i:
                return "its bias's DequantizeLinear feeds another node too"
            members.append(b_i)
    if rule.only_consumer(w_dq.output[0]) != i:
        return "its weights' DequantizeLinear feeds another node too"
    # The output: Conv [-> Relu | Clip] -> QuantizeLinear, each read by the next alone.
    lo_f, hi_f = -np.inf, np.inf
    cur = node
    nxt = rule.only_consumer(cur.output[0])
    if nxt is not None and idx.nodes[nxt].op_type in ("Relu", "Clip"):
        clip = idx.nodes[nxt]
        if clip.op_type == "Relu":
            lo_f = 0.0
        else:
            lo = rule.scalar(clip.input[1]) if len(clip.input) > 1 and clip.input[1] else _attr(clip, "min", None)
            hi = rule.scalar(clip.input[2]) if len(clip.input) > 2 and clip.input[2] else _attr(clip, "max", None)
            if (len(clip.input) > 1 and clip.input[1] and lo is None) or (len(clip.input) > 2 and clip.input[2]
                                                                        and hi is None):
                return "its Clip's bounds are not constant"
            lo_f = float(lo) if lo is not None else -np.inf
            hi_f = float(hi) if hi is not None else np.inf
        members.append(nxt)
        cur = clip
        nxt = rule.only_consumer(cur.output[0])
    if nxt is None or idx.nodes[nxt].op_type != "QuantizeLinear" or nxt in claimed:
        return "its result does not go to one QuantizeLinear alone"
    q = idx.nodes[nxt]
    sy = rule.scalar(q.input[1], np.float32)
    zy = rule.scalar(q.input[2]) if len(q.input) > 2 and q.input[2] else np.uint8(0)
    if sy is None or zy is None or zy.dtype not in (np.uint8, np.int8):
        return "its output's scale or zero point is not a constant u8 or s8 scalar"
    if any(a.name in ("saturate", "block_size", "output_dtype") for a in q.attribute):
        return "its QuantizeLinear has attributes of opset 19 and later"
    members.append(nxt)
    bias_rest = None
    if bias_value is not None:
        split = bias_in_sum_steps(bias_value, (np.float32(sx) * sw).astype(np.float32), sy)
        if split is None:
            return "its float bias overflows the int32 sums"
        bias, bias_rest = split
    qmin, qmax = (0, 255) if zy.dtype == np.uint8 else (-128, 127)
    # Relu / Clip: clamp(q(y), q(lo), q(hi)), exact because quantizing is monotone.
    lo_q = qmin if lo_f == -np.inf else int(np.clip(np.round(np.float32(lo_f) / sy) + int(zy), qmin, qmax))
    hi_q = qmax if hi_f == np.inf else int(np.clip(np.round(np.float32(hi_f) / sy) + int(zy), qmin, qmax))
    # The pipeline gives each unit dequantizers of its own first (graph/quantized.py, dedicate_unit_dequantizers).
    if rule.only_consumer(x_dq.output[0]) != i:
        return "its input's DequantizeLinear feeds another node too"
    members.append(x_i)
    if any(m in claimed for m in members):
        return "part of it is fused elsewhere"
    zx_name = x_dq.input[2] if len(x_dq.input) > 2 and x_dq.input[2] else None

    def fallback(unpacked: str) -> list:
        """The same DequantizeLinear of the rebuilt weights (s8 w - zw, zero point 0, where they were shifted),
        then the unit's own nodes."""
        wdq = _copy(w_dq)
        wdq.input[0] = unpacked
        if shifted:
            del wdq.input[2:]
        return [wdq] + [_copy(idx.nodes[m]) for m in sorted(members) if m != w_i]

    region = _quant_region(rule, node, members, xq, act, zx_name, w, sw, bias, sx, sy, zy, (lo_q, hi_q), q.output[0],
                           geo, fallback, zw, _weights_note(shifted, zw, depthwise(w, geo[4])) + bias_note, bias_rest)
    claimed.update(members)
    return _with_tail(rule, region, claimed)


def _quant_region(rule, node, members, xq, act, zx_name, w, sw, bias, sx, sy, zy, clamp, out, geo, fallback,
                  w_zero=0, weights_note="", bias_rest=None):
    """The QUANT region of a quantized convolution (a QDQ unit or a QLinearConv): its weights packed (with their
    zero point `w_zero`: one, or one an output channel), its requantization's tables made (`bias_rest`: a float
    per channel added after the scale, or None); `fallback(the rebuilt weights' name)` gives the function body's
    nodes after the weights are rebuilt."""
    idx = rule.index
    cout = int(w.shape[0])
    uid = node.output[0]
    has_asum = w.dtype == np.uint8 or bool(np.any(np.asarray(w_zero) != 0))
    grouped, form_note = choose_form(geo, has_asum, rule.ew.shape_of(out), cout, int(w.shape[1]), rule.rates)
    tables, names, has_fix, has_asum = _tables(rule, uid, w, w_zero, grouped, geo[4])
    scale = (np.float32(sx) * sw / np.float32(sy)).astype(np.float32)  # as onnxruntime's QLinearConv computes it
    extra = {"bias": bias, "scale": scale} | ({"bias_rest": bias_rest} if bias_rest is not None else {})
    enames = {key: f"{uid}__qc{key}" for key in extra}
    out_dtype = "int8" if zy.dtype == np.int8 else "uint8"
    # Not lowered (QUANT's epilogue is lower.py's requantization); it names the output in the op type's signature.
    program = EwProgram(inputs=[Value(uid, "int32")], consts={}, ops=[EwOp("Cast", (uid,), out, out_dtype)],
                        outputs=[Value(out, out_dtype)])
    inits = []
    if zx_name is None:
        zx_name = f"{uid}__qczero"
        inits.append(numpy_helper.from_array(np.zeros((), np.dtype(act)), zx_name))
    unpacked = f"{uid}__unpacked_w"
    body = _unpack_body(names, w, unpacked, rule.ew.opset, grouped) + fallback(unpacked)
    params = QConvParams(cin=int(w.shape[1]) * geo[4], cout=cout, kernel=geo[0], strides=geo[1], pads=geo[2],
                         dilations=geo[3], group=geo[4], k4=int(tables["packed"].shape[1]), mode=QUANT,
                         has_asum=has_asum,
                         has_fix=has_fix, act_signed=act == "int8", implicit=grouped, depthwise=depthwise(w, geo[4]),
                         form_note=form_note, out_signed=zy.dtype == np.int8,
                         clamp=clamp, out_zero=int(zy), weights_note=weights_note, bias_rest=bias_rest is not None,
                         body=tuple(body))
    inputs = [xq, zx_name] + list(names.values()) + list(enames.values())
    shape = rule.ew.shape_of(out)
    region = Region("qconv", [idx.nodes[m] for m in sorted(members)], inputs, [out], program,
                    list(shape) if shape is not None else None, params=params)
    region.initializers = inits + [numpy_helper.from_array(tables[key], name) for key, name in names.items()] + \
        [numpy_helper.from_array(extra[key], name) for key, name in enames.items()]
    return region


def _with_tail(rule, region: Region, claimed: set[int]) -> Region:
    """The region with the elementwise tail after its quantized output as a table (lookup.py), when there is one;
    the tail's nodes are claimed and join its function body."""
    p, root, idx = region.params, region.outputs[0], rule.index
    values: dict = {}

    def value(name, depth=0):
        """A constant, or one that a DequantizeLinear or Identity of constants computes (a quantized
        BatchNormalization's scale): the quantizer leaves those unfolded."""
        if name not in values:
            v = rule._const(name)
            k = idx.producer.get(name)
            if v is None and k is not None and depth < 4:
                n = idx.nodes[k]
                ins = [value(x, depth + 1) if x else None for x in n.input]
                if n.op_type == "Identity" and ins[0] is not None:
                    v = ins[0]
                elif n.op_type == "DequantizeLinear" and len(ins) == 3 and all(x is not None for x in ins):
                    x, s, z = ins
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % max(x.ndim, 1)
                    along = [-1 if d == axis else 1 for d in range(x.ndim)] if s.size > 1 else [1] * x.ndim
                    v = ((x.astype(np.int32) - z.astype(np.int32).reshape(along)).astype(np.float32) *
                         s.astype(np.float32).reshape(along)).astype(np.float32)
            values[name] = v
        return values[name]

    def const_shape(name):
        v = value(name)
        return None if v is None else list(v.shape)

    found = tail_after(idx, root, claimed | {idx.producer[root]}, const_shape, rule.ew.dtype_of, p.cout)
    if found is None:
        return region
    members, end = found
    nodes = [_copy(idx.nodes[k]) for k in members]
    inits, computed, makers = [], [], set()
    for n in nodes:  # constants the graph computes become the body's own (Constant nodes), named apart
        for k, x in enumerate(n.input):
            if x and x != root and value(x) is not None:
                if rule._const(x) is None:
                    stack = [x]
                    while stack:  # the nodes that compute it join the region: nothing else may read them
                        m = idx.producer.get(stack.pop())
                        if m is not None and rule._const(idx.nodes[m].output[0]) is None and m not in makers:
                            makers.add(m)
                            stack += [y for y in idx.nodes[m].input if y]
                    n.input[k] = f"{x}__qcconst"
                    computed.append(helper.make_node("Constant", [], [n.input[k]],
                                                     value=numpy_helper.from_array(value(x), n.input[k])))
                inits.append(numpy_helper.from_array(value(x), n.input[k]))
    computed = list({c.output[0]: c for c in computed}.values())
    inside = set(members) | makers
    if makers & claimed or any(c not in inside for m in makers for c in idx.consumers.get(idx.nodes[m].output[0], [])) \
            or any(idx.nodes[m].output[0] in idx.graph_outputs for m in makers):
        return region
    end_dtype = rule.ew.dtype_of(end)
    try:
        table = lookup_table(nodes, root, end, "int8" if p.out_signed else "uint8", end_dtype, p.cout,
                             list({t.name: t for t in inits}.values()), [helper.make_opsetid("", rule.ew.opset)])
    except Exception:  # noqa: BLE001 - a tail onnxruntime cannot run alone stays onnxruntime's
        return region
    name = f"{root}__qclut"
    region.params = replace(p, lut=True, lut_offset=128 if p.out_signed else 0, out_signed=end_dtype == "int8",
                            body=p.body + tuple(computed) + tuple(nodes),
                            tail=tuple(idx.nodes[k].output[0] for k in sorted(inside)))
    region.nodes = region.nodes + [idx.nodes[k] for k in sorted(inside)]
    region.inputs = region.inputs + [name]
    region.initializers = region.initializers + [numpy_helper.from_array(table, name)]
    region.outputs = [end]
    region.program = EwProgram(inputs=list(region.program.inputs), consts={},
                               ops=[EwOp("Cast", (region.program.inputs[0].name,), end, end_dtype)],
                               outputs=[Value(end, end_dtype)])
    shape = rule.ew.shape_of(end)
    region.shape = list(shape) if shape is not None else region.shape
    claimed.update(inside)
    return region


def _qlinear_region(rule: _Rule, i: int, claimed: set[int]) -> Region | str:
    """QLinearConv, the QOperator format (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
    y_zero_point[, B int32]), as QUANT: the same requantization, clamped to the output type's range."""
    node = rule.index.nodes[i]
    xq = node.input[0]
    sx = rule.scalar(node.input[1], np.float32)
    zx = rule.scalar(node.input[2]) if node.input[2] else None
    # The zero point's type is the input's (shape inference leaves contrib ops' outputs, QLinearConcat's, untyped).
    act = str(zx.dtype) if zx is not None else rule.ew.dtype_of(xq)
    if act not in ("uint8", "int8"):
        return f"its input is {act}, not u8 or s8"
    if sx is None or (node.input[2] and zx is None):
        return "its input's scale or zero point is not a constant scalar"
    w, sw, zw = (rule._const(node.input[k]) if len(node.input) > k and node.input[k] else None for k in (3, 4, 5))
    if w is None or w.dtype not in (np.int8, np.uint8) or sw is None or sw.dtype != np.float32 or \
            (zw is None and len(node.input) > 5 and node.input[5]):
        return "its weights are not constant u8 or s8 with constant scales"
    zw = np.zeros((), w.dtype) if zw is None else zw
    geo = _geometry(rule, node, w)
    if isinstance(geo, str):
        return geo
    cout = int(w.shape[0])
    if sw.size not in (1, cout):
        return "its weights' scale is not per tensor or per output channel"
    if zw.dtype != w.dtype or zw.size not in (1, cout):
        return "its weights' zero point is not of their type, per tensor or per output channel"
    # kept as they are (no shift to s8 w - zw): the fallback's QLinearConv reads the weights with their zero point
    zw = zw.reshape(-1) if zw.size > 1 else zw.reshape(())
    sw = np.broadcast_to(sw.reshape(-1), (cout,)).astype(np.float32)
    sy = rule.scalar(node.input[6], np.float32)
    zy = rule.scalar(node.input[7]) if len(node.input) > 7 and node.input[7] else np.uint8(0)
    if sy is None or zy is None or zy.dtype not in (np.uint8, np.int8):
        return "its output's scale or zero point is not a constant u8 or s8 scalar"
    bias = np.zeros(cout, np.int32)
    if len(node.input) > 8 and node.input[8]:
        b = rule._const(node.input[8])
        if b is None or b.dtype != np.int32 or b.size != cout:
            return "its bias is not a constant int32 per output channel"
        bias = b.reshape(-1).astype(np.int32)
    clamp = (0, 255) if zy.dtype == np.uint8 else (-128, 127)

    def fallback(unpacked: str) -> list:
        conv = _copy(node)
        conv.input[3] = unpacked
        return [conv]

    region = _quant_region(rule, node, [i], xq, act, node.input[2] or None, w, sw, bias, sx, sy, zy, clamp,
                           node.output[0], geo, fallback, zw,
                           _weights_note(False, zw, depthwise(w, geo[4])))
    claimed.add(i)
    return _with_tail(rule, region, claimed)
