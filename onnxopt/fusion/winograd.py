"""Winograd convolution: a stride-1 convolution computed in tiles of outputs, for the blocked-layout kernel.

Along one axis, F(m, r) computes m outputs of an r-tap correlation from the n = m + r - 1 inputs above them as

    y = A^T [ (G g) . (B^T d) ]        (. : elementwise)

with n multiplies instead of m * r. Nested over both axes, an mh x mw block of output pixels comes from the nh x nw
input window above it as Y = A_h^T [ sum over input channels of (G_h w G_w^T) . (B_h^T d B_w) ] A_w, so the nh * nw
positions of the transformed tile each become one matrix product over the channels (tiles x C times C x K), and the
rh * rw * mh * mw multiply-adds per output channel and input channel of a tile become nh * nw. The kernels and tile
lengths offered (`SIZES_BY_KERNEL`; m is the tile length along each axis the kernel spans, 1 along the others):

    kernel  m   tile      positions  multiplies per output against direct
    3x3     2   2x2       4x4        2.25x fewer
    3x3     4   4x4       6x6        4x fewer
    5x5     2   2x2       6x6        2.8x fewer
    1x7     2   1x2       1x8        1.75x fewer      (7x1 the same, transposed: Inception-v3's factorized 7x7)
    1x7     4   1x4       1x10       2.8x fewer
    1x3     4   1x4       1x6        2x fewer         (3x1 the same: Inception-v3's last blocks)
    1x3     6   1x6       1x8        2.25x fewer

onnxruntime's CPU convolutions are direct (NCHWc) or im2col + GEMM: they run at close to the machine's peak, so
spending fewer multiply-adds is the only way past them.

The matrices come from Toom-Cook interpolation at the points of `POINTS` (by n) plus the point at infinity,
computed exactly with fractions. The price is rounding: the transforms add and subtract inputs and scale by the
points' powers, so the result differs from the direct sum by more than reordering would. Measured on random layers
with 256 input channels, relative to the output's largest magnitude (direct: 3e-7):

    F(2x2, 3x3) 8e-7    F(4x4, 3x3) 4e-6 (points 0, 1, -1, 1/2, -2; 9e-6 with the textbook 0, +-1, +-2)
    F(2x2, 5x5) 3.5e-6  F(1x2, 1x7) 4e-6  F(1x4, 1x7) 1.2e-5 (1.4e-5 with +-1/3, 2.1e-5 with +-3 for the +-3/2)
    F(1x4, 1x3) 1.1e-6  F(1x6, 1x3) 1.7e-6

`error_bound` is what the kernel checks allow, with margin; the optimizer picks Winograd per convolution only where
the timing says it wins (onnxopt/tune/winograd_search.py), and `--winograd off` keeps the direct kernels everywhere.

The weights are transformed once, offline, and packed for the blocked tiles that run the per-position products:
[ceil(OC / (NI * L))][nh * nw][IC][NI * L]. A grouped convolution (NCHW in and out, each group's input and output
channels whole vectors: `group_refusal`) runs each group as its own convolution over its own vectors of the blocked
buffers, its weights each group's packing in turn; AlexNet's grouped 5x5 (96 -> 256 in two groups at 27x27), 0.67x
onnxruntime on our direct NCHW kernel and so left to it, ran 1.73-1.84x onnxruntime as F(2x2, 5x5) (BENCHMARKS.md,
issue 48's first bar). The function fallback recovers the weights with a left inverse of each axis' G (two MatMuls
on constants, which onnxruntime folds when the session loads) and runs the original convolution.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from functools import cache

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .compute import FLOAT16_MAX
from .region import Region

# Interpolation points per transform length n (n - 1 finite points; the last point is infinity).
_HALF = Fraction(1, 2)
POINTS = {4: (0, 1, -1), 6: (0, 1, -1, _HALF, -2), 8: (0, 1, -1, _HALF, -_HALF, 2, -2),
          10: (0, 1, -1, _HALF, -_HALF, 2, -2, Fraction(3, 2), Fraction(-3, 2))}
# Tile lengths m offered per kernel (kh, kw); m runs along the axes whose kernel extent is above 1.
SIZES_BY_KERNEL = {(3, 3): (2, 4), (5, 5): (2,), (1, 7): (2, 4), (7, 1): (2, 4), (1, 3): (4, 6), (3, 1): (4, 6)}
SIZES = tuple(sorted({m for ms in SIZES_BY_KERNEL.values() for m in ms}))
# Largest error the kernel checks accept, as a fraction of the output's largest magnitude (see above), by (kernel, m).
_ERROR_BOUND = {((3, 3), 2): 2e-6, ((3, 3), 4): 2e-5, ((5, 5), 2): 2e-5, ((1, 7), 2): 2e-5, ((1, 7), 4): 6e-5,
                ((1, 3), 4): 6e-6, ((1, 3), 6): 1e-5}


def _axes(kernel) -> tuple[int, int]:
    kh, kw = (int(k) for k in kernel)
    return kh, kw


def sizes(kernel) -> tuple[int, ...]:
    """The tile lengths m offered for a convolution kernel (kh, kw); () when Winograd does not apply to it."""
    return SIZES_BY_KERNEL.get(_axes(kernel), ())


def tile_shape(kernel, m: int) -> tuple[int, int]:
    """(mh, mw): the output pixels of one tile of F(m, kernel)."""
    kh, kw = _axes(kernel)
    return (m if kh > 1 else 1, m if kw > 1 else 1)


def positions(kernel, m: int) -> tuple[int, int]:
    """(nh, nw): the transformed tile's size, mh + kh - 1 by mw + kw - 1."""
    kh, kw = _axes(kernel)
    mh, mw = tile_shape(kernel, m)
    return mh + kh - 1, mw + kw - 1


