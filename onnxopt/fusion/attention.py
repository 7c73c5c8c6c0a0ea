"""Attention chains as exporters write them: MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(., V).

The forms found in real exports (torch's TorchScript exporter and its dynamo exporter, opset 14-18):

    scores = MatMul(Mul(Q, s), Mul(K^T, s))            torch's SDPA decomposition: sqrt(scale) on both sides
    scores = Div(MatMul(Q, Transpose(K)), sqrt(d))      the older BERT/GPT-2 code
    scores = FusedMatMul(Q, K, transB=1, alpha=scale)   onnxruntime's own optimized graphs (com.microsoft)
    logits = Add(scores, mask)                          an additive mask: Where(bool, 0, -inf), finfo.min, causal
    logits = Where(keep, scores, fill)                  the select form
    logits = Where(masked, fill, scores)                masked_fill: the fill form (fill where the mask is true)
    probs  = Softmax(logits, axis=-1)
    probs  = Where(IsNaN(probs), 0, probs)              torch's guard for rows that are masked everywhere
    out    = MatMul(probs, V)

Chimera's GEMM chains without a softmax are found too: MatMul(A, B) [-> Relu] -> MatMul(., D) (`middle` "none" or
"relu"), batched (rank 3 or more) with B and D computed at run time (a chain of constant weights is the compute kind's
packed GEMMs), the first product read by nothing else: the same kernel with the Relu, or nothing, in place of its
softmax, the first product's rows kept in the block's scratch instead of written out.

`find_attention` returns one `AttentionChain` per match: the tensors the fused kernel reads (Q, K or K^T, V, the
mask), the scale as one number, and the nodes the chain replaces. A Softmax that is not the heart of such a chain
is refused with the reason (the probabilities are read elsewhere, the scale is not a constant, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from .graph_index import GraphIndex

MS_DOMAIN = "com.microsoft"


@dataclass
class AttentionChain:
    nodes: list[onnx.NodeProto]  # in graph order: what the fused op replaces (its function fallback)
    q: str  # queries [..., M, d]
    k: str  # keys: [..., L, d], or K^T [..., d, L] when k_transposed
    k_transposed: bool
    v: str  # values [..., L, dv]
    scale: float  # multiplies Q K^T before the mask
    output: str  # [..., M, dv]
    mask: str | None = None  # additive ([..., M or 1, L] broadcast), or the select form's condition
    mask_kind: str = "none"  # "none", "add", "select" (keep where true, else `fill`) or "fill" (`fill` where true)
    fill: float = 0.0
    nan_guard: bool = False  # rows whose every logit is -inf give zeros instead of NaN
    middle: str = "softmax"  # between the products: "softmax", or a plain GEMM chain's "none" or "relu"
    notes: list[str] = field(default_factory=list)


@dataclass
class _Graph:
    index: GraphIndex
    consts: dict[str, np.ndarray]
    weights: frozenset = frozenset()  # the initializers' names

    def producer(self, name: str) -> onnx.NodeProto | None:
        i = self.index.producer.get(name)
        return None if i is None else self.index.nodes[i]

    def only_reader(self, name: str, node: onnx.NodeProto) -> bool:
        """`node` is the one consumer of `name`, which is no graph output."""
        if name in self.index.graph_outputs or name in self.index.used_by_subgraphs:
            return False
        readers = self.index.consumers.get(name, [])
        return len(readers) == 1 and self.index.nodes[readers[0]] is node

    def scalar(self, name: str) -> float | None:
        """A one-element constant of rank 0 or 1 (a higher rank would raise the rank of what it multiplies)."""
        a = self.consts.get(name)
        return float(a.reshape(-1)[0]) if a is not None and a.size == 1 and a.ndim <= 1 else None


def _is(node, op, domain=("", "ai.onnx")) -> bool:
    return node is not None and node.op_type == op and node.domain in domain


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if int(np.prod(t.dims)) <= 16}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute:
            a = n.attribute[0]
            if a.name == "value" and int(np.prod(a.t.dims)) <= 16:
                out[n.output[0]] = numpy_helper.to_array(a.t)
            elif a.name == "value_float":
                out[n.output[0]] = np.array(a.f, np.float32)
    return out


class _Reject(Exception):
    pass


def _unscale(g: _Graph, name: str, chain: list) -> tuple[str, float]:
    """`name` without a Mul or Div by a one-element constant that only this chain reads."""
    node = g.producer(name)
    if (_is(node, "Mul") or _is(node, "Div")) and g.only_reader(name, _reader_of(g, name)):
        for i, other in ((0, 1), (1, 0)) if node.op_type == "Mul" else ((0, 1),):
            c = g.scalar(node.input[other])
            if c is not None:
                chain.append(node)
                return node.input[i], (c if node.op_type == "Mul" else 1.0 / c)
    return name, 1.0


def _reader_of(g: _Graph, name: str):
    readers = g.index.consumers.get(name, [])
    return g.index.nodes[readers[0]] if len(readers) == 1 else None


def _scores(g: _Graph, logits: str, chain: list) -> tuple[str, str, bool, float]:
    """(Q, K or K^T, k_transposed, scale) of the scores tensor `logits` (after the mask was taken off)."""
    scaled, scale = _unscale(g, logits, chain)
    mm = g.producer(scaled)
    if not g.only_reader(scaled, _reader_of(g, scaled)):
        raise _Reject("the scores are read outside the chain")
    if _is(mm, "FusedMatMul", (MS_DOMAIN,)):
        if _attr(mm, "transA", 0) or _attr(mm, "transBatchA", 0) or _attr(mm, "transBatchB", 0):
            raise _Reject("a FusedMatMul with transposed A or batch dims")
        chain.append(mm)
        scale *= float(_attr(mm, "alpha", 1.0))
        return mm.input[0], mm.input[1], not _attr(mm, "transB", 0), scale
    if not _is(mm, "MatMul"):
        raise _Reject(f"the softmax's input is not a MatMul of queries and keys (it is {mm.op_type if mm else 'an input'})")
    chain.append(mm)
    q, qs = _unscale(g, mm.input[0], chain)
    kt, ks = _unscale(g, mm.input[1], chain)
    scale *= qs * ks
    tr = g.producer(kt)
    perm = list(_attr(tr, "perm", [])) if _is(tr, "Transpose") else []
    if len(perm) >= 2 and perm[:-2] == list(range(len(perm) - 2)) and perm[-2:] == [len(perm) - 1, len(perm) - 2] \
            and g.only_reader(kt, _reader_of(g, kt)):
        chain.append(tr)  # K^T by a Transpose of the last two axes: the kernel reads K itself
        return q, tr.input[0], False, scale
    return q, kt, True, scale


def _match(g: _Graph, softmax: onnx.NodeProto, opset: int, ranks: dict | None) -> AttentionChain:
    axis = _attr(softmax, "axis", -1 if opset >= 13 else 1)
    rank = (ranks or {}).get(softmax.input[0])
    if axis != -1 and (rank is None or axis != rank - 1):
        raise _Reject(f"the softmax is over axis {axis}, not the last one")
    chain: list = [softmax]
    probs, guard = softmax.output[0], False
    reader = _reader_of(g, probs)
    readers = [g.index.nodes[i] for i in g.index.consumers.get(probs, [])]
    isnan = next((r for r in readers if _is(r, "IsNaN")), None)
    if isnan is not None:  # Where(IsNaN(p), 0, p): reads p twice
        where = _reader_of(g, isnan.output[0])
        if not (_is(where, "Where") and where.input[0] == isnan.output[0] and where.input[2] == probs
                and g.scalar(where.input[1]) == 0.0 and len(readers) == 2 and where in readers
                and probs not in g.index.graph_outputs and g.only_reader(isnan.output[0], where)):
            raise _Reject("the probabilities are read outside the chain (the score tile would have to be written)")
        chain += [isnan, where]
        probs, guard, reader = where.output[0], True, _reader_of(g, where.output[0])
    if not g.only_reader(probs, reader):
        raise _Reject("the probabilities are read outside the chain (the score tile would have to be written)")
    if not (_is(reader, "MatMul") and reader.input[0] == probs):
        raise _Reject("the probabilities do not feed a MatMul with the values")
    chain.append(reader)
    v, out = reader.input[1], reader.output[0]
    logits = softmax.input[0]
    mask, kind, fill = None, "none", 0.0
    node = g.producer(logits)
    if _is(node, "Add") and g.only_reader(logits, softmax):
        for s, m in ((0, 1), (1, 0)):
            try:
                sub: list = []
                found = _scores(g, node.input[s], sub)
            except _Reject:
                continue
            chain += [node] + sub
            mask, kind = node.input[m], "add"
            break
        else:
            raise _Reject("the softmax's input is an Add, but neither side is a MatMul of queries and keys")
    elif _is(node, "Where") and g.only_reader(logits, softmax) and g.scalar(node.input[2]) is not None:
        sub = []
        found = _scores(g, node.input[1], sub)
        chain += [node] + sub
        mask, kind, fill = node.input[0], "select", g.scalar(node.input[2])
    elif _is(node, "Where") and g.only_reader(logits, softmax) and g.scalar(node.input[1]) is not None:
        sub = []
        found = _scores(g, node.input[2], sub)
        chain += [node] + sub
        mask, kind, fill = node.input[0], "fill", g.scalar(node.input[1])
    else:
        found = _scores(g, logits, chain)
    q, k, k_t, scale = found
    order = {id(n): i for i, n in enumerate(g.index.nodes)}
    chain.sort(key=lambda n: order[id(n)])
    return AttentionChain(chain, q, k, k_t, v, scale, out, mask, kind, fill, guard)


def _match_plain(g: _Graph, second: onnx.NodeProto, ranks: dict | None) -> AttentionChain:
    """MatMul(MatMul(A, B) [-> Relu], D): the chain ending at `second`, or _Reject."""
    product, middle, chain = second.input[0], "none", [second]
    relu = g.producer(product)
    if _is(relu, "Relu") and g.only_reader(product, second):
        product, middle = relu.input[0], "relu"
        chain.append(relu)
    first = g.producer(product)
    if not (_is(first, "MatMul") or _is(first, "FusedMatMul", (MS_DOMAIN,))):
        raise _Reject("not a chain")
    rank = (ranks or {}).get(product)
    if rank is None or rank < 3:
        raise _Reject("a chain of rank 2 or unknown rank (the compute kind's GEMMs)")
    q, k, k_t, scale = _scores(g, product, chain)
    runtime = [not _constant(g, x) for x in (k, second.input[1])]
    if not all(runtime):
        raise _Reject("a chain with constant weights (the compute kind's packed GEMMs)")
    order = {id(n): i for i, n in enumerate(g.index.nodes)}
    chain.sort(key=lambda n: order[id(n)])
    return AttentionChain(chain, q, k, k_t, second.input[1], scale, second.output[0], middle=middle)


def _constant(g: _Graph, name: str) -> bool:
    if name in g.weights:
        return True
    node = g.producer(name)
    return node is not None and node.op_type == "Constant"


def find_attention(model: onnx.ModelProto, ranks: dict[str, int] | None = None,
                   rejected: list | None = None, index: GraphIndex | None = None) -> list[AttentionChain]:
    """The attention chains of `model`'s main graph. `ranks`: tensor ranks where known (for a Softmax whose axis is
    given as a number). Each Softmax that is not part of a chain adds {"nodes", "reason"} to `rejected`. `index`:
    the graph's index when the caller has one."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    g = _Graph(index or GraphIndex(model.graph), _constants(model), frozenset(t.name for t in model.graph.initializer))
    chains, taken = [], set()
    for node in model.graph.node:
        if not _is(node, "Softmax"):
            continue
        try:
            c = _match(g, node, opset, ranks)
        except _Reject as e:
            if rejected is not None:
                rejected.append({"nodes": [node.name or node.output[0]], "reason": str(e)})
            continue
        if any(id(n) in taken for n in c.nodes):
            continue
        taken |= {id(n) for n in c.nodes}
        chains.append(c)
    for node in model.graph.node:  # the plain chains, among what the softmax chains left
        if not _is(node, "MatMul") or id(node) in taken:
            continue
        try:
            c = _match_plain(g, node, ranks)
        except _Reject:
            continue
        if any(id(n) in taken for n in c.nodes):
            continue
        taken |= {id(n) for n in c.nodes}
        chains.append(c)
    return chains
