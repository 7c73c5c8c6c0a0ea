"""Stable topological order: Kahn's algorithm taking the earliest ready item, so that the given order is kept
wherever the dependencies allow (a fused model reads like the original; a plan keeps graph order)."""

from __future__ import annotations

import heapq


def stable_order(deps: list[set[int]]) -> list[int] | None:
    """The indices 0..n-1 in an order where each comes after every index in its `deps[i]`, else in index order;
    None when the dependencies have a cycle."""
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for p in d:
            users.setdefault(p, []).append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(deps) else None
