"""What the data-movement model (onnxopt/annotate/data_movement.py) says of one attention kernel at the shapes it
was checked on, for the report beside its measured time: the kernel's tiles, its block order, the data it moves
and the buffer it needs, and why the softmax may keep whole rows.

The tiles are the executor's (exec.c, attention_execute): a task takes a (batch, head)'s query rows, split into
whole micro-kernel blocks only as far as every thread needs a task; the l, k and n tiles are whole (T_L = L: the
score rows are kept, one micro-kernel block of them at a time). The buffer is a task's scratch: K^T and V packed in
panels and the block's score rows (the bf16 kernel's: K^T and V as bf16 pairs, and its blocks of 16 rows, amx.py).
"""

from __future__ import annotations

import math

from onnxopt.annotate.data_movement import gemm_chain, illegal, movement, softmax_strategy

from . import amx
from .lower import MIN_TASKS, MR


def task_rows(M: int, heads: int, min_tasks: int = MIN_TASKS, mr: int = MR) -> int:
    """exec.c's rows a task, for these extents, in blocks of `mr` rows (the bf16 kernel's: 16)."""
    want_blocks = -(-min_tasks // max(heads, 1))
    if want_blocks <= 1:
        return max(1, M)
    rows = -(-M // want_blocks)
    if rows >= mr or mr == amx.ROWS:  # a tile block computes 16 rows however few are kept
        rows = -(-rows // mr) * mr
    return max(1, min(rows, M))


def scratch_floats(L: int, d: int, dv: int, block: int) -> int:
    """exec.c's scratch a task (without an expanded mask): MR score rows, K^T and V in panels of `block`."""
    pad = lambda n: max(block, -(-n // block) * block)  # noqa: E731
    return MR * pad(L) + pad(L) * d + pad(dv) * L


def amx_scratch_floats(L: int, d: int, dv: int) -> int:
    """exec.c's scratch a task for the bf16 kernel (amx.py): K^T and V as bf16 pairs, the block's scores, q16, p16
    and sums (attn_amx_scratch)."""
    lp, dp, lk, dvp = -(-L // 64) * 64, -(-d // 32) * 32, -(-L // 32) * 32, -(-dv // 64) * 64
    return dp // 2 * lp + lk // 2 * dvp + 16 * lp + 8 * dp + 8 * lp + 16 * dvp


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
    # the 16-bit kernel where the tiles run (the report's view assumes they do where the library has them)
    tiles_run = bool(desc.amx_fn) and L >= desc.amx_min_keys
    rows = task_rows(M, heads, desc.min_tasks, amx.ROWS if tiles_run else MR)
    buffer = amx_scratch_floats(L, d, dv) if tiles_run else scratch_floats(L, d, dv, desc.block)
    chain = gemm_chain(M, dv, d, L, batch=heads, middle=None if p.middle == "none" else p.middle)
    tiles = {"b": 1, "m": rows, "l": L, "k": d, "n": dv}
    order = ("b", "m", "l", "k", "n")
    moved = movement(chain, order, tiles)
    strategy, why = softmax_strategy(chain, tiles) if p.middle == "softmax" else (None, None)
    return {"data_movement": {
        "extents": {"heads": heads, "M": M, "L": L, "d": d, "dv": dv}, "order": "".join(order), "tiles": tiles,
        "illegal": illegal(chain, order, tiles), "buffer_floats": buffer,
        "predicted_moved_bytes": 4 * moved.dv, "predicted_buffer_bytes": 4 * moved.mu,
        "softmax": strategy, "softmax_why": why}}
