"""A chain of Transposes and Reshapes that only add or drop dims of size 1 becomes one Transpose (and a Reshape
where the ranks differ).

DistilBERT's export (torch's dynamo exporter) makes each layer's K^T in two moves, where BERT's makes it in one:

    view [1, 128, 12, 64] -> Transpose(0, 2, 1, 3) -> Reshape [12, 128, 64] -> Transpose(0, 2, 1)
                          -> Reshape [1, 12, 64, 128]                          (BERT: Transpose(0, 2, 3, 1))

The attention kind reads a head split's Transpose in place (kinds/attention), but not this chain, so onnxruntime
ran both Transposes of each of the six layers (80 us each at 1 x 128, single-threaded). A Reshape that only adds or
drops dims of 1 keeps the other dims in their order, so it moves no element: the chain is one permutation of the
input's dims of size > 1, which is what the one Transpose does. The numbers are the same (a Transpose copies).

Only chains with at least two Transposes, of tensors whose shapes are static, each tensor inside the chain read by
the next node alone (not a graph output, not read by a subgraph).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold import names_used_by_subgraphs, replace_nodes


def _perm(node: onnx.NodeProto, rank: int) -> list[int]:
    given = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return given if given is not None else list(range(rank))[::-1]


def _sizes(shape) -> list[int]:
    return [d for d in shape if d != 1]


def merge_transpose_chains(model: onnx.ModelProto, static: dict[str, list[int]]) -> int:
    """Rewrite in place (see the module docstring); returns the number of chains merged."""
    graph = model.graph
    readers: dict[str, list] = {}
    for n in graph.node:
        for x in n.input:
            if x:
                readers.setdefault(x, []).append(n)
    keep_out = {o.name for o in graph.output} | names_used_by_subgraphs(graph)

    def plain(n):
        return n.domain in ("", "ai.onnx") and n.op_type in ("Transpose", "Reshape")

    def only_reader(t):
        r = readers.get(t, [])
        return r[0] if len(r) == 1 and t not in keep_out and plain(r[0]) else None

    def unit_reshape(n) -> bool:  # a Reshape whose dims of size > 1 are its input's, in order
        x, y = static.get(n.input[0]), static.get(n.output[0])
        return x is not None and y is not None and _sizes(x) == _sizes(y)

    starts = [n for n in graph.node if plain(n) and n.op_type == "Transpose"]
    inside: set[int] = set()
    replaced: dict[int, list] = {}
    merged = 0
    for first in starts:
        if id(first) in inside or static.get(first.input[0]) is None:
            continue
        chain, node = [first], first
        while True:
            nxt = only_reader(node.output[0])
            if nxt is None or static.get(nxt.output[0]) is None or id(nxt) in inside:
                break
            if nxt.op_type == "Reshape" and not unit_reshape(nxt):
                break
            chain.append(nxt)
            node = nxt
        if sum(n.op_type == "Transpose" for n in chain) < 2:
            continue
        src = static[first.input[0]]
        # which dim of the input each dim of size > 1 of the current tensor is, followed through the chain
        where = [a for a, d in enumerate(src) if d != 1]
        for n in chain:
            shape_in, shape_out = static[n.input[0]], static[n.output[0]]
            if n.op_type == "Transpose":
                perm = _perm(n, len(shape_in))
                of_pos = dict(zip([a for a, d in enumerate(shape_in) if d != 1], where))
                where = [of_pos[perm[i]] for i, d in enumerate(shape_out) if d != 1]
        out_name = chain[-1].output[0]
        final = static[out_name]
        ones_src = [a for a, d in enumerate(src) if d == 1]
        tag = f"{out_name}__merged_transpose"
        if len(final) == len(src):  # the dims of 1 go where the result has its dims of 1, in order
            it_ones, it_where = iter(ones_src), iter(where)
            perm = [next(it_ones) if d == 1 else next(it_where) for d in final]
            new = [helper.make_node("Transpose", [first.input[0]], [out_name], name=first.name or tag, perm=perm)]
        else:
            perm = where + ones_src
            shape = numpy_helper.from_array(np.array(final, np.int64), f"{tag}_shape")
            graph.initializer.append(shape)
            new = [helper.make_node("Transpose", [first.input[0]], [tag], name=first.name or tag, perm=perm),
                   helper.make_node("Reshape", [tag, shape.name], [out_name], name=f"{tag}_reshape")]
        inside.update(id(n) for n in chain)
        replaced[id(chain[-1])] = new
        merged += 1
    if not merged:
        return 0
    nodes, gone = [], set()
    for n in graph.node:
        if id(n) in replaced:
            nodes.extend(replaced[id(n)])
        elif id(n) in inside:
            gone.update(n.output)
        else:
            nodes.append(n)
    replace_nodes(graph, nodes, gone)
    return merged
