"""Per-node cost: FLOPs, bytes read, bytes written and arithmetic intensity (OptiFX Eq.1 and Eq.3).

Conventions (the rules below follow them; every approximation is written into `NodeCost.notes`):

- A multiply-add counts 2 FLOPs. Comparisons, selects, min/max and integer arithmetic count 1 "op" like a FLOP.
- Bytes use each tensor's own dtype (sub-byte types packed). Every input is a read, initializers (weights) included;
  every output is a write. A tensor that a node takes twice (``Mul(x, x)``) is read once. A tensor whose shape is
  unknown contributes no bytes (noted).
- Conv follows OptiFX Eq.3: FLOPs = 2*N*K*H'*W'*(C/G)*R*S and bytes = itemsize*(N*C*H*W + K*(C/G)*R*S + N*K*H'*W')
  (for a depthwise conv the weight is K*R*S*(C/G) elements, not Eq.3's literal C*K*R*S). Eq.3 models a conv
  without bias. When a node has a bias input we count it as what it costs: K more elements read and one add per
  output element (N*K*H'*W' FLOPs). The OptiFX golden values (G1 157.09, G3 22.93, G4 3.27) are computed on
  bias-free convs, which is what Eq.3 describes, and come out exactly that way.
- Transcendental functions (Exp, Log, Tanh, Erf, Sin, Pow, ...) count ``TRANSCENDENTAL_FLOPS`` = 10 FLOPs per element:
  a vectorised expf/logf/tanhf is a range reduction plus a degree 5-7 polynomial, about 10 arithmetic instructions.
  Composite activations add their extra arithmetic (Sigmoid = exp + add + divide = 12, Gelu = erf + 4, ...).
- Softmax/LogSoftmax count 5 per element (max, subtract, exp, sum, divide; the exp is *not* charged at the
  transcendental rate, following the usual convention), LayerNormalization/GroupNormalization/InstanceNormalization
  8 per element (mean, variance, normalise, scale and shift), inference BatchNormalization 2 per element (the
  per-channel scale and shift are folded), reductions one op per input element, pooling one op per window element.
- View ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity) do no arithmetic and are aliased by ONNX Runtime
  (the output shares the input's buffer): their `bytes_read`/`bytes_written` still count the input read and output
  written, but `is_view` is True and `bytes_moved` is 0. Shape and Size read only metadata: 0 bytes read.
- If/Loop/Scan cost 0 themselves: their body graphs are annotated node by node (see `onnxopt.annotate.graph`).
- An op without a rule gets 0 FLOPs, bytes = inputs + outputs, and the note "no cost rule".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import onnx

from .shapes import TensorInfo, nbytes

from .rules import RULES, _Ctx, _prod


@dataclass
class NodeCost:
    """The cost of one node. `reads`/`writes` give the bytes per tensor name (used by `fused_intensity`)."""

    op_type: str
    name: str
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    is_view: bool = False
    notes: list[str] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def bytes_moved(self) -> int:
        """Bytes that really cross memory: 0 for a view, else read + written."""
        return 0 if self.is_view else self.bytes_total

    @property
    def intensity(self) -> float:
        """FLOPs / (bytes read + written); 0 for a node without FLOPs, inf for FLOPs without bytes."""
        if self.flops == 0:
            return 0.0
        return self.flops / self.bytes_total if self.bytes_total else math.inf

    def to_dict(self) -> dict:
        i = self.intensity
        return {
            "op_type": self.op_type, "name": self.name, "flops": int(self.flops),
            "bytes_read": int(self.bytes_read), "bytes_written": int(self.bytes_written),
            "intensity": None if math.isinf(i) else i, "is_view": self.is_view, "notes": list(self.notes),
        }


def node_display_name(node: onnx.NodeProto, index: int | None = None) -> str:
    if node.name:
        return node.name
    return f"{node.op_type}_{index}" if index is not None else f"{node.op_type}:{node.output[0] if node.output else ''}"


def node_cost(node: onnx.NodeProto, info: Mapping[str, TensorInfo], bindings: dict[str, int] | None = None,
              name: str | None = None) -> NodeCost:
    """The cost of `node`, with shapes and dtypes from `info` (see `shapes.tensor_info`).

    Symbolic dims take their value from `bindings`; unbound ones are taken as 1 and say so in the notes.
    """
    ctx = _Ctx(node, info, bindings)
    rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx", "com.microsoft") else None
    if rule is None:
        ctx.note("no cost rule")
        flops = 0
    else:
        flops = int(rule(ctx))

    reads: dict[str, int] = {}
    for name_ in node.input:
        if not name_ or name_ in reads or name_ in ctx.no_read:
            continue
        ti = info.get(name_)
        if ti is None or ti.shape is None:
            ctx.note(f"shape of input '{name_}' unknown; its bytes are not counted")
            reads[name_] = 0
            continue
        elems = ctx.read_override.get(name_)
        if elems is None:
            elems = _prod(ctx._shape(name_))
        if ti.dtype is None:
            ctx.note(f"dtype of '{name_}' unknown; assumed 4 bytes")
        reads[name_] = nbytes(elems, ti.dtype)
    writes: dict[str, int] = {}
    if not ctx.no_write:
        for i, name_ in enumerate(node.output):
            if not name_:
                continue
            y = ctx.oshape(i)
            dt = ctx.dtype(name_)
            if y is None:
                ctx.note(f"shape of output '{name_}' unknown; its bytes are not counted")
                writes[name_] = 0
                continue
            if dt is None:
                ctx.note(f"dtype of '{name_}' unknown; assumed 4 bytes")
            writes[name_] = nbytes(_prod(y), dt)
    return NodeCost(op_type=node.op_type, name=name or node_display_name(node), flops=flops,
                    bytes_read=sum(reads.values()), bytes_written=sum(writes.values()), is_view=ctx.is_view,
                    notes=ctx.notes, reads=reads, writes=writes)


def output_shape(node: onnx.NodeProto, info: Mapping[str, TensorInfo]) -> list | None:
    """The first output's shape as inferred (symbolic dims kept), or None."""
    if not node.output or not node.output[0]:
        return None
    ti = info.get(node.output[0])
    return None if ti is None else ti.shape


