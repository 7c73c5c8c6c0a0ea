"""The AFUSION tile algebra (OptiFX §3.1-3.2, Eq.4 and the T_red formula).

A fused kernel computes its output tile by tile. To produce an output tile of h' x w' a region op (ROP) with an
R x S window and stride st needs an input tile of

    h = (h' - 1) * st + (R - 1) * dil + 1        (Eq.4; the paper writes (h' - 1) * st + R, i.e. dilation 1)

and the same along w. Applied backwards through a chain it gives the tile of every tensor: a 2x2 output of
3x3 -> 3x3 needs a 4x4 intermediate and a 6x6 input (`chain_tiles`). When one intermediate feeds several
consumers (SIMO) its tile is the union, i.e. the elementwise max, of what each consumer needs (`simo_tile`).

Adjacent tiles of an intermediate overlap by phi = R - st rows (and S - st columns). Every task recomputes its own
overlap instead of exchanging it with its neighbours, so for T_H x T_W tiles over an H x W intermediate the
redundant elements per channel are

    T_red = (H + (T_H - 1) * phi_r) * (W + (T_W - 1) * phi_s) - H * W              (`redundant_elements`)

and the redundant FLOPs T_red * K1 * 2 * C1 * R1 * S1 / G1 for a producer conv with K1 output channels
(`redundant_flops`).

The CPU kernel tiles by *bands* of full-width rows (T_W = 1): a band of b output rows of the last op needs a band
of rows of every intermediate, clipped at the image border where the padding supplies zeros instead of computed
rows. `band_rows` does this for a chain and `region_rows` for any region (SISO, SIMO, MISO), returning the rows one
band needs (the scratch buffer) and the rows computed over all bands (the recomputation).

Everything here is integer arithmetic on geometry; nothing reads an ONNX graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def _pair(v, name: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair; anything else is a caller's mistake worth a clear message."""
    if isinstance(v, int):
        return (v, v)
    t = tuple(int(x) for x in v)
    if len(t) != 2:
        raise ValueError(f"{name} must be an int or a pair (rows, cols), not {v!r}")
    return t  # type: ignore[return-value]


