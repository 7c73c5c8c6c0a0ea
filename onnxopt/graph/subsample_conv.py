"""Crops, zero pads and 1x1 pools in front of a 1x1 convolution become the convolution's own stride and pads.

NASNet's factorized reduction halves a tensor twice, once shifted by a pixel, as exported:

    Relu -> AveragePool 1x1/2 -> Conv 1x1                       (path 1)
    Relu -> Pad (bottom, right) -> Slice [1:, 1:] -> AveragePool 1x1/2 -> Conv 1x1   (path 2)

A 1x1 pool with no padding only picks every s-th pixel, and a 1x1 convolution mixes channels pixel by pixel, so
the chain reads pixels of the source at a fixed stride and offset, or reads zeros. Path 1 is the convolution with
stride 2. Path 2 is the convolution with stride 2 and one pixel of padding in front, whose first output row and
column a Slice crops (a convolution that narrows the channels, as here: the crop is a fraction of what the Pad and
the Slice each wrote); a convolution that widens them reads a Slice with step 2 from pixel 1 instead. In our
NASNet-A the three factorized reductions' Pads and Slices took 0.77 ms of a 13 ms profile of the fused model.

Per spatial axis, a tensor of the chain is described as T[i] = x[a*i + b] for vlo <= i < vhi and 0 elsewhere in
[0, L). Each op maps that form to a new one exactly; the convolution's pads and stride are two more such steps. At
the end an axis becomes the convolution's stride a and pads when its zeros are exactly where that convolution reads
padding (with leading outputs cropped after it when b > 0); otherwise a Slice cuts its pixels from x. The rewrite
is exact: each output is the same sum of the same products (a 1x1 average is the value itself, zeros read from
padding are zeros, an output that reads only padding is the bias), though onnxruntime may pick another convolution
algorithm for the new stride and sum in another order.

What is matched: each op of the chain reads the previous one's output, which nothing else reads and which is not a
graph output; Pad in constant mode with value 0 and pads only on spatial axes; Slice with positive steps on spatial
axes only; AveragePool or MaxPool with all-ones kernel, no pads, floor mode, one output; Conv with all-ones kernel
and explicit pads (or VALID). The source needs static spatial sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import names_used_by_subgraphs, replace_nodes
from .large import add_messages

CHAIN_OPS = ("Pad", "Slice", "AveragePool", "MaxPool")


@dataclass
class _Axis:
    """T[i] = x[a*i + b] for vlo <= i < vhi, 0 elsewhere in [0, length)."""

    a: int
    b: int
    vlo: int
    vhi: int
    length: int

    def pad(self, begin: int, end: int) -> _Axis:
        n = self.length + begin + end
        return _Axis(self.a, self.b - self.a * begin, max(0, self.vlo + begin), min(n, self.vhi + begin), n)

    def take(self, start: int, n: int, step: int) -> _Axis:
        """T'[i] = T[start + step*i] for i < n (start within [0, length])."""
        lo = max(0, -((start - self.vlo) // step))  # ceil((vlo - start) / step)
        hi = min(n, -((start - self.vhi) // step))
        return _Axis(self.a * step, self.b + self.a * start, lo, max(lo, hi), n)


def _const(name: str, inits: dict) -> np.ndarray | None:
    t = inits.get(name)
    return None if t is None else numpy_helper.to_array(t)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _spatial_axes(axes, rank: int) -> list[int] | None:
    out = [int(a) + rank if a < 0 else int(a) for a in axes]
    return out if all(2 <= a < rank for a in out) else None


def _pad_of(node: onnx.NodeProto, rank: int, inits: dict, opset: int) -> list[tuple[int, int]] | None:
    """(begin, end) per spatial axis of a zero constant Pad, or None."""
    mode = _attr(node, "mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return None
    if opset < 11:
        pads, value, axes = _attr(node, "pads"), _attr(node, "value", 0.0), None
    else:
        pads = _const(node.input[1], inits) if len(node.input) > 1 and node.input[1] else None
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            v = _const(node.input[2], inits)
            if v is None or v.size != 1:
                return None
            value = float(v.reshape(-1)[0])
        axes = _const(node.input[3], inits) if len(node.input) > 3 and node.input[3] else None
        if len(node.input) > 3 and node.input[3] and axes is None:
            return None
    if pads is None or value != 0.0:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = list(range(rank)) if axes is None else [int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)]
    if len(pads) != 2 * len(axes):
        return None
    out = [(0, 0)] * rank
    for k, ax in enumerate(axes):
        out[ax] = (pads[k], pads[k + len(axes)])
    if out[0] != (0, 0) or out[1] != (0, 0):
        return None
    return out[2:]


def _slice_of(node: onnx.NodeProto, shape: list[int], inits: dict, opset: int) -> list[tuple[int, int, int]] | None:
    """(start, count, step) per spatial axis of a Slice with positive steps on spatial axes, or None."""
    rank = len(shape)
    if opset < 10:
        starts, ends, axes, steps = _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes"), None
    else:
        got = [_const(x, inits) if x else None for x in list(node.input[1:]) + [""] * (5 - len(node.input))]
        if any(g is None for g, x in zip(got, list(node.input[1:])) if x):
            return None
        starts, ends, axes, steps = got
    if starts is None or ends is None:
        return None
    starts, ends = [int(s) for s in np.asarray(starts).reshape(-1)], [int(e) for e in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.asarray(steps).reshape(-1)]
    axes = _spatial_axes(axes, rank)
    if axes is None or not (len(starts) == len(ends) == len(axes) == len(steps)) or min(steps, default=1) < 1:
        return None
    out = [(0, n, 1) for n in shape[2:]]
    for s, e, ax, st in zip(starts, ends, axes, steps):
        n = shape[ax]
        s = min(max(s + n if s < 0 else s, 0), n)
        e = min(max(e + n if e < 0 else e, 0), n)
        out[ax - 2] = (s, max(0, -((s - e) // st)), st)
    return out


def _pool_strides(node: onnx.NodeProto, rank: int) -> list[int] | None:
    """The strides of a 1x1 pool that only subsamples (no pads, floor mode, one output), or None."""
    kernel = _attr(node, "kernel_shape")
    if kernel is None or len(kernel) != rank - 2 or any(k != 1 for k in kernel) or len(node.output) != 1:
        return None
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID") or any(_attr(node, "pads", [0]) or [0]) or _attr(node, "ceil_mode", 0):
        return None
    return list(_attr(node, "strides", [1] * (rank - 2)))


def _conv_geometry(node: onnx.NodeProto, rank: int, inits: dict) -> tuple[list[int], list[int]] | None:
    """(strides, pads) of a convolution with an all-ones kernel and explicit pads, or None."""
    w = inits.get(node.input[1]) if len(node.input) > 1 else None
    kernel = _attr(node, "kernel_shape") or (list(w.dims[2:]) if w is not None else None)
    if kernel is None or len(kernel) != rank - 2 or any(k != 1 for k in kernel):
        return None
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return None
    pads = list(_attr(node, "pads", [0] * (2 * (rank - 2))))
    return list(_attr(node, "strides", [1] * (rank - 2))), pads


def _shifted(ax: _Axis, n: int) -> tuple[int, int, int] | None:
    """(begin pad, end pad, shift) of a convolution with stride a over the source (length n) whose outputs
    shift, shift + 1, ... are the axis's pixels; None when the axis's zeros are not all where that convolution reads
    padding (an inner crop cut the source)."""
    p = -ax.b if ax.b <= 0 else (-ax.b) % ax.a  # output 0 reads x[b] when b <= 0; else output `shift` does
    shift = (ax.b + p) // ax.a
    total = ax.length + shift
    pe = max(0, (total - 1) * ax.a + 1 - n - p)
    if (n + p + pe - 1) // ax.a + 1 != total:
        return None
    # outputs j read x[a*j - p]: inside the source for ceil(p / a) <= j < ceil((n + p) / a)
    lo, hi = -(-p // ax.a) - shift, -(-(n + p) // ax.a) - shift
    if (max(0, lo), min(ax.length, hi)) != (ax.vlo, ax.vhi):
        return None
    return p, pe, shift


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _slice(graph: onnx.GraphProto, src: str, dst: str, cuts, name: str, taken: set[str]) -> onnx.NodeProto:
    """A Slice node src -> dst over (axis, start, end, step) cuts, its bounds as new initializers."""
    names = [_fresh(f"{dst}_{w}", taken) for w in ("starts", "ends", "axes", "steps")]
    axes, starts, ends, steps = zip(*cuts)
    for w, values in zip(names, (starts, ends, axes, steps)):
        graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), w))
    return helper.make_node("Slice", [src] + names, [dst], name=name)


def fold_subsampling_into_convs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> int:
    """Rewrite every matched chain in place (see the module docstring); returns the number of ops removed.
    `shapes` maps tensor names to static shapes (from shape inference)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for n in graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {o: n for n in graph.node for o in n.output if o}
    removed_nodes: set[int] = set()
    before: dict[int, onnx.NodeProto] = {}  # node id of a Conv -> the Slice to put before it (a cut of its input)
    after: dict[int, onnx.NodeProto] = {}  # and after it (a crop of its output)
    taken = set(inits) | {x for n in graph.node for x in list(n.input) + list(n.output)} | \
        {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    removed = 0
    for conv in graph.node:
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            continue
        chain, t = [], conv.input[0]
        while (p := producer.get(t)) is not None and p.op_type in CHAIN_OPS and p.domain in ("", "ai.onnx") \
                and readers.get(t) == 1 and t not in outputs and id(p) not in removed_nodes:
            chain.append(p)
            t = p.input[0]
        if not chain:
            continue
        shape = shapes.get(t)
        if shape is None or len(shape) < 3 or any(not isinstance(d, int) or d <= 0 for d in shape):
            continue
        rank = len(shape)
        geometry = _conv_geometry(conv, rank, inits)
        if geometry is None:
            continue
        axes = [_Axis(1, 0, 0, n, n) for n in shape[2:]]
        ok = True
        for op in reversed(chain):
            cur = [ax.length for ax in axes]
            if op.op_type == "Pad":
                pads = _pad_of(op, rank, inits, opset)
                ok = pads is not None and all(ax.length + b + e >= 1 for ax, (b, e) in zip(axes, pads))
                if ok:
                    axes = [ax.pad(b, e) for ax, (b, e) in zip(axes, pads)]
            elif op.op_type == "Slice":
                cuts = _slice_of(op, list(shape[:2]) + cur, inits, opset)
                ok = cuts is not None and all(n >= 1 for _, n, _ in cuts)
                if ok:
                    axes = [ax.take(s, n, st) for ax, (s, n, st) in zip(axes, cuts)]
            else:
                strides = _pool_strides(op, rank)
                ok = strides is not None
                if ok:
                    axes = [ax.take(0, (ax.length - 1) // s + 1, s) for ax, s in zip(axes, strides)]
            if not ok:
                break
        if not ok:
            continue
        strides, pads = geometry
        d = rank - 2
        axes = [ax.pad(pads[k], pads[k + d]) for k, ax in enumerate(axes)]
        axes = [ax.take(0, (ax.length - 1) // s + 1, s) for ax, s in zip(axes, strides)]
        if any(ax.vlo >= ax.vhi for ax in axes):
            continue  # an output of bias only: leave such a graph as it is
        w = inits.get(conv.input[1])
        narrows = w is not None and w.dims[0] < shape[1]  # fewer output channels than input ones
        plan = [_shifted(ax, n) for ax, n in zip(axes, shape[2:])]
        if not narrows:  # a crop of the output would cost more than a cut of the input
            plan = [f if f is not None and f[2] == 0 else None for f in plan]
        new_strides, begins, ends, cuts, crops = [], [], [], [], []
        for k, (ax, form) in enumerate(zip(axes, plan)):
            if form is not None:  # the convolution's stride and pads; `shift` leading outputs cropped after it
                p, pe, shift = form
                new_strides.append(ax.a)
                begins.append(p)
                ends.append(pe)
                if shift:
                    crops.append((2 + k, shift, shift + ax.length))
            else:  # a Slice reads the pixels; the convolution adds the zeros around them
                cuts.append((2 + k, ax.a * ax.vlo + ax.b, ax.a * (ax.vhi - 1) + ax.b + 1, ax.a))
                new_strides.append(1)
                begins.append(ax.vlo)
                ends.append(ax.length - ax.vhi)
        new_nodes = (1 if cuts else 0) + (1 if crops else 0)
        if len(chain) <= new_nodes or ((cuts or crops) and opset < 10):
            continue  # nothing would be removed, or a Slice with inputs (and steps) needs opset 10
        if cuts:
            base = _fresh(f"{conv.output[0]}__subsample", taken)
            before[id(conv)] = _slice(graph, t, base, cuts, f"{conv.name}/subsample", taken)
            conv.input[0] = base
        else:
            conv.input[0] = t
        if crops:
            whole = _fresh(f"{conv.output[0]}__uncropped", taken)
            after[id(conv)] = _slice(graph, whole, conv.output[0], [(ax, b, e, 1) for ax, b, e in crops],
                                     f"{conv.name}/crop", taken)
            conv.output[0] = whole
        keep = [a for a in conv.attribute if a.name not in ("strides", "pads", "auto_pad")]
        del conv.attribute[:]
        conv.attribute.extend(keep)
        conv.attribute.extend([helper.make_attribute("strides", new_strides),
                               helper.make_attribute("pads", begins + ends)])
        removed_nodes.update(id(op) for op in chain)
        removed += len(chain) - new_nodes
    if not removed_nodes:
        return 0
    nodes = []
    for n in graph.node:
        if id(n) in removed_nodes:
            continue
        if id(n) in before:
            nodes.append(before[id(n)])
        nodes.append(n)
        if id(n) in after:
            nodes.append(after[id(n)])
    chain_nodes = [n for n in graph.node if id(n) in removed_nodes]
    replace_nodes(graph, nodes, {o for n in chain_nodes for o in n.output})
    # The chain's constants (pads, slice bounds) that nothing reads now
    used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output} | names_used_by_subgraphs(graph)
    dropped = {x for n in chain_nodes for x in n.input[1:]} - used
    left = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    add_messages(graph.initializer, left)
    return removed
