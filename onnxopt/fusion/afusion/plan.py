"""Turn convolution groups of a plan into AFUSION regions: a convolution and the one (SISO, siso.py) or several
(SIMO, simo.py) convolutions reading its output, or two convolutions whose outputs meet in the second's epilogue
(MISO, miso.py), or a convolution and the pool reading its output (conv_pool.py), or a chain of three
convolutions (chain.py).

`afusion_pairs` lists the groups that can be fused, with the reason for each producer -> readers edge that cannot;
`apply_pairs` replaces the chosen ones. Which groups to fuse is the search's decision (onnxopt/fusion/search); the
default choice, `greedy_pairs`, takes every legal group in graph order, each region in one group at most.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..region import Region
from .conv_pool import (
    ceil_mode_reason,
    fuse_conv_pool,
    is_pool_region,
    pool_band_rows,
    pool_params,
    pool_reason,
)
from .chain import chain_band_rows, chain_reason, fuse_chain
from .miso import epilogue_inputs, fuse_miso, miso_band_rows, miso_reason
from .simo import simo_reason
from .siso import choose_band_rows, fuse_group, siso_reason


@dataclass
class Pair:
    """A first convolution region and the regions reading its output (one for SISO, several for SIMO)."""

    first: Region
    seconds: list[Region]
    band_rows: int
    miso: bool = False  # the first's output meets the second's in its epilogue (miso.py)
    pool: bool = False  # the second is the pool reading the first's output (conv_pool.py)
    chain: bool = False  # seconds[0] reads the first's output and seconds[1] reads seconds[0]'s (chain.py)

    @property
    def pattern(self) -> str:
        # A chain of three is SISO too (OptiFX's term, and the search candidates' pattern).
        return "MISO" if self.miso else "SISO" if len(self.seconds) == 1 or self.chain else "SIMO"

    @property
    def node_names(self) -> list[str]:
        return self.first.node_names + [x for r in self.seconds for x in r.node_names]


def _conv_regions(plan: list[Region]) -> list[Region]:
    return [r for r in plan if r.compute is not None and r.compute.op == "conv"]


def afusion_pairs(plan: list[Region], index, shape_of, lanes: int, threads: int,
                  scratch_bytes: int | None = None) -> tuple[list[Pair], list[dict]]:
    """(legal groups in graph order, refusals with reasons) for every conv region whose output some conv region
    reads as its input."""
    convs = _conv_regions(plan)
    readers: dict[str, list[Region]] = {}
    for r in convs:
        readers.setdefault(r.inputs[0], []).append(r)
    pairs, refused = [], []
    for first in convs:
        t = first.outputs[0] if len(first.outputs) == 1 else None
        seconds = readers.get(t, []) if t else [r for o in first.outputs for r in readers.get(o, [])]
        if not seconds:
            continue
        consumers = {t: index.consumers.get(t, [])} if t else None
        if len(seconds) == 1:
            why = siso_reason(first, seconds[0], lanes, consumers, index.graph_outputs)
        else:
            why = simo_reason(first, seconds, lanes, consumers, index.graph_outputs)
        out1 = shape_of(seconds[0].inputs[0])
        outs = [shape_of(r.outputs[0]) for r in seconds]
        if why is None and (out1 is None or any(o is None for o in outs)
                            or not all(isinstance(d, int) for d in (*out1, *(d for o in outs for d in o)))):
            why = "the shapes are not static"
        if why is None and len({tuple(o[2:]) for o in outs}) > 1:
            why = "the convolutions reading the intermediate have different output sizes"
        names = first.node_names + [x for r in seconds for x in r.node_names]
        if why is not None:
            refused.append({"nodes": names, "reason": f"AFUSION: {why}"})
            continue
        kw = {} if scratch_bytes is None else {"scratch_bytes": scratch_bytes}
        rows = choose_band_rows(first, seconds, lanes, outs[0][2], out1[3], outs[0][0], threads, **kw)
        forced = os.environ.get("ONNXOPT_AFUSION_BAND_ROWS")
        if forced:  # the tests run uneven and one-row bands on every shape
            rows = max(1, int(forced))
        pairs.append(Pair(first, list(seconds), rows))
    pairs += _chain_pairs([p for p in pairs if len(p.seconds) == 1], index, shape_of, lanes, threads, refused,
                          scratch_bytes)
    pairs += _miso_pairs(convs, index, shape_of, lanes, threads, refused, scratch_bytes)
    pairs += _pool_pairs(plan, convs, index, shape_of, lanes, threads, refused, scratch_bytes)
    position = {id(r): i for i, r in enumerate(plan)}
    pairs.sort(key=lambda p: max(position[id(r)] for r in p.seconds))  # graph order, for greedy_pairs
    return pairs, refused


def _chain_pairs(siso: list[Pair], index, shape_of, lanes, threads, refused, scratch_bytes) -> list[Pair]:
    """Chains of three (chain.py) made of two legal SISO pairs A -> B and B -> C."""
    by_first = {id(p.first): p for p in siso}
    pairs = []
    for p in siso:
        q = by_first.get(id(p.seconds[0]))
        if q is None:
            continue
        a, b, c = p.first, p.seconds[0], q.seconds[0]
        consumers = {t: index.consumers.get(t, []) for t in (a.outputs[0], b.outputs[0])}
        why = chain_reason(a, b, c, lanes, consumers, index.graph_outputs)
        if why is not None:
            refused.append({"nodes": a.node_names + b.node_names + c.node_names, "reason": f"AFUSION chain: {why}"})
            continue
        out_a, out_b, out_c = shape_of(a.outputs[0]), shape_of(b.outputs[0]), shape_of(c.outputs[0])
        kw = {} if scratch_bytes is None else {"scratch_bytes": scratch_bytes}
        rows = chain_band_rows(a, b, c, lanes, out_c[2], out_a[3], out_b[3], out_c[0], threads, **kw)
        forced = os.environ.get("ONNXOPT_AFUSION_BAND_ROWS")
        if forced:
            rows = max(1, int(forced))
        pairs.append(Pair(a, [b, c], rows, chain=True))
    return pairs


def _miso_pairs(convs, index, shape_of, lanes, threads, refused, scratch_bytes) -> list[Pair]:
    """Conv regions whose output is a per-pixel input of another conv region's epilogue (miso.py)."""
    produced_by = {r.outputs[0]: r for r in convs if len(r.outputs) == 1}
    pairs = []
    for second in convs:
        for x in epilogue_inputs(second):
            first = produced_by.get(x)
            if first is None or first is second:
                continue
            why = miso_reason(first, second, lanes, {x: index.consumers.get(x, [])}, index.graph_outputs)
            out = shape_of(second.outputs[0])
            if why is None and (out is None or not all(isinstance(d, int) for d in out)):
                why = "the shapes are not static"
            if why is not None:
                refused.append({"nodes": first.node_names + second.node_names, "reason": f"AFUSION MISO: {why}"})
                continue
            kw = {} if scratch_bytes is None else {"scratch_bytes": scratch_bytes}
            rows = miso_band_rows(second.compute.attrs.oc, lanes, out[2], out[3], out[0], threads, **kw)
            forced = os.environ.get("ONNXOPT_AFUSION_BAND_ROWS")
            if forced:
                rows = max(1, int(forced))
            pairs.append(Pair(first, [second], rows, miso=True))
    return pairs


