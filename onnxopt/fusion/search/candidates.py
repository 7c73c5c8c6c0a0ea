"""OptiFX Algorithm 1: candidate sub-graphs for fusion, pruned with the roofline (OptiFX §4.1).

Nodes are classified as ROPs (Conv, MaxPool, AveragePool, the global pools; not ConvTranspose), EOPs (elementwise
ops and inference BatchNormalization, which fold into an epilogue) and others (Concat, Reshape, Resize...).
Gemm/MatMul get vertical fusion only. The candidates:

* vertical ("single"): a ROP, Gemm or MatMul with the chain of single-consumer EOPs after it (conv + bias + Relu,
  "CBR"). A ROP with no EOP after it fuses nothing and is not a candidate.
* horizontal ("siblings"): 2-3 convs reading the same input with the same output size (Inception branches, a
  fire's expand 1x1 + 3x3), each with its epilogue: the input is read once.
* afusion: 2-3 ROPs with the EOPs between them, legal by `afusion.legality`: "SISO" chains, "SIMO" (one conv
  feeding two ROPs, SqueezeNet's fire), "MISO" (two convs meeting at an Add, NASNet; optionally with the conv that
  reads the sum). Their FLOPs include the halo recomputation of full-width row bands (`afusion.tiles`), at the
  tallest band up to `band_height` rows whose intermediate rows fit the scratch buffer.

**GraphSplit** (Algorithm 1, lines 5-14) splits the graph recursively by a minimum cut until every part holds at
most `t_graph` ROPs, and only candidates whose members all lie in one part (a *leaf*) are kept. Our cut is a
*prefix cut of a topological order*: a part is always a contiguous range of one topological order of the nodes,
split at one position. Why not a general s-t min cut (networkx):

- a range of a topological order is convex (every path between two of its nodes stays inside it), so every leaf,
  and every candidate inside one, contracts to a node without creating a cycle; an s-t cut needs extra infinite
  reverse edges to guarantee that, and a choice of s and t to stay balanced;
- the weight of every cut position follows from difference arrays in one pass, so a split costs O(nodes +
  candidates) and the whole recursion takes milliseconds on a 400-node NASNet; networkx is also not a dependency.

What a prefix cut can reach depends on the order, and ONNX exporters emit branches one after another, so the
order is built for the purpose (`fusion_order`): backwards from the outputs, continuing the partly placed
candidate that saves the most bytes. Any topological order keeps the convexity argument.

The cut weight is a deliberate choice too. Plain "bytes of the tensors cut" (`cut_weight="bytes"`) prefers the
narrowest tensors, and those are the ones fusion wants to keep on chip: it cuts every SqueezeNet fire between its
16-channel squeeze and its expands (24 of 42 SqueezeNet candidates survive instead of 42). The default
(`cut_weight="savings"`) weighs a cut by what it destroys: the bytes of memory traffic that the candidates it
separates would have saved. Among equally cheap cuts it takes the one that balances the ROPs of the two sides (so
the recursion stays shallow), then the one crossing fewer tensor bytes. Cuts between SqueezeNet fires or DenseNet
layers cost nothing and are taken first.

**SimulateFusion** (lines 7-11) keeps a candidate when its roofline performance fused beats the unfused one by
`theta_opt` (1.05): P~ = useful FLOPs / roofline time (Eq.2), with the unfused time the sum of its kernels' roofline
times (each kernel is its own roofline point, as it runs on its own) and the fused time max(FLOPs incl. recompute /
P_max, bytes after / M_max). For one kernel this is exactly Eq.2's min(P_max, M_max * I).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Iterable, Sequence

import numpy as np
from onnx import numpy_helper

from onnxopt.annotate.cost import fused_bytes
from onnxopt.annotate.graph import machine_dtype
from onnxopt.errors import UsageError
from onnxopt.fusion.afusion.legality import (
    AFUSION_CONSUMERS,
    AfusionRegion,
    FusionGraph,
    afusion_region,
    check_horizontal,
)
from onnxopt.hardware.machine_model import Machine

from .split import T_GRAPH, fusion_order, graph_split  # noqa: E402 - re-exported
THETA_OPT = 1.05
DEFAULT_BAND_HEIGHT = 8  # output rows per band for the recompute estimate (the paper's tiles are 2-16)
MAX_SIBLINGS = 10  # above this many siblings of one tensor, only pairs are tried (C(n, 3) grows fast)
SMALL_CONSTANT = 16  # constants up to this many elements are part of a kernel's signature (Clip bounds, scales)

from .records import KINDS, Candidate, CandidateResult, Leaf, Refusal  # noqa: E402


# ----------------------------------------------------------------------------------------------------------------
# Signatures


def signature(graph: FusionGraph, members: Iterable[int], kind: str = "node") -> str:
    """A key equal for identical sub-graphs: op types, attributes, shapes and dtypes, the wiring between members,
    small constants' values; not names and not weight values."""
    ids = sorted(members)
    inside = set(ids)
    pos = {i: k for k, i in enumerate(ids)}
    produced = {t: f"@{pos[i]}.{j}" for i in ids for j, t in enumerate(graph.nodes[i].output) if t}
    external: dict[str, int] = {}
    inits = _initializer_map(graph)
    parts = [kind]
    for i in ids:
        node = graph.nodes[i]
        ins = []
        for t in node.input:
            if not t:
                ins.append("-")
            elif t in produced:
                ins.append(produced[t])
            elif graph.is_constant(t):
                desc = f"c{graph.shape(t)}{graph.dtype(t)}"
                init = inits.get(t)
                if init is not None and int(np.prod(init.dims)) <= SMALL_CONSTANT:
                    desc += repr(numpy_helper.to_array(init).tolist())
                ins.append(desc)
            else:
                k = external.setdefault(t, len(external))
                ins.append(f"x{k}{graph.shape(t)}{graph.dtype(t)}")
        outs = []
        for t in node.output:
            kept = graph.is_kept(t) or any(c not in inside for c in graph.consumers.get(t, ()))
            outs.append(f"{graph.shape(t)}{graph.dtype(t)}{'!' if kept else ''}" if t else "-")
        attrs = ";".join(f"{k}={_attr_text(v)}" for k, v in sorted(graph.attrs[i].items()))
        parts.append(f"{node.domain}:{node.op_type}({','.join(ins)})->({','.join(outs)})[{attrs}]")
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
    return f"{kind}:{digest}"


