"""ConvTranspose as a compute region: what the rule admits, the weights packed by output phase, the fallback.

A strided transposed convolution is computed by output phases (codegen/glue/compute_exec.c): output rows
oh = ph + q * sh take only the kernel taps r = t * sh + a with a = (ph + pt) mod sh, so every phase is a stride-1
convolution of the input with a sub-kernel of ceil(kh / sh) x ceil(kw / sw) taps, and no multiply-add is spent on
the zeros that "insert zeros, then convolve" would add. The phases run on the channel-vector kernel (vectors of
output channels, blocked per phase), or, for few output channels, on the pixel-vector kernel (vectors along each
phase's output rows, interleaved into the output at the end). The kernel is
zero-padded to a multiple of the stride so every phase has the same number of taps; the packed weights are a plain
reshape and transpose of the padded kernel, which the function fallback undoes with Transpose, Reshape and Slice
before running the original ConvTranspose.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from .elementwise import _attr
from .params import ComputeAttrs

MAX_PHASES = 64  # sh * sw; the glue's phase table (CB_MAX_PHASES)


def admit_reason(rule, node) -> str | None:
    """Why `rule` (a ComputeRule, which has checked the operands: conv_operands_reason) cannot fuse this
    ConvTranspose node; None when it can."""
    if rule.blocked is None:
        return "ConvTranspose needs the channel-vector kernel, which this target lacks (fewer than 8 lanes)"
    w = rule._const(node.input[1])
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


def _padded(w: np.ndarray, strides, width: int) -> tuple[np.ndarray, int]:
    """The kernel zero-padded to a multiple of the stride and the output channels to a multiple of `width`, as
    [IC, blocks, width, th, sh, tw, sw] (tap r = t * sh + a); and the number of blocks."""
    ic, oc, kh, kw = w.shape
    sh, sw = strides
    th, tw = -(-kh // sh), -(-kw // sw)
    blocks = -(-oc // width)
    full = np.zeros((ic, blocks * width, th * sh, tw * sw), np.float32)
    full[:, :oc, :kh, :kw] = w
    return full.reshape(ic, blocks, width, th, sh, tw, sw), blocks


# The packed layouts as permutations of _padded's axes (IC, blocks, width, th, sh, tw, sw), and back.
# Within a phase block the rows are (t, u, ic): the taps a phase really has (t < ceil((kh - a) / sh)) come first, so
# the kernel stops before the padding taps (a 3x3 / 2 computes 10 taps of its 4 phases, not 16).
CHANNEL_VECTOR_PERM = (1, 4, 6, 3, 5, 0, 2)  # [blocks of NI * L channels][sh][sw][th][tw][IC][NI * L]
PIXEL_VECTOR_PERM = (4, 6, 1, 3, 5, 0, 2)  # [sh][sw][blocks of MI channels][th][tw][IC][MI]


def pack_phase_weights(w: np.ndarray, strides, width: int, perm=CHANNEL_VECTOR_PERM) -> np.ndarray:
    """[IC, OC, KH, KW] -> the phase-major packing `perm` names, blocks of `width` output channels (NI * L for the
    channel-vector kernel, MI for the pixel-vector one): the taps r = t * SH + a of phase block a are together."""
    full, _ = _padded(w, strides, width)
    return np.ascontiguousarray(full.transpose(perm))


def _inverse(perm):
    return [perm.index(i) for i in range(len(perm))]


def unpack_phase_weights(packed: np.ndarray, shape, perm=CHANNEL_VECTOR_PERM) -> np.ndarray:
    """The inverse of pack_phase_weights (what the fallback's nodes compute)."""
    ic, blocks, width, th, sh, tw, sw = packed.transpose(_inverse(perm)).shape
    full = packed.transpose(_inverse(perm)).reshape(ic, blocks * width, th * sh, tw * sw)
    _, oc, kh, kw = shape
    return full[:, :oc, :kh, :kw]


def phases_merged(kernel, strides, pads, out_pad) -> bool:
    """A kernel as large as its stride, without pads: every phase is a 1x1 of the whole input, and the pixel-vector
    kernel merges the phases into the rows of one matrix product (the glue's ctt_phases_merged: the same rule)."""
    return tuple(kernel) == tuple(strides) and not any(pads) and not any(out_pad)


def pack_merged_weights(w: np.ndarray, mi: int) -> np.ndarray:
    """[IC, OC, SH, SW] (kernel = stride) -> [ceil(SH * SW * OC / MI)][IC][MI], rows (a, b, oc)."""
    ic, oc, sh, sw = w.shape
    m = sh * sw * oc
    mb = -(-m // mi)
    rows = np.zeros((ic, mb * mi), np.float32)
    rows[:, :m] = w.transpose(0, 2, 3, 1).reshape(ic, m)
    return np.ascontiguousarray(rows.reshape(ic, mb, mi).transpose(1, 0, 2))


def use_pixel_vectors(oc: int, lanes: int, has_position_input: bool) -> bool:
    """Few output channels leave the channel-vector kernel's lanes idle and its NCHW output goes through a blocked
    buffer; there the pixel-vector kernel (vectors along the phase's output rows) wins (benchmarks/
    conv_transpose.py). Up to two vectors of channels: a 2x2 / 2 kernel to 160 x 160, NCHW in and out, ran 1.45x
    faster on pixel vectors at 24 channels and 1.09x at 32, 0.95x at 48 (AVX-512). It takes no per-pixel epilogue
    input."""
    return oc <= 2 * lanes and not has_position_input


def build(rule, node, bn, params, head_out: str, uid: str, *, has_position_input: bool = False):
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
    pixels = use_pixel_vectors(oc, lanes, has_position_input)
    merged = pixels and phases_merged((kh, kw), strides, pads, out_pad)
    perm = PIXEL_VECTOR_PERM if pixels else CHANNEL_VECTOR_PERM
    width = rule.mi if pixels else ni * lanes
    packed = pack_merged_weights(w, width) if merged else pack_phase_weights(w, strides, width, perm)
    wname = f"{uid}__phase_w"
    params.initializers.append(numpy_helper.from_array(packed, wname))
    bname = None
    if bias is not None:
        bname = f"{uid}__bias"
        params.initializers.append(numpy_helper.from_array(bias, bname))
    params.attrs = ComputeAttrs(oc=oc, groups=1, kernel=(kh, kw), strides=strides, dilations=dil, pads=tuple(pads),
                                auto_pad=0, ic_g=ic, output_padding=out_pad, packed_shape=packed.shape, in_blocked=0,
                                out_blocked=0, channel_vectors=int(not pixels), block=lanes)
    if pixels:
        params.attrs.packed_mi = width
    else:
        params.attrs.packed_ni = ni

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, np.int64),
                                                                                      name))
    u = f"{uid}__unpack"

    def sliced(src, dst, ends, axes):
        if rule.ew.opset >= 10:
            return [const(f"{dst}_starts", [0] * len(ends)), const(f"{dst}_ends", ends), const(f"{dst}_axes", axes),
                    helper.make_node("Slice", [src, f"{dst}_starts", f"{dst}_ends", f"{dst}_axes"], [dst])]
        return [helper.make_node("Slice", [src], [dst], starts=[0] * len(ends), ends=ends, axes=axes)]

    if merged:  # [mb, IC, MI] -> [IC, mb * MI] -> the first SH * SW * OC rows -> [IC, SH, SW, OC] -> [IC, OC, SH, SW]
        body = [helper.make_node("Transpose", [wname], [f"{u}_t"], perm=[1, 0, 2]),
                const(f"{u}_s", [ic, packed.shape[0] * width]),
                helper.make_node("Reshape", [f"{u}_t", f"{u}_s"], [f"{u}_rows"]),
                *sliced(f"{u}_rows", f"{u}_m", [kh * kw * oc], [1]),
                const(f"{u}_s2", [ic, kh, kw, oc]),
                helper.make_node("Reshape", [f"{u}_m", f"{u}_s2"], [f"{u}_hwo"]),
                helper.make_node("Transpose", [f"{u}_hwo"], [f"{u}_w"], perm=[0, 3, 1, 2])]
    else:
        full_shape = [ic, -(-oc // width) * width, -(-kh // strides[0]) * strides[0],
                      -(-kw // strides[1]) * strides[1]]
        body = [helper.make_node("Transpose", [wname], [f"{u}_t"], perm=_inverse(perm)),
                const(f"{u}_s", full_shape),
                helper.make_node("Reshape", [f"{u}_t", f"{u}_s"], [f"{u}_full"]),
                *sliced(f"{u}_full", f"{u}_w", [oc, kh, kw], [1, 2, 3])]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body.append(helper.make_node("ConvTranspose", [node.input[0], f"{u}_w"] + ([bname] if bname else []),
                                 [head_out], name=node.name, **attrs))
    return [node.input[0], wname], body, bname