@dataclass(frozen=True)
class ConvGeometry:
    """The spatial geometry of one 2-D region op (a conv or a pooling window).

    `pads` in ONNX order (top, left, bottom, right). Pools use `groups` = channels, so the same formulas
    (FLOPs per output, weights) hold where they apply.
    """

    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    in_channels: int = 1
    out_channels: int = 1
    op_type: str = "Conv"

    def __post_init__(self):
        object.__setattr__(self, "kernel", _pair(self.kernel, "kernel"))
        object.__setattr__(self, "stride", _pair(self.stride, "stride"))
        object.__setattr__(self, "dilation", _pair(self.dilation, "dilation"))
        pads = tuple(int(p) for p in self.pads)
        if len(pads) == 2:  # (rows, cols) given symmetric
            pads = (pads[0], pads[1], pads[0], pads[1])
        if len(pads) != 4:
            raise ValueError(f"pads must be (top, left, bottom, right), not {self.pads!r}")
        object.__setattr__(self, "pads", pads)
        if min(self.kernel) < 1 or min(self.stride) < 1 or min(self.dilation) < 1 or self.groups < 1:
            raise ValueError(f"kernel, stride, dilation and groups must be positive: {self}")

    @property
    def effective_kernel(self) -> tuple[int, int]:
        """The window's extent in input pixels: (R - 1) * dilation + 1."""
        return ((self.kernel[0] - 1) * self.dilation[0] + 1, (self.kernel[1] - 1) * self.dilation[1] + 1)

    @property
    def overlap(self) -> tuple[int, int]:
        """(phi_r, phi_s): how many rows/cols adjacent tiles of the input share (0 when the stride skips)."""
        er, es = self.effective_kernel
        return (max(0, er - self.stride[0]), max(0, es - self.stride[1]))

    def output_size(self, in_h: int, in_w: int) -> tuple[int, int]:
        """Output spatial size for an `in_h` x `in_w` input (floor division, as ONNX without ceil_mode)."""
        er, es = self.effective_kernel
        t, l, b, r = self.pads
        return ((in_h + t + b - er) // self.stride[0] + 1, (in_w + l + r - es) // self.stride[1] + 1)

    def input_rows(self, out_start: int, out_end: int, in_height: int) -> tuple[int, int]:
        """Input rows [start, end) that output rows [out_start, out_end) read, clipped to the real input
        (rows in the padding are zeros, not computed). An empty output range gives an empty input range."""
        if out_end <= out_start:
            return (0, 0)
        first = out_start * self.stride[0] - self.pads[0]
        last = (out_end - 1) * self.stride[0] - self.pads[0] + self.effective_kernel[0]  # exclusive
        return (max(0, first), min(in_height, last))

    def flops_per_output(self) -> int:
        """Multiply-adds x 2 per output element of a conv: 2 * (C / G) * R * S."""
        return 2 * (self.in_channels // self.groups) * self.kernel[0] * self.kernel[1]


# ----------------------------------------------------------------------------------------------------------------
# Eq.4 and its uses


def input_tile(out_h: int, out_w: int, kernel=(1, 1), stride=(1, 1), dilation=(1, 1)) -> tuple[int, int]:
    """Eq.4: the input tile (h, w) an `out_h` x `out_w` output tile of an R x S window needs.

    h = (h' - 1) * stride + (R - 1) * dilation + 1; the borders are not clipped (that is `band_rows`' job).
    """
    (r, s), (sh, sw), (dr, ds) = _pair(kernel, "kernel"), _pair(stride, "stride"), _pair(dilation, "dilation")
    if out_h < 1 or out_w < 1:
        raise ValueError(f"an output tile must be at least 1x1, not {out_h}x{out_w}")
    return ((out_h - 1) * sh + (r - 1) * dr + 1, (out_w - 1) * sw + (s - 1) * ds + 1)


def _geometry_tile(out_tile: tuple[int, int], g: ConvGeometry) -> tuple[int, int]:
    return input_tile(out_tile[0], out_tile[1], g.kernel, g.stride, g.dilation)


def chain_tiles(out_tile: tuple[int, int], convs: Sequence[ConvGeometry]) -> list[tuple[int, int]]:
    """Tiles of every tensor of a chain, chain input first and `out_tile` last (Eq.4 applied backwards).

    `convs` lists the ops first op first. A 2x2 output of 3x3 -> 3x3 gives [(6, 6), (4, 4), (2, 2)].
    """
    tiles = [tuple(_pair(out_tile, "out_tile"))]
    for g in reversed(list(convs)):
        tiles.append(_geometry_tile(tiles[-1], g))
    return list(reversed(tiles))  # type: ignore[arg-type]


def simo_tile(out_tiles: Sequence[tuple[int, int]], consumers: Sequence[ConvGeometry]) -> tuple[int, int]:
    """The tile of an intermediate read by several consumers: the union (elementwise max) of what each needs.

    Consumers 1x1 and 3x3 (stride 1) with 2x2 outputs each need 2x2 and 4x4; the shared tile is 4x4.
    """
    if len(out_tiles) != len(consumers) or not consumers:
        raise ValueError(f"simo_tile needs one output tile per consumer ({len(out_tiles)} tiles, "
                         f"{len(consumers)} consumers)")
    needs = [_geometry_tile(tuple(t), g) for t, g in zip(out_tiles, consumers)]
    return (max(h for h, _ in needs), max(w for _, w in needs))


def redundant_elements(H: int, W: int, T_H: int, T_W: int, phi_r: int, phi_s: int) -> int:
    """T_red: elements of one channel of an H x W intermediate computed more than once when T_H x T_W tiles
    overlap by phi_r rows and phi_s cols (OptiFX §3.2). H = W = 8, T_H = T_W = 4, phi = 2 gives 132."""
    if min(H, W, T_H, T_W) < 1 or min(phi_r, phi_s) < 0:
        raise ValueError(f"redundant_elements needs positive sizes and tile counts and phi >= 0, got "
                         f"H={H} W={W} T_H={T_H} T_W={T_W} phi=({phi_r}, {phi_s})")
    return (H + (T_H - 1) * phi_r) * (W + (T_W - 1) * phi_s) - H * W


def redundant_flops(t_red: int, producer: ConvGeometry) -> int:
    """FLOPs spent recomputing `t_red` elements per channel of the intermediate that `producer` writes:
    T_red * K1 * 2 * C1 * R1 * S1 / G1 (bias and epilogue not counted)."""
    return t_red * producer.out_channels * producer.flops_per_output()


# ----------------------------------------------------------------------------------------------------------------
# Bands of full-width rows (the CPU kernel's tiling, T_W = 1)


@dataclass(frozen=True)
class RowOp:
    """One region op for the row analysis: `geometry` maps rows of tensor `input` to rows of tensor `output`.

    Tensors are any hashable ids. Several ops may write the same id (MISO: two convs whose outputs are added are
    one tensor for row purposes); elementwise ops are not listed, they keep rows as they are.
    """

    geometry: ConvGeometry
    input: str
    output: str


@dataclass
class RegionRows:
    """Rows of each tensor of a region when its outputs are computed in bands of `band_height` rows."""

    band_height: int
    bands: int
    heights: dict[str, int]
    band_rows: dict[str, int]  # the most rows of a tensor one band needs (what a scratch buffer must hold)
    computed_rows: dict[str, int]  # rows summed over all bands (read for inputs, computed for the others)
    intermediates: tuple[str, ...]  # written and read inside the region
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    recomputed_rows: dict[str, int] = field(default_factory=dict)  # computed_rows - height, intermediates only

    def recompute_ratio(self, tensor: str) -> float:
        """Extra work on an intermediate: rows computed over all bands / its height - 1."""
        return self.recomputed_rows.get(tensor, 0) / self.heights[tensor]


def region_rows(ops: Sequence[RowOp], heights: Mapping[str, int], band_height: int) -> RegionRows:
    """Walk every band of the region's output rows backwards through `ops` (listed in topological order).

    A tensor read by several ops needs the union of their row ranges (SIMO); each op reads its own input (MISO
    branches are sized separately). All region outputs must have the same height (one band grid). Ranges are
    clipped to each tensor's rows: rows in the padding are zeros, computed by nobody.
    """
    if band_height < 1:
        raise ValueError(f"band_height must be at least 1, not {band_height}")
    ops = list(ops)
    produced = {op.output for op in ops}
    consumed = {op.input for op in ops}
    outputs = tuple(dict.fromkeys(op.output for op in ops if op.output not in consumed))
    inputs = tuple(dict.fromkeys(op.input for op in ops if op.input not in produced))
    intermediates = tuple(dict.fromkeys(op.output for op in ops if op.output in consumed))
    missing = [t for t in (*inputs, *intermediates, *outputs) if t not in heights]
    if missing:
        raise ValueError(f"region_rows: no height for {', '.join(map(str, missing))}")
    out_heights = {heights[t] for t in outputs}
    if len(out_heights) != 1:
        raise ValueError(f"region outputs have different heights {sorted(out_heights)}; bands need one grid")
    out_h = out_heights.pop()
    bands = math.ceil(out_h / band_height)
    band_max = {t: 0 for t in heights}
    total = {t: 0 for t in heights}
    for k in range(bands):
        need: dict[str, tuple[int, int]] = {t: (k * band_height, min(out_h, (k + 1) * band_height)) for t in outputs}
        for op in reversed(ops):
            lo, hi = need.get(op.output, (0, 0))
            a, b = op.geometry.input_rows(lo, hi, heights[op.input])
            if op.input in need and need[op.input][1] > need[op.input][0]:
                pa, pb = need[op.input]
                a, b = (min(a, pa), max(b, pb)) if b > a else (pa, pb)
            need[op.input] = (a, b)
        for t, (a, b) in need.items():
            rows = max(0, b - a)
            band_max[t] = max(band_max[t], rows)
            total[t] += rows
    recomputed = {t: total[t] - heights[t] for t in intermediates}
    return RegionRows(band_height=band_height, bands=bands, heights=dict(heights), band_rows=band_max,
                      computed_rows=total, intermediates=intermediates, inputs=inputs, outputs=outputs,
                      recomputed_rows=recomputed)


@dataclass
class BandRows:
    """`band_rows`' answer for a chain; lists run from the chain input to the chain output."""

    band_height: int
    bands: int
    heights: list[int]  # of each tensor
    rows: list[int]  # rows of each tensor one full band needs (for the intermediates: the scratch rows)
    computed_rows: list[int]  # over all bands; for the intermediates, computed rows
    recomputed_rows: int  # over all bands and all intermediates: computed - height

    @property
    def intermediate_rows(self) -> list[int]:
        return self.rows[1:-1]


def band_rows(band_height: int, chain: Sequence[ConvGeometry], in_height: int) -> BandRows:
    """Rows of every tensor of a chain (first op first) tiled in bands of `band_height` output rows of the last
    op, for a chain input `in_height` rows high (which fixes every later height, including the output's H').

    Example: 3x3 (pad 1) -> 3x3 (pad 1) on 8 rows in bands of 2: an interior band needs 4 rows of the
    intermediate and 6 of the input; over the 4 bands 14 rows of the intermediate are computed for its 8 rows,
    6 of them recomputed ((T_H - 1) * phi as in T_red with T_W = 1).
    """
    chain = list(chain)
    if not chain:
        raise ValueError("band_rows needs at least one op")
    heights = [int(in_height)]
    for g in chain:
        heights.append(g.output_size(heights[-1], 1)[0])
        if heights[-1] < 1:
            raise ValueError(f"the chain's output would be empty after {g} (heights {heights})")
    names = [f"t{i}" for i in range(len(chain) + 1)]
    ops = [RowOp(g, names[i], names[i + 1]) for i, g in enumerate(chain)]
    rr = region_rows(ops, dict(zip(names, heights)), band_height)
    return BandRows(band_height=band_height, bands=rr.bands, heights=heights,
                    rows=[rr.band_rows[t] for t in names], computed_rows=[rr.computed_rows[t] for t in names],
                    recomputed_rows=sum(rr.recomputed_rows.values()))


__all__ = [
    "BandRows",
    "ConvGeometry",
    "RegionRows",
    "RowOp",
    "band_rows",
    "chain_tiles",
    "input_tile",
    "redundant_elements",
    "redundant_flops",
    "region_rows",
    "simo_tile",
]