def _pool_pairs(plan, convs, index, shape_of, lanes, threads, refused, scratch_bytes) -> list[Pair]:
    """Conv regions whose output only a MaxPool or AveragePool reads (conv_pool.py)."""
    pools = {r.inputs[0]: r for r in plan if is_pool_region(r)}
    pairs = []
    for first in convs:
        pool = pools.get(first.outputs[0]) if len(first.outputs) == 1 else None
        if pool is None:
            continue
        t = first.outputs[0]
        why = pool_reason(first, pool, lanes, {t: index.consumers.get(t, [])}, index.graph_outputs)
        mid, out = shape_of(t), shape_of(pool.outputs[0])
        if why is None and (mid is None or out is None or not all(isinstance(d, int) for d in (*mid, *out))):
            why = "the shapes are not static"
        if why is None:
            why = ceil_mode_reason(pool_params(pool.nodes[0]), mid[2], mid[3])
        if why is not None:
            refused.append({"nodes": first.node_names + pool.node_names, "reason": f"AFUSION conv -> pool: {why}"})
            continue
        kw = {} if scratch_bytes is None else {"scratch_bytes": scratch_bytes}
        rows = pool_band_rows(first, pool_params(pool.nodes[0]), lanes, out[2], mid[3], out[0], threads, **kw)
        forced = os.environ.get("ONNXOPT_AFUSION_BAND_ROWS")
        if forced:
            rows = max(1, int(forced))
        pairs.append(Pair(first, [pool], rows, pool=True))
    return pairs


def greedy_pairs(pairs: list[Pair]) -> list[Pair]:
    """Every group in graph order whose regions are not in an earlier chosen group."""
    used: set[int] = set()
    chosen = []
    for p in pairs:
        members = [id(p.first)] + [id(r) for r in p.seconds]
        if any(m in used for m in members):
            continue
        used.update(members)
        chosen.append(p)
    return chosen


def apply_pairs(plan: list[Region], chosen: list[Pair], lanes: int, ni: int, opset: int,
                made: dict | None = None) -> list[Region]:
    """The plan with each chosen group replaced by its AFUSION region, at its last second region's place (after
    everything its inputs come from, so the plan stays in graph order). `made` (group node names -> region) keeps
    the regions made, and gives back the same region for a group applied again (built and checked once)."""
    made = {} if made is None else made
    position = {id(r): i for i, r in enumerate(plan)}
    at_last = {id(max(p.seconds, key=lambda r: position[id(r)])): p for p in chosen}
    members = {id(r) for p in chosen for r in [p.first, *p.seconds]}
    out = []
    for r in plan:
        p = at_last.get(id(r))
        if p is not None:
            key = tuple(p.node_names)
            if key not in made:
                if p.chain:
                    made[key] = fuse_chain(p.first, *p.seconds, lanes, ni, opset, p.band_rows)
                elif p.pool:
                    made[key] = fuse_conv_pool(p.first, p.seconds[0], lanes, ni, opset, p.band_rows)
                elif p.miso:
                    made[key] = fuse_miso(p.first, p.seconds[0], lanes, ni, opset, p.band_rows)
                else:
                    made[key] = fuse_group(p.first, p.seconds, lanes, ni, opset, p.band_rows)
            out.append(made[key])
        elif id(r) not in members:
            out.append(r)
    return out
