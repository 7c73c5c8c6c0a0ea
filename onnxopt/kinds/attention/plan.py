"""What the data-movement model (onnxopt/annotate/data_movement.py) says of one attention kernel at the shapes it
was checked on, for the report beside its measured time: the kernel's tiles, its block order, the data it moves
and the buffer it needs, and why the softmax may keep whole rows.

The tiles are the executor's (exec.c, attention_execute): a task takes a (batch, head)'s query rows, split into
whole micro-kernel blocks only as far as every thread needs a task; the k and n tiles are whole. The l tile is the
model's: whole rows (T_L = L, the scores of one micro-kernel block of rows at a time) where a task's K^T and V
panels and score rows fit the share of a core's L2 the model gives them (`key_floats`), or where the machine's L3
feeds whole rows as fast as they compute (capacity.py: the capacity is then 0); else blocks of keys merged as the
online softmax does (`key_block`, the closed form of the least DV, `model_key_block`). The buffer is
a task's scratch: K^T and V packed in panels and the block's score rows (the bf16 kernel's: K^T and V as bf16
pairs, and its blocks of 16 rows, amx.py; it keeps whole rows).

The same kernel as TileFlow's tile tree (`kernel_tree`, annotate/tile_tree.py) gives its latency on the machine model
(`tileflow_seconds`), in the report beside the data-movement entry; benchmarks/attention_key_blocks.py fits both
models against the measured candidates (BENCHMARKS.md).
"""

from __future__ import annotations

import math

from onnxopt.annotate import tile_tree as tt
from onnxopt.annotate.data_movement import gemm_chain, illegal, movement, softmax_strategy

from . import amx
from .capacity import KEY_SHARE, core_cache_bytes, key_floats, l3_balance  # noqa: F401 (the model's capacity)
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


