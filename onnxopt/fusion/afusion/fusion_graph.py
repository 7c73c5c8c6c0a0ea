"""The fusion graph: the annotated graph seen as region ops (ROPs: convolutions and pools), the elementwise ops
(EOPs) between them, and the paths that join them. legality.py decides which groups of ROPs fuse."""

from __future__ import annotations

import os
from collections.abc import Iterable

import onnx
from onnx import helper

from onnxopt.annotate.graph import AnnotatedGraph, AnnotatedNode, annotate
from onnxopt.fusion.graph_index import GraphIndex


# AfusionRegion ops: sliding-window or whole-image reductions (OptiFX's ROPs). ConvTranspose is left out.
ROP_TYPES = frozenset({"Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
AFUSION_PRODUCERS = frozenset({"Conv"})
AFUSION_CONSUMERS = frozenset({"Conv", "MaxPool", "AveragePool"})
# Compute ops that get vertical (epilogue) fusion only.
COMPUTE_TYPES = frozenset({"Gemm", "MatMul"})
# Elementwise ops that fold into an epilogue (one output, the shape of a data input).
EOP_TYPES = frozenset({
    "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
    "Gelu", "Softplus", "Softsign", "Mish", "Erf", "Exp", "Neg", "Abs", "Sqrt", "Reciprocal",
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sum", "BatchNormalization", "Identity", "Dropout",
})
MAX_EOP_DEPTH = 16  # how many EOPs a path between two ROPs may cross (real epilogues have 1-4)
ITEMSIZE = 4  # float32


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


class FusionGraph:
    """The main graph of an annotated model, indexed for fusion decisions. Node ids are graph positions (ONNX
    keeps nodes in topological order, so the position is a topological rank)."""

    def __init__(self, annotated: AnnotatedGraph):
        self.annotated = annotated
        self.machine = annotated.machine
        self.model = annotated.model
        graph = self.model.graph
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        main = [a for a in annotated.nodes if a.graph == ""]
        if len(main) != len(self.nodes):
            raise ValueError(f"annotated graph has {len(main)} main-graph nodes, the model {len(self.nodes)}")
        self.annotations: list[AnnotatedNode] = main
        # Node names as the annotation shows them, made unique (models with repeated names exist).
        self.names: list[str] = []
        seen: set[str] = set()
        for i, a in enumerate(main):
            name = a.name if a.name not in seen else f"{a.name}#{i}"
            seen.add(name)
            self.names.append(name)
        self.index_of = {n: i for i, n in enumerate(self.names)}
        index = GraphIndex(graph)
        self.producer: dict[str, int] = index.producer
        self.consumers = index.consumers  # tensor -> node ids, body-graph readers included
        self.graph_outputs: set[str] = set(index.graph_outputs)
        self.used_by_subgraphs: set[str] = set(index.used_by_subgraphs)
        self.info = annotated.info
        self.initializers = {t.name for t in graph.initializer}
        self.attrs = [_attrs(n) for n in self.nodes]
        self.kinds = [self._classify(i) for i in range(len(self.nodes))]
        self._desc: list[int] | None = None
        self._anc: list[int] | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def of(cls, obj, machine=None) -> FusionGraph:
        """A FusionGraph from a FusionGraph (returned as is), an AnnotatedGraph, a ModelProto or a path."""
        if isinstance(obj, FusionGraph):
            return obj
        if isinstance(obj, AnnotatedGraph):
            return cls(obj)
        if isinstance(obj, (onnx.ModelProto, str, os.PathLike)):
            return cls(annotate(obj, machine))
        raise TypeError(f"expected a FusionGraph, AnnotatedGraph, ModelProto or path, not {type(obj).__name__}")

    # ------------------------------------------------------------------ tensors
    def shape(self, tensor: str) -> list | None:
        ti = self.info.get(tensor)
        return None if ti is None or ti.shape is None else list(ti.shape)

    def static_shape(self, tensor: str) -> tuple[int, ...] | None:
        """The shape if every dim is a known int, else None."""
        s = self.shape(tensor)
        if s is None or not all(isinstance(d, int) for d in s):
            return None
        return tuple(s)

    def dtype(self, tensor: str) -> str | None:
        ti = self.info.get(tensor)
        return None if ti is None else ti.dtype

    def is_constant(self, tensor: str) -> bool:
        if tensor in self.initializers:
            return True
        ti = self.info.get(tensor)
        if ti is not None and ti.constant:
            return True
        p = self.producer.get(tensor)
        return p is not None and self.nodes[p].op_type == "Constant"

    def is_kept(self, tensor: str) -> bool:
        """A tensor the world outside the graph's nodes sees: a graph output or a body graph's outer name."""
        return tensor in self.graph_outputs or tensor in self.used_by_subgraphs

    # ------------------------------------------------------------------ nodes
    def resolve(self, node) -> int:
        """A node id from an id, a name or a NodeProto of this graph."""
        if isinstance(node, int):
            if not 0 <= node < len(self.nodes):
                raise KeyError(f"no node #{node} (the graph has {len(self.nodes)})")
            return node
        if isinstance(node, str):
            if node not in self.index_of:
                raise KeyError(f"no node named {node!r}")
            return self.index_of[node]
        if isinstance(node, onnx.NodeProto):
            for i, n in enumerate(self.nodes):
                if n is node or (n.output and list(n.output) == list(node.output)):
                    return i
            raise KeyError(f"node {node.name or node.op_type!r} is not in this graph")
        raise TypeError(f"a node is an id, a name or a NodeProto, not {type(node).__name__}")

    def op(self, i: int) -> str:
        return self.nodes[i].op_type

    def data_inputs(self, i: int) -> list[str]:
        """Non-constant inputs (what a kernel streams; weights and scalars are constants)."""
        return [t for t in self.nodes[i].input if t and not self.is_constant(t)]

    def outputs(self, i: int) -> list[str]:
        return [t for t in self.nodes[i].output if t]

    def successors(self, i: int) -> list[int]:
        out: set[int] = set()
        for t in self.outputs(i):
            out.update(self.consumers.get(t, ()))
        return sorted(out)

    def _classify(self, i: int) -> str:
        node = self.nodes[i]
        if node.domain not in ("", "ai.onnx"):
            return "other"
        if node.op_type in ROP_TYPES:
            return "rop"
        if node.op_type in COMPUTE_TYPES:
            return "compute"
        if node.op_type in EOP_TYPES and self._is_elementwise(i):
            return "eop"
        return "other"

    def _is_elementwise(self, i: int) -> bool:
        outs = self.outputs(i)
        if len(outs) != 1 or (self.op(i) == "Dropout" and len(self.nodes[i].output) > 1):
            return False
        data = self.data_inputs(i)
        out_shape = self.shape(outs[0])
        # The output must keep the shape of a data input (no broadcast growth): then rows map one to one.
        return bool(data) and out_shape is not None and any(self.shape(t) == out_shape for t in data)

    def is_rop(self, i: int) -> bool:
        return self.kinds[i] == "rop"

    def is_eop(self, i: int) -> bool:
        return self.kinds[i] == "eop"

    # ------------------------------------------------------------------ reachability
    def _reach(self) -> tuple[list[int], list[int]]:
        """Descendant and ancestor bitsets of every node (Python ints, bit j = node j)."""
        if self._desc is None:
            n = len(self.nodes)
            succ = [self.successors(i) for i in range(n)]
            desc = [0] * n
            for i in range(n - 1, -1, -1):
                m = 0
                for s in succ[i]:
                    if s > i:  # body-graph readers are listed as consumers; order keeps this a DAG
                        m |= desc[s] | (1 << s)
                desc[i] = m
            anc = [0] * n
            for i in range(n):
                for s in succ[i]:
                    if s > i:
                        anc[s] |= anc[i] | (1 << i)
            self._desc, self._anc = desc, anc
        return self._desc, self._anc  # type: ignore[return-value]

    def descendants(self, i: int) -> int:
        return self._reach()[0][i]

    def ancestors(self, i: int) -> int:
        return self._reach()[1][i]

    @staticmethod
    def mask(ids: Iterable[int]) -> int:
        m = 0
        for i in ids:
            m |= 1 << i
        return m

    def cycle_through(self, members: Iterable[int]) -> list[int]:
        """Nodes outside `members` on a path that leaves the set and comes back (empty when contracting the set
        to one node keeps the graph acyclic)."""
        members = list(members)
        m = self.mask(members)
        desc, anc = self._reach()
        down = up = 0
        for i in members:
            down |= desc[i]
            up |= anc[i]
        bad = down & up & ~m
        return _bits(bad)

    # ------------------------------------------------------------------ epilogues
    def epilogue(self, i: int) -> list[int]:
        """The EOPs that fold into node i's epilogue: the chain of single-consumer elementwise ops after it
        (Conv -> Relu, Conv -> Add(residual) -> Relu, Conv -> BN -> Clip...)."""
        chain: list[int] = []
        outs = self.outputs(i)
        if len(outs) != 1:
            return chain
        t = outs[0]
        while not self.is_kept(t):
            cons = self.consumers.get(t, [])
            if len(cons) != 1:
                break
            c = cons[0]
            if not self.is_eop(c) or self.shape(self.outputs(c)[0]) != self.shape(t):
                break
            chain.append(c)
            t = self.outputs(c)[0]
        return chain

    def with_epilogues(self, members: Iterable[int], ends: Iterable[int]) -> set[int]:
        """`members` plus the epilogue chain of each node in `ends`, each chain cut before the first EOP that would
        make the set cyclic after contraction (a residual Add whose other input depends on another member)."""
        out = set(members)
        for e in sorted(ends):
            for x in self.epilogue(e):
                if self.cycle_through(out | {x}):
                    break
                out.add(x)
        return out

    def eop_paths(self, sources: set[str], target: str) -> set[int] | None:
        """EOP nodes on paths from any tensor in `sources` to `target` through elementwise ops only (the direct
        edge of rule 4); None when `target` is not reached that way. An empty set: target is a source."""
        memo: dict[str, bool] = {}
        on_path: set[int] = set()

        def reaches(t: str, depth: int) -> bool:
            if t in sources:
                return True
            if t in memo:
                return memo[t]
            ok = False
            p = self.producer.get(t)
            if p is not None and depth < MAX_EOP_DEPTH and self.is_eop(p):
                for x in self.data_inputs(p):
                    if reaches(x, depth + 1):
                        ok = True
                if ok:
                    on_path.add(p)
            memo[t] = ok
            return ok

        return on_path if reaches(target, 0) else None

    def eop_forward(self, i: int) -> set[int]:
        """EOP nodes reachable from node i's output through EOPs only (any number of consumers)."""
        seen: set[int] = set()
        frontier = [(c, 1) for t in self.outputs(i) for c in self.consumers.get(t, ())]
        while frontier:
            c, depth = frontier.pop()
            if c in seen or not self.is_eop(c) or depth > MAX_EOP_DEPTH:
                continue
            seen.add(c)
            frontier.extend((d, depth + 1) for t in self.outputs(c) for d in self.consumers.get(t, ()))
        return seen

    def label(self, i: int) -> str:
        return f"{self.names[i]} ({self.op(i)})"


def _bits(m: int) -> list[int]:
    out = []
    while m:
        low = m & -m
        out.append(low.bit_length() - 1)
        m ^= low
    return out
