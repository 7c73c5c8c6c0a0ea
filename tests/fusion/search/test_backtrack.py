"""OptiFX Algorithm 2, the backtracking search (OptiFX §4). The cost tables here are synthetic:
the search is what is tested, and it must find what brute force finds."""

from __future__ import annotations

import hashlib
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.models import build_model
from onnxopt.models.conv_shapes import optifx_model

from onnxopt.errors import UsageError
from onnxopt.fusion.afusion import FusionGraph
from onnxopt.fusion.search import (
    Candidate,
    RooflineCostSource,
    backtrack_search,
    generate_candidates,
    node_kernels,
    plan_cost,
    valid_plan,
)
from onnxopt.hardware.presets import get_preset
from search_nets import Net

A6000 = get_preset("rtx-6000-ada")


def toy_model():
    """A conv chain, a fire (SIMO + horizontal) and two 1x1 siblings meeting at an Add (MISO): 14 candidates that
    overlap in many ways, 350 valid plans."""
    n = Net()
    h = n.op("Relu", "r1", [n.conv("c1", n.input("x", [1, 16, 28, 28]), 16, 32)])
    h = n.op("Relu", "r2", [n.conv("c2", h, 32, 32, 3)])
    h = n.fire("f", h, 32, 8, 16)
    y = n.op("Relu", "mr", [n.op("Add", "add", [n.conv("m1", h, 32, 32), n.conv("m2", h, 32, 32)])])
    return n.model(y)


def fires_model(count=3):
    n = Net()
    h, c = n.input("x", [1, 32, 28, 28]), 32
    for i in range(count):
        h, c = n.fire(f"fire{i}", h, c, 8, 16), 32
    return n.model(h)


@pytest.fixture(scope="module")
def toy():
    return generate_candidates(toy_model(), A6000)


class TableCost:
    """Seconds per kernel key from a table; counts the calls."""

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def cost(self, kernel):
        self.calls += 1
        return self.table[kernel.key]


class HashCost:
    """A deterministic pseudo-random cost per key, 1-10 us for nodes; fused kernels cost 40-110% of their members."""

    def __init__(self, graph):
        self.nodes = {k.key: k for k in node_kernels(graph)}

    @staticmethod
    def unit(key: str) -> float:
        return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    def cost(self, kernel):
        if isinstance(kernel, Candidate):
            members = sum(1e-6 + 9e-6 * self.unit(f"node:{kernel.members[i]}") for i in range(len(kernel.members)))
            return members * (0.4 + 0.7 * self.unit(kernel.key))
        return 1e-6 + 9e-6 * self.unit(f"node:{kernel.name}")


def all_keys(graph, cands):
    return sorted({k.key for k in node_kernels(graph)} | {c.key for c in cands})


def valid_plans(graph, cands):
    """Every valid plan (brute force: include/exclude each candidate, refusing overlaps and cycles)."""
    plans = []

    def rec(i, chosen, used):
        if i == len(cands):
            plans.append(list(chosen))
            return
        rec(i + 1, chosen, used)
        c = cands[i]
        if not used & set(c.node_ids) and valid_plan(graph, chosen + [c]):
            rec(i + 1, chosen + [c], used | set(c.node_ids))

    rec(0, [], set())
    return plans


def table_plan_cost(kernels, plan, table):
    covered = {n for c in plan for n in c.node_ids}
    return math.fsum([*(table[c.key] for c in plan), *(table[k.key] for k in kernels if k.node_id not in covered)])


def test_deterministic(toy):
    runs = [backtrack_search(toy, toy.enumerated, HashCost(toy.graph)) for _ in range(2)]
    a, b = runs
    assert a.plan_ids == b.plan_ids and a.plan == b.plan
    assert a.best_cost == b.best_cost and a.history == b.history
    assert (a.expansions, a.plans_visited, a.cache_hits, a.cache_misses) == \
           (b.expansions, b.plans_visited, b.cache_hits, b.cache_misses)
    assert a.best_cost < a.baseline_cost
    assert [c.node_ids[0] for c in a.plan] == sorted(c.node_ids[0] for c in a.plan)  # topological order


@pytest.fixture(scope="module")
def toy_plans(toy):
    return valid_plans(toy.graph, toy.enumerated)


