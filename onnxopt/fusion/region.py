"""Regions: connected groups of nodes that become one fused kernel.

A region records the original nodes (they become the fused node's function fallback), its boundary tensors, the
elementwise program that codegen lowers (a compute or pool kernel's epilogue), and its kind's typed parameters.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import onnx

from .params import ComputeParams, CopyParams, ElementwiseParams, KindParams, PoolParams, RelayoutParams


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
    """A region's kind is the type of its `params` (fusion/params.py): ElementwiseParams, ComputeParams,
    PoolParams, CopyParams, RelayoutParams, or a registered kind's (onnxopt/kinds/). `label` names the op type."""

    label: str  # the op type's prefix: "Elementwise", "Conv", "MaxPool", "Copy", "afusion", "relayout", ...
    nodes: list[onnx.NodeProto]
    inputs: list[str]  # tensor names in the graph, in fused-op input order
    outputs: list[str]  # tensor names in the graph, in fused-op output order
    program: EwProgram
    shape: list  # the iteration shape as inferred: ints and symbolic names (str) or None when unknown
    op_type: str = ""
    params: KindParams = field(default_factory=ElementwiseParams)
    # filled by later stages
    rejected: str | None = None
    measured: dict = field(default_factory=dict)
    op_type_key: str = ""  # the target text the op type was computed with (compute_op_type), to recompute it
    # new constant tensors an elementwise region reads (a BatchNormalization's scale and shift, fusion/batchnorm.py):
    # written into fused.onnx with it; its function fallback reads the original parameters instead
    initializers: list = field(default_factory=list)
    # the constants its function fallback embeds (emit/model.py, fallback_key): part of the op type, since one op
    # type has one function
    fallback_key: str = ""

    # Typed views of `params`: the parameters when the region is of that kind, else None.
    @property
    def compute(self) -> ComputeParams | None:
        return self.params if isinstance(self.params, ComputeParams) else None

    @property
    def pool(self) -> PoolParams | None:
        return self.params if isinstance(self.params, PoolParams) else None

    @property
    def copy(self) -> CopyParams | None:
        return self.params if isinstance(self.params, CopyParams) else None

    @property
    def relayout(self) -> list | None:
        """A relayout region's onnxruntime nodes; None for a kernel region."""
        return self.params.nodes if isinstance(self.params, RelayoutParams) else None

    @property
    def carried_initializers(self) -> list:
        """The new constants fused.onnx gets with this region (packed weights, folded BatchNorm parameters)."""
        return self.compute.initializers if self.compute is not None else self.initializers

    def compute_op_type(self, target_name: str) -> str:
        self.op_type_key = target_name
        if isinstance(self.params, RelayoutParams):  # emitted as its nodes, never as a custom op
            self.op_type = "relayout_" + hashlib.sha256("|".join(self.outputs).encode()).hexdigest()[:16]
            return self.op_type
        h = hashlib.sha256(self._op_type_text(target_name, self.fallback_key).encode()).hexdigest()
        self.op_type = f"{self.label}_{h[:16]}"
        return self.op_type

    def _op_type_text(self, target_name: str, fallback_key: str) -> str:
        text = self.label + "|" + target_name + "|" + self.program.signature()
        if fallback_key:
            text += "|fallback" + fallback_key
        return text + self.params.op_type_text(target_name)

    def kernel_key(self) -> str:
        """What the op type says of the kernel's code alone, the function fallback's constants left out: regions
        with the same key run the same machine code on their own weights (a transformer's repeated layers)."""
        if isinstance(self.params, RelayoutParams) or not self.op_type_key:
            return self.op_type
        return hashlib.sha256(self._op_type_text(self.op_type_key, "").encode()).hexdigest()[:16]

    @property
    def node_names(self) -> list[str]:
        return [n.name or n.output[0] for n in self.nodes]

    def describe(self) -> str:
        return " -> ".join(n.op_type for n in self.nodes)
