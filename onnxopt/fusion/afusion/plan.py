"""Turn convolution pairs of a plan into AFUSION regions (siso.py).

`afusion_pairs` lists the pairs that can be fused, with the reason for each producer -> consumer edge that cannot;
`apply_pairs` replaces the chosen ones. Which pairs to fuse is the search's decision (onnxopt/fusion/search); the
default choice, `greedy_pairs`, takes every legal pair in graph order, each region in one pair at most.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..region import Region
from .siso import choose_band_rows, fuse_siso, siso_reason


@dataclass
class Pair:
    first: Region
    second: Region
    band_rows: int


def _conv_regions(plan: list[Region]) -> list[Region]:
    return [r for r in plan if r.compute is not None and r.compute.op == "conv"]


def afusion_pairs(plan: list[Region], index, shape_of, lanes: int, threads: int,
                  scratch_bytes: int | None = None) -> tuple[list[Pair], list[dict]]:
    """(legal pairs in graph order, refusals with reasons) for every conv region that reads a conv region's
    output as its input."""
    produced_by = {o: r for r in _conv_regions(plan) for o in r.outputs}
    pairs, refused = [], []
    for second in _conv_regions(plan):
        first = produced_by.get(second.inputs[0])
        if first is None:
            continue
        t = first.outputs[0] if len(first.outputs) == 1 else None
        consumers = {t: index.consumers.get(t, [])} if t else None
        why = siso_reason(first, second, lanes, consumers, index.graph_outputs)
        out1, out2 = shape_of(second.inputs[0]), shape_of(second.outputs[0])
        if why is None and (out1 is None or out2 is None or not all(isinstance(d, int) for d in (*out1, *out2))):
            why = "the shapes are not static"
        if why is not None:
            refused.append({"nodes": first.node_names + second.node_names, "reason": f"AFUSION: {why}"})
            continue
        kw = {} if scratch_bytes is None else {"scratch_bytes": scratch_bytes}
        rows = choose_band_rows(first, second, lanes, out2[2], out1[3], out2[0], threads, **kw)
        forced = os.environ.get("ONNXOPT_AFUSION_BAND_ROWS")
        if forced:  # the tests run uneven and one-row bands on every shape
            rows = max(1, int(forced))
        pairs.append(Pair(first, second, rows))
    return pairs, refused


def greedy_pairs(pairs: list[Pair]) -> list[Pair]:
    """Every pair in graph order whose regions are not in an earlier chosen pair."""
    used: set[int] = set()
    chosen = []
    for p in pairs:
        if id(p.first) in used or id(p.second) in used:
            continue
        used.update((id(p.first), id(p.second)))
        chosen.append(p)
    return chosen


def apply_pairs(plan: list[Region], chosen: list[Pair], lanes: int, ni: int, opset: int) -> list[Region]:
    """The plan with each chosen pair replaced by its AFUSION region (at the second region's place, so the plan
    stays in graph order)."""
    firsts = {id(p.first) for p in chosen}
    by_second = {id(p.second): p for p in chosen}
    out = []
    for r in plan:
        if id(r) in firsts:
            continue
        p = by_second.get(id(r))
        out.append(fuse_siso(p.first, p.second, lanes, ni, opset, p.band_rows) if p else r)
    return out
