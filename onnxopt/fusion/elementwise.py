"""Fusion rule: connected groups of elementwise and broadcast ops become one memory-bound region.

Exported models are full of such chains: hardswish as `x * Clip(x + 3, 0, 6) / 6`, SiLU as `x * Sigmoid(x)`, GELU
through `Erf`, the arithmetic of a decomposed LayerNorm. One fused kernel reads each input once and writes each
output once, instead of a round trip through memory per op.

Legality:
- every node is an op of `elementwise_ops.SUPPORTED` on a supported dtype, with known dtypes and a known shape;
- every node of a region has the same output shape (dims equal, symbolic dims by name): that shape is the region's
  iteration space, and inputs broadcast to it by numpy's rules;
- contracting the region keeps the graph acyclic (no path leaves the region and comes back);
- an intermediate that is a graph output, or is used outside the region (also by an If/Loop/Scan body), is written;
- scalar constants (initializers that are not graph inputs, one element) are folded into the code;
- an inference BatchNormalization with constant parameters joins as `x * scale + shift` (fusion/batchnorm.py): the
  region reads the new [C, 1, 1] scale and shift initializers it carries.
A region needs at least two ops: a single op is already one pass over memory in onnxruntime.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import numpy_helper

from onnxopt.annotate.shapes import tensor_info

from . import batchnorm
from .elementwise_ops import QUANTIZERS, SUPPORTED
from .graph_index import GraphIndex
from .params import ElementwiseParams
from .region import EwOp, EwProgram, Region, Value

MAX_INPUTS = 16  # the glue's mask is 32 bits; this also bounds the variants compiled per region
# Ops in one region: a kernel is compiled in one LLVM module, whose optimization time grows faster than its size (a
# 3,000-op chain took 70 s as one kernel); longer chains become several kernels, compiled in parallel.
MAX_OPS = 64
MIN_OPS = 2


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


class ElementwiseRule:
    kind = "Elementwise"

    def __init__(self, model: onnx.ModelProto, min_ops: int = MIN_OPS):
        self.min_ops = min_ops  # tests lower single ops with min_ops=1
        self.model = model
        self.graph = model.graph
        self.opset = _opset(model)
        self.info = tensor_info(model)
        # An initializer listed as a graph input can be overridden by a feed, so it is not a constant; except in
        # IR version 3, which required every initializer to be listed as an input.
        overridable = {i.name for i in self.graph.input} if model.ir_version >= 4 else set()
        self.inits = {t.name: t for t in self.graph.initializer if t.name not in overridable}
        self.index = GraphIndex(self.graph)
        self.derived: dict[str, onnx.TensorProto] = {}  # BatchNormalization scale/shift by name (batchnorm.py)
        self._scalars: dict[str, tuple | None] = {}  # scalar_const's answers by name

    # ---- per-node admission ----
    def scalar_const(self, name: str):
        """The value of a one-element constant tensor, or None (remembered: grouping asks for every input)."""
        if name not in self._scalars:
            self._scalars[name] = self._scalar_const(name)
        return self._scalars[name]

    def _scalar_const(self, name: str):
        t = self.inits.get(name)
        if t is None:
            return None
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        if n != 1:
            return None
        arr = numpy_helper.to_array(t)
        if arr.dtype.name not in SUPPORTED["Identity"]:
            return None
        return arr.reshape(()).item(), arr.dtype.name

    def shape_of(self, name):
        if name in self.derived:
            return tuple(self.derived[name].dims)
        ti = self.info.get(name)
        if ti is None or ti.shape is None or ti.dtype is None:
            return None
        if any(d is None or (isinstance(d, str) and d.startswith("unk__")) for d in ti.shape):
            return None
        return tuple(ti.shape)

    def dtype_of(self, name):
        if name in self.derived:
            return onnx.helper.tensor_dtype_to_np_dtype(self.derived[name].data_type).name
        ti = self.info.get(name)
        return None if ti is None else ti.dtype

    def admits(self, node: onnx.NodeProto) -> str | None:
        """None if the node can join a region, else the reason it cannot."""
        if node.domain not in ("", "ai.onnx"):
            return "custom domain"
        if node.op_type == "BatchNormalization":
            why = batchnorm.admit(node, self.inits, self.shape_of, self.dtype_of)
            if why is None and self.shape_of(node.output[0]) is None:
                why = "output shape unknown"
            if why is None:
                for t in batchnorm.affine(node, self.inits, len(self.shape_of(node.input[0])),
                                          self.dtype_of(node.input[0])):
                    self.derived[t.name] = t
            return why
        if node.op_type not in SUPPORTED:
            return "not elementwise"
        if len(node.output) != 1:
            return "more than one output"
        data_in = next((x for x in node.input if x), None)
        if data_in is None:
            return "no input"
        first_dtype = self.dtype_of(node.input[1] if node.op_type == "Where" else data_in)
        if first_dtype not in SUPPORTED[node.op_type]:
            return f"dtype {first_dtype} not supported for {node.op_type}"
        for x in list(node.input) + list(node.output):
            if x and self.dtype_of(x) is None:
                return f"dtype of {x} unknown"
        if self.shape_of(node.output[0]) is None:
            return "output shape unknown"
        if node.op_type == "Pow":
            c = self.scalar_const(node.input[1])
            if c is None:
                return "Pow exponent is not a constant scalar"
        if node.op_type == "Cast" and self.dtype_of(node.output[0]) not in SUPPORTED["Identity"]:
            return "Cast to an unsupported dtype"
        if node.op_type == "Clip" and self.opset >= 11:
            for x in node.input[1:]:
                if x and self.scalar_const(x) is None and self.shape_of(x) != ():
                    return "Clip bounds are not scalars"
        if node.op_type == "Gelu" and self.opset < 20:
            return "Gelu below opset 20"
        if node.op_type in QUANTIZERS:
            return self._quantizer_refusal(node)
        return None

    def _quantizer_refusal(self, node: onnx.NodeProto) -> str | None:
        """A DequantizeLinear or QuantizeLinear joins as one step of one scale: a scalar float32 scale and an int8
        or uint8 zero point (or none), both constant; per-channel and blocked quantization stay onnxruntime's."""
        ints = ("uint8", "int8")
        if node.op_type == "DequantizeLinear" and self.dtype_of(node.output[0]) != "float32":
            return "DequantizeLinear to a type other than float32"
        if node.op_type == "QuantizeLinear" and self.dtype_of(node.output[0]) not in ints:
            return "QuantizeLinear to a type other than int8 or uint8"
        if len(node.input) < 2 or self.scalar_const(node.input[1]) is None or \
                self.scalar_const(node.input[1])[1] != "float32":
            return "its scale is not one constant float32"
        zp = node.input[2] if len(node.input) > 2 else ""
        if zp and (self.scalar_const(zp) is None or self.scalar_const(zp)[1] not in ints):
            return "its zero point is not one constant int8 or uint8"
        if (_attr(node, "block_size", 0) or 0) != 0:
            return "blocked quantization"
        return None

    # ---- grouping ----
    def find_regions(self, rejected: list[dict] | None = None, exclude: set[int] | None = None) -> list[Region]:
        """`exclude`: node indices already claimed by other regions (compute ops' epilogues)."""
        idx = self.index
        exclude = exclude or set()
        ok = {i for i, n in enumerate(idx.nodes) if i not in exclude and self.admits(n) is None}
        group_of: dict[int, int] = {}
        groups: dict[int, _Group] = {}

        def link(p: int, i: int) -> None:
            a, b = group_of[p], group_of[i]
            if a == b:
                return
            merged = groups[a].merge(groups[b], idx, MAX_INPUTS, MAX_OPS)
            if merged is None:
                return
            keep, drop = (a, b) if merged is groups[a] else (b, a)
            for m in groups[drop].members:
                group_of[m] = keep
            del groups[drop]

        # A QuantizeLinear -> DequantizeLinear edge is linked last: the DequantizeLinear first joins the unit that
        # reads it (a residual Add whose other input comes round through a convolution could not join the unit
        # before it, and would lose its step to that one).
        steps: list[tuple[int, int]] = []
        broadcast: set[int] = set()  # DequantizeLinear nodes run in a larger iteration space than their own
        for i in sorted(ok):
            shape = self.shape_of(idx.nodes[i].output[0])
            groups[i] = _Group.of(i, idx, self)
            group_of[i] = i
            for x in idx.nodes[i].input:
                p = idx.producer.get(x)
                if p is None or p not in ok or group_of[p] == group_of[i]:
                    continue
                if self.shape_of(idx.nodes[p].output[0]) != shape:
                    if not (len(groups[group_of[p]].members) == 1 and self._broadcast_dequantizer(p, i)):
                        continue
                    broadcast.add(p)
                if idx.nodes[i].op_type == "DequantizeLinear" and idx.nodes[p].op_type == "QuantizeLinear":
                    steps.append((p, i))
                    continue
                link(p, i)
        for p, i in steps:
            if i not in broadcast:  # else its region's shape is not the QuantizeLinear's
                link(p, i)
        groups = {k: g.members for k, g in groups.items()}
        regions = []
        for members in groups.values():
            members = self._without_quantizer_edges(members)
            if len(members) < self.min_ops:
                continue
            region = self._make_region(sorted(members))
            if isinstance(region, str):
                if rejected is not None:
                    rejected.append({"nodes": [idx.nodes[m].name for m in sorted(members)], "reason": region})
                continue
            regions.append(region)
        return regions

    def sequence_bridges(self, plan: list[Region]) -> list[Region]:
        """Regions for the elementwise ops left between two of the plan's regions because they are too few for a
        region of their own (MIN_OPS): a squeeze-excite block's Mul of a convolution's output by its channel
        scales, read by the next convolution (PP-OCRv4's). Alone such a kernel is no faster than onnxruntime's
        op, but that op would end the sequence node around them (emit/sequence.py): the regions are marked
        `bridge`, judged in the whole model. Each reads a tensor one of the plan's regions writes, and its outputs
        are read only by them. The plan's own elementwise regions on plain tensors that sit the same way are
        marked too (in place): one rejected alone at 0.97x would end the sequence as well. Needs a rule of
        min_ops=1."""
        taken = {id(n) for r in plan for n in r.nodes} | {id(n) for r in plan for n in (r.relayout or [])}
        written = {o for r in plan for o in r.outputs}
        idx = self.index

        def between(region) -> bool:
            if not written & set(region.inputs):
                return False
            readers = [idx.consumers.get(y, []) for y in region.outputs]
            return not any(y in idx.graph_outputs or not r or not all(id(idx.nodes[c]) in taken for c in r)
                           for y, r in zip(region.outputs, readers))

        for r in plan:
            if isinstance(r.params, ElementwiseParams) and not r.params.blocked_lanes and between(r):
                r.params = replace(r.params, bridge=True)
        lone = {i for i, n in enumerate(idx.nodes) if id(n) not in taken}
        out = []
        for region in self.find_regions(exclude=set(range(len(idx.nodes))) - lone):
            if len(region.nodes) < MIN_OPS and between(region):
                region.params = replace(region.params, bridge=True)
                out.append(region)
        return out

    def _without_quantizer_edges(self, members: set[int]) -> set[int]:
        """The group less the quantization steps at its edges: a DequantizeLinear whose result only leaves it, a
        QuantizeLinear that only reads what comes in. The region then reads and writes the int8 tensors (a quarter
        of the bytes), and a QDQ unit it borders (a residual Add's next unit) keeps its own steps."""
        idx, members = self.index, set(members)
        changed = True
        while changed:
            changed = False
            for m in sorted(members):
                node = idx.nodes[m]
                if node.op_type == "DequantizeLinear":
                    edge = not any(c in members for c in idx.consumers.get(node.output[0], ()))
                elif node.op_type == "QuantizeLinear":
                    edge = idx.producer.get(node.input[0]) not in members
                else:
                    continue
                if edge and len(members) > 1:
                    members.discard(m)
                    changed = True
        return members

    def _broadcast_dequantizer(self, p: int, i: int) -> bool:
        """A DequantizeLinear that only node i reads, broadcast there (a squeeze-excite block's per-channel scale):
        it joins i's region and runs in i's iteration space, so its int8 tensor is read broadcast like any input
        instead of dequantized by a kernel or node of its own."""
        node, idx = self.index.nodes[p], self.index
        return node.op_type == "DequantizeLinear" and not idx.is_used_outside(node.output[0], {i})

    def _reads(self, node: onnx.NodeProto) -> list[str]:
        """What the node's operations read: a BatchNormalization its data and its scale and shift."""
        if node.op_type == "BatchNormalization":
            return [node.input[0], *batchnorm.names(node)]
        return list(node.input)

    def _boundary_inputs(self, members: set[int]) -> list[str]:
        produced = {o for m in members for o in self.index.nodes[m].output}
        seen = []
        for m in sorted(members):
            for x in self._reads(self.index.nodes[m]):
                if x and x not in produced and x not in seen and self.scalar_const(x) is None:
                    seen.append(x)
        return seen

    def _make_region(self, members: list[int]) -> Region | str:
        idx = self.index
        nodes = [idx.nodes[m] for m in members]
        group = set(members)
        inputs = self._boundary_inputs(group)
        if not inputs:
            return "no runtime input (constant-foldable)"
        if any(self.shape_of(x) is None for x in inputs):
            return "an input's shape is unknown"
        outputs = [o for n in nodes for o in n.output if idx.is_used_outside(o, group)]
        if not outputs:
            return "no output is used"
        shape = self.shape_of(nodes[-1].output[0])
        consts: dict[str, tuple] = {}
        ops: list[EwOp] = []
        for n in nodes:
            ops += self._to_ops(n, consts)
        prog = EwProgram(
            inputs=[Value(x, self.dtype_of(x)) for x in inputs],
            consts=consts,
            ops=ops,
            outputs=[Value(o, self.dtype_of(o)) for o in outputs],
        )
        prog.masks = expected_masks([self.shape_of(x) for x in inputs], shape)
        return Region("Elementwise", nodes, inputs, outputs, prog, list(shape),
                      initializers=[self.derived[x] for x in inputs if x in self.derived])

    def _to_ops(self, n: onnx.NodeProto, consts: dict) -> list[EwOp]:
        if n.op_type == "BatchNormalization":
            out, dtype = n.output[0], self.dtype_of(n.output[0])
            scale, shift = batchnorm.names(n)
            return [EwOp("Mul", (n.input[0], scale), f"{out}__bn_mul", dtype),
                    EwOp("Add", (f"{out}__bn_mul", shift), out, dtype)]
        return [self._to_op(n, consts)]

    def _to_op(self, n: onnx.NodeProto, consts: dict) -> EwOp:
        out = n.output[0]
        dtype = self.dtype_of(out)
        args = []
        for x in n.input:
            c = self.scalar_const(x) if x else None
            if c is not None:
                consts[x] = c
            args.append(x)
        attrs = {}
        if n.op_type in QUANTIZERS and (len(args) < 3 or not args[2]):  # no zero point: zero, of the int type
            int_type = self.dtype_of(n.input[0] if n.op_type == "DequantizeLinear" else out)
            consts[f"{out}__zero_point"] = (0, int_type)
            args = [args[0], args[1], f"{out}__zero_point"]
        if n.op_type == "Pow":
            attrs["exponent"] = float(self.scalar_const(n.input[1])[0])
            args = [n.input[0]]
        elif n.op_type == "Clip" and self.opset < 11:
            lo, hi = _attr(n, "min", None), _attr(n, "max", None)
            names = [n.input[0], "", ""]
            for k, v in ((1, lo), (2, hi)):
                if v is not None:
                    cname = f"{out}__clip{k}"
                    consts[cname] = (float(v), dtype)
                    names[k] = cname
            args = names
        else:
            for a in n.attribute:
                if a.type in (onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT, onnx.AttributeProto.STRING):
                    v = onnx.helper.get_attribute_value(a)
                    attrs[a.name] = v.decode() if isinstance(v, bytes) else v
        return EwOp(n.op_type, tuple(args), out, dtype, tuple(sorted(attrs.items())))