def test_brute_force_has_the_plans(toy, toy_plans):
    assert len(toy_plans) == 350
    assert all(valid_plan(toy.graph, p) for p in toy_plans)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_costs_history_never_rises_and_matches_brute_force(toy, toy_plans, data):
    g, cands = toy.graph, toy.enumerated
    keys = all_keys(g, cands)
    values = data.draw(st.lists(st.floats(1e-6, 1e-4), min_size=len(keys), max_size=len(keys)))
    table = dict(zip(keys, values))
    kernels = node_kernels(g)
    optimum = min(table_plan_cost(kernels, p, table) for p in toy_plans)
    for theta_ex in (1.1, math.inf):
        r = backtrack_search(toy, cands, TableCost(table), theta_ex=theta_ex)
        assert all(b <= a for a, b in zip(r.history, r.history[1:]))
        assert r.best_cost <= r.baseline_cost + 1e-15
        assert valid_plan(g, r.plan)
        assert r.best_cost == pytest.approx(plan_cost(g, r.plan, table), rel=1e-12)
        assert r.best_cost >= optimum - 1e-15
        if theta_ex == math.inf:  # explores every valid plan (minus the hopeless ones): the optimum
            assert r.best_cost == pytest.approx(optimum, rel=1e-12)


def test_roofline_costs_match_brute_force(toy, toy_plans):
    """With the default theta_ex and the roofline estimates the search finds the exhaustive optimum."""
    g, cands = toy.graph, toy.enumerated
    source = RooflineCostSource()
    r = backtrack_search(toy, cands, source)
    table = {k.key: k.estimate for k in node_kernels(g)} | {c.key: c.estimate for c in cands}
    optimum = min(table_plan_cost(node_kernels(g), p, table) for p in toy_plans)
    assert r.best_cost == pytest.approx(optimum, rel=1e-12)
    assert r.estimated and set(r.estimated) <= set(table)


@pytest.mark.parametrize("name", ["toy", "fires", "G1", "G3", "G4", "G5", "G6", "G7", "squeezenet"])
def test_pruned_and_unpruned_candidates_give_the_same_plan(name):
    model = {"toy": toy_model, "fires": fires_model}.get(name, lambda: None)() or \
        (build_model(name) if name == "squeezenet" else optifx_model(name, bias=False))
    r = generate_candidates(model, A6000)
    pruned = backtrack_search(r, r.candidates)
    unpruned = backtrack_search(r, r.unpruned)
    assert pruned.plan_ids == unpruned.plan_ids
    assert pruned.best_cost == pytest.approx(unpruned.best_cost)


def test_decomposition_and_bounding_do_not_change_the_result(toy):
    for source in (RooflineCostSource, lambda: HashCost(toy.graph)):
        results = [backtrack_search(toy, toy.enumerated, source(), decompose=d, bound=b)
                   for d in (True, False) for b in (True, False)]
        assert len({r.plan_ids for r in results}) == 1
        assert max(r.best_cost for r in results) == pytest.approx(min(r.best_cost for r in results))
    r = backtrack_search(toy, toy.enumerated)
    assert r.components == 2 and r.largest_component == 10  # the chain + fire, and the Add's siblings


def test_a_new_best_plan_is_queued(toy):
    """Reaching {V(c1), V(c2)} goes through {V(c1)}, the best plan when it is made. The paper's printed
    pseudo-code only queues plans worse than the best, so it would stop at the SISO c1 -> c2; with theta_ex = 1
    nothing else is queued, so only the TASO rule finds the optimum."""
    g = toy.graph
    v1, siso, v2 = (next(c for c in toy.enumerated if c.id == i)
                    for i in ("vertical:single:c1", "afusion:SISO:c1+c2", "vertical:single:c2"))
    table = {k.key: 10e-6 for k in node_kernels(g)}  # 20 us for each pair of nodes
    table.update({v1.key: 17e-6, v2.key: 17e-6, siso.key: 35e-6})  # gains 3, 3 and 5
    r = backtrack_search(g, [v1, siso, v2], TableCost(table), theta_ex=1.0)
    assert r.plan_ids == tuple(sorted((v1.id, v2.id)))
    assert r.baseline_cost - r.best_cost == pytest.approx(6e-6)


def test_budget_is_respected(toy):
    class Sleepy(HashCost):
        def cost(self, kernel):
            time.sleep(0.05)
            return super().cost(kernel)

    start = time.monotonic()
    r = backtrack_search(toy, toy.enumerated, Sleepy(toy.graph), budget_s=0.5)
    elapsed = time.monotonic() - start
    assert r.stopped_by_budget
    assert elapsed < 0.5 + 0.05 + 0.25  # the budget, one kernel's cost, and slack for a loaded machine
    assert r.best_cost <= r.baseline_cost and valid_plan(toy.graph, r.plan)
    assert r.estimated  # the kernels that were not costed in time took their roofline estimate


def test_max_expansions(toy):
    r = backtrack_search(toy, toy.enumerated, max_expansions=1)
    assert r.stopped_by_expansions and r.expansions == 1 and len(r.history) == 1


