"""OptiFX Algorithm 2: backtracking search over fusion plans, in the style of TASO (OptiFX §4.2).

A *plan* is a set of candidates (from Algorithm 1) that share no node and keep the graph acyclic when each one is
contracted to a single node. Its cost is the sum over its kernels, each candidate plus each node it leaves alone,
of a per-kernel cost from a `CostSource` (measured latency in the pipeline; the roofline estimate by default).

The search is best-first: a min-heap of plans ordered by (cost, sorted candidate ids) starts with the empty plan
(no fusion). Popping a plan tries every compatible candidate; a plan that beats the best becomes the best and is
queued (TASO queues it; the paper's printed pseudo-code forgets to), one within `theta_ex` (1.1) of the best is
queued. A visited set on plans keeps a plan from being expanded twice, and a kernel cache keyed on the candidate's
signature (`Candidate.key`) costs identical sub-graphs (ResNet's repeated blocks) once, since the cost source may
compile and time a kernel. The search stops when the queue empties, after `max_expansions`, or when `budget_s`
seconds have passed (checked between expansions and before every uncached cost); it then returns the best so far.
Everything iterates over sorted lists, so the same inputs give the same result.

Two sound speedups keep DenseNet- and NASNet-sized candidate sets to seconds:

* **Independent components.** Two candidates *interact* if they share a node or can lie on a common cycle after
  contraction. With R(a, b) = "a node of a reaches a node of b", contraction creates a cycle exactly when R has a
  cycle over the plan's candidates (each candidate is convex by itself), so cycles stay inside one strongly
  connected component of R. Candidates are grouped by shared nodes and by R's SCCs; an R edge a -> b needs
  min pos(a) < max pos(b), so an SCC's position intervals overlap in a chain and the SCCs are found inside groups
  of overlapping intervals only. Costs are additive and constraints never cross groups, so the best plan is the
  union of each group's best plan; each group is searched on its own, with `theta_ex` applied to the whole
  model's cost (the paper's Cost(G) is the model's).
* **Bounding** (`bound=True`). A plan is not queued when even the most it could still gain could not beat the
  best: each node it leaves free counted at the largest gain per node among the compatible candidates of positive
  gain that hold it (disjoint candidates gain the sum of their nodes' shares, so no descendant gains more). Such a
  plan's descendants are just as hopeless, so this never changes which plans become best; it only saves
  expansions.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from onnxopt.errors import UsageError
from onnxopt.fusion.afusion.legality import FusionGraph

from .candidates import Candidate, CandidateResult, node_key

THETA_EX = 1.1


@dataclass(frozen=True)
class NodeKernel:
    """A node left unfused: it runs as its own kernel. `estimate` is its roofline time in seconds."""

    name: str
    node_id: int
    key: str
    estimate: float


Kernel = Candidate | NodeKernel


class CostSource(Protocol):
    """What the search asks for a kernel's cost: `cost(kernel) -> seconds`, where `kernel` is a `Candidate` or a
    `NodeKernel` (both have `key`, the sub-graph signature, and `estimate`, the roofline seconds)."""

    def cost(self, kernel: Kernel) -> float: ...


class RooflineCostSource:
    """Measured seconds where `measured` (key -> seconds) has the kernel, else its roofline estimate. The keys
    that were estimated are recorded in `estimated` (in the order first asked)."""

    def __init__(self, measured: Mapping[str, float] | None = None):
        self.measured = dict(measured or {})
        self.estimated: list[str] = []
        self._estimated: set[str] = set()

    def cost(self, kernel: Kernel) -> float:
        if kernel.key in self.measured:
            return float(self.measured[kernel.key])
        if kernel.key not in self._estimated:
            self._estimated.add(kernel.key)
            self.estimated.append(kernel.key)
        return float(kernel.estimate)


@dataclass
class SearchResult:
    plan: list[Candidate]  # the best plan's candidates in topological order
    best_cost: float
    baseline_cost: float  # no fusion: every node its own kernel
    history: list[float]  # the best cost after each expansion (never rises)
    expansions: int
    plans_visited: int
    cache_hits: int
    cache_misses: int
    seconds: float
    stopped_by_budget: bool
    stopped_by_expansions: bool
    components: int  # independent groups searched
    largest_component: int  # candidates in the biggest group
    estimated: list[str] = field(default_factory=list)  # kernel keys costed by their roofline estimate

    @property
    def plan_ids(self) -> tuple[str, ...]:
        return tuple(sorted(c.id for c in self.plan))

    @property
    def speedup(self) -> float:
        return self.baseline_cost / self.best_cost if self.best_cost else math.inf

    def summary(self) -> str:
        stop = " (stopped by the budget)" if self.stopped_by_budget else \
            " (stopped at max_expansions)" if self.stopped_by_expansions else ""
        return (f"{len(self.plan)} fused kernels, cost {self.best_cost * 1e6:.1f} us vs {self.baseline_cost * 1e6:.1f} "
                f"us unfused ({self.speedup:.3f}x); {self.expansions} expansions, {self.plans_visited} plans, "
                f"{self.components} groups (largest {self.largest_component}), cache {self.cache_hits} hits / "
                f"{self.cache_misses} misses, {self.seconds:.2f} s{stop}")


class _OutOfTime(Exception):
    pass


def node_kernels(graph: FusionGraph) -> list[NodeKernel]:
    """Every node of the graph as its own kernel, with its signature and roofline time."""
    return [NodeKernel(graph.names[i], i, node_key(graph, i), float(graph.annotations[i].seconds or 0.0))
            for i in range(len(graph.nodes))]


def _components(graph: FusionGraph, cands: Sequence[Candidate], masks: Sequence[int],
                decompose: bool) -> list[list[int]]:
    """Groups of candidate indices that interact (see the module docstring); each sorted, groups in order."""
    k = len(cands)
    if not decompose:
        return [list(range(k))] if k else []
    parent = list(range(k))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    # Shared nodes.
    by_node: dict[int, int] = {}
    for ci, c in enumerate(cands):
        for n in c.node_ids:
            if n in by_node:
                union(by_node[n], ci)
            else:
                by_node[n] = ci
    # Cycles: SCCs of R inside groups of overlapping position intervals.
    order = sorted(range(k), key=lambda ci: (cands[ci].node_ids[0], ci))
    groups: list[list[int]] = []
    end = -1
    for ci in order:
        c = cands[ci]
        if not groups or c.node_ids[0] > end:
            groups.append([])
            end = c.node_ids[-1]
        groups[-1].append(ci)
        end = max(end, c.node_ids[-1])
    out = _reach_out(graph, cands, masks)
    for grp in groups:
        if len(grp) < 2:
            continue
        succ = {a: [b for b in grp if b != a and out[a] & masks[b]] for a in grp}
        for scc in _sccs(grp, succ):
            for x in scc[1:]:
                union(scc[0], x)
    comps: dict[int, list[int]] = {}
    for ci in range(k):
        comps.setdefault(find(ci), []).append(ci)
    return sorted((sorted(v) for v in comps.values()), key=lambda v: v[0])


def _reach_out(graph: FusionGraph, cands: Sequence[Candidate], masks: Sequence[int]) -> list[int]:
    """For each candidate, the nodes outside it that its members reach."""
    out = []
    for c, m in zip(cands, masks):
        r = 0
        for n in c.node_ids:
            r |= graph.descendants(n)
        out.append(r & ~m)
    return out


def _sccs(nodes: Sequence[int], succ: Mapping[int, Sequence[int]]) -> list[list[int]]:
    """Strongly connected components (iterative Tarjan), deterministic for sorted inputs."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    result: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            children = succ[v]
            while i < len(children):
                w = children[i]
                i += 1
                if w not in index:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                result.append(sorted(scc))
            if work:
                parent_v = work[-1][0]
                low[parent_v] = min(low[parent_v], low[v])
    return result