def key_block(L: int, d: int, dv: int, rows: int, capacity: int, block: int, mr: int = MR) -> int:
    """exec.c's keys a kernel call: L where the task's K^T and V panels and its score rows, (d + dv + mr) floats
    a key, fit `capacity` floats, the task has one micro-kernel block of rows or not even one panel of `block`
    keys fits; else the most whole panels that fit, balanced over the blocks."""
    per_key = d + dv + mr
    tl = capacity // per_key // block * block
    if rows <= mr or L * per_key <= capacity or tl == 0:  # fits, nothing to reuse, or not even a panel fits
        return L
    nb = -(-L // tl)
    tl = -(-(-(-L // nb)) // block) * block
    return min(tl, L)


def key_block_moved(M: int, L: int, d: int, dv: int, rows: int, tl: int, capacity: int, mr: int = MR) -> int:
    """Chimera's DV (Table III's form) between a core's L2 and the next level for one head, the kernel's order
    (b, m, l, k, n) with an m tile of `rows` and an l tile of `tl`: where the key block's panels and scores do not
    fit `capacity`, they are read again for every micro-kernel block of rows (an m tile of `mr`)."""
    fits = tl * (d + dv + mr) <= capacity
    chain = gemm_chain(M, dv, d, L, batch=1, middle="softmax")
    tiles = {"b": 1, "m": rows if fits else min(mr, rows), "l": tl, "k": d, "n": dv}
    return movement(chain, ("b", "m", "l", "k", "n"), tiles, table_form=True).dv


def model_key_block(M: int, L: int, d: int, dv: int, rows: int, capacity: int, block: int, mr: int = MR) -> int:
    """The l tile of least DV (key_block_moved) among whole rows and whole-panel blocks, ties to the longer: the
    model's choice, which `key_block` computes in closed form (a test holds them equal)."""
    cands = {L} | {min(L, k * block) for k in range(1, -(-L // block) + 1)}
    return min(cands, key=lambda tl: (key_block_moved(M, L, d, dv, rows, tl, capacity, mr), -tl))


# A score's softmax in flops: the row max, the exp polynomial with its range reduction, the sum and the scale.
SOFTMAX_FLOPS = 16
# The online-softmax merge of a block's output row into the task's: o = a * o + b * p, an element.
MERGE_FLOPS = 3


def kernel_tree(rows: int, L: int, d: int, dv: int, tl: int, l2_floats: int, softmax: bool = True, mr: int = MR,
                panel: int = 32) -> tuple[tt.Tile, dict[str, int]]:
    """exec.c's float32 kernel for one task as TileFlow's tile tree, with its problem extents: the task walks its
    key blocks (lb), each block its micro-kernel blocks of `mr` rows (m), and each row block computes its scores
    (K^T in panels of `panel` keys), their softmax and its output rows, sharing the block's buffer; with several
    key blocks a block's output rows are merged into the task's. The task's and the block's buffer is a core's L2
    where a key block's K^T and V panels and score rows fit `l2_floats` (the kernel's own test, key_block), else
    L3: the panels stream from there for every block of rows. Ragged rows are padded to whole blocks."""
    blocks = -(-L // tl)
    ext = {"lb": blocks, "m": -(-rows // mr) * mr, "l": tl, "k": d, "n": dv}
    steps = (tt.Loop("l", tl // panel),) if tl % panel == 0 and tl > panel else ()
    key = f"{tl}*lb + l"
    scores = tt.Tile("L1", steps, op="scores", accesses=(
        tt.access("Q", "m", "k"), tt.access("K", "k", key), tt.access("S", "lb", "m", "l", write=True)))
    rows_op = [tt.Tile("L1", steps, op="softmax", flops=SOFTMAX_FLOPS, accesses=(
        tt.access("S", "lb", "m", "l"), tt.access("S", "lb", "m", "l", write=True)))] if softmax else []
    out = ("P", "lb", "m", "n") if blocks > 1 else ("O", "m", "n")
    values = tt.Tile("L1", steps, op="values", accesses=(
        tt.access("S", "lb", "m", "l"), tt.access("V", key, "n"), tt.access(*out, write=True)))
    level = "L2" if tl * (d + dv + mr) <= l2_floats else "L3"
    block = tt.Tile(level, (tt.Loop("m", ext["m"] // mr),), (scores, *rows_op, values), primitive="Shar")
    if blocks == 1:
        return tt.Tile(level, (), (block,), primitive="Shar"), ext
    merge = tt.Tile("L1", (tt.Loop("m", ext["m"] // mr),), op="merge", flops=MERGE_FLOPS, accesses=(
        tt.access("P", "lb", "m", "n"), tt.access("O", "m", "n"), tt.access("O", "m", "n", write=True)))
    return tt.Tile(level, (tt.Loop("lb", blocks),), (block, merge), primitive="Shar"), ext


def tileflow_seconds(machine, heads: int, M: int, L: int, d: int, dv: int, tl: int, softmax: bool = True,
                     min_tasks: int = MIN_TASKS, panel: int = 32) -> float:
    """TileFlow's latency (eq 3.22) of the float32 kernel on `machine`: a task's tree on one core's share of the
    bandwidths and of the float32 peak, times the tasks a core runs, scaled by the part of the padded keys the
    ragged last block really covers (the tree's blocks are whole). `panel`: the kernel's column block, the
    target's (AttentionKernelDesc.block)."""
    cores = max(1, machine.cores)
    rows = task_rows(M, heads, min_tasks)
    l2 = next(lv for lv in machine.levels if lv.name == "L2")
    tree, ext = kernel_tree(rows, L, d, dv, tl, l2.size_bytes // cores // 4, softmax, panel=panel)
    arch = tt.Arch.per_thread(machine, cores)
    tasks = heads * -(-M // rows)
    padded = ext["lb"] * ext["l"]
    return tt.analyze(tree, ext, arch, outer="L3").latency * -(-tasks // cores) * L / padded


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
    tl = L if tiles_run else key_block(L, d, dv, rows, desc.key_floats, desc.block)
    tiles = {"b": 1, "m": rows, "l": tl, "k": d, "n": dv}
    order = ("b", "m", "l", "k", "n")
    moved = movement(chain, order, tiles)
    strategy, why = softmax_strategy(chain, tiles) if p.middle == "softmax" else (None, None)
    from onnxopt.hardware.measure import cached_machine

    machine = cached_machine()
    latency = None if tiles_run or machine is None else tileflow_seconds(
        machine, heads, M, L, d, dv, tl, p.middle == "softmax", desc.min_tasks, desc.block)
    return {"data_movement": {
        "extents": {"heads": heads, "M": M, "L": L, "d": d, "dv": dv}, "order": "".join(order), "tiles": tiles,
        "illegal": illegal(chain, order, tiles), "buffer_floats": buffer, "key_floats": desc.key_floats,
        "predicted_moved_bytes": 4 * moved.dv, "predicted_buffer_bytes": 4 * moved.mu,
        "softmax": strategy, "softmax_why": why, "tileflow_predicted_seconds": latency}}
