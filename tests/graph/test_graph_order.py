"""The stable topological order (onnxopt/graph/order.py) shared by the emitter and the sibling plans."""

from __future__ import annotations

from onnxopt.graph.order import stable_order


def test_keeps_the_given_order_where_dependencies_allow():
    assert stable_order([set(), set(), set()]) == [0, 1, 2]
    # 0 needs 2: 1 and 2 move ahead of it, 1 stays first of the ready ones
    assert stable_order([{2}, set(), set()]) == [1, 2, 0]
    assert stable_order([set(), {0}, {0, 1}, {1}]) == [0, 1, 2, 3]


def test_a_cycle_has_no_order():
    assert stable_order([{1}, {0}, set()]) is None