def most_gain_left(positive: Sequence[tuple[int, Sequence[int], float]], mask: int) -> float:
    """An upper bound on what a plan covering the nodes of `mask` can still gain, from `positive`: (mask, nodes,
    gain per node) of each candidate of positive gain. Each free node counts at most the largest gain per node of a
    compatible candidate holding it. Disjoint candidates gain the sum of their nodes' shares, so no plan below can
    gain more; summing whole gains instead counted every overlap (NASNet-A's measured search: 284 thousand
    expansions, 5.9 s, against 65 thousand, 2.7 s). A candidate already in the plan is not compatible: its nodes
    are in `mask`."""
    most: dict[int, float] = {}
    for m, nodes, share in positive:
        if not m & mask:
            for n in nodes:
                if share > most.get(n, 0.0):
                    most[n] = share
    return math.fsum(most.values())


class _Search:
    """The state one search shares across components: the kernel cache, the gains, the best plan of each component,
    the counters and the clock."""

    def __init__(self, graph: FusionGraph, cands: list[Candidate], cost_source: CostSource, theta_ex: float,
                 deadline: float, max_expansions: int, bound: bool):
        self.graph, self.cands, self.cost_source = graph, cands, cost_source
        self.theta_ex, self.deadline, self.max_expansions, self.bound = theta_ex, deadline, max_expansions, bound
        self.masks = [FusionGraph.mask(c.node_ids) for c in cands]
        self.reach = _reach_out(graph, cands, self.masks)
        self.cache: dict[str, float] = {}
        self.hits = self.misses = 0
        self.estimated: list[str] = []
        self.out_of_time = False
        self.stopped_by_expansions = False
        self.expansions = 0
        self.visited = 0
        self.history: list[float] = []
        self.gains: dict[int, float] = {}
        self.best_gain: dict[int, float] = {}  # component number -> the best gain found in it
        self.best_plans: dict[int, tuple[int, ...]] = {}
        self.node_cost: list[float] = []
        self.baseline = 0.0

    # ------------------------------------------------------------------ costs
    def cost_of(self, kernel: Kernel) -> float:
        if kernel.key in self.cache:
            self.hits += 1
            return self.cache[kernel.key]
        if time.monotonic() >= self.deadline:
            self.out_of_time = True
            raise _OutOfTime
        self.misses += 1
        value = float(self.cost_source.cost(kernel))
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"the cost source returned {value!r} for {kernel.key}; costs are seconds >= 0")
        self.cache[kernel.key] = value
        return value

    def cost_nodes(self) -> None:
        """The baseline: every node its own kernel. Once the budget is out, a node takes its roofline estimate."""
        for k in node_kernels(self.graph):
            try:
                self.node_cost.append(self.cost_of(k))
            except _OutOfTime:
                self.node_cost.append(k.estimate)
                if k.key not in self.estimated:
                    self.estimated.append(k.key)
        self.baseline = math.fsum(self.node_cost)

    def gain(self, ci: int) -> float:
        """What candidate ci saves over running its members unfused (may ask the cost source)."""
        if ci not in self.gains:
            c = self.cands[ci]
            self.gains[ci] = math.fsum(self.node_cost[n] for n in c.node_ids) - self.cost_of(c)
        return self.gains[ci]

    def global_best(self) -> float:
        return self.baseline - math.fsum(self.best_gain.values())

    # ------------------------------------------------------------------ one component
    def search_component(self, number: int, comp: list[int]) -> None:
        cands, masks, reach = self.cands, self.masks, self.reach
        succ = {a: [b for b in comp if b != a and reach[a] & masks[b]] for a in comp}  # R inside the component
        self.best_gain[number] = 0.0
        self.best_plans[number] = ()
        other = self.global_best()  # the model's cost with this component unfused

        def makes_cycle(plan: frozenset[int], c: int) -> bool:
            # Walk R from c through the plan's candidates; reaching one that reaches back to c closes a cycle.
            seen: set[int] = set()
            frontier = [d for d in succ[c] if d in plan]
            while frontier:
                d = frontier.pop()
                if d in seen:
                    continue
                seen.add(d)
                if c in succ[d]:
                    return True
                frontier.extend(e for e in succ[d] if e in plan and e not in seen)
            return False

        # (mask, nodes, gain per node) of the candidates that gain: bounding only
        positive: list[tuple[int, tuple[int, ...], float]] = []

        empty: frozenset[int] = frozenset()
        heap = [(other, (), empty, 0)]
        visited = {empty}
        best = other
        model_best = self.global_best()  # the history's value, recomputed only when this component's best changes
        try:
            if self.bound:  # bounding needs every gain; the first expansion would cost them all anyway
                for ci in comp:
                    self.gain(ci)
                positive.extend((masks[ci], cands[ci].node_ids, self.gains[ci] / len(cands[ci].node_ids))
                                for ci in comp if self.gains[ci] > 0)
            while heap:
                if self.expansions >= self.max_expansions:
                    self.stopped_by_expansions = True
                    break
                if time.monotonic() >= self.deadline:
                    self.out_of_time = True
                    break
                cost, _, plan, mask = heapq.heappop(heap)
                self.expansions += 1
                for ci in comp:
                    if ci in plan or masks[ci] & mask:
                        continue
                    new = plan | {ci}
                    # A plan reached before passed the cycle walk then: skip it first, the walk is the costly test
                    # (NASNet-A's measured search: 2.2 million walks, 5 of its 15 s).
                    if new in visited or makes_cycle(plan, ci):
                        continue
                    visited.add(new)
                    new_cost = cost - self.gain(ci)
                    new_mask = mask | masks[ci]
                    if new_cost < best:  # the new best is queued too (TASO), not only the near-best
                        best = new_cost
                        self.best_gain[number] = other - new_cost
                        self.best_plans[number] = tuple(sorted(new))
                        model_best = self.global_best()
                    elif not new_cost < self.theta_ex * best:
                        continue
                    if self.bound and new_cost - most_gain_left(positive, new_mask) >= best:
                        continue  # nothing below it can beat the best
                    heapq.heappush(heap, (new_cost, tuple(sorted(cands[x].id for x in new)), new, new_mask))
                self.history.append(model_best)
        except _OutOfTime:
            pass
        self.visited += len(visited)


