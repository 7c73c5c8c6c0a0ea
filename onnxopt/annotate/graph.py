"""The annotated graph: every node's cost, its roofline bound and predicted time on a machine model.

    ag = annotate(model, machine, bindings={"N": 1})
    ag.render_table(console)          # rich table, one row per node, plus a summary line
    ag.top(5)                         # the five nodes with the largest predicted time
    json.dumps(ag.to_dict())

A node is compute-bound when its intensity (FLOPs / bytes moved) reaches the machine's balance
`machine.balance(dtype)` (peak FLOP/s over DRAM bandwidth, OptiFX I_max), memory-bound otherwise; its predicted time
is `machine.predict_seconds(flops, bytes_moved, dtype)` (the roofline, Eq.2). The dtype is the node's first
input's, mapped onto the dtypes the machine lists (int8 for 8-bit integers, float16 for 16-bit floats when the
machine has it, float32 otherwise).

Body graphs of If/Loop/Scan nodes are annotated too; their nodes carry `graph="<parent>/<attribute>"`. A Loop or
Scan body is counted once (the trip count is not applied; the parent node says so). Of an If's two branches only
the costlier one counts towards the totals; the other's nodes have `counted=False`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import onnx
from onnx import numpy_helper

from onnxopt.graph.large import add_messages, model_bytes, tensor_bytes

from .cost import NodeCost, fused_bytes, node_cost, node_display_name, subgraph_intensity
from .shapes import TensorInfo, tensor_info

if TYPE_CHECKING:  # the machine model is passed in; annotate does not build one
    from rich.console import Console

    from onnxopt.hardware.machine_model import Machine

# Models larger than this are shape-inferred on a copy without the big initializers' data (protobuf's 2 GB limit).
_STRIP_ABOVE = 2**31 - 2**26
_STRIP_TENSOR_ABOVE = 1 << 20  # ... and which initializers lose their data there


@dataclass
class AnnotatedNode:
    name: str
    op_type: str
    cost: NodeCost
    dtype: str | None
    output_shape: list | None
    bound: str | None  # "compute" or "memory"; None without a machine
    seconds: float | None  # roofline prediction; None without a machine
    graph: str = ""  # "" for the main graph, "<parent>/<attribute>" for a body graph
    counted: bool = True  # False for the cheaper branch of an If (not in the totals)
    node: onnx.NodeProto | None = field(default=None, repr=False)

    @property
    def flops(self) -> int:
        return self.cost.flops

    @property
    def bytes(self) -> int:
        return self.cost.bytes_moved

    @property
    def intensity(self) -> float:
        return self.cost.intensity

    def to_dict(self, total_seconds: float | None = None) -> dict:
        d = self.cost.to_dict()
        d.update({
            "name": self.name, "dtype": self.dtype, "output_shape": self.output_shape,
            "bytes_moved": int(self.cost.bytes_moved), "bound": self.bound, "seconds": self.seconds,
            "graph": self.graph, "counted": self.counted,
        })
        if total_seconds and self.seconds is not None and self.counted:
            d["fraction"] = self.seconds / total_seconds
        return d


def machine_dtype(machine: "Machine", dtype: str | None) -> str:
    """The key of `machine.peak_flops` that applies to a tensor of `dtype`."""
    peaks = machine.peak_flops
    if dtype in peaks:
        return dtype
    if dtype in ("int8", "uint8", "int4", "uint4") and "int8" in peaks:
        return "int8"
    if dtype in ("float16", "bfloat16") or (dtype or "").startswith("float8"):
        for k in (dtype, "float16", "bfloat16"):
            if k in peaks:
                return k
    if "float32" in peaks:
        return "float32"
    return next(iter(peaks))


@dataclass
class AnnotatedGraph:
    model: onnx.ModelProto  # the shape-inferred copy the costs were computed on
    info: dict[str, TensorInfo]
    nodes: list[AnnotatedNode]
    machine: "Machine | None" = None
    bindings: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ totals
    def _counted(self) -> list[AnnotatedNode]:
        return [n for n in self.nodes if n.counted]

    @property
    def total_flops(self) -> int:
        return sum(n.cost.flops for n in self._counted())

    @property
    def total_bytes(self) -> int:
        return sum(n.cost.bytes_moved for n in self._counted())

    @property
    def total_seconds(self) -> float | None:
        if self.machine is None:
            return None
        return sum(n.seconds or 0.0 for n in self._counted())

    @property
    def intensity(self) -> float:
        b = self.total_bytes
        return self.total_flops / b if b else 0.0

    def bound_counts(self) -> dict[str, int]:
        out = {"compute": 0, "memory": 0}
        for n in self._counted():
            if n.bound in out:
                out[n.bound] += 1
        return out

    # ------------------------------------------------------------------ queries
    def __getitem__(self, name: str) -> AnnotatedNode:
        """A node by name, or by its qualified name "<graph>/<name>" for a node of a body graph."""
        for n in self.nodes:
            if n.name == name or (n.graph and f"{n.graph}/{n.name}" == name):
                return n
        raise KeyError(name)

    def top(self, n: int = 10) -> list[AnnotatedNode]:
        """The n counted nodes with the largest predicted time (without a machine: the most bytes, then FLOPs)."""
        if self.machine is not None:
            key = lambda a: (a.seconds or 0.0, a.cost.flops)  # noqa: E731
        else:
            key = lambda a: (a.cost.bytes_moved, a.cost.flops)  # noqa: E731
        return sorted(self._counted(), key=key, reverse=True)[:n]

    def subgraph_intensity(self, names: Iterable[str]) -> float:
        return subgraph_intensity(self[n].cost for n in names)

    def fused_intensity(self, names: Iterable[str]) -> float:
        """Intensity of the named nodes fused into one kernel; intermediates that the rest of the graph (or the
        graph outputs) still need stay written."""
        members = [self[n] for n in names]
        member_ids = {id(m) for m in members}
        outside_reads = {i for a in self.nodes if id(a) not in member_ids and a.node is not None
                         for i in _all_inputs(a.node)}
        outputs = {o.name for o in self.model.graph.output}
        keep = outside_reads | outputs
        nodes = [m.node for m in members]
        b = fused_bytes(nodes, [m.cost for m in members], keep)
        f = sum(m.cost.flops for m in members)
        return f / b if b else (math.inf if f else 0.0)

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        total = self.total_seconds
        return {
            "machine": self.machine.to_dict() if self.machine is not None else None,
            "balance": self.machine.balance(machine_dtype(self.machine, "float32")) if self.machine else None,
            "bindings": dict(self.bindings),
            "totals": {
                "nodes": len(self.nodes), "flops": int(self.total_flops), "bytes": int(self.total_bytes),
                "intensity": self.intensity, "seconds": total, **{f"{k}_bound": v for k, v in
                                                                   self.bound_counts().items()},
            },
            "notes": list(self.notes),
            "nodes": [n.to_dict(total) for n in self.nodes],
        }

    def summary(self) -> str:
        counts = self.bound_counts()
        s = (f"{len(self.nodes)} nodes, {self.total_flops / 1e9:.3f} GFLOP, {self.total_bytes / 1e6:.3f} MB moved, "
             f"intensity {self.intensity:.2f} FLOP/B")
        if self.machine is not None:
            s += (f"; predicted {self.total_seconds * 1e6:.1f} µs on {self.machine.name} "
                  f"(balance {self.machine.balance(machine_dtype(self.machine, 'float32')):.2f} FLOP/B); "
                  f"{counts['compute']} compute-bound, {counts['memory']} memory-bound")
        return s

    def render_table(self, console: "Console | None" = None, limit: int | None = None) -> None:
        """Print one row per node (graph order; with `limit`, the `limit` slowest) and a summary line."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        total = self.total_seconds
        title = "Annotated graph" + (f" on {self.machine.name}" if self.machine is not None else "")
        table = Table(title=title)
        for col, just in (("node", "left"), ("op", "left"), ("output shape", "left"), ("GFLOPs", "right"),
                          ("MB", "right"), ("intensity", "right"), ("bound", "left"), ("predicted µs", "right"),
                          ("% of total", "right")):
            table.add_column(col, justify=just)
        rows = self.top(limit) if limit else self.nodes
        for n in rows:
            i = n.cost.intensity
            shape = "?" if n.output_shape is None else "x".join("?" if d is None else str(d) for d in n.output_shape)
            pct = "-" if not (total and n.seconds is not None and n.counted) else f"{100 * n.seconds / total:.1f}"
            table.add_row(
                (n.graph + "/" if n.graph else "") + n.name, n.op_type, shape or "scalar",
                f"{n.cost.flops / 1e9:.4g}", f"{n.cost.bytes_moved / 1e6:.4g}",
                "inf" if math.isinf(i) else f"{i:.2f}", n.bound or "-",
                "-" if n.seconds is None else f"{n.seconds * 1e6:.2f}", pct,
            )
        console.print(table)
        console.print(self.summary())


