"""When may region ops be fused by AFUSION? (OptiFX §2; the paper only implies the rules.)

A region is one or two *producer* convs and up to two *consumer* ROPs, with the elementwise ops (EOPs) between
them folded into the producers' epilogues. `check_afusion` returns None for a legal region and otherwise one
sentence a user can act on. The rules, in the order they are checked:

1. At most `max_rops` (3) ROPs, at least two. Producers are convs (dense, grouped or depthwise); consumers are
   convs or MaxPool/AveragePool. A pool only ends a region (conv -> pool): its output must not feed another ROP
   of the region. Global pools reduce the whole image and are not fused.
2. Known geometry on static shapes: 2-D ops, constant weights, kernel/stride/pad/dilation from the attributes,
   auto_pad resolved from the static shapes, ceil_mode only where it does not change the output size.
3. A direct edge: each consumer's data input comes from the region through EOPs only (Relu, Clip, BN, an Add of
   a bias or a residual...); those EOPs join the region. Two producers (MISO) must meet at an elementwise op
   (the Add of NASNet's two 1x1 convs).
4. Acyclic after contraction: no path leaves the region and comes back into it (e.g. A -> X -> Add -> B next
   to A -> Add -> B). Writing an intermediate would not fix that, so it is checked before rule 5.
5. Every intermediate (a tensor written and read inside the region) is neither a graph output nor read by a node
   outside the region: otherwise it would still have to be written, and the fusion would save nothing.
6. float32 tensors only (the kernels are written for fp32), static shapes on every tensor of the region.
7. The region's outputs share one H x W grid (the kernel walks bands of output rows), and the intermediate rows
   that one band needs fit `scratch_limit` bytes.

After rule 4 the EOP chains after the region's outputs join it too (what the fused kernel runs in its epilogue),
each cut before an EOP that would make a cycle.

`FusionGraph` is the view of a model these checks (and the candidate generator) work on: the annotated main-graph
nodes with their costs, producers and consumers, op kinds (ROP / EOP / compute / other) and, lazily, reachability
bitsets for the cycle checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from .fusion_graph import (AFUSION_CONSUMERS, AFUSION_PRODUCERS, COMPUTE_TYPES, EOP_TYPES, ITEMSIZE,  # noqa: F401
                           ROP_TYPES, FusionGraph)
from .tiles import ConvGeometry, RegionRows, RowOp, region_rows


# ----------------------------------------------------------------------------------------------------------------
# Geometry of one ROP


def _same_pads(in_sp: Sequence[int], eff: Sequence[int], strides: Sequence[int], upper: bool) -> list[int]:
    begins, ends = [], []
    for x, k, s in zip(in_sp, eff, strides):
        out = -(-x // s)
        total = max(0, (out - 1) * s + k - x)
        small, big = total // 2, total - total // 2
        begins.append(small if upper else big)
        ends.append(big if upper else small)
    return begins + ends


def rop_geometry(graph: FusionGraph, i: int) -> ConvGeometry | str:
    """The geometry of a 2-D Conv/MaxPool/AveragePool on static shapes, or why it cannot be had."""
    node, a = graph.nodes[i], graph.attrs[i]
    label = graph.label(i)
    if not node.input or not node.output:
        return f"{label} has no input or output"
    x, y = node.input[0], node.output[0]
    xs, ys = graph.static_shape(x), graph.static_shape(y)
    if xs is None or ys is None:
        bad = x if xs is None else y
        return f"{label}: the shape of '{bad}' is not static ({graph.shape(bad)}); AFusion needs static shapes"
    if len(xs) != 4 or len(ys) != 4:
        return f"{label} is not a 2-D op (input rank {len(xs)}); AFusion handles NCHW 2-D ops only"
    op = node.op_type
    if op == "Conv":
        if len(node.input) < 2 or not graph.is_constant(node.input[1]):
            return f"{label}: the weights are not a constant initializer"
        if len(node.input) > 2 and node.input[2] and not graph.is_constant(node.input[2]):
            return f"{label}: the bias is not a constant initializer"
        ws = graph.static_shape(node.input[1])
        if ws is None or len(ws) != 4:
            return f"{label}: the weight shape is unknown"
        kernel = list(a.get("kernel_shape") or ws[2:])
        groups = int(a.get("group", 1) or 1)
        channels = (xs[1], ws[0])
    elif op in ("MaxPool", "AveragePool"):
        if op == "MaxPool" and len(graph.outputs(i)) > 1:
            return f"{label} also returns indices; only the plain pool is fused"
        kernel = list(a.get("kernel_shape") or [])
        if len(kernel) != 2:
            return f"{label} has no 2-D kernel_shape"
        groups = xs[1]
        channels = (xs[1], xs[1])
    else:
        return f"{label} is not a conv or a windowed pool"
    strides = list(a.get("strides") or [1, 1])
    dil = list(a.get("dilations") or [1, 1])
    auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if auto_pad == "NOTSET":
        pads = list(a.get("pads") or [0, 0, 0, 0])
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(xs[2:], eff, strides, auto_pad == "SAME_UPPER")
    else:
        return f"{label}: auto_pad={auto_pad!r} is not understood"
    if len(pads) != 4:
        return f"{label}: pads {pads} are not 2-D"
    g = ConvGeometry(kernel=tuple(kernel), stride=tuple(strides), pads=tuple(pads), dilation=tuple(dil),
                     groups=groups, in_channels=channels[0], out_channels=channels[1], op_type=op)
    expected = g.output_size(xs[2], xs[3])
    if op != "Conv" and a.get("ceil_mode", 0) and tuple(ys[2:]) != expected:
        return f"{label}: ceil_mode=1 changes the output size ({ys[2]}x{ys[3]} instead of " \
               f"{expected[0]}x{expected[1]}); only floor-mode windows are fused"
    if tuple(ys[2:]) != expected:
        return f"{label}: output {ys[2]}x{ys[3]} does not match its geometry ({expected[0]}x{expected[1]})"
    return g


# ----------------------------------------------------------------------------------------------------------------
# Regions


@dataclass
class AfusionRegion:
    """A legal AFusion region of `graph`. Node ids are graph positions; `members` in topological order."""

    graph: FusionGraph = field(repr=False)
    pattern: str  # "SISO" (a chain of 2-3 ROPs), "SIMO" (one intermediate, several ROP readers), "MISO"
    producers: tuple[int, ...]
    rops: tuple[int, ...]
    members: tuple[int, ...]
    intermediates: tuple[str, ...]  # ONNX tensors kept out of memory
    row_ops: tuple[RowOp, ...]  # the ROPs as row maps between row classes (a tensor and its EOP results)
    row_class: dict[int, str]  # member id -> the row class of its output
    heights: dict[str, int]
    plane_bytes: dict[str, int]  # row class -> bytes of one full-width row over all channels
    geometry: dict[int, ConvGeometry]

    def rows(self, band_height: int) -> RegionRows:
        return region_rows(self.row_ops, self.heights, band_height)

    def scratch_bytes(self, band_height: int) -> int:
        """Bytes of intermediate rows that one band of `band_height` output rows holds at once."""
        rr = self.rows(band_height)
        return sum(rr.band_rows[t] * self.plane_bytes[t] for t in rr.intermediates)

    @property
    def names(self) -> list[str]:
        return [self.graph.names[i] for i in self.members]


def _as_list(x) -> list:
    if x is None:
        return []
    if isinstance(x, (str, int, onnx.NodeProto)):
        return [x]
    return list(x)


def afusion_region(graph, producer_node, consumer_nodes, *, scratch_limit: int | None = None,
                   band_height: int = 1, max_rops: int = 3, with_epilogues: bool = True) -> AfusionRegion | str:
    """The region that fuses `producer_node` (one conv, or two whose outputs meet at an elementwise op: MISO)
    with `consumer_nodes` (ROPs reading it, or each other, through EOPs), or the reason it is not legal.

    Nodes are names, ids or NodeProtos. `with_epilogues` also folds the EOP chains after the region's outputs into
    it (what a fused kernel would run in its epilogue). The scratch check uses bands of `band_height` output rows.
    """
    g = FusionGraph.of(graph)
    try:
        prods = sorted(g.resolve(p) for p in _as_list(producer_node))
        cons = sorted(g.resolve(c) for c in _as_list(consumer_nodes))
    except KeyError as e:
        return str(e.args[0])
    rops = prods + cons
    names = ", ".join(g.names[i] for i in rops)
    if len(set(rops)) != len(rops):
        return f"a node is listed twice among {names}"
    # Rule 1: sizes and kinds.
    if len(rops) > max_rops:
        return f"{len(rops)} ROPs ({names}); AFusion fuses at most {max_rops}"
    if not prods or len(prods) > 2:
        return f"{len(prods)} producers; AFusion takes one (SISO/SIMO) or two (MISO)"
    if len(rops) < 2:
        return f"only one ROP ({names}); AFusion fuses two or three (use vertical fusion for one)"
    for p in prods:
        if g.op(p) in ("MaxPool", "AveragePool"):
            return f"{g.label(p)} cannot produce an intermediate: pools are fused only as the last op (conv -> pool)"
        if g.op(p) not in AFUSION_PRODUCERS:
            return f"{g.label(p)} is not a conv; AFusion producers are convs"
    for c in cons:
        if g.op(c) in ("GlobalAveragePool", "GlobalMaxPool"):
            return f"{g.label(c)} reduces the whole image; a band kernel cannot fuse it"
        if g.op(c) not in AFUSION_CONSUMERS:
            return f"{g.label(c)} is not a ROP (conv or windowed pool)"
    # Rule 2: geometry on static shapes.
    geometry: dict[int, ConvGeometry] = {}
    for r in rops:
        geo = rop_geometry(g, r)
        if isinstance(geo, str):
            return geo
        geometry[r] = geo

    # Rule 3: the direct edges, collecting the EOPs on them.
    members: set[int] = set(rops)
    region_tensors: set[str] = set()
    for p in prods:
        if any(t in {o for q in prods if q != p for o in g.outputs(q)} for t in g.data_inputs(p)):
            return f"{g.label(p)} reads another producer's output; list it as a consumer"
        region_tensors.update(g.outputs(p))
    if len(prods) == 2:
        a, b = prods
        common = g.eop_forward(a) & g.eop_forward(b)
        if not common:
            return (f"no direct edge: the outputs of {g.names[a]} and {g.names[b]} never meet at an elementwise op "
                    f"(MISO needs them added)")
        merge = min(common)
        target = g.outputs(merge)[0]
        for p in prods:
            path = g.eop_paths(set(g.outputs(p)), target)
            members |= path or set()
        region_tensors.update(t for m in members for t in g.outputs(m))
    for c in cons:
        x = g.nodes[c].input[0]
        path = g.eop_paths(region_tensors, x)
        if path is None:
            src = g.producer.get(x)
            where = "a graph input" if src is None else g.label(src)
            return (f"no direct edge into {g.label(c)}: it reads '{x}' from {where}, not from the region "
                    f"through elementwise ops")
        members |= path
        region_tensors.update(t for m in path | {c} for t in g.outputs(m))

    def consumed_inside(i: int) -> bool:
        return any(k in members for t in g.outputs(i) for k in g.consumers.get(t, ()))

    for c in cons:
        if g.op(c) in ("MaxPool", "AveragePool") and consumed_inside(c):
            return f"{g.label(c)} feeds another ROP of the region; pools are fused only as the last op"

    # Rule 4: acyclic after contraction.
    outside_path = g.cycle_through(members)
    if outside_path:
        shown = ", ".join(g.label(i) for i in outside_path[:3]) + (" ..." if len(outside_path) > 3 else "")
        return (f"indirect path: the region reaches {shown} outside itself, which leads back into it; "
                f"contracting it would create a cycle")
    # Fold the epilogues of the region's outputs, as far as they keep it acyclic.
    if with_epilogues:
        members = g.with_epilogues(members, [m for m in members if not consumed_inside(m)])
    order = tuple(sorted(members))
    # Rule 5: intermediates stay inside.
    produced = {t: m for m in order for t in g.outputs(m)}
    intermediates = [t for t in produced if any(k in members for k in g.consumers.get(t, ()))]
    for t in intermediates:
        if t in g.graph_outputs:
            return f"intermediate '{t}' is a graph output; would need to be written"
        if t in g.used_by_subgraphs:
            return f"intermediate '{t}' is read inside a subgraph body; would need to be written"
        outside = [k for k in g.consumers.get(t, ()) if k not in members]
        if outside:
            readers = ", ".join(g.label(k) for k in outside[:3]) + (" ..." if len(outside) > 3 else "")
            return f"intermediate '{t}' also read by {readers}; would need to be written"
    # Rule 6: float32 and static shapes on every data tensor the region touches.
    for m in order:
        for t in g.data_inputs(m) + g.outputs(m):
            if g.dtype(t) != "float32":
                return f"{g.label(m)} uses {g.dtype(t) or 'an unknown dtype'} tensor '{t}'; AFusion kernels are " \
                       f"float32 only"
            if g.static_shape(t) is None:
                return f"{g.label(m)}: the shape of '{t}' is not static ({g.shape(t)}); AFusion needs static shapes"

    # Row classes: an EOP keeps the rows of its region-produced inputs.
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            parent[t] = parent.get(parent[t], parent[t])
            t = parent[t]
        return t

    for m in order:
        if m in geometry:
            continue
        out = g.outputs(m)[0]
        for t in g.data_inputs(m):
            if t in produced and g.static_shape(t) == g.static_shape(out):
                parent[find(t)] = find(out)
    row_ops = tuple(RowOp(geometry[r], find(g.nodes[r].input[0]), find(g.nodes[r].output[0])) for r in rops)
    row_class = {m: find(g.outputs(m)[0]) for m in order}
    heights: dict[str, int] = {}
    plane: dict[str, int] = {}
    for op_, r in zip(row_ops, rops):
        for cls_, t in ((op_.input, g.nodes[r].input[0]), (op_.output, g.nodes[r].output[0])):
            _, ch, h, w = g.static_shape(t)  # type: ignore[misc]
            heights[cls_] = h
            plane[cls_] = ch * w * ITEMSIZE
    # Rule 7: one output grid, and the band's intermediate rows fit the scratch buffer.
    consumed_cls = {op_.input for op_ in row_ops}
    sinks = [(op_.output, r) for op_, r in zip(row_ops, rops) if op_.output not in consumed_cls]
    grids = {tuple(g.static_shape(g.nodes[r].output[0])[2:]) for _, r in sinks}  # type: ignore[index]
    if len(grids) > 1:
        return (f"the region's outputs differ in size ({', '.join('x'.join(map(str, s)) for s in sorted(grids))}); "
                f"the band kernel needs one output grid")
    # SIMO: an intermediate read by two ROPs (a region input read twice does not count).
    produced_cls = {op_.output for op_ in row_ops}
    readers: dict[str, int] = {}
    for op_ in row_ops:
        if op_.input in produced_cls:
            readers[op_.input] = readers.get(op_.input, 0) + 1
    pattern = "MISO" if len(prods) == 2 else "SIMO" if any(v > 1 for v in readers.values()) else "SISO"
    region = AfusionRegion(graph=g, pattern=pattern, producers=tuple(prods), rops=tuple(rops), members=order,
                           intermediates=tuple(intermediates), row_ops=row_ops, row_class=row_class,
                           heights=heights, plane_bytes=plane, geometry=geometry)
    if scratch_limit is not None:
        need = region.scratch_bytes(band_height)
        if need > scratch_limit:
            return (f"the intermediate tiles of a {band_height}-row band take {need} bytes; the scratch limit is "
                    f"{scratch_limit} bytes")
    return region


def check_afusion(model_or_index, producer_node, consumer_nodes, *, scratch_limit: int | None = None,
                  band_height: int = 1, max_rops: int = 3) -> str | None:
    """None when AFusion may fuse `producer_node` with `consumer_nodes`, else the reason (see the module doc).

    `model_or_index`: a ModelProto, a path, an AnnotatedGraph or a FusionGraph (build one FusionGraph and pass it
    when checking many regions of one model). `producer_node`: a conv, or a pair of convs for MISO.
    """
    r = afusion_region(model_or_index, producer_node, consumer_nodes, scratch_limit=scratch_limit,
                       band_height=band_height, max_rops=max_rops)
    return r if isinstance(r, str) else None


def check_horizontal(model_or_index, nodes) -> str | None:
    """None when sibling convs may run as one kernel (horizontal fusion): they read the same data input, have the
    same output size, static float32 shapes, and stay acyclic after contraction with their epilogues."""
    g = FusionGraph.of(model_or_index)
    try:
        ids = sorted(g.resolve(n) for n in _as_list(nodes))
    except KeyError as e:
        return str(e.args[0])
    if len(ids) < 2 or len(set(ids)) != len(ids):
        return "horizontal fusion needs two or more distinct convs"
    for i in ids:
        if g.op(i) != "Conv":
            return f"{g.label(i)} is not a conv"
        geo = rop_geometry(g, i)
        if isinstance(geo, str):
            return geo
    inputs = {g.nodes[i].input[0] for i in ids}
    if len(inputs) != 1:
        return f"the convs read different inputs ({', '.join(sorted(inputs))}); siblings share one"
    sizes = {tuple(g.static_shape(g.nodes[i].output[0])[2:]) for i in ids}  # type: ignore[index]
    if len(sizes) != 1:
        return f"the siblings' outputs differ in size ({sorted(sizes)})"
    outside = g.cycle_through(ids)
    if outside:
        return (f"indirect path through {g.label(outside[0])}: one sibling's result leads into another; "
                f"contracting them would create a cycle")
    members = g.with_epilogues(ids, ids)
    for m in members:
        for t in g.data_inputs(m) + g.outputs(m):
            if g.dtype(t) != "float32":
                return f"{g.label(m)} uses {g.dtype(t) or 'an unknown dtype'} tensor '{t}'; kernels are float32 only"
    return None


__all__ = [
    "AFUSION_CONSUMERS",
    "AFUSION_PRODUCERS",
    "COMPUTE_TYPES",
    "EOP_TYPES",
    "ROP_TYPES",
    "AfusionRegion",
    "FusionGraph",
    "afusion_region",
    "check_afusion",
    "check_horizontal",
    "rop_geometry",
]