def backtrack_search(source: CandidateResult | FusionGraph, candidates: Iterable[Candidate] | None = None,
                     cost_source: CostSource | None = None, *, theta_ex: float = THETA_EX, budget_s: float = 60.0,
                     max_expansions: int = 1_000_000, decompose: bool = True, bound: bool = True) -> SearchResult:
    """Search the best fusion plan over `candidates` (default: `source.candidates` of a CandidateResult).

    `source`: the CandidateResult of `generate_candidates`, or the FusionGraph the candidates were made on.
    `cost_source`: default `RooflineCostSource()` (roofline estimates). `theta_ex`: queue plans within this
    factor of the best (math.inf explores every valid plan). `budget_s`: wall-clock budget in seconds.
    `decompose` and `bound` switch the two speedups of the module docstring (for testing that they change nothing).
    """
    start = time.monotonic()
    if isinstance(source, CandidateResult):
        graph = source.graph
        cands_in = list(source.candidates if candidates is None else candidates)
    elif isinstance(source, FusionGraph):
        if candidates is None:
            raise UsageError("backtrack_search on a FusionGraph needs the candidates")
        graph, cands_in = source, list(candidates)
    else:
        raise UsageError(f"backtrack_search needs a CandidateResult or a FusionGraph, not {type(source).__name__}")
    if theta_ex < 1.0:
        raise UsageError(f"theta_ex must be at least 1 (it lets plans worse than the best be explored), not {theta_ex}")
    cost_source = cost_source or RooflineCostSource()

    # Candidates in a fixed order, checked against the graph.
    unique: dict[str, Candidate] = {}
    for c in cands_in:
        for i, name in zip(c.node_ids, c.members):
            if i >= len(graph.names) or graph.names[i] != name:
                raise UsageError(f"candidate {c.id} does not belong to this graph (node {name!r})")
        unique.setdefault(c.id, c)
    cands = sorted(unique.values(), key=lambda c: (c.node_ids, c.id))

    search = _Search(graph, cands, cost_source, theta_ex, start + budget_s, max_expansions, bound)
    search.cost_nodes()
    comps = _components(graph, cands, search.masks, decompose)
    for number, comp in enumerate(comps):
        if search.out_of_time or search.stopped_by_expansions:
            break
        search.search_component(number, comp)

    chosen = sorted((ci for p in search.best_plans.values() for ci in p), key=lambda ci: cands[ci].node_ids)
    plan = [cands[ci] for ci in chosen]
    covered = {n for c in plan for n in c.node_ids}
    node_cost = search.node_cost
    best_cost = math.fsum([*(search.cache.get(c.key, c.estimate) for c in plan),
                           *(node_cost[i] for i in range(len(node_cost)) if i not in covered)])
    estimated = list(search.estimated)
    estimated += [k for k in getattr(cost_source, "estimated", ()) if k not in estimated]
    return SearchResult(
        plan=plan, best_cost=best_cost, baseline_cost=search.baseline, history=search.history,
        expansions=search.expansions, plans_visited=search.visited, cache_hits=search.hits,
        cache_misses=search.misses, seconds=time.monotonic() - start, stopped_by_budget=search.out_of_time,
        stopped_by_expansions=search.stopped_by_expansions, components=len(comps),
        largest_component=max((len(c) for c in comps), default=0), estimated=estimated)


