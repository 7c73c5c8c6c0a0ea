"""The glue's description of a blocked copy op type (copy_exec.c) and its C initializer; no generated code: the
copy is memcpy of vectors, which the glue does itself."""

from __future__ import annotations

from dataclasses import dataclass

from ..glue.kinds import c_define

MAX_INPUTS = c_define("copy.h", "CP_MAX_IN")

MAX_RANK = c_define("glue.h", "MAX_RANK")
ELEMENT_BYTES = {"float32": 4, "uint8": 1, "int8": 1}  # the element types a copy takes
INT8_LANES = 4  # the channels a word of the qconv kind's blocked int8 tensors (onnxopt/kinds/qconv/layout.py)


# The default schedule: 64 tasks at most, and one thread below 65536 floats written (waking onnxruntime's pool cost
# more than it saved).
MAX_TASKS = 64
INLINE_FLOATS = 65536


@dataclass
class CopyKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    lanes: int  # 0: a plain Concat along `axis`
    factors: list[tuple[int, int]]  # per input: (rows, columns) each input pixel is repeated
    axis: int = 1
    # a Slice (lanes 0, one input): the input's dims and the box's start and end per axis
    slice: tuple[list[int], list[int], list[int]] | None = None
    max_tasks: int = MAX_TASKS  # the schedule (the copy kind's space): the most tasks a call is split into
    inline_floats: int = INLINE_FLOATS  # the schedule: below this many floats written, one thread
    elem: int = 4  # bytes an element (ELEMENT_BYTES): a plain Concat's may be a quantized model's int8
    split: list[int] | None = None  # a Split: each output's length along `axis` (in blocks when blocked)


def copy_source(i: int, k: CopyKernelDesc) -> str:
    """The tables and the descriptor of copy op number i."""
    if not 1 <= len(k.factors) <= MAX_INPUTS or len(k.factors) != len(k.in_types):
        raise ValueError(f"a blocked copy has 1 to {MAX_INPUTS} inputs, each with its factors")
    ins = ", ".join(str(t) for t in k.in_types)
    outs = ", ".join(str(t) for t in k.out_types)
    fh = ", ".join(str(int(f[0])) for f in k.factors)
    fw = ", ".join(str(int(f[1])) for f in k.factors)
    dims, start, end = k.slice or ([], [], [])
    if k.split and len(k.split) != len(k.out_types):
        raise ValueError("a Split's copy has one length per output")
    if len(dims) > MAX_RANK:
        raise ValueError(f"a Slice of rank {len(dims)}: the glue takes at most {MAX_RANK}")

    def arr(v):
        return "{" + (", ".join(str(int(x)) for x in v) or "0") + "}"

    return (f"static const int y{i}_in_types[] = {{{ins}}};\n"
            f"static const int y{i}_out_types[] = {{{outs}}};\n"
            f'static const onnxopt_copy_desc y{i}_desc = {{{{"{k.op_type}", KIND_COPY, {len(k.in_types)}, '
            f"{len(k.out_types)}, y{i}_in_types, y{i}_out_types}}, {k.lanes}, {{{fh}}}, {{{fw}}}, {k.axis}, "
            f"{len(dims)}, {arr(dims)}, {arr(start)}, {arr(end)}, {int(k.max_tasks)}, {int(k.inline_floats)}, "
            f"{int(k.elem)}, {len(k.split or [])}, {arr(k.split or [])}}};\n")
