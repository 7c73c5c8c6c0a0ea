"""Regions: connected groups of nodes that become one fused kernel.

A region records the original nodes (they become the fused node's function fallback), its boundary tensors, and a
kind-specific program that codegen lowers. Today the kind is `Elementwise`; later kinds (reductions, compute-op
epilogues, conv chains, GEMM chains) add their own programs and reuse the boundary, legality and emission logic.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import onnx


@dataclass(frozen=True)
class Value:
    """A tensor at a region boundary: its name inside the program and its numpy dtype name."""

    name: str
    dtype: str


@dataclass(frozen=True)
class EwOp:
    """One elementwise operation: `out = op(*args)`. Args name program inputs, constants or earlier outputs."""

    op: str
    args: tuple[str, ...]
    out: str
    dtype: str  # dtype of the result
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, name, default=None):
        return dict(self.attrs).get(name, default)


@dataclass
class EwProgram:
    """A straight-line elementwise program over one broadcast iteration space.

    `inputs` are the runtime tensors in the fused op's input order; `consts` are scalars baked into the code;
    `outputs` all have the full iteration shape. `masks` lists the inner-stride patterns (bit i set: input i is
    contiguous along the innermost dimension, clear: broadcast) that get a specialized vector loop; any other
    pattern seen at run time goes to the generic loop.
    """

    inputs: list[Value]
    consts: dict[str, tuple[object, str]]
    ops: list[EwOp]
    outputs: list[Value]
    masks: list[int] = field(default_factory=list)

    def output_dependencies(self) -> list[int]:
        """Per output, a bitmask of the inputs it depends on (its own broadcast shape comes from those)."""
        deps = {v.name: 1 << i for i, v in enumerate(self.inputs)}
        for op in self.ops:
            deps[op.out] = 0
            for a in op.args:
                deps[op.out] |= deps.get(a, 0)
        return [deps.get(v.name, 0) for v in self.outputs]

    def signature(self) -> str:
        """Canonical text of the computation, independent of tensor names: the content hash of the op type."""
        rename: dict[str, str] = {}
        for i, v in enumerate(self.inputs):
            rename[v.name] = f"in{i}"
        # Constants numbered by first use, so the names they had in the graph do not matter.
        n_consts = 0
        for i, op in enumerate(self.ops):
            for a in op.args:
                if a in self.consts and a not in rename:
                    rename[a] = f"c{n_consts}"
                    n_consts += 1
            rename[op.out] = f"t{i}"
        rename[""] = ""  # an omitted optional input (Clip without a bound)
        doc = {
            "in": [v.dtype for v in self.inputs],
            "consts": {rename[k]: [repr(val), dt] for k, (val, dt) in self.consts.items() if k in rename},
            "ops": [[o.op, [rename[a] for a in o.args], o.dtype, [[k, repr(v)] for k, v in o.attrs]] for o in self.ops],
            "out": [[rename[v.name], v.dtype] for v in self.outputs],
            "masks": sorted(self.masks),
        }
        return json.dumps(doc, sort_keys=True)


@dataclass
class Region:
    kind: str
    nodes: list[onnx.NodeProto]
    inputs: list[str]  # tensor names in the graph, in fused-op input order
    outputs: list[str]  # tensor names in the graph, in fused-op output order
    program: EwProgram
    shape: list  # the iteration shape as inferred: ints and symbolic names (str) or None when unknown
    op_type: str = ""
    # filled by later stages
    rejected: str | None = None
    measured: dict = field(default_factory=dict)
    compute: object = None  # fusion.compute.ComputeParams for Conv/MatMul regions
    pool: object = None  # fusion.pool.PoolParams for MaxPool/AveragePool/GlobalMaxPool/GlobalAveragePool regions
    op_type_key: str = ""  # the target text the op type was computed with (compute_op_type), to recompute it
    # kind "relayout": no kernel; the node is replaced by these onnxruntime nodes that run on blocked tensors
    # (fusion/blocked_passthrough.py)
    relayout: list | None = None
    copy: object = None  # fusion.blocked_copy.CopyParams: a Concat / nearest Resize of blocked tensors
    # new constant tensors an elementwise region reads (a BatchNormalization's scale and shift, fusion/batchnorm.py):
    # written into fused.onnx with it; its function fallback reads the original parameters instead
    initializers: list = field(default_factory=list)
    # the constants its function fallback embeds (emit/model.py, fallback_key): part of the op type, since one op
    # type has one function
    fallback_key: str = ""
    # an elementwise region on blocked tensors (fusion/blocked_elementwise.py): their lanes, and the passthrough
    # regions it replaces, which come back if its kernel is rejected
    blocked_lanes: int = 0
    replaces: list = field(default_factory=list)
    # the typed parameters of a registered kind's region (onnxopt/kinds/): their key() is part of the op type
    params: object = None

    def compute_op_type(self, target_name: str) -> str:
        self.op_type_key = target_name
        if self.relayout is not None:  # emitted as its nodes, never as a custom op: the name only tells it apart
            self.op_type = "relayout_" + hashlib.sha256("|".join(self.outputs).encode()).hexdigest()[:16]
            return self.op_type
        text = self.kind + "|" + target_name + "|" + self.program.signature()
        if self.fallback_key:
            text += "|fallback" + self.fallback_key
        if self.compute is not None:
            c = self.compute
            text += "|" + json.dumps([c.op, c.extra_kinds, c.extra_nstride,
                                      {k: repr(v) for k, v in sorted(c.attrs.items())}], sort_keys=True)
            for part in c.parts:  # AFUSION: the fused convolutions' own kernels
                text += "|part" + part.compute_op_type(target_name)
            tile = getattr(c, "tile", None)
            if tile is not None:  # a searched register tile: another kernel, another op type
                text += "|tile" + json.dumps([tile.mi, tile.ni, tile.mii, tile.lanes])
        if self.pool is not None:
            text += "|pool" + json.dumps(self.pool.key(), sort_keys=True)
        if self.copy is not None:
            text += "|copy" + json.dumps(self.copy.key())
        if self.params is not None:
            text += "|params" + json.dumps(self.params.key())
        h = hashlib.sha256(text.encode()).hexdigest()
        self.op_type = f"{self.kind}_{h[:16]}"
        return self.op_type

    @property
    def node_names(self) -> list[str]:
        return [n.name or n.output[0] for n in self.nodes]

    def describe(self) -> str:
        return " -> ".join(n.op_type for n in self.nodes)
