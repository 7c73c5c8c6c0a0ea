"""Producer/consumer index of a graph and the reachability check that keeps fused regions legal.

Contracting a set of nodes into one node is legal only if no path leaves the set and comes back into it (that would
make the contracted graph cyclic).
"""

from __future__ import annotations

from collections import defaultdict

import onnx

from onnxopt.graph.fold import names_used_by_subgraphs, outer_names_of


class GraphIndex:
    def __init__(self, graph: onnx.GraphProto):
        self.nodes = list(graph.node)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
            # A node whose If/Loop/Scan body reads a tensor consumes it as much as an input does.
            for x in set(x for x in n.input if x) | outer_names_of(n):
                self.consumers[x].append(i)
        self.graph_outputs = {o.name for o in graph.output}
        self.used_by_subgraphs = names_used_by_subgraphs(graph)
        # onnx requires nodes in topological order, so the index is a topological rank.

    def successors(self, i: int) -> set[int]:
        out = set()
        for o in self.nodes[i].output:
            out.update(self.consumers.get(o, ()))
        return out

    def escapes_and_returns(self, group: set[int], outside: set[int] | None = None, hi: int | None = None) -> bool:
        """True if some path goes from the group to a node outside it and back into the group. `outside`: the
        group's successors outside it and `hi` its last node, when the caller keeps them (growing a group one node
        at a time, recomputing them is quadratic)."""
        hi = max(group) if hi is None else hi
        if outside is None:
            outside = {s for g in group for s in self.successors(g) if s not in group}
        frontier = [s for s in outside if s < hi]
        seen = set(frontier)
        while frontier:
            n = frontier.pop()
            for s in self.successors(n):
                if s in group:
                    return True
                if s < hi and s not in seen:
                    seen.add(s)
                    frontier.append(s)
        return False

    def is_used_outside(self, name: str, group: set[int]) -> bool:
        if name in self.graph_outputs or name in self.used_by_subgraphs:
            return True
        return any(c not in group for c in self.consumers.get(name, ()))
