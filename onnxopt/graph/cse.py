"""Common subexpression elimination: nodes that compute the same thing from the same inputs become one.

Exporters repeat work that a graph can share: NASNet's cells apply a Relu to a cell input once per branch (five
identical Relu nodes of one tensor in its stem), and each copy is a separate pass over memory. Worse for fusion,
every copy is one more reader of the tensor: a convolution whose epilogue would take the Relu gets five outputs
instead of two, over the glue's limit of four, and is left to onnxruntime.

Two nodes are the same when their domain, op type, inputs (in order) and attributes are equal, and the op is
deterministic and has no subgraph. The later one goes; its readers read the earlier one's outputs. A node whose
output is a graph output, or a name a subgraph reads, is kept (renaming those would change the model's interface
or need the subgraph rewritten). Merging can make later nodes equal, so it runs until nothing changes.
"""

from __future__ import annotations

import onnx

from .fold import (
    NONDETERMINISTIC,
    _has_subgraph,
    names_used_by_subgraphs,
    replace_nodes,
)


def _signature(node: onnx.NodeProto) -> tuple:
    attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
    return node.domain or "", node.op_type, tuple(node.input), attrs, len(node.output)


def eliminate_common_subexpressions(model: onnx.ModelProto) -> int:
    """Merge duplicate nodes of the main graph in place; returns the number of nodes removed."""
    graph = model.graph
    keep_names = {o.name for o in graph.output} | names_used_by_subgraphs(graph)
    removed = 0
    while True:
        first: dict[tuple, onnx.NodeProto] = {}
        renames: dict[str, str] = {}
        drop: set[int] = set()
        for i, node in enumerate(graph.node):
            if node.op_type in NONDETERMINISTIC or _has_subgraph(node) or not node.output:
                continue
            # Inputs renamed by a merge earlier in this pass (the graph is in topological order).
            for j, x in enumerate(node.input):
                if x in renames:
                    node.input[j] = renames[x]
            sig = _signature(node)
            kept = first.get(sig)
            if kept is None:
                first[sig] = node
                continue
            if any(o in keep_names for o in node.output if o):
                continue
            for mine, theirs in zip(node.output, kept.output):
                if mine:
                    if not theirs:  # the kept node does not produce this optional output
                        break
                    renames[mine] = theirs
            else:
                drop.add(i)
                continue
            for o in node.output:  # an output the kept node lacks: keep this node after all
                renames.pop(o, None)
        if not drop:
            return removed
        for node in graph.node:
            for j, x in enumerate(node.input):
                if x in renames:
                    node.input[j] = renames[x]
        nodes = [n for i, n in enumerate(graph.node) if i not in drop]
        replace_nodes(graph, nodes, {o for i in drop for o in graph.node[i].output})
        removed += len(drop)