def label(kernel, m: int) -> str:
    mh, mw = tile_shape(kernel, m)
    kh, kw = _axes(kernel)
    return f"F({mh}x{mw},{kh}x{kw})"


def error_bound(kernel, m: int) -> float:
    kh, kw = _axes(kernel)
    return _ERROR_BOUND[((min(kh, kw), max(kh, kw)) if kh == 1 or kw == 1 else (kh, kw), m)]


def _check(kernel, m: int) -> None:
    if m not in sizes(kernel):
        offered = sizes(kernel)
        raise ValueError(f"Winograd F({m}, {'x'.join(map(str, _axes(kernel)))}) is not supported; tile sizes for "
                         f"this kernel: {offered or 'none'} (kernels: "
                         f"{', '.join(f'{a}x{b}' for a, b in SIZES_BY_KERNEL)})")


@cache
def matrices(m: int, r: int = 3) -> tuple[tuple, tuple, tuple]:
    """(A^T [m x n], G [n x r], B^T [n x n]) of F(m, r) as exact fractions; F(1, 1) is the identity."""
    n = m + r - 1
    if m == 1 and r == 1:
        one = ((Fraction(1),),)
        return one, one, one
    if m < 1 or r < 2 or n not in POINTS:
        raise ValueError(f"Winograd F({m}, {r}) is not supported: no interpolation points for n = {n} "
                         f"(supported n: {tuple(POINTS)})")
    pts = [Fraction(p) for p in POINTS[n]]

    def poly_without(skip: int | None) -> list[Fraction]:
        """Coefficients (lowest first) of the product of (x - p) over the points other than `skip`."""
        c = [Fraction(1)]
        for k, p in enumerate(pts):
            if k == skip:
                continue
            c = [(c[i - 1] if i > 0 else 0) - p * (c[i] if i < len(c) else 0) for i in range(len(c) + 1)]
        return c

    at = [[p ** i for p in pts] + [Fraction(1 if i == m - 1 else 0)] for i in range(m)]
    g = []
    for j, p in enumerate(pts):
        den = Fraction(1)
        for k, q in enumerate(pts):
            if k != j:
                den *= p - q
        g.append([p ** i / den for i in range(r)])
    g.append([Fraction(0)] * (r - 1) + [Fraction(1)])
    bt = []
    for j in range(n - 1):
        c = poly_without(j)
        bt.append(c + [Fraction(0)] * (n - len(c)))
    bt.append(poly_without(None))
    return tuple(map(tuple, at)), tuple(map(tuple, g)), tuple(map(tuple, bt))


def axis_matrices(kernel, m: int) -> tuple[tuple, tuple]:
    """((A^T, G, B^T) along the height, the same along the width) of F(m, kernel), exact."""
    _check(kernel, m)
    kh, kw = _axes(kernel)
    mh, mw = tile_shape(kernel, m)
    return matrices(mh, kh), matrices(mw, kw)


def float_matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    at, g, bt = matrices(m, r)
    return (np.array(at, np.float64), np.array(g, np.float64), np.array(bt, np.float64))


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """[OC, IC, kh, kw] -> [nh, nw, OC, IC]: G_h w G_w^T per (output, input) channel, in float64 then rounded once."""
    kh, kw = w.shape[2:]
    _check((kh, kw), m)
    mh, mw = tile_shape((kh, kw), m)
    (_, gh, _), (_, gw, _) = float_matrices(mh, kh), float_matrices(mw, kw)
    return np.einsum("ij,ocjk,lk->iloc", gh, w.astype(np.float64), gw).astype(np.float32)


