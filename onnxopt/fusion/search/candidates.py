"""OptiFX Algorithm 1: candidate sub-graphs for fusion, pruned with the roofline (OptiFX §4.1, notes/optifx.md §4).

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
from dataclasses import dataclass, field

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

T_GRAPH = 3
THETA_OPT = 1.05
DEFAULT_BAND_HEIGHT = 8  # output rows per band for the recompute estimate (the paper's tiles are 2-16)
KINDS = ("vertical", "horizontal", "afusion")
MAX_SIBLINGS = 10  # above this many siblings of one tensor, only pairs are tried (C(n, 3) grows fast)
SMALL_CONSTANT = 16  # constants up to this many elements are part of a kernel's signature (Clip bounds, scales)


@dataclass(frozen=True)
class Candidate:
    """One candidate kernel: a set of nodes that would run as one fused kernel.

    Node names are the annotated graph's. `key` is a signature of the sub-graph (op types, shapes, attributes,
    wiring; not the weights' values): identical sub-graphs share it, so a kernel or cost cache can be keyed on it.
    `id` is stable for a model: kind, pattern and ROP names.
    """

    id: str
    kind: str  # "vertical", "horizontal" or "afusion"
    pattern: str  # "single", "siblings", "SISO", "SIMO" or "MISO"
    rops: tuple[str, ...]  # the ROPs (and Gemm/MatMul) in topological order
    members: tuple[str, ...]  # every member, EOPs included, in topological order
    node_ids: tuple[int, ...]  # the members' positions in the graph
    removed_tensors: tuple[str, ...]  # intermediates no longer written or read
    shared_inputs: tuple[str, ...]  # inputs read once instead of once per member (horizontal)
    flops_before: int
    recompute_flops: int  # halo recomputation (afusion)
    bytes_before: int
    bytes_after: int
    rop_flops: int  # the ROP members alone (the paper's Table 4 counts convs only)
    rop_bytes_before: int
    seconds_before: float  # sum of the members' roofline times, each its own kernel
    seconds_after: float  # roofline time of the fused kernel
    key: str
    band_height: int | None = None  # afusion: output rows per band used for the recompute
    scratch_bytes: int | None = None  # afusion: intermediate rows one band holds

    @property
    def flops_after(self) -> int:
        return self.flops_before + self.recompute_flops

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def intensity_before(self) -> float:
        return self.flops_before / self.bytes_before if self.bytes_before else 0.0

    @property
    def intensity_after(self) -> float:
        """The paper's fused I: useful FLOPs over the bytes the fused kernel moves (recompute not counted)."""
        return self.flops_before / self.bytes_after if self.bytes_after else 0.0

    @property
    def rop_intensity_before(self) -> float:
        """Table 4's "before": the ROPs' FLOPs over their own bytes, epilogue ops left out."""
        return self.rop_flops / self.rop_bytes_before if self.rop_bytes_before else 0.0

    @property
    def rop_intensity_after(self) -> float:
        """Table 4's "after": the ROPs' FLOPs over the fused kernel's bytes."""
        return self.rop_flops / self.bytes_after if self.bytes_after else 0.0

    @property
    def attainable_before(self) -> float:
        """P~ unfused: useful FLOP/s when each member runs as its own roofline-bound kernel."""
        return self.flops_before / self.seconds_before if self.seconds_before else 0.0

    @property
    def attainable_after(self) -> float:
        """P~ fused: useful FLOP/s of the fused kernel on the roofline (recompute costs time, not useful FLOPs)."""
        return self.flops_before / self.seconds_after if self.seconds_after else 0.0

    @property
    def predicted_speedup(self) -> float:
        return self.seconds_before / self.seconds_after if self.seconds_after else float("inf")

    @property
    def estimate(self) -> float:
        """The roofline cost of the fused kernel in seconds (what a cost source falls back to)."""
        return self.seconds_after

    def to_dict(self) -> dict:
        return {
            "id": self.id, "kind": self.kind, "pattern": self.pattern, "rops": list(self.rops),
            "members": list(self.members), "removed_tensors": list(self.removed_tensors),
            "shared_inputs": list(self.shared_inputs), "flops_before": self.flops_before,
            "recompute_flops": self.recompute_flops, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "intensity_before": self.intensity_before,
            "intensity_after": self.intensity_after, "seconds_before": self.seconds_before,
            "seconds_after": self.seconds_after, "predicted_speedup": self.predicted_speedup,
            "band_height": self.band_height, "scratch_bytes": self.scratch_bytes, "key": self.key,
        }


