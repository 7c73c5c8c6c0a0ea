"""An AFUSION kernel of two convolutions (codegen/glue/afusion_exec.c, SISO) as TileFlow's tile tree, and its latency on
the machine model for each band height (annotate/tile_tree.py).

A band task computes the first convolution's rows that `rows` output rows of the second need (all its channels,
the halo rows included, which the neighbouring band computes again), then the second convolution's rows from them:
two leaves sharing the band's buffer, the intermediate never leaving it. The buffer is the core's L2 where the band's
input rows, both weights, the intermediate and the output rows fit it, else L3. Each task reads both weights again.
The tasks (batch x bands, the last band short) are spread over the threads as a dynamic scheduler does (each to
the least loaded), so the prediction sees the halo's recomputation, the weights read a band, the buffer's level and
the threads' balance, which are what the band height trades.
"""

from __future__ import annotations

from dataclasses import replace

from onnxopt.annotate import tile_tree as tt
from onnxopt.annotate.data_movement import ConvPair, conv_chain_tiles

from .siso import balanced_rows

__all__ = ["ConvPair", "band_tree", "predicted_seconds", "model_band_rows", "chimera_band_rows"]


def band_tree(g: ConvPair, rows: int, l2_floats: int) -> tuple[tt.Tile, dict[str, int]]:
    """One band task of `rows` output rows as a tile tree, with its problem extents."""
    a, b = g.st1, g.st2
    ext = {"y": rows, "x": g.out_w, "c2": g.oc2, "c1": g.oc1, "ci": g.ic, "r1": g.k1, "s1": g.k1, "r2": g.k2,
           "s2": g.k2}
    i_at = (f"{b}*y + r2", f"{b}*x + s2")  # the intermediate's rows and columns a second's window reads
    x_at = (f"{a * b}*y + {a}*r2 + r1", f"{a * b}*x + {a}*s2 + s1")
    conv1 = tt.Tile("L1", op="conv1", accesses=(
        tt.access("X", "ci", *x_at), tt.access("W1", "c1", "ci", "r1", "s1"), tt.access("I", "c1", *i_at, write=True)))
    conv2 = tt.Tile("L1", op="conv2", accesses=(
        tt.access("I", "c1", *i_at), tt.access("W2", "c2", "c1", "r2", "s2"),
        tt.access("Y", "c2", "y", "x", write=True)))
    band = tt.Tile("L2", children=(conv1, conv2), primitive="Shar")
    if tt.step_slice(band, ext) > l2_floats:
        band = replace(band, level="L3")
    return band, ext


def predicted_seconds(g: ConvPair, rows: int, machine, threads: int) -> float:
    """TileFlow's latency of the kernel with bands of `rows` on `machine` (a thread's share of each level's
    bandwidth and a core's float32 peak, tile_tree.Arch.per_thread), the tasks spread over `threads`."""
    cores = max(1, min(threads, machine.cores))
    l2 = next(lv for lv in machine.levels if lv.name == "L2")
    arch = tt.Arch.per_thread(machine, threads)
    bands = -(-g.out_h // rows)
    last = g.out_h - (bands - 1) * rows
    latency = {}
    for r in {rows, last}:
        tree, ext = band_tree(g, r, l2.size_bytes // max(1, machine.cores) // 4)  # a core's L2
        latency[r] = tt.analyze(tree, ext, arch, outer="L3").latency
    load = [0.0] * cores
    for r in sorted([rows] * (bands - 1) + [last], reverse=True) * g.batch:
        load[load.index(min(load))] += latency[r]
    return max(load)


def model_band_rows(g: ConvPair, machine, threads: int) -> int:
    """The band height of least predicted time among the heights balanced over the threads (the tallest of those
    within a billionth of it: equal sums in another order)."""
    heights = {balanced_rows(r, g.out_h, g.batch, threads) for r in range(1, g.out_h + 1)}
    predicted = {r: predicted_seconds(g, r, machine, threads) for r in heights}
    least = min(predicted.values())
    return max(r for r, t in predicted.items() if t <= least * (1 + 1e-9))


def chimera_band_rows(g: ConvPair, machine, threads: int, lanes: int = 16) -> int:
    """The band height Chimera's data-movement model gives the AFUSION kernel's form (whole rows, every channel:
    `conv_chain_tiles(band=True)`) for a core's L2, the band's input rows, both weights, the intermediate and the
    output rows held there: the tallest that fits (fewer bands read the weights and the halo fewer times), balanced
    over the threads."""
    l2 = next(lv for lv in machine.levels if lv.name == "L2")
    tiles = conv_chain_tiles(g, l2.size_bytes // max(1, machine.cores) // 4, threads, lanes, band=True)
    return balanced_rows(tiles["h"], g.out_h, g.batch, threads)
