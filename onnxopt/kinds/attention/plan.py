"""What the data-movement model (onnxopt/annotate/data_movement.py) says of one attention kernel at the shapes it
was checked on, for the report beside its measured time: the kernel's tiles, its block order, the data it moves
and the buffer it needs, and why the softmax may keep whole rows.

The tiles are the executor's (exec.c, attention_execute): the query rows of a task are as many as keep the rows'
Q and scores, K^T, V and the output rows within `capacity` floats (one core's L2), in whole micro-kernel blocks,
split further so that every thread has a task; the l, k and n tiles are whole (T_L = L: the score rows are kept).
"""

from __future__ import annotations

import math

from onnxopt.annotate.data_movement import gemm_chain, illegal, movement, softmax_strategy

from .lower import MR

MIN_TASKS = 8  # exec.c ATTN_MIN_TASKS


def task_rows(M: int, L: int, d: int, dv: int, heads: int, capacity: int, block: int) -> int:
    """exec.c's rows a task, for these extents."""
    s_rs = max(block, -(-L // block) * block)
    fixed, per_row = L * (d + dv), d + s_rs + dv
    rows = (capacity - fixed) // per_row if capacity > fixed + MR * per_row else capacity // 2 // per_row
    if rows >= MR:
        rows -= rows % MR
    rows = max(rows, 1)
    want_blocks = -(-MIN_TASKS // max(heads, 1))
    if want_blocks > 1:
        cap = -(-M // want_blocks)
        if cap >= MR:
            cap = -(-cap // MR) * MR
        rows = min(rows, cap)
    return max(1, min(rows, M))


def logical_shape(shape, perm) -> list[int]:
    return [shape[p] for p in perm] if perm else list(shape)


def report(region, feeds: dict, desc) -> dict:
    """The report's "data_movement" entry for an attention region whose inputs are in `feeds`, built as `desc`
    (AttentionKernelDesc: its column block and capacity); {} when Q, K or V is not among the feeds."""
    p = region.params
    if any(x not in feeds for x in region.inputs[:3]):
        return {}
    q = logical_shape(feeds[region.inputs[0]].shape, p.perms[0])
    k = logical_shape(feeds[region.inputs[1]].shape, p.perms[1])
    v = logical_shape(feeds[region.inputs[2]].shape, p.perms[2])
    M, d, dv = q[-2], q[-1], v[-1]
    L = k[-1] if p.k_transposed else k[-2]
    heads = math.prod(max(a, b, c) for a, b, c in zip(q[:-2], k[:-2], v[:-2]))
    if 0 in (M, L, d, dv, heads):  # an empty chain moves nothing
        return {}
    capacity = desc.capacity
    rows = task_rows(M, L, d, dv, heads, capacity, desc.block)
    chain = gemm_chain(M, dv, d, L, batch=heads, middle="softmax")
    tiles = {"b": 1, "m": rows, "l": L, "k": d, "n": dv}
    order = ("b", "m", "l", "k", "n")
    moved = movement(chain, order, tiles)
    strategy, why = softmax_strategy(chain, tiles)
    return {"data_movement": {
        "extents": {"heads": heads, "M": M, "L": L, "d": d, "dv": dv}, "order": "".join(order), "tiles": tiles,
        "illegal": illegal(chain, order, tiles), "buffer_floats": capacity,
        "predicted_moved_bytes": 4 * moved.dv, "predicted_buffer_bytes": 4 * moved.mu,
        "softmax": strategy, "softmax_why": why}}
