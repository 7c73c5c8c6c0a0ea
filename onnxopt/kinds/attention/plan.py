"""What the data-movement model (onnxopt/annotate/data_movement.py) says of one attention kernel at the shapes it
was checked on, for the report beside its measured time: the kernel's tiles, its block order, the data it moves
and the buffer it needs, and why the softmax may keep whole rows.

The tiles are the executor's (exec.c, attention_execute): a task takes a (batch, head)'s query rows, split into
whole micro-kernel blocks only as far as every thread needs a task; the l, k and n tiles are whole (T_L = L: the
score rows are kept, one micro-kernel block of them at a time). The buffer is a task's scratch: K^T and V packed in
panels and the block's score rows.
"""

from __future__ import annotations

import math

from onnxopt.annotate.data_movement import gemm_chain, illegal, movement, softmax_strategy

from .lower import MIN_TASKS, MR


def task_rows(M: int, heads: int, min_tasks: int = MIN_TASKS) -> int:
    """exec.c's rows a task, for these extents."""
    want_blocks = -(-min_tasks // max(heads, 1))
    if want_blocks <= 1:
        return max(1, M)
    rows = -(-M // want_blocks)
    if rows >= MR:
        rows = -(-rows // MR) * MR
    return max(1, min(rows, M))


def scratch_floats(L: int, d: int, dv: int, block: int) -> int:
    """exec.c's scratch a task (without an expanded mask): MR score rows, K^T and V in panels of `block`."""
    pad = lambda n: max(block, -(-n // block) * block)  # noqa: E731
    return MR * pad(L) + pad(L) * d + pad(dv) * L


def logical_shape(shape, perm) -> list[int]:
    return [shape[p] for p in perm] if perm else list(shape)


def report(region, feeds: dict, desc) -> dict:
    """The report's "data_movement" entry for an attention region whose inputs are in `feeds`, built as `desc`
    (AttentionKernelDesc: its column block); {} when Q, K or V is not among the feeds."""
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
    rows = task_rows(M, heads, desc.min_tasks)
    buffer = scratch_floats(L, d, dv, desc.block)
    chain = gemm_chain(M, dv, d, L, batch=heads, middle="softmax")
    tiles = {"b": 1, "m": rows, "l": L, "k": d, "n": dv}
    order = ("b", "m", "l", "k", "n")
    moved = movement(chain, order, tiles)
    strategy, why = softmax_strategy(chain, tiles)
    return {"data_movement": {
        "extents": {"heads": heads, "M": M, "L": L, "d": d, "dv": dv}, "order": "".join(order), "tiles": tiles,
        "illegal": illegal(chain, order, tiles), "buffer_floats": buffer,
        "predicted_moved_bytes": 4 * moved.dv, "predicted_buffer_bytes": 4 * moved.mu,
        "softmax": strategy, "softmax_why": why}}
