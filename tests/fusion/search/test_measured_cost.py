"""The search's measured costs (onnxopt/fusion/search/measured_cost.py): measured seconds where a kernel was timed,
the roofline calibrated by nearby measurements elsewhere, and measurements deciding what the roofline got wrong."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxopt.models.conv_shapes import optifx_model
from search_nets import Net

from onnxopt.fusion.search import (
    MeasuredCostSource,
    backtrack_search,
    generate_candidates,
    measured_search,
    node_kernels,
)

MACHINE = "xeon-gold-6240"
KINDS = ("vertical", "afusion")


@pytest.fixture(scope="module")
def fire():
    """G5, a SqueezeNet fire module: three vertical candidates (conv + Relu) and the SIMO group of all three."""
    return generate_candidates(optifx_model("G5"), MACHINE, kinds=KINDS)


def simo(result):
    return next(c for c in result.enumerated if c.pattern == "SIMO")


def verticals(result):
    return [c for c in result.enumerated if c.kind == "vertical"]


def test_without_measurements_it_is_the_roofline(fire):
    source = MeasuredCostSource(fire, {})
    for k in [*fire.enumerated, *node_kernels(fire.graph)]:
        assert source.cost(k) == pytest.approx(k.estimate, rel=1e-12)
    assert source.factor == 1.0 and not source.used
    res, _ = measured_search(fire, {})
    assert res.plan_ids == backtrack_search(fire).plan_ids


def test_measured_kernels_cost_what_they_measured_and_calibrate_their_nodes(fire):
    v = verticals(fire)[0]
    source = MeasuredCostSource(fire, {v.key: 3 * v.estimate})
    assert source.cost(v) == 3 * v.estimate and source.used == [v.key]
    nodes = node_kernels(fire.graph)
    for n in nodes:
        # Its own nodes take its factor; with one measurement, so does everything else (the median).
        assert source.cost(n) == pytest.approx(3 * n.estimate)
    # The unmeasured SIMO group keeps the roofline's ratio to its members' calibrated costs.
    g = simo(fire)
    assert source.cost(g) == pytest.approx(3 * g.estimate)
    assert g.key in source.estimated


def test_nodes_take_the_factor_of_the_smallest_measured_kernel_around_them(fire):
    v1, v2, _ = verticals(fire)
    g = simo(fire)
    source = MeasuredCostSource(fire, {v1.key: 2 * v1.estimate, v2.key: 5 * v2.estimate, g.key: 7 * g.estimate})
    by_id = {n.node_id: n for n in node_kernels(fire.graph)}
    for n in v1.node_ids:
        assert source.cost(by_id[n]) == pytest.approx(2 * by_id[n].estimate)
    for n in v2.node_ids:
        assert source.cost(by_id[n]) == pytest.approx(5 * by_id[n].estimate)
    third = [n for n in g.node_ids if n not in v1.node_ids + v2.node_ids]
    for n in third:  # inside the group only: the group's factor
        assert source.cost(by_id[n]) == pytest.approx(7 * by_id[n].estimate)
    assert source.factor == 5  # the median of 2, 5 and 7


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.2, 20), min_size=3, max_size=3))
def test_a_measured_kernel_never_costs_more_than_its_calibrated_nodes(fire, factors):
    """Disjoint measured kernels: their nodes, calibrated by them, cost at least what they measured (the bytes
    fusion saves), so the search never unfuses what was timed fused for want of a common scale."""
    vs = verticals(fire)
    measured = {v.key: f * v.estimate for v, f in zip(vs, factors)}
    source = MeasuredCostSource(fire, measured)
    by_id = {n.node_id: n for n in node_kernels(fire.graph)}
    for v in vs:
        nodes = math.fsum(source.cost(by_id[n]) for n in v.node_ids)
        assert nodes >= measured[v.key] * (1 - 1e-12)


def test_a_group_slower_than_its_parts_is_not_chosen(fire):
    """The roofline chooses the SIMO group; measured slower than its three kernels, it is left out, and measured
    faster it is chosen again."""
    assert simo(fire).id in backtrack_search(fire).plan_ids
    parts = {v.key: 100e-6 for v in verticals(fire)}
    slow, _ = measured_search(fire, {**parts, simo(fire).key: 400e-6})
    assert simo(fire).id not in slow.plan_ids
    assert sorted(slow.plan_ids) == sorted(v.id for v in verticals(fire))
    fast, source = measured_search(fire, {**parts, simo(fire).key: 250e-6})
    assert fast.plan_ids == (simo(fire).id,)
    others = [n for n in node_kernels(fire.graph) if n.node_id not in simo(fire).node_ids]  # the Concat
    assert fast.best_cost == pytest.approx(250e-6 + math.fsum(source.cost(n) for n in others))
    assert set(source.used) == set(parts) | {simo(fire).key}  # the nodes were calibrated, not measured


def test_a_pruned_candidate_is_searched_once_measured():
    """What the roofline pruned is still searched when it was measured: measurements outrank the filter."""
    pruned = generate_candidates(optifx_model("G5"), MACHINE, kinds=KINDS, theta_opt=1000.0)
    assert not pruned.candidates and pruned.unpruned
    res, _ = measured_search(pruned, {})
    assert res.plan == []
    g = simo(pruned)
    parts = {v.key: 100e-6 for v in verticals(pruned)}
    res, _ = measured_search(pruned, {**parts, g.key: 150e-6})
    assert res.plan_ids == (g.id,)


def test_identical_blocks_share_their_measurement():
    """Two identical fire modules have one signature per kernel: one measurement costs both."""
    net = Net()
    x = net.input("x", [1, 32, 28, 28])
    y = net.fire("f1", x, 32, 8, 16)
    y = net.fire("f2", y, 32, 8, 16)
    result = generate_candidates(net.model(y), MACHINE, kinds=KINDS)
    groups = [c for c in result.enumerated if c.pattern == "SIMO"]
    assert len(groups) == 2 and groups[0].key == groups[1].key
    parts = {c.key: 100e-6 for c in result.enumerated if c.kind == "vertical"}
    res, _ = measured_search(result, {**parts, groups[0].key: 500e-6})
    assert not any(c.pattern == "SIMO" for c in res.plan)
    res, _ = measured_search(result, {**parts, groups[0].key: 200e-6})
    assert sorted(c.id for c in res.plan if c.pattern == "SIMO") == sorted(g.id for g in groups)