class _Group:
    """A growing elementwise group with what its legality checks need kept up to date as groups merge: its
    produced tensors, its non-constant inputs, and its successors outside it. Recomputing them from the members at
    every merge made a 1,000-node chain take 100 s; merging the smaller group into the larger, in place, keeps it
    near-linear."""

    __slots__ = ("members", "produced", "boundary", "outside", "hi")

    def __init__(self, members, produced, boundary, outside, hi):
        self.members, self.produced, self.boundary, self.outside, self.hi = members, produced, boundary, outside, hi

    @classmethod
    def of(cls, i: int, idx, rule) -> _Group:
        node = idx.nodes[i]
        produced = {o for o in node.output if o}
        boundary = list(dict.fromkeys(x for x in rule._reads(node)
                                      if x and x not in produced and rule.scalar_const(x) is None))
        return cls({i}, produced, boundary, idx.successors(i) - {i}, i)

    def merge(self, other: _Group, idx, max_inputs: int, max_ops: int) -> _Group | None:
        """The two groups as one (the larger one, grown in place), or None when that is not a legal region: too
        many ops or inputs, or a path that leaves it and comes back."""
        big, small = (self, other) if len(self.members) >= len(other.members) else (other, self)
        if len(big.members) + len(small.members) > max_ops:
            return None
        members = _Both(big.members, small.members)
        produced = _Both(big.produced, small.produced)
        boundary = [x for x in dict.fromkeys(big.boundary + small.boundary) if x not in produced]
        if len(boundary) > max_inputs:
            return None
        outside = {s for s in big.outside | small.outside if s not in members}
        hi = max(big.hi, small.hi)
        if idx.escapes_and_returns(members, outside, hi):
            return None
        big.members |= small.members
        big.produced |= small.produced
        big.boundary, big.outside, big.hi = boundary, outside, hi
        return big


