"""An elementwise op of one input that is a Concat's only reader moves in front of the Concat, once per input.

NASNet's cells end in a Concat whose only reader (after graph/cse.py merged the copies) is the Relu the next
cells start with:

    c0 = Conv -> Add ... c4 = Conv -> Add;  Concat(left, c0, .., c4) -> Relu -> Conv 1x1, depthwise convs

The Relu is a pass over the whole tensor that no fusion takes: a convolution has no prologue, and a Concat is
not elementwise. Applied to each input instead, Relu(Concat(x_1..x_n)) = Concat(Relu(x_1)..Relu(x_n)), and each
Relu(x_j) becomes part of the kernel that computes x_j (an epilogue after the Add), so the pass disappears. An
input that other nodes also read gets its own Relu node, which the producer's kernel writes as a second output;
the same op of the same tensor is merged with one that already exists (graph/cse.py runs after this).

Moved ops: those that map every element on its own with no other tensor input (Relu, LeakyRelu, Sigmoid, Tanh,
..., and Clip whose bounds are constants). The numbers are the same: the op sees the same values either way.
Not moved: when the Concat's output is a graph output or read by anything else, or when an input of the Concat
is a graph input or a constant (there is no kernel to take the op, so it would only add a node).
"""

from __future__ import annotations

import onnx
from onnx import helper

from .fold import names_used_by_subgraphs, replace_nodes

UNARY_OPS = {"Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus",
             "Softsign", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Erf",
             "Gelu", "Mish", "Clip"}


def _movable(node: onnx.NodeProto, constants: set[str]) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in UNARY_OPS or len(node.output) != 1:
        return False
    # Clip's optional bounds must be constants: they are read as they are by every copy
    return all(x == "" or x in constants for x in node.input[1:])


def push_unary_through_concats(model: onnx.ModelProto) -> int:
    """Rewrite in place (see the module docstring); returns the number of Concats rewritten."""
    graph = model.graph
    constants = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    graph_inputs = {i.name for i in graph.input}
    outputs = {o.name for o in graph.output} | names_used_by_subgraphs(graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in set(n.input):
            readers.setdefault(x, []).append(n)
    produced = {o for n in graph.node for o in n.output}
    taken = produced | set(constants) | graph_inputs | {t.name for t in graph.initializer}
    rewritten = 0
    replace: dict[int, list[onnx.NodeProto]] = {}  # id of a Concat -> the nodes that take its place
    gone: set[int] = set()
    for concat in graph.node:
        if concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") or concat.output[0] in outputs:
            continue
        users = readers.get(concat.output[0], [])
        if len(users) != 1 or not _movable(users[0], constants) or users[0].input[0] != concat.output[0]:
            continue
        if any(x not in produced or x in graph_inputs for x in concat.input):
            continue
        op = users[0]
        moved, new_inputs = {}, []
        for x in concat.input:
            if x not in moved:
                name = f"{x}__{op.op_type.lower()}"
                while name in taken:
                    name += "_"
                taken.add(name)
                copy = onnx.NodeProto()
                copy.CopyFrom(op)
                copy.name = f"{op.name or op.op_type}/{x}"
                copy.input[0] = x
                copy.output[0] = name
                moved[x] = copy
            new_inputs.append(moved[x].output[0])
        new_concat = helper.make_node("Concat", new_inputs, [op.output[0]], name=concat.name or "",
                                      axis=next(a.i for a in concat.attribute if a.name == "axis"))
        replace[id(concat)] = list(moved.values()) + [new_concat]
        gone.add(id(op))
        rewritten += 1
    if not rewritten:
        return 0
    nodes = []
    for n in graph.node:
        if id(n) in gone:
            continue
        nodes.extend(replace.get(id(n), [n]))
    replace_nodes(graph, nodes, {c.output[0] for c in graph.node if id(c) in replace})  # the old Concats' outputs
    return rewritten