def pack_winograd_weights(w: np.ndarray, m: int, lanes: int, ni: int, groups: int = 1) -> np.ndarray:
    """[OC, IC, kh, kw] -> [groups * ceil(OC / groups / (NI * L))][nh * nw][IC][NI * L] (each convolution group's
    output channels zero-padded): per run of NI output channel vectors of one convolution group and per position,
    the IC x NI * L right-hand side of that position's product (IC: the group's input channels)."""
    if groups > 1:
        return np.concatenate([pack_winograd_weights(part, m, lanes, ni) for part in np.split(w, groups)])
    u = transform_weights(w, m)
    nn = u.shape[0] * u.shape[1]
    oc, ic = w.shape[:2]
    width = ni * lanes
    runs = -(-oc // width)
    padded = np.zeros((nn, runs * width, ic), np.float32)
    padded[:, :oc] = u.reshape(nn, oc, ic)
    return np.ascontiguousarray(padded.reshape(nn, runs, width, ic).transpose(1, 0, 3, 2))


NOT_ON_CHANNEL_VECTORS = "not on the blocked (channel-vector) kernel"


def group_refusal(a, lanes: int | None) -> str | None:
    """Why a grouped convolution's groups cannot run as Winograd tiles on channel vectors of `lanes` floats, or None.
    The kernel runs each group as its own convolution over its own channel vectors of the one blocked input and
    output (winograd_exec.c), so each group's input and output channels must be whole vectors; a depthwise one has
    no products to speed up."""
    g = a.groups or 1
    if g == 1:
        return None
    if not lanes or not a.ic_g or not a.oc or a.ic_g % lanes or (a.oc // g) % lanes:
        return (f"grouped: {g} groups of {a.ic_g} -> {(a.oc or 0) // g} channels, not whole vectors of "
                f"{lanes or 'L'} lanes")
    return None


def applies_on_channel_vectors(region: Region, lanes: int) -> bool:
    """Whether an NCHW convolution would take Winograd tiles once given the channel-vector kernel (NCHW in and out,
    computed on blocked buffers: fusion/layout.py use_channel_vectors), as a lone convolution between ops that are
    not ours must be."""
    from .layout import channel_vectors_apply

    c = region.compute
    return (applies(region) == NOT_ON_CHANNEL_VECTORS and channel_vectors_apply(region, lanes, any_groups=True)
            and group_refusal(c.attrs, lanes) is None and c.tile is None and c.attrs.b_dtype is None)


def applies(region: Region) -> str | None:
    """None when the region's convolution can run as Winograd tiles on the blocked kernel, else why not."""
    c = region.compute
    if c is None or c.op != "conv":
        return "not a convolution"
    a = c.attrs
    kernel = tuple(a.kernel or ())
    if not sizes(kernel):
        offered = ", ".join(f"{h}x{w}" for h, w in SIZES_BY_KERNEL)
        return f"kernel {'x'.join(map(str, kernel))}: Winograd tiles are for {offered}"
    if tuple(a.strides or ()) != (1, 1) or tuple(a.dilations or ()) != (1, 1):
        return "strided or dilated"
    if c.weights is None or c.weights.ndim != 4:
        return "no constant weights"
    # grouped: only on channel vectors, NCHW in and out, each group whole vectors (a blocked chain's grouped
    # convolutions are depthwise)
    if (a.groups or 1) != 1 and (a.out_blocked or a.in_blocked or a.channel_vectors):
        why = group_refusal(a, a.block if a.channel_vectors and not (a.out_blocked or a.in_blocked) else None)
        if why is not None:
            return why
    if not (a.out_blocked or a.channel_vectors):
        return NOT_ON_CHANNEL_VECTORS
    if c.tile is not None:
        return "a searched register tile"
    if a.b_dtype is not None:
        return f"its weights are {a.b_dtype} pairs (--precision)"
    return None


def left_inverse(m: int, r: int = 3) -> np.ndarray:
    """P [r x n] with P G = I for F(m, r): the fallback's way back from G w G^T to w along one axis (least squares,
    exact in exact arithmetic)."""
    _, g, _ = float_matrices(m, r)
    return np.linalg.pinv(g)


def to_winograd(region: Region, m: int, lanes: int, ni: int) -> Region:
    """A copy of a blocked convolution region (`applies`) computed by F(m, kernel) tiles: weights transformed and
    packed, attrs.winograd = m, and the fallback's weight unpacking replaced by the way back from the transformed
    weights. The op type is recomputed."""
    why = applies(region)
    if why is not None:
        raise ValueError(f"Winograd does not apply: {why}")
    c = region.compute
    w = c.weights
    kernel = w.shape[2:]
    _check(kernel, m)
    oc, ic = w.shape[:2]
    kh, kw = kernel
    mh, mw = tile_shape(kernel, m)
    nh, nw = positions(kernel, m)
    conv_groups = c.attrs.groups or 1
    packed = pack_winograd_weights(w, m, lanes, ni, conv_groups)
    old = region.inputs[1]
    name = f"{old}__wino{m}"
    body = list(c.body)
    conv = next(nd for nd in body if nd.op_type == "Conv")
    # The old unpacking nodes produce conv.input[1] from `old`: everything that reads `old` (directly or through
    # its own nodes) before the Conv goes.
    derived = {old}
    kept = []
    for nd in body:
        if nd is conv:
            break
        if any(x in derived for x in nd.input):
            derived.update(o for o in nd.output if o)
        elif nd.op_type == "Constant" and all(o.startswith(f"{old}__unpack") for o in nd.output):
            derived.update(nd.output)
        else:
            kept.append(nd)
    at = body.index(conv)
    u = f"{name}__unpack"
    padded = packed.shape[0] // conv_groups * ni * lanes  # a convolution group's output channels, padded
    ph, pw = left_inverse(mh, kh).astype(np.float32), left_inverse(mw, kw).astype(np.float32)

    def const(tname, arr):
        return helper.make_node("Constant", [], [tname], value=numpy_helper.from_array(np.asarray(arr), tname))

    unpack = [helper.make_node("Transpose", [name], [f"{u}_t"], perm=[0, 3, 2, 1]),  # [runs, NI*L, IC, n^2]
              # [convolution groups, padded output channels, IC, nh, nw]: each group's padding left out (a Gather
              # of the real channels: it reads the same at every opset, where Slice's form changed at 10)
              const(f"{u}_s1", np.asarray([conv_groups, padded, ic, nh, nw], np.int64)),
              helper.make_node("Reshape", [f"{u}_t", f"{u}_s1"], [f"{u}_r"]),
              const(f"{u}_keep", np.arange(oc // conv_groups, dtype=np.int64)),
              helper.make_node("Gather", [f"{u}_r", f"{u}_keep"], [f"{u}_sl"], axis=1),
              const(f"{u}_s2", np.asarray([oc, ic, nh, nw], np.int64)),
              helper.make_node("Reshape", [f"{u}_sl", f"{u}_s2"], [f"{u}_gw"]),
              # [OC, IC, nh, nw]: P_h . X . P_w^T
              const(f"{u}_pt", pw.T.copy()), const(f"{u}_p", ph),
              helper.make_node("MatMul", [f"{u}_gw", f"{u}_pt"], [f"{u}_half"]),
              helper.make_node("MatMul", [f"{u}_p", f"{u}_half"], [conv.input[1]])]
    new_body = kept + unpack + body[at:]
    stored = c.attrs.stored_dtype
    if stored == "float16":  # --precision fp16: the transformed weights stored as float16 too, rounded now
        stored = None if np.max(np.abs(packed), initial=0.0) > FLOAT16_MAX else stored
        packed = packed.astype(np.float16).astype(np.float32) if stored else packed
    attrs = replace(c.attrs, winograd=m, packed_shape=packed.shape, stored_dtype=stored)
    inits = [t for t in c.initializers if t.name != old] + [numpy_helper.from_array(packed, name)]
    new = replace(region, inputs=[region.inputs[0], name] + list(region.inputs[2:]), outputs=list(region.outputs),
                  measured={}, rejected=None,
                  params=replace(c, attrs=attrs, initializers=inits, body=new_body))
    if region.op_type_key:
        new.compute_op_type(region.op_type_key)
    return new


def apply_winograd(region: Region, m: int, lanes: int, ni: int) -> Region:
    """`to_winograd` in place (as fusion.compute.apply_tile): the region keeps its identity, so every plan that
    holds it gets the Winograd kernel. Returns the region."""
    new = to_winograd(region, m, lanes, ni)
    region.inputs, region.params, region.op_type = new.inputs, new.params, new.op_type
    return region


def check_opset(model: onnx.ModelProto) -> str | None:
    """The fallback's Reshape takes its shape as an input (opset 5); its Gather, Transpose and MatMul are older."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    return None if opset >= 5 else f"opset {opset} < 5 (the fallback's Reshape)"
