"""GraphSplit: a topological order that keeps candidates together, and the split of a big graph into subgraphs of
T_GRAPH candidates at most, each searched on its own (OptiFX's Algorithm 1, lines 1-3)."""

from __future__ import annotations

from collections.abc import Sequence


from onnxopt.errors import UsageError
from onnxopt.fusion.afusion.legality import FusionGraph

from .records import Candidate, Leaf

T_GRAPH = 3


# ----------------------------------------------------------------------------------------------------------------
# GraphSplit


def fusion_order(graph: FusionGraph, candidates: Sequence[Candidate] = ()) -> list[int]:
    """A topological order of the node ids that keeps each candidate's members close together.

    Built from the outputs backwards: a node is placed once all its consumers are, and among the ready nodes the
    one in the *partly placed* candidate that saves the most bytes goes first, else the latest in the graph's own
    order. Groups that a model emits far apart (an Inception branch's tail and its sibling) are thereby pulled
    together where that keeps a bigger saving in one piece. Without candidates this is the graph's own order.

    Orders trade candidates against each other: preferring the candidate closest to completion instead keeps
    NASNet's MISO pairs (two pointwise convs meeting at an Add) in one leaf, but each of those overlaps the two
    dw -> pw SISO pairs of the same branches and a 3-ROP leaf cannot hold all four convs; on the roofline the
    SISO pairs save more (NASNet 1.25x vs 1.19x predicted), so the bigger saving wins here.
    """
    g = graph
    n = len(g.nodes)
    succ = [[s for s in g.successors(i) if s > i] for i in range(n)]
    pending = [len(x) for x in succ]
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for s in succ[i]:
            preds[s].append(i)
    member_of: dict[int, list[int]] = {}
    for ci, c in enumerate(candidates):
        for m in c.node_ids:
            member_of.setdefault(m, []).append(ci)
    placed_in = [0] * len(candidates)
    saving = [max(0, c.bytes_saved) for c in candidates]
    size = [len(c.node_ids) for c in candidates]
    ready = [i for i in range(n) if pending[i] == 0]
    backwards: list[int] = []

    def priority(x: int) -> tuple[int, int]:
        # A member of the partly placed candidate that saves the most goes next; a node in no open candidate
        # keeps the graph's order.
        open_saving = max((saving[ci] for ci in member_of.get(x, ()) if 0 < placed_in[ci] < size[ci]), default=-1)
        return (open_saving, x)

    while ready:
        x = max(ready, key=priority)
        ready.remove(x)
        backwards.append(x)
        for ci in member_of.get(x, ()):
            placed_in[ci] += 1
        for p in preds[x]:
            pending[p] -= 1
            if pending[p] == 0:
                ready.append(p)
    if len(backwards) != n:  # a graph that is not a DAG in node order: keep the given order
        return list(range(n))
    return backwards[::-1]


def graph_split(graph: FusionGraph, t_graph: int = T_GRAPH, candidates: Sequence[Candidate] = (),
                cut_weight: str = "savings", order: Sequence[int] | None = None) -> list[Leaf]:
    """Split `order` (default: `fusion_order(graph, candidates)`) recursively at minimum-weight cuts until each
    part holds at most `t_graph` ROPs (see the module docstring for the cut and its weight). Returns the leaves,
    each a contiguous range of the order, in order."""
    if cut_weight not in ("savings", "bytes"):
        raise UsageError(f"cut_weight must be 'savings' or 'bytes', not {cut_weight!r}")
    if t_graph < 1:
        raise UsageError(f"t_graph must be at least 1, not {t_graph}")
    g = graph
    order = list(fusion_order(g, candidates) if order is None else order)
    n = len(order)
    pos = {node: k for k, node in enumerate(order)}
    rop_prefix = [0]
    for node in order:
        rop_prefix.append(rop_prefix[-1] + (1 if g.is_rop(node) else 0))
    # Each tensor: (producer position, consumer positions, bytes).
    tensors = []
    for node in order:
        p = pos[node]
        writes = g.annotations[node].cost.writes
        for t in g.outputs(node):
            cons = sorted(pos[c] for c in g.consumers.get(t, ()) if c in pos and pos[c] > p)
            if cons:
                tensors.append((p, cons, int(writes.get(t, 0))))
    spans = []
    for c in candidates:
        ps = [pos[m] for m in c.node_ids]
        spans.append((min(ps), max(ps), max(0, c.bytes_saved)))

    def leaf(lo: int, hi: int, rops: int) -> Leaf:
        nodes = tuple(order[lo:hi])
        return Leaf(lo, hi, rops, tuple(g.names[x] for x in nodes), nodes)

    leaves: list[Leaf] = []
    stack = [(0, n, tensors, spans)]
    while stack:
        lo, hi, ts, sp = stack.pop()
        rops = rop_prefix[hi] - rop_prefix[lo]
        if rops <= t_graph or hi - lo < 2:
            leaves.append(leaf(lo, hi, rops))
            continue
        size = hi - lo + 1
        crossing = [0] * size  # at index k - lo: the change of the weight of a cut just before position k
        lost = [0] * size
        for p, cons, b in ts:
            last = max((c for c in cons if c < hi), default=None)
            if last is None:
                continue
            crossing[p + 1 - lo] += b
            crossing[last + 1 - lo] -= b
        for a, z, saved in sp:
            lost[a + 1 - lo] += saved
            lost[z + 1 - lo] -= saved
        best, best_key = None, None
        run_cross = run_lost = 0
        for k in range(lo + 1, hi):
            run_cross += crossing[k - lo]
            run_lost += lost[k - lo]
            left = rop_prefix[k] - rop_prefix[lo]
            right = rops - left
            if left < 1 or right < 1:
                continue
            imbalance = abs(left - right)
            key = (run_lost, imbalance, run_cross, k) if cut_weight == "savings" else (run_cross, imbalance, k)
            if best_key is None or key < best_key:
                best, best_key = k, key
        if best is None:  # cannot happen with more than t_graph >= 1 ROPs; never loop forever
            leaves.append(leaf(lo, hi, rops))
            continue
        k = best
        left_ts = [(p, [c for c in cons if c < k], b) for p, cons, b in ts if p < k]
        right_ts = [(p, cons, b) for p, cons, b in ts if p >= k]
        stack.append((k, hi, right_ts, [x for x in sp if x[0] >= k]))
        stack.append((lo, k, left_ts, [x for x in sp if x[1] < k]))
    leaves.sort(key=lambda lf: lf.start)
    return leaves