# --------------------------------------------------------------------------------------------------------------
# Groups of nodes


def subgraph_intensity(costs: Iterable[NodeCost]) -> float:
    """Unfused intensity of a group: sum of FLOPs / sum of bytes moved (each node counts its inputs, weights and
    outputs; views move nothing)."""
    costs = list(costs)
    b = sum(c.bytes_moved for c in costs)
    f = sum(c.flops for c in costs)
    return f / b if b else (math.inf if f else 0.0)


def fused_bytes(nodes: Sequence[onnx.NodeProto], costs: Sequence[NodeCost], keep: Iterable[str] = ()) -> int:
    """Bytes a fused kernel of `nodes` moves.

    A tensor produced inside the group and read inside it (an intermediate) is never read from memory, and never
    written unless it is in `keep` (a graph output, or consumed by a node outside the group). A tensor read from
    outside by several members is read once. Halo recomputation is not counted: FLOPs are unchanged.
    """
    keep = set(keep)
    produced = {o for n in nodes for o in n.output if o}
    consumed = {i for n in nodes for i in n.input if i}
    internal = produced & consumed
    total = 0
    seen_reads: set[str] = set()
    for c in costs:
        if c.is_view:
            continue
        for t, b in c.reads.items():
            if t in internal or t in seen_reads:
                continue
            seen_reads.add(t)
            total += b
        for t, b in c.writes.items():
            if t in internal and t not in keep:
                continue
            total += b
    return total


def fused_intensity(nodes: Sequence[onnx.NodeProto], costs: Sequence[NodeCost] | None = None,
                    info: Mapping[str, TensorInfo] | None = None, bindings: dict[str, int] | None = None,
                    keep: Iterable[str] = ()) -> float:
    """Intensity of `nodes` fused into one kernel (OptiFX "fused I": the intermediates' writes and reads are
    dropped). `costs` are the nodes' costs in the same order (computed from `info` when omitted); `keep` lists
    intermediates that must still be written (see `fused_bytes`)."""
    nodes = list(nodes)
    if costs is None:
        if info is None:
            raise ValueError("fused_intensity needs either the nodes' costs or the tensor info to compute them")
        costs = [node_cost(n, info, bindings) for n in nodes]
    costs = list(costs)
    if len(costs) != len(nodes):
        raise ValueError(f"fused_intensity: {len(nodes)} nodes but {len(costs)} costs")
    f = sum(c.flops for c in costs)
    b = fused_bytes(nodes, costs, keep)
    return f / b if b else (math.inf if f else 0.0)