def _attr_text(v) -> str:
    if hasattr(v, "SerializeToString"):  # a body graph or a tensor attribute
        return hashlib.sha256(v.SerializeToString()).hexdigest()[:12]
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_attr_text(x) for x in v) + "]"
    return repr(v)


def _initializer_map(graph: FusionGraph) -> dict:
    cached = getattr(graph, "_initializer_protos", None)
    if cached is None:
        cached = {t.name: t for t in graph.model.graph.initializer}
        graph._initializer_protos = cached  # type: ignore[attr-defined]
    return cached


def node_key(graph: FusionGraph, node: int | str) -> str:
    """The signature of one unfused node (the cost of "this node as its own kernel" is cached under it)."""
    return signature(graph, [graph.resolve(node)], "node")


# ----------------------------------------------------------------------------------------------------------------
# Building candidates


def default_scratch_limit(machine: Machine) -> int:
    """Bytes a fused kernel may keep its intermediate rows in: a GPU block's shared memory (the first level over
    the SM count); on a CPU half a core's L2, as the CPU kernel does (onnxopt/fusion/afusion/siso.py): the rows
    written in phase 1 are still cached in phase 2, next to the weights phase 2 streams."""
    if machine.details.get("kind") == "gpu" or machine.levels[0].name == "shared":
        lvl = machine.levels[0]
        return int((lvl.size_bytes or 48 * 1024) // max(1, machine.cores))
    buffers = machine.details.get("buffers", {})
    for lvl in machine.levels:
        if lvl.name == "L2":
            per_core = buffers.get("L2", {}).get("instance_bytes")
            return int(per_core or (lvl.size_bytes or 0) // max(1, machine.cores) or 1 << 20) // 2
    return 1 << 19


class _Builder:
    """Turns member sets into Candidates with costs (shared state: the graph, the machine, the limits)."""

    def __init__(self, graph: FusionGraph, machine: Machine, band_height: int, scratch_limit: int):
        self.g = graph
        self.machine = machine
        self.dtype = machine_dtype(machine, "float32")
        self.band_height = band_height
        self.scratch_limit = scratch_limit

    def make(self, kind: str, pattern: str, rops: Sequence[int], members: Iterable[int],
             shared_inputs: Sequence[str] = (), region: AfusionRegion | None = None) -> Candidate:
        g = self.g
        ids = tuple(sorted(set(members)))
        inside = set(ids)
        anns = [g.annotations[i] for i in ids]
        nodes = [g.nodes[i] for i in ids]
        costs = [a.cost for a in anns]
        produced = {t for i in ids for t in g.outputs(i)}
        keep = {t for t in produced if g.is_kept(t) or any(c not in inside for c in g.consumers.get(t, ()))}
        consumed = {t for i in ids for t in g.nodes[i].input if t}
        removed = tuple(t for i in ids for t in g.outputs(i) if t in consumed and t not in keep)
        bytes_after = fused_bytes(nodes, costs, keep)
        flops_before = sum(c.flops for c in costs)
        recompute, band, scratch = 0, None, None
        if region is not None:
            band, scratch = self._band(region)
            rr = region.rows(band)
            for i in ids:
                cls = region.row_class.get(i)
                if cls in rr.recomputed_rows:
                    recompute += round(g.annotations[i].cost.flops * rr.recompute_ratio(cls))
        rop_set = set(rops)
        rop_costs = [g.annotations[i].cost for i in sorted(rop_set)]
        seconds_before = sum(a.seconds or 0.0 for a in anns)
        seconds_after = self.machine.predict_seconds(flops_before + recompute, bytes_after, self.dtype)
        rop_names = tuple(g.names[i] for i in sorted(rop_set))
        return Candidate(
            id=f"{kind}:{pattern}:{'+'.join(rop_names)}", kind=kind, pattern=pattern, rops=rop_names,
            members=tuple(g.names[i] for i in ids), node_ids=ids, removed_tensors=removed,
            shared_inputs=tuple(shared_inputs), flops_before=flops_before, recompute_flops=recompute,
            bytes_before=sum(c.bytes_moved for c in costs), bytes_after=bytes_after,
            rop_flops=sum(c.flops for c in rop_costs), rop_bytes_before=sum(c.bytes_moved for c in rop_costs),
            seconds_before=seconds_before, seconds_after=seconds_after,
            key=signature(g, ids, f"{kind}/{pattern}"), band_height=band, scratch_bytes=scratch)

    def _band(self, region: AfusionRegion) -> tuple[int, int]:
        """The tallest band up to `band_height` rows whose intermediate rows fit the scratch limit (legality
        already checked that one row does)."""
        out_h = max(region.heights[op.output] for op in region.row_ops)
        for b in range(min(self.band_height, out_h), 0, -1):
            s = region.scratch_bytes(b)
            if s <= self.scratch_limit or b == 1:
                return b, s
        return 1, region.scratch_bytes(1)


def _float32_reason(g: FusionGraph, members: Iterable[int]) -> str | None:
    for m in members:
        for t in g.data_inputs(m) + g.outputs(m):
            if g.dtype(t) != "float32":
                return f"{g.label(m)} uses {g.dtype(t) or 'an unknown dtype'} tensor '{t}'; kernels are float32 only"
            if g.static_shape(t) is None:
                return f"{g.label(m)}: the shape of '{t}' is not static"
    return None


def _rop_readers(g: FusionGraph, sources: Iterable[int], allowed: frozenset[str]) -> list[int]:
    """ROPs of `allowed` types whose data input (input 0) is an output of `sources` or of their epilogue chain of
    single-consumer EOPs (the direct edge)."""
    tensors: set[str] = set()
    for s in sources:
        for n in [s, *g.epilogue(s)]:
            tensors.update(g.outputs(n))
    out = set()
    for t in tensors:
        for c in g.consumers.get(t, ()):
            if g.op(c) in allowed and g.nodes[c].input and g.nodes[c].input[0] == t and g.is_rop(c):
                out.add(c)
    return sorted(out)


def _trace_back_to_conv(g: FusionGraph, tensor: str) -> int | None:
    """The conv a tensor comes from through single-data-input EOPs (Relu, BN, bias Add...), or None."""
    for _ in range(16):
        p = g.producer.get(tensor)
        if p is None:
            return None
        if g.op(p) == "Conv" and g.is_rop(p):
            return p
        if not g.is_eop(p):
            return None
        data = g.data_inputs(p)
        if len(data) != 1:
            return None
        tensor = data[0]
    return None


def enumerate_candidates(graph: FusionGraph, machine: Machine, kinds: Iterable[str] = KINDS, *,
                         band_height: int = DEFAULT_BAND_HEIGHT, scratch_limit: int | None = None,
                         max_rops: int = 3) -> tuple[list[Candidate], list[Refusal]]:
    """Every legal candidate of the graph (GraphSplit ignored), in a deterministic order, and the refusals.
    `graph` must be annotated with `machine` (its nodes' roofline times are the "before" of each candidate)."""
    g = graph
    limit = default_scratch_limit(machine) if scratch_limit is None else int(scratch_limit)
    builder = _Builder(g, machine, band_height, limit)
    kinds = set(kinds)
    found: dict[str, Candidate] = {}
    refused: list[Refusal] = []

    def add(c: Candidate) -> None:
        found.setdefault(c.id, c)

    n = len(g.nodes)
    if "vertical" in kinds:
        for i in range(n):
            if g.kinds[i] not in ("rop", "compute"):
                continue
            chain = g.epilogue(i)
            if not chain:
                continue  # nothing to fuse
            reason = _float32_reason(g, [i, *chain])
            if reason:
                refused.append(Refusal("vertical", "single", (g.names[i],), reason))
                continue
            add(builder.make("vertical", "single", [i], [i, *chain]))

    if "horizontal" in kinds:
        seen_inputs: set[str] = set()
        tensors = [t for i in range(n) for t in g.nodes[i].input if t]
        for t in tensors:
            if t in seen_inputs or g.is_constant(t):
                continue
            seen_inputs.add(t)
            convs = sorted({c for c in g.consumers.get(t, ()) if g.op(c) == "Conv" and g.is_rop(c)
                            and g.nodes[c].input[0] == t})
            if len(convs) < 2:
                continue
            by_size: dict[tuple, list[int]] = {}
            for c in convs:
                s = g.static_shape(g.nodes[c].output[0])
                if s is not None and len(s) == 4:
                    by_size.setdefault(s[2:], []).append(c)
            for group in by_size.values():
                sizes = (2, 3) if len(group) <= MAX_SIBLINGS else (2,)
                for k in sizes:
                    for combo in itertools.combinations(group, k):
                        reason = check_horizontal(g, list(combo))
                        names = tuple(g.names[c] for c in combo)
                        if reason:
                            refused.append(Refusal("horizontal", "siblings", names, reason))
                            continue
                        members = g.with_epilogues(combo, combo)
                        add(builder.make("horizontal", "siblings", combo, members, shared_inputs=(t,)))

    if "afusion" in kinds:
        def attempt(prods: Sequence[int], cons: Sequence[int]) -> AfusionRegion | None:
            r = afusion_region(g, list(prods), list(cons), scratch_limit=builder.scratch_limit, band_height=1,
                               max_rops=max_rops)
            names = tuple(g.names[x] for x in sorted([*prods, *cons]))
            if isinstance(r, str):
                refused.append(Refusal("afusion", "MISO" if len(prods) > 1 else "SISO/SIMO", names, r))
                return None
            add(builder.make("afusion", r.pattern, r.rops, r.members, region=r))
            return r

        for p in range(n):
            if not (g.op(p) == "Conv" and g.is_rop(p)):
                continue
            readers = _rop_readers(g, [p], AFUSION_CONSUMERS)
            for c in readers:
                if attempt([p], [c]) is None or max_rops < 3:
                    continue
                for d in _rop_readers(g, [c], AFUSION_CONSUMERS):
                    attempt([p], [c, d])
            if max_rops >= 3:
                for c1, c2 in itertools.combinations(readers, 2):
                    attempt([p], [c1, c2])
        for m in range(n):
            if not g.is_eop(m) or len(g.data_inputs(m)) < 2:
                continue
            convs = sorted({c for t in g.data_inputs(m) if (c := _trace_back_to_conv(g, t)) is not None})
            for a, b in itertools.combinations(convs, 2):
                if attempt([a, b], []) is None or max_rops < 3:
                    continue
                for d in _rop_readers(g, [m], AFUSION_CONSUMERS):
                    attempt([a, b], [d])

    order = sorted(found.values(), key=lambda c: (c.node_ids[0], c.node_ids, c.id))
    return order, refused


# ----------------------------------------------------------------------------------------------------------------
# Algorithm 1


def generate_candidates(model, machine: Machine | str, t_graph: int = T_GRAPH, theta_opt: float = THETA_OPT,
                        prune: bool = True, kinds: Iterable[str] = KINDS, *, band_height: int = DEFAULT_BAND_HEIGHT,
                        scratch_limit: int | None = None, cut_weight: str = "savings", roofline: str = "kernels",
                        max_rops: int = 3) -> CandidateResult:
    """OptiFX Algorithm 1 on `model` (a ModelProto, path, AnnotatedGraph or FusionGraph) for `machine` (a Machine
    or a preset name): enumerate legal candidates, keep those inside one GraphSplit leaf, and (with `prune`) those
    whose roofline performance fused beats unfused by `theta_opt`.

    `band_height`: output rows per band for the afusion recompute estimate; `scratch_limit`: bytes for a band's
    intermediate rows (default: `default_scratch_limit(machine)`). `roofline`: "kernels" (P~ unfused from the sum of
    the members' own roofline times, the default) or "aggregate" (Eq.2 on the members' summed FLOPs over summed
    bytes, the paper's literal reading; it also prunes a compute-bound conv's Relu epilogue, whose separate kernel
    the per-kernel view still counts).
    """
    start = time.perf_counter()
    if isinstance(machine, str):
        from onnxopt.hardware.presets import get_preset

        machine = get_preset(machine)
    if not isinstance(machine, Machine):
        raise UsageError(f"generate_candidates needs a Machine or a preset name, not {type(machine).__name__}")
    wanted = {kinds} if isinstance(kinds, str) else set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise UsageError(f"unknown candidate kinds {sorted(unknown)}; use {', '.join(KINDS)}")
    kinds = tuple(k for k in KINDS if k in wanted)
    if theta_opt <= 0:
        raise UsageError(f"theta_opt must be positive, not {theta_opt}")
    if band_height < 1:
        raise UsageError(f"band_height must be at least 1, not {band_height}")
    if roofline not in ("kernels", "aggregate"):
        raise UsageError(f"roofline must be 'kernels' or 'aggregate', not {roofline!r}")
    g = FusionGraph.of(model, machine)
    if g.machine is not machine:
        from onnxopt.annotate.graph import annotate

        g = FusionGraph(annotate(g.model, machine))
    enumerated, refused = enumerate_candidates(g, machine, kinds, band_height=band_height,
                                               scratch_limit=scratch_limit, max_rops=max_rops)
    leaves = graph_split(g, t_graph, enumerated, cut_weight)
    leaf_of = {node: k for k, lf in enumerate(leaves) for node in lf.node_ids}
    unpruned = [c for c in enumerated if len({leaf_of[m] for m in c.node_ids}) == 1]
    dtype = machine_dtype(machine, "float32")

    def keeps(c: Candidate) -> bool:
        if roofline == "kernels":
            return c.attainable_after > theta_opt * c.attainable_before
        # Eq.2 on the group's summed intensity, as the paper's Algorithm 1 reads.
        before = machine.attainable(c.intensity_before, dtype)
        after = machine.attainable(c.flops_after / c.bytes_after if c.bytes_after else math.inf, dtype)
        return after * c.flops_before / max(1, c.flops_after) > theta_opt * before

    kept = [c for c in unpruned if keeps(c)] if prune else list(unpruned)
    return CandidateResult(graph=g, machine=machine, candidates=kept, unpruned=unpruned, enumerated=enumerated,
                           leaves=leaves, refused=refused, theta_opt=theta_opt, t_graph=t_graph,
                           seconds=time.perf_counter() - start, pruned=prune)


__all__ = [
    "DEFAULT_BAND_HEIGHT", "KINDS", "THETA_OPT", "T_GRAPH", "Candidate", "CandidateResult", "Leaf", "Refusal",
    "default_scratch_limit", "enumerate_candidates", "fusion_order", "generate_candidates", "graph_split", "node_key",
    "signature",
]
