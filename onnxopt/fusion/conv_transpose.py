"""ConvTranspose as a compute region: what the rule admits, the weights packed by output phase, the fallback.

A strided transposed convolution is computed by output phases (codegen/glue/compute_exec.c): output rows
oh = ph + q * sh take only the kernel taps r = t * sh + a with a = (ph + pt) mod sh, so every phase is a stride-1
convolution of the input with a sub-kernel of ceil(kh / sh) x ceil(kw / sw) taps, on the blocked (channel-vector)
kernel, and no multiply-add is spent on the zeros that "insert zeros, then convolve" would add. The kernel is
zero-padded to a multiple of the stride so every phase has the same number of taps; the packed weights are a plain
reshape and transpose of the padded kernel, which the function fallback undoes with Transpose, Reshape and Slice
before running the original ConvTranspose.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from .elementwise import _attr

MAX_PHASES = 64  # sh * sw; the glue's phase table (CB_MAX_PHASES)


def admit_reason(rule, node) -> str | None:
    """Why `rule` (a ComputeRule) cannot fuse this ConvTranspose node; None when it can."""
    if rule.blocked is None:
        return "ConvTranspose needs the channel-vector kernel, which this target lacks (fewer than 8 lanes)"
    w = rule._const(node.input[1])
    if w is None or w.ndim != 4:
        return "not a 2-D transposed convolution with constant weights"
    if len(node.input) > 2 and node.input[2] and rule._const(node.input[2]) is None:
        return "bias is not constant"
    xs = rule.ew.shape_of(node.input[0])
    if xs is None or len(xs) != 4 or not isinstance(xs[1], int):
        return "input is not [N, C, H, W] with a known C"
    if int(_attr(node, "group", 1)) != 1:
        return "grouped ConvTranspose (left to onnxruntime)"
    if _attr(node, "output_shape", None):
        return "ConvTranspose with output_shape (left to onnxruntime; give pads and output_padding instead)"
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        return "ConvTranspose with SAME auto_pad (left to onnxruntime)"
    strides = list(_attr(node, "strides", [1, 1]))
    dil = list(_attr(node, "dilations", [1, 1]))
    kernel = list(_attr(node, "kernel_shape", None) or w.shape[2:])
    if kernel != list(w.shape[2:]):
        return "kernel_shape differs from the weights"
    if any(s > 1 and d != 1 for s, d in zip(strides, dil)):
        return "dilated and strided ConvTranspose (left to onnxruntime)"
    if strides[0] * strides[1] > MAX_PHASES:
        return f"ConvTranspose strides with more than {MAX_PHASES} phases"
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    if any(p < 0 for p in pads) or any(p < 0 for p in _attr(node, "output_padding", [0, 0])):
        return "negative pads"
    return None


def pack_phase_weights(w: np.ndarray, strides, lanes: int, ni: int) -> np.ndarray:
    """[IC, OC, KH, KW] -> [ceil(OC / (NI * L))][SH][SW][IC][ceil(KH / SH)][ceil(KW / SW)][NI * L]: per group of NI
    channel vectors, the taps r = t * SH + a of phase block (a, b) together, each row NI * L output channels."""
    ic, oc, kh, kw = w.shape
    sh, sw = strides
    th, tw = -(-kh // sh), -(-kw // sw)
    width = ni * lanes
    gv = -(-oc // width)
    full = np.zeros((ic, gv * width, th * sh, tw * sw), np.float32)
    full[:, :oc, :kh, :kw] = w
    return np.ascontiguousarray(full.reshape(ic, gv, width, th, sh, tw, sw).transpose(1, 4, 6, 0, 3, 5, 2))


def unpack_phase_weights(packed: np.ndarray, shape) -> np.ndarray:
    """The inverse of pack_phase_weights (what the fallback's nodes compute)."""
    gv, sh, sw, ic, th, tw, width = packed.shape
    full = packed.transpose(3, 0, 6, 4, 1, 5, 2).reshape(ic, gv * width, th * sh, tw * sw)
    _, oc, kh, kw = shape
    return full[:, :oc, :kh, :kw]


def build(rule, node, bn, params, head_out: str, uid: str):
    """Fill `params` for a ConvTranspose (BatchNorm folded): returns (region inputs, fallback body, bias name)."""
    lanes, ni = rule.blocked
    w = rule._const(node.input[1]).astype(np.float32)
    bias = rule._const(node.input[2]).astype(np.float32) if len(node.input) > 2 and node.input[2] else None
    ic, oc, kh, kw = w.shape
    if bn is not None:
        scale, b_bn, mean, var = (rule._const(x).astype(np.float64) for x in bn.input[1:5])
        s = scale / np.sqrt(var + float(_attr(bn, "epsilon", 1e-5)))
        w = (w.astype(np.float64) * s[None, :, None, None]).astype(np.float32)
        b0 = bias.astype(np.float64) if bias is not None else np.zeros(oc)
        bias = ((b0 - mean) * s + b_bn).astype(np.float32)
    strides = tuple(int(v) for v in _attr(node, "strides", [1, 1]))
    dil = tuple(int(v) for v in _attr(node, "dilations", [1, 1]))
    pads = [int(v) for v in _attr(node, "pads", [0, 0, 0, 0])]
    out_pad = tuple(int(v) for v in _attr(node, "output_padding", [0, 0]))
    packed = pack_phase_weights(w, strides, lanes, ni)
    wname = f"{uid}__phase_w"
    params.initializers.append(numpy_helper.from_array(packed, wname))
    bname = None
    if bias is not None:
        bname = f"{uid}__bias"
        params.initializers.append(numpy_helper.from_array(bias, bname))
    params.attrs = dict(oc=oc, groups=1, kernel=(kh, kw), strides=strides, dilations=dil, pads=tuple(pads),
                        auto_pad=0, ic_g=ic, output_padding=out_pad, packed_shape=packed.shape, in_blocked=0,
                        out_blocked=0, channel_vectors=1, block=lanes, packed_ni=ni)

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, np.int64),
                                                                                      name))
    gv, sh, sw, _, th, tw, width = packed.shape
    u = f"{uid}__unpack"
    body = [helper.make_node("Transpose", [wname], [f"{u}_t"], perm=[3, 0, 6, 4, 1, 5, 2]),
            const(f"{u}_s", [ic, gv * width, th * sh, tw * sw]),
            helper.make_node("Reshape", [f"{u}_t", f"{u}_s"], [f"{u}_full"])]
    if rule.ew.opset >= 10:
        body += [const(f"{u}_starts", [0, 0, 0]), const(f"{u}_ends", [oc, kh, kw]), const(f"{u}_axes", [1, 2, 3]),
                 helper.make_node("Slice", [f"{u}_full", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_w"])]
    else:
        body.append(helper.make_node("Slice", [f"{u}_full"], [f"{u}_w"], starts=[0, 0, 0], ends=[oc, kh, kw],
                                     axes=[1, 2, 3]))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body.append(helper.make_node("ConvTranspose", [node.input[0], f"{u}_w"] + ([bname] if bname else []),
                                 [head_out], name=node.name, **attrs))
    return [node.input[0], wname], body, bname