def test_kernel_cache_costs_identical_subgraphs_once():
    r = generate_candidates(fires_model(3), A6000)
    source = TableCost({k: 1e-6 for k in all_keys(r.graph, r.enumerated)})
    result = backtrack_search(r, r.enumerated, source)
    assert source.calls == result.cache_misses
    assert result.cache_hits > 0
    # fires 1 and 2 are identical: their SIMO candidates share a key, so fewer calls than kernels.
    assert source.calls < len(node_kernels(r.graph)) + len(r.enumerated)


def test_measured_costs_override_estimates(toy):
    simo = next(c for c in toy.enumerated if c.pattern == "SIMO")
    source = RooflineCostSource({simo.key: 0.0})
    r = backtrack_search(toy, toy.enumerated, source)
    assert simo in r.plan
    assert simo.key not in source.estimated and simo.key not in r.estimated


def _hand_candidate(graph, name, node_names):
    ids = tuple(sorted(graph.resolve(x) for x in node_names))
    return Candidate(id=name, kind="horizontal", pattern="siblings", rops=(),
                     members=tuple(graph.names[i] for i in ids), node_ids=ids, removed_tensors=(), shared_inputs=(),
                     flops_before=0, recompute_flops=0, bytes_before=0, bytes_after=0, rop_flops=0,
                     rop_bytes_before=0, seconds_before=2e-6, seconds_after=1e-6, key=f"hand:{name}")


def test_plans_stay_acyclic():
    """A = {a1, a2} and B = {b1, b2} with a1 -> b1 and b2 -> a2: each contracts fine alone, both together make a
    cycle, so the best plan takes one of them."""
    n = Net()
    a1 = n.op("Relu", "a1", [n.input("u", [1, 4, 8, 8])])
    b1 = n.op("Relu", "b1", [a1])
    b2 = n.op("Relu", "b2", [n.input("v", [1, 4, 8, 8])])
    a2 = n.op("Relu", "a2", [b2])
    g = FusionGraph.of(n.model(b1, a2))
    A, B = _hand_candidate(g, "A", ["a1", "a2"]), _hand_candidate(g, "B", ["b1", "b2"])
    assert valid_plan(g, [A]) and valid_plan(g, [B]) and not valid_plan(g, [A, B])
    table = {k.key: 5e-6 for k in node_kernels(g)} | {"hand:A": 1e-6, "hand:B": 2e-6}
    r = backtrack_search(g, [A, B], TableCost(table), theta_ex=math.inf)
    assert r.plan_ids == ("A",)
    assert r.components == 1  # they can meet on a cycle, so they are searched together
    overlapping = _hand_candidate(g, "C", ["a1", "b1"])
    assert not valid_plan(g, [A, overlapping])


def test_errors(toy):
    with pytest.raises(UsageError, match="theta_ex"):
        backtrack_search(toy, theta_ex=0.5)
    other = generate_candidates(fires_model(1), A6000)
    with pytest.raises(UsageError, match="does not belong to this graph"):
        backtrack_search(toy, other.enumerated)
    with pytest.raises(UsageError, match="needs the candidates"):
        backtrack_search(toy.graph)


@pytest.mark.parametrize("name", ["densenet_bc", "nasnet_a", "inception_v3"])
def test_network_sized_searches_finish(name):
    r = generate_candidates(build_model(name), A6000)
    for cands in (r.candidates, r.enumerated):  # the enumerated set ignores GraphSplit: more overlap
        result = backtrack_search(r, cands, budget_s=30)
        assert not result.stopped_by_budget and not result.stopped_by_expansions
        assert result.seconds < 5.0
        assert result.best_cost < result.baseline_cost and valid_plan(r.graph, result.plan)


def test_the_bound_counts_overlapping_candidates_once():
    """most_gain_left: A (nodes 0, 1) and B (nodes 1, 2) gain 4 each but overlap, C (node 3) gains 1. No plan gains
    more than 5 (A + C or B + C); each node at its best share bounds it by 7, where adding whole gains said 9."""
    from onnxopt.fusion.search.backtrack import most_gain_left

    def cand(nodes, gain):
        return FusionGraph.mask(nodes), tuple(nodes), gain / len(nodes)

    positive = [cand([0, 1], 4.0), cand([1, 2], 4.0), cand([3], 1.0)]
    assert most_gain_left(positive, 0) == pytest.approx(7.0)
    # with node 0 in the plan, A is out: B and C, disjoint, are exactly the bound
    assert most_gain_left(positive, FusionGraph.mask([0])) == pytest.approx(5.0)
    assert most_gain_left(positive, FusionGraph.mask([0, 2, 3])) == 0.0
    # the larger share wins a shared node: a 6-gain pair over the 4-gain pairs on node 1
    assert most_gain_left(positive + [cand([1, 4], 6.0)], FusionGraph.mask([3])) == pytest.approx(2 + 3 + 2 + 3)
