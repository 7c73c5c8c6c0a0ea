"""Winograd convolution: a 3x3 stride-1 convolution in F(m x m, 3 x 3) tiles, for the blocked-layout kernel.

An m x m block of output pixels is computed from the (m + 2) x (m + 2) input window above it as

    Y = A^T [ sum over input channels of (G w G^T) . (B^T d B) ] A        (. : elementwise, per output channel)

so the n x n = (m + 2)^2 positions of the transformed tile each become one matrix product over the channels
(tiles x C times C x K), and the 9 m^2 multiply-adds per output channel and input channel of a tile become n^2:
2.25x fewer at m = 2 (16 against 36), 4x fewer at m = 4 (36 against 144). onnxruntime's CPU convolutions are
direct (NCHWc) or im2col + GEMM: they run at close to the machine's peak, so on 3x3 layers spending fewer
multiply-adds is the only way past them.

The matrices come from Toom-Cook interpolation at the points of `POINTS` plus the point at infinity, computed
exactly with fractions. The price is rounding: the transforms add and subtract inputs and scale by the points'
powers, so the result differs from the direct sum by more than reordering would. Measured on random 3x3 layers
(C 128-512), relative to the output's largest magnitude: direct 3e-7, F(2x2) 4.5e-7, F(4x4) 3e-6 with the points
(0, 1, -1, 1/2, -2) (9e-6 with (0, +-1, +-2), the textbook set). `ERROR_BOUND` is what the kernel checks allow,
with margin; the optimizer picks Winograd per convolution only where the timing says it wins
(onnxopt/tune/winograd_search.py), and `--winograd off` keeps the direct kernels everywhere.

The weights are transformed once, offline, and packed for the blocked tiles that run the per-position products:
[ceil(OC / (NI * L))][n^2][IC][NI * L]. The function fallback recovers the 3x3 weights with a left inverse of G
(two MatMuls on constants, which onnxruntime folds when the session loads) and runs the original convolution.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from functools import cache

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .region import Region

# Interpolation points per output tile size m (n = m + 2 points, the last one infinity).
POINTS = {2: (0, 1, -1), 4: (0, 1, -1, Fraction(1, 2), -2)}
SIZES = tuple(POINTS)
# Largest error the kernel checks accept, as a fraction of the output's largest magnitude (see above).
ERROR_BOUND = {2: 2e-6, 4: 2e-5}


@cache
def matrices(m: int) -> tuple[tuple, tuple, tuple]:
    """(A^T [m x n], G [n x 3], B^T [n x n]) of F(m, 3) as exact fractions."""
    if m not in POINTS:
        raise ValueError(f"Winograd F({m}, 3) is not supported; output tile sizes: {SIZES}")
    r = 3
    n = m + r - 1
    pts = [Fraction(p) for p in POINTS[m]]

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


def float_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    at, g, bt = matrices(m)
    return (np.array(at, np.float64), np.array(g, np.float64), np.array(bt, np.float64))


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """[OC, IC, 3, 3] -> [n, n, OC, IC]: G w G^T per (output, input) channel, in float64 then rounded once."""
    _, g, _ = float_matrices(m)
    return np.einsum("ij,ocjk,lk->iloc", g, w.astype(np.float64), g).astype(np.float32)


def pack_winograd_weights(w: np.ndarray, m: int, lanes: int, ni: int) -> np.ndarray:
    """[OC, IC, 3, 3] -> [ceil(OC / (NI * L))][n^2][IC][NI * L] (zero-padded output channels): per group of NI
    output channel vectors and per position, the IC x NI * L right-hand side of that position's product."""
    u = transform_weights(w, m)
    n = m + 2
    oc, ic = w.shape[:2]
    width = ni * lanes
    groups = -(-oc // width)
    padded = np.zeros((n * n, groups * width, ic), np.float32)
    padded[:, :oc] = u.reshape(n * n, oc, ic)
    return np.ascontiguousarray(padded.reshape(n * n, groups, width, ic).transpose(1, 0, 3, 2))


def applies(region: Region) -> str | None:
    """None when the region's convolution can run as Winograd tiles on the blocked kernel, else why not."""
    c = region.compute
    if c is None or c.op != "conv":
        return "not a convolution"
    a = c.attrs
    if tuple(a.get("kernel", ())) != (3, 3):
        return f"kernel {tuple(a.get('kernel', ()))}, not 3x3"
    if tuple(a.get("strides", ())) != (1, 1) or tuple(a.get("dilations", ())) != (1, 1):
        return "strided or dilated"
    if a.get("groups", 1) != 1:
        return "grouped"
    if c.weights is None or c.weights.ndim != 4:
        return "no constant weights"
    if not (a.get("out_blocked") or a.get("channel_vectors")):
        return "not on the blocked (channel-vector) kernel"
    if c.tile is not None:
        return "a searched register tile"
    return None


def left_inverse(m: int) -> np.ndarray:
    """P [3 x n] with P G = I: the fallback's way back from G w G^T to w (least squares, exact in exact
    arithmetic)."""
    _, g, _ = float_matrices(m)
    return np.linalg.pinv(g)


def to_winograd(region: Region, m: int, lanes: int, ni: int) -> Region:
    """A copy of a blocked convolution region (`applies`) computed by F(m x m, 3 x 3) tiles: weights transformed and
    packed, attrs["winograd"] = m, and the fallback's weight unpacking replaced by the way back from the transformed
    weights. The op type is recomputed."""
    why = applies(region)
    if why is not None:
        raise ValueError(f"Winograd does not apply: {why}")
    if m not in POINTS:
        raise ValueError(f"Winograd F({m}, 3) is not supported; output tile sizes: {SIZES}")
    c = region.compute
    w = c.weights
    oc, ic = w.shape[:2]
    n = m + 2
    packed = pack_winograd_weights(w, m, lanes, ni)
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
    groups = packed.shape[0]
    p = left_inverse(m).astype(np.float32)

    def const(tname, arr):
        return helper.make_node("Constant", [], [tname], value=numpy_helper.from_array(np.asarray(arr), tname))

    unpack = [helper.make_node("Transpose", [name], [f"{u}_t"], perm=[0, 3, 2, 1]),  # [G, NI*L, IC, n^2]
              const(f"{u}_s1", np.asarray([groups * ni * lanes, ic, n, n], np.int64)),
              helper.make_node("Reshape", [f"{u}_t", f"{u}_s1"], [f"{u}_r"]),
              const(f"{u}_starts", np.asarray([0], np.int64)), const(f"{u}_ends", np.asarray([oc], np.int64)),
              const(f"{u}_axes", np.asarray([0], np.int64)),
              helper.make_node("Slice", [f"{u}_r", f"{u}_starts", f"{u}_ends", f"{u}_axes"], [f"{u}_gw"]),
              # [OC, IC, n(rows), n(cols)]: P . X . P^T
              const(f"{u}_pt", p.T.copy()), const(f"{u}_p", p),
              helper.make_node("MatMul", [f"{u}_gw", f"{u}_pt"], [f"{u}_half"]),
              helper.make_node("MatMul", [f"{u}_p", f"{u}_half"], [conv.input[1]])]
    new_body = kept + unpack + body[at:]
    attrs = dict(c.attrs, winograd=m, packed_shape=packed.shape)
    inits = [t for t in c.initializers if t.name != old] + [numpy_helper.from_array(packed, name)]
    new = replace(region, inputs=[region.inputs[0], name] + list(region.inputs[2:]), outputs=list(region.outputs),
                  measured={}, rejected=None,
                  compute=replace(c, attrs=attrs, initializers=inits, body=new_body))
    if region.op_type_key:
        new.compute_op_type(region.op_type_key)
    return new


def apply_winograd(region: Region, m: int, lanes: int, ni: int) -> Region:
    """`to_winograd` in place (as fusion.compute.apply_tile): the region keeps its identity, so every plan that
    holds it gets the Winograd kernel. Returns the region."""
    new = to_winograd(region, m, lanes, ni)
    region.inputs, region.compute, region.op_type = new.inputs, new.compute, new.op_type
    return region


def check_opset(model: onnx.ModelProto) -> str | None:
    """The fallback uses Slice with input starts/ends (opset 10) and MatMul."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    return None if opset >= 10 else f"opset {opset} < 10 (the fallback's Slice)"
