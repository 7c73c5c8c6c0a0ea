"""The glue's description of a pool op type, and its C initializer (the tables library.py links in)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The default schedule, measured when the pool kernels were written: 64 tasks at most, and one thread below 393216
# taps, where waking onnxruntime's pool cost more than it saved.
MAX_TASKS = 64
INLINE_WORK = 393216.0
# The pooled tensor's element type, as pool.h numbers it (POOL_F32, POOL_U8, POOL_S8).
ELEMS = {"float32": 0, "uint8": 1, "int8": 2}


@dataclass
class PoolKernelDesc:
    """What the glue needs to know of one pool op type (pool_exec.c): the op, its window and its epilogue."""

    op_type: str
    op: str  # "max", "avg" (2-D windows), "gmax", "gavg" (global)
    in_types: list[int]
    out_types: list[int]
    lanes: int
    elem: int  # ELEMS: float32, or uint8 / int8 (a windowed MaxPool)
    rows: str | None  # windowed: <op>_rows (codegen/pool/kernels.py)
    glob: str | None  # global: <op>_global
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    auto_pad: int = 0  # 0 explicit, 1 SAME_UPPER, 2 SAME_LOWER, 3 VALID
    ceil_mode: int = 0
    count_include_pad: int = 0
    rank: int = 4  # of the input
    extra_kinds: list[int] = field(default_factory=list)
    extra_nstride: list[int] = field(default_factory=list)
    blocked: int = 0  # lanes of a blocked input [N, C / L, H, W, L] (pool_exec.c's blocked path), or 0
    exit_channels: int = 0  # a blocked global pool writing NCHW [N, C, 1, 1]: C (0: its output is blocked too)
    max_tasks: int = MAX_TASKS  # the schedule (the pool kind's space): the most tasks a call is split into
    inline_work: float = INLINE_WORK  # the schedule: below this many taps, one thread


_POOL_OP = {"max": "POOL_MAX", "avg": "POOL_AVG", "gmax": "POOL_GMAX", "gavg": "POOL_GAVG"}


def pool_source(i: int, k: PoolKernelDesc) -> str:
    """Declarations, tables and the descriptor of pool op number i."""
    parts = []
    for sym in (k.rows, k.glob):
        if sym:
            parts.append(f"extern void {sym}(const int64_t *);\n")
    parts.append(_c_array("int", f"p{i}_in_types", k.in_types))
    parts.append(_c_array("int", f"p{i}_out_types", k.out_types))
    parts.append(_c_array("int", f"p{i}_extra_kind", k.extra_kinds or []))
    parts.append(_c_array("int64_t", f"p{i}_extra_nstride", k.extra_nstride or []))
    parts.append(f'static const onnxopt_pool_desc p{i}_desc = {{{{"{k.op_type}", KIND_POOL, {len(k.in_types)}, '
                 f"{len(k.out_types)}, p{i}_in_types, p{i}_out_types}}, {_POOL_OP[k.op]}, {k.lanes}, {k.elem}, "
                 f"{k.rows or 'NULL'}, {k.glob or 'NULL'}, {k.kernel[0]}, {k.kernel[1]}, "
                 f"{k.strides[0]}, {k.strides[1]}, {k.dilations[0]}, {k.dilations[1]}, "
                 f"{{{', '.join(str(p) for p in k.pads)}}}, {k.auto_pad}, {k.ceil_mode}, {k.count_include_pad}, "
                 f"{k.rank}, {len(k.extra_kinds or [])}, p{i}_extra_kind, p{i}_extra_nstride, {int(k.blocked)}, "
                 f"{int(k.exit_channels)}, {int(k.max_tasks)}, {float(k.inline_work)!r}}};\n")
    return "".join(parts)


def _c_array(ctype: str, name: str, values) -> str:
    body = ", ".join(str(v) for v in values) or "0"
    return f"static const {ctype} {name}[] = {{{body}}};\n"