class _Both:
    """Membership in either of two sets, without building their union."""

    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, x) -> bool:
        return x in self.a or x in self.b


def coalesce(in_shapes: list[tuple], out_shape: tuple) -> tuple[list[int], list[list[int]]]:
    """The glue's dimension coalescing, in Python: returns (dims, per-input strides), innermost last."""
    R = len(out_shape)
    strides = []
    for s in in_shapes:
        lead = R - len(s)
        st, acc = [0] * R, 1
        for j in range(R - 1, -1, -1):
            d = s[j - lead] if j >= lead else 1
            st[j] = 0 if d == 1 else acc
            acc *= d
        strides.append(st)
    keep = [j for j in range(R) if out_shape[j] != 1] or []
    dims = [out_shape[j] for j in keep]
    sts = [[st[j] for j in keep] for st in strides]
    if not dims:
        return [1], [[0] for _ in in_shapes]
    cd, cs = [dims[-1]], [[st[-1]] for st in sts]
    for j in range(len(dims) - 2, -1, -1):
        if all(st[j] == c[-1] * cd[-1] for st, c in zip(sts, cs)):
            cd[-1] *= dims[j]
        else:
            cd.append(dims[j])
            for st, c in zip(sts, cs):
                c.append(st[j])
    return cd[::-1], [c[::-1] for c in cs]


def expected_masks(in_shapes: list[tuple], out_shape: tuple) -> list[int]:
    """Inner-stride masks to specialize for: the one the static shapes give (symbolic dims taken as > 1)."""
    # Distinct primes for distinct symbols, so unrelated symbolic dims never look mergeable by accident.
    symbols: dict[str, int] = {}
    primes = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]

    def num(d):
        if isinstance(d, str):
            return symbols.setdefault(d, primes[len(symbols) % len(primes)])
        return int(d)

    ins = [tuple(num(d) for d in s) for s in in_shapes]
    out = tuple(num(d) for d in out_shape)
    _, strides = coalesce(ins, out)
    mask = sum(1 << i for i, st in enumerate(strides) if st[-1] != 0)
    return [mask]