def _all_inputs(node: onnx.NodeProto) -> set[str]:
    """A node's inputs plus the outer-scope names its body graphs use."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
        for g in graphs:
            for sub in g.node:
                names |= _all_inputs(sub)
    return names


def _needs_inference(model: onnx.ModelProto) -> bool:
    known = {v.name for v in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)}
    known |= {t.name for t in model.graph.initializer}
    return any(o and o not in known for n in model.graph.node for o in n.output)


def _infer(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """Shape-infer a copy (the caller's model is never modified)."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    if not _needs_inference(work):
        return work
    stripped = model_bytes(work) > _STRIP_ABOVE
    if stripped:  # keep dims and types, drop the data: inference needs no big weights
        for t in work.graph.initializer:
            if tensor_bytes(t) > _STRIP_TENSOR_ABOVE:
                data_type, dims = t.data_type, list(t.dims)
                name = t.name
                t.Clear()
                t.name, t.data_type = name, data_type
                t.dims.extend(dims)
                t.data_location = onnx.TensorProto.EXTERNAL
                e = t.external_data.add()
                e.key, e.value = "location", "stripped-for-inference"
    try:
        inferred = onnx.shape_inference.infer_shapes(work, data_prop=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types for models it cannot infer
        notes.append(f"shape inference failed ({e}); costs use the shapes the model declares")
        work = onnx.ModelProto()
        work.CopyFrom(model)
        return work
    if stripped:
        # Put back the original initializers (the inferred copy holds only their dims).
        del inferred.graph.initializer[:]
        add_messages(inferred.graph.initializer, model.graph.initializer)
    return inferred


def _trip_note(node: onnx.NodeProto, info: dict[str, TensorInfo], model: onnx.ModelProto) -> str:
    if node.op_type == "Loop":
        m = node.input[0] if node.input else ""
        for t in model.graph.initializer:
            if m and t.name == m:
                trip = int(numpy_helper.to_array(t).reshape(-1)[0])
                return f"Loop body counted once (trip count {trip} not applied)"
        return "Loop body counted once (trip count unknown)"
    if node.op_type == "Scan":
        return "Scan body counted once (one iteration)"
    return ""


def annotate(model, machine: "Machine | None" = None, bindings: dict[str, int] | None = None) -> AnnotatedGraph:
    """Annotate every node of `model` (a ModelProto or a path) with its cost, bound and predicted time.

    Shape inference runs on a copy when the model lacks value_info; the caller's model is not modified. Symbolic
    dims are kept in the reported shapes and bound to `bindings` (else 1, noted per node) for the estimates.
    """
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    notes: list[str] = []
    work = _infer(model, notes)
    info = tensor_info(work)
    bindings = dict(bindings or {})

    def make(node: onnx.NodeProto, name: str, graph: str) -> AnnotatedNode:
        cost = node_cost(node, info, bindings, name=name)
        dt = next((info[i].dtype for i in node.input if i and i in info and info[i].dtype), None)
        if dt is None:
            dt = next((info[o].dtype for o in node.output if o and o in info and info[o].dtype), None)
        out = info.get(node.output[0]).shape if node.output and node.output[0] in info else None
        bound = seconds = None
        if machine is not None:
            mdt = machine_dtype(machine, dt)
            bound = "compute" if cost.bytes_moved == 0 and cost.flops > 0 or \
                (cost.bytes_moved and cost.flops / cost.bytes_moved >= machine.balance(mdt)) else "memory"
            seconds = machine.predict_seconds(cost.flops, cost.bytes_moved, mdt)
        return AnnotatedNode(name=name, op_type=node.op_type, cost=cost, dtype=dt, output_shape=out, bound=bound,
                             seconds=seconds, graph=graph, node=node)

    def weight(nodes: list[AnnotatedNode]) -> float:
        if machine is not None:
            return sum(n.seconds or 0.0 for n in nodes if n.counted)
        return sum(n.cost.flops + n.cost.bytes_moved for n in nodes if n.counted)

    def walk(graph: onnx.GraphProto, prefix: str, where: str) -> list[AnnotatedNode]:
        result: list[AnnotatedNode] = []
        for idx, node in enumerate(graph.node):
            name = node_display_name(node, idx)
            a = make(node, name, where)
            result.append(a)
            bodies: list[tuple[str, list[AnnotatedNode]]] = []
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    path = f"{prefix}{name}/{attr.name}"
                    bodies.append((attr.name, walk(attr.g, path + "/", path)))
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for k, g in enumerate(attr.graphs):
                        path = f"{prefix}{name}/{attr.name}[{k}]"
                        bodies.append((f"{attr.name}[{k}]", walk(g, path + "/", path)))
            if node.op_type == "If" and len(bodies) == 2:
                (na, a_nodes), (nb, b_nodes) = bodies
                keep, drop = ((na, nb) if weight(a_nodes) >= weight(b_nodes) else (nb, na))
                for bname, bnodes in bodies:
                    if bname == drop:
                        for b in bnodes:
                            b.counted = False
                a.cost.notes.append(f"If: the costlier branch ({keep}) counts towards the totals, {drop} does not")
            elif bodies:
                note = _trip_note(node, info, work)
                if note:
                    a.cost.notes.append(note)
            for _, bnodes in bodies:
                result.extend(bnodes)
        return result

    nodes = walk(work.graph, "", "")
    return AnnotatedGraph(model=work, info=info, nodes=nodes, machine=machine, bindings=bindings, notes=notes)