def plan_cost(graph: FusionGraph, plan: Iterable[Candidate], costs: Mapping[str, float]) -> float:
    """The cost of a plan from a table of kernel costs (key -> seconds): each candidate's, plus each node it
    leaves alone. Used to check the search against brute force."""
    plan = list(plan)
    covered = {n for c in plan for n in c.node_ids}
    kernels = node_kernels(graph)
    return math.fsum([*(costs[c.key] for c in plan),
                      *(costs[k.key] for k in kernels if k.node_id not in covered)])


def valid_plan(graph: FusionGraph, plan: Sequence[Candidate]) -> bool:
    """No node in two candidates, and the graph stays acyclic with every candidate contracted to one node."""
    seen: set[int] = set()
    for c in plan:
        if seen & set(c.node_ids):
            return False
        seen |= set(c.node_ids)
    # Contract and look for a cycle (Kahn's algorithm on the contracted graph).
    group = {n: f"c{k}" for k, c in enumerate(plan) for n in c.node_ids}
    label = [group.get(i, f"n{i}") for i in range(len(graph.nodes))]
    edges: dict[str, set[str]] = {x: set() for x in label}
    for i in range(len(graph.nodes)):
        for s in graph.successors(i):
            if label[s] != label[i]:
                edges[label[i]].add(label[s])
    indeg = {x: 0 for x in edges}
    for targets in edges.values():
        for y in targets:
            indeg[y] += 1
    ready = [x for x, d in indeg.items() if d == 0]
    done = 0
    while ready:
        x = ready.pop()
        done += 1
        for y in edges[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    return done == len(edges)


__all__ = [
    "THETA_EX", "CostSource", "NodeKernel", "RooflineCostSource", "SearchResult", "backtrack_search",
    "node_kernels", "plan_cost", "valid_plan",
]