@dataclass(frozen=True)
class Leaf:
    """A part of GraphSplit: the nodes at positions [start, end) of the split order (`fusion_order`)."""

    start: int
    end: int
    rops: int
    names: tuple[str, ...] = field(repr=False, default=())
    node_ids: tuple[int, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class Refusal:
    kind: str
    pattern: str
    rops: tuple[str, ...]
    reason: str


@dataclass
class CandidateResult:
    """Algorithm 1's answer. `candidates` are the ones kept; `unpruned` the legal ones inside GraphSplit's leaves
    before the roofline filter (Table 5's "before"); `enumerated` every legal one, leaves ignored."""

    graph: FusionGraph = field(repr=False)
    machine: Machine = field(repr=False)
    candidates: list[Candidate]
    unpruned: list[Candidate]
    enumerated: list[Candidate]
    leaves: list[Leaf]
    refused: list[Refusal]
    theta_opt: float
    t_graph: int
    seconds: float
    pruned: bool = True

    def counts(self) -> dict[str, dict[str, int]]:
        """{"before"|"after"|"enumerated": {kind: n, ..., "total": n}} (Table 5's two rows, per kind)."""

        def by_kind(cs: Sequence[Candidate]) -> dict[str, int]:
            d = {k: sum(1 for c in cs if c.kind == k) for k in KINDS}
            d["total"] = len(cs)
            return d

        return {"enumerated": by_kind(self.enumerated), "before": by_kind(self.unpruned),
                "after": by_kind(self.candidates)}

    @property
    def count_before(self) -> int:
        return len(self.unpruned)

    @property
    def count_after(self) -> int:
        return len(self.candidates)

    def by_id(self) -> dict[str, Candidate]:
        return {c.id: c for c in self.enumerated}

    def summary(self) -> str:
        c = self.counts()
        kinds = ", ".join(f"{k} {c['before'][k]}->{c['after'][k]}" for k in KINDS)
        return (f"{c['before']['total']} candidates before pruning, {c['after']['total']} after (theta_opt "
                f"{self.theta_opt}; {kinds}; {len(self.leaves)} leaves of <= {self.t_graph} ROPs; "
                f"{c['enumerated']['total']} legal in the whole graph) on {self.machine.name}, "
                f"{self.seconds:.2f} s")


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
# GraphSplit


def fusion_order(graph: FusionGraph, candidates: Sequence[Candidate] = ()) -> list[int]:
    """A topological order of the node ids that keeps each candidate's members close together.

    Built from the outputs backwards: a node is placed once all its consumers are, and among the ready nodes the
    one in the *partly placed* candidate that saves the most bytes goes first, else the latest in the graph's own
    order. Groups that a model emits far apart (an Inception branch's tail and its sibling) are thereby pulled
    together where that keeps a bigger saving in one piece. Without candidates this is the graph's own order.

    Orders trade candidates against each other: preferring the candidate closest to completion instead keeps
    NASNet's MISO pairs (two pointwise convs meeting at an Add) in one leaf, but each of those overlaps the two
    dw -> pw SISO pairs of the same branches and a 3-ROP leaf cannot hold all four convs; on the roofline the
    SISO pairs save more (NASNet 1.25x vs 1.19x predicted), so the bigger saving wins here.
    """
    g = graph
    n = len(g.nodes)
    succ = [[s for s in g.successors(i) if s > i] for i in range(n)]
    pending = [len(x) for x in succ]
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for s in succ[i]:
            preds[s].append(i)
    member_of: dict[int, list[int]] = {}
    for ci, c in enumerate(candidates):
        for m in c.node_ids:
            member_of.setdefault(m, []).append(ci)
    placed_in = [0] * len(candidates)
    saving = [max(0, c.bytes_saved) for c in candidates]
    size = [len(c.node_ids) for c in candidates]
    ready = [i for i in range(n) if pending[i] == 0]
    backwards: list[int] = []

    def priority(x: int) -> tuple[int, int]:
        # A member of the partly placed candidate that saves the most goes next; a node in no open candidate
        # keeps the graph's order.
        open_saving = max((saving[ci] for ci in member_of.get(x, ()) if 0 < placed_in[ci] < size[ci]), default=-1)
        return (open_saving, x)

    while ready:
        x = max(ready, key=priority)
        ready.remove(x)
        backwards.append(x)
        for ci in member_of.get(x, ()):
            placed_in[ci] += 1
        for p in preds[x]:
            pending[p] -= 1
            if pending[p] == 0:
                ready.append(p)
    if len(backwards) != n:  # a graph that is not a DAG in node order: keep the given order
        return list(range(n))
    return backwards[::-1]


def graph_split(graph: FusionGraph, t_graph: int = T_GRAPH, candidates: Sequence[Candidate] = (),
                cut_weight: str = "savings", order: Sequence[int] | None = None) -> list[Leaf]:
    """Split `order` (default: `fusion_order(graph, candidates)`) recursively at minimum-weight cuts until each
    part holds at most `t_graph` ROPs (see the module docstring for the cut and its weight). Returns the leaves,
    each a contiguous range of the order, in order."""
    if cut_weight not in ("savings", "bytes"):
        raise UsageError(f"cut_weight must be 'savings' or 'bytes', not {cut_weight!r}")
    if t_graph < 1:
        raise UsageError(f"t_graph must be at least 1, not {t_graph}")
    g = graph
    order = list(fusion_order(g, candidates) if order is None else order)
    n = len(order)
    pos = {node: k for k, node in enumerate(order)}
    rop_prefix = [0]
    for node in order:
        rop_prefix.append(rop_prefix[-1] + (1 if g.is_rop(node) else 0))
    # Each tensor: (producer position, consumer positions, bytes).
    tensors = []
    for node in order:
        p = pos[node]
        writes = g.annotations[node].cost.writes
        for t in g.outputs(node):
            cons = sorted(pos[c] for c in g.consumers.get(t, ()) if c in pos and pos[c] > p)
            if cons:
                tensors.append((p, cons, int(writes.get(t, 0))))
    spans = []
    for c in candidates:
        ps = [pos[m] for m in c.node_ids]
        spans.append((min(ps), max(ps), max(0, c.bytes_saved)))

    def leaf(lo: int, hi: int, rops: int) -> Leaf:
        nodes = tuple(order[lo:hi])
        return Leaf(lo, hi, rops, tuple(g.names[x] for x in nodes), nodes)

    leaves: list[Leaf] = []
    stack = [(0, n, tensors, spans)]
    while stack:
        lo, hi, ts, sp = stack.pop()
        rops = rop_prefix[hi] - rop_prefix[lo]
        if rops <= t_graph or hi - lo < 2:
            leaves.append(leaf(lo, hi, rops))
            continue
        size = hi - lo + 1
        crossing = [0] * size  # at index k - lo: the change of the weight of a cut just before position k
        lost = [0] * size
        for p, cons, b in ts:
            last = max((c for c in cons if c < hi), default=None)
            if last is None:
                continue
            crossing[p + 1 - lo] += b
            crossing[last + 1 - lo] -= b
        for a, z, saved in sp:
            lost[a + 1 - lo] += saved
            lost[z + 1 - lo] -= saved
        best, best_key = None, None
        run_cross = run_lost = 0
        for k in range(lo + 1, hi):
            run_cross += crossing[k - lo]
            run_lost += lost[k - lo]
            left = rop_prefix[k] - rop_prefix[lo]
            right = rops - left
            if left < 1 or right < 1:
                continue
            imbalance = abs(left - right)
            key = (run_lost, imbalance, run_cross, k) if cut_weight == "savings" else (run_cross, imbalance, k)
            if best_key is None or key < best_key:
                best, best_key = k, key
        if best is None:  # cannot happen with more than t_graph >= 1 ROPs; never loop forever
            leaves.append(leaf(lo, hi, rops))
            continue
        k = best
        left_ts = [(p, [c for c in cons if c < k], b) for p, cons, b in ts if p < k]
        right_ts = [(p, cons, b) for p, cons, b in ts if p >= k]
        stack.append((k, hi, right_ts, [x for x in sp if x[0] >= k]))
        stack.append((lo, k, left_ts, [x for x in sp if x[1] < k]))
    leaves.sort(key=lambda lf: lf.start)
    return leaves


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
