"""Tensor intrinsics: a hand-written piece of IR that replaces a whole loop nest.

An intrinsic describes what its code computes as a small compute of its own (over its own placeholders), and
provides `emit(builder, operands)` that writes the IR. `Schedule.tensorize(axis, intrinsic)` replaces the nest from
`axis` inwards when it computes the same thing:

* the nest's loops, taken without the extent-1 ones, pair with the intrinsic's axes: spatial with spatial and
  reduce with reduce, each in order, with equal extents;
* the nest's statement has the intrinsic's statement's shape (same operations and constants, in the same order)
  with each intrinsic tensor standing for one program tensor of the same dtype;
* each access is a view: moving one intrinsic index by one moves the program offset by a fixed stride, and
  variables the intrinsic tensor is not indexed by do not move it.

The intrinsic receives each tensor as an `Operand`: a pointer to its element at index 0 and the element stride of
each of its dimensions in the program's buffer. The pairing keeps each element's reduction order (reduce loops
pair in order), so an intrinsic that sums in the order of its own reduce axes gives bit-identical results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llvmlite import ir

from ..vmath.irutil import fma
from .affine import flat_offset
from .expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Not,
    Select,
    Var,
    children,
    free_vars,
)
from .schedule import ScheduleError
from .stmt import Loop, OperandBinding, Store
from .te import Tensor, compute, placeholder, reduce_axis
from .te import sum as te_sum


@dataclass(frozen=True)
class Operand:
    """An intrinsic tensor as the emitter sees it."""

    ptr: ir.Value
    strides: tuple[int, ...]
    dtype: str


@dataclass(eq=False)
class TensorIntrinsic:
    name: str
    output: Tensor  # a compute over the intrinsic's own placeholders: what `emit` computes
    emit: Callable[[ir.IRBuilder, dict[str, Operand]], None]
    unit_stride: tuple[str, ...] = field(default=())  # tensors whose last dimension must be contiguous


def bind_intrinsic(intrinsic: TensorIntrinsic, loops: list[Loop], store: Store) -> dict[str, OperandBinding]:
    """Match a perfect loop nest around `store` against the intrinsic; returns its operands or raises."""
    from .lower import compute_statements

    intrinsic_store = compute_statements(intrinsic.output).update
    op = intrinsic.output.op
    program_loops, store = _without_unit_loops([lp.var for lp in loops], store)
    intrinsic_axes, intrinsic_store = _without_unit_loops([*op.axes, *op.reduce_axes], intrinsic_store)
    pairs = _pair_axes(intrinsic.name, intrinsic_axes, program_loops)
    matcher = _Matcher(intrinsic.name, pairs, program_loops)
    matcher.statement(intrinsic_store, store)
    for name in intrinsic.unit_stride:
        binding = matcher.bindings.get(name)
        if binding is not None and binding.strides and binding.strides[-1] != 1:
            raise ScheduleError(f"tensorize {intrinsic.name}: {name}'s last dimension is not contiguous in "
                                f"{binding.tensor.name} (stride {binding.strides[-1]})")
    for lp in loops:
        for bound in lp.bounds:
            if free_vars(bound) & {other.var for other in loops}:
                raise ScheduleError(f"tensorize {intrinsic.name}: loop {lp.var.name} is shortened by a bound that "
                                    "depends on the nest itself")
    return matcher.bindings


def _without_unit_loops(axes: list, store: Store) -> tuple[list, Store]:
    """Drop extent-1 loops, their variable being 0."""
    unit = {a: Const(0, "int64") for a in axes if a.extent == 1}
    return [a for a in axes if a.extent != 1], store.substituted(unit)


def _pair_axes(name: str, intrinsic_axes: list, program_axes: list) -> dict[Var, Var]:
    pairs = {}
    for kind in ("spatial", "reduce"):
        ours = [a for a in intrinsic_axes if a.kind == kind]
        theirs = [a for a in program_axes if a.kind == kind]
        if [a.extent for a in ours] != [a.extent for a in theirs]:
            raise ScheduleError(f"tensorize {name}: the nest's {kind} loops have extents "
                                f"{[a.extent for a in theirs]}, the intrinsic's {[a.extent for a in ours]}")
        pairs.update(zip(ours, theirs))
    return pairs


class _Matcher:
    """Walks the intrinsic's statement and the program's side by side, binding tensors."""

    def __init__(self, name: str, pairs: dict[Var, Var], program_loops: list):
        self.name = name
        self.pairs = pairs
        self.program_loops = program_loops
        self.bindings: dict[str, OperandBinding] = {}

    def fail(self, why: str):
        raise ScheduleError(f"tensorize {self.name}: the loop nest does not match the intrinsic: {why}")

    def statement(self, ours: Store, theirs: Store) -> None:
        self.access(ours.tensor, ours.indices, theirs.tensor, theirs.indices)
        self.expr(ours.value, theirs.value)

    def expr(self, ours: Expr, theirs: Expr) -> None:
        if type(ours) is not type(theirs) or ours.dtype != theirs.dtype:
            self.fail(f"{ours} vs {theirs}")
        if isinstance(ours, Load):
            self.access(ours.tensor, ours.indices, theirs.tensor, theirs.indices)
            return
        if isinstance(ours, Const):
            if ours.value != theirs.value:
                self.fail(f"constant {ours.value} vs {theirs.value}")
            return
        if isinstance(ours, Var):
            if self.pairs.get(ours) is not theirs:
                self.fail(f"variable {ours} vs {theirs}")
            return
        if isinstance(ours, (Binary, Compare, Logical)) and ours.op != theirs.op:
            self.fail(f"{ours.op} vs {theirs.op}")
        if isinstance(ours, Call) and ours.fn != theirs.fn:
            self.fail(f"{ours.fn} vs {theirs.fn}")
        if not isinstance(ours, (Binary, Compare, Logical, Call, Cast, Not, Select)):
            self.fail(f"unsupported node {type(ours).__name__}")
        for a, b in zip(children(ours), children(theirs)):
            self.expr(a, b)

    def access(self, ours: Tensor, our_index, theirs: Tensor, their_index) -> None:
        if ours.dtype != theirs.dtype:
            self.fail(f"{ours.name} is {ours.dtype}, {theirs.name} is {theirs.dtype}")
        offset = flat_offset(theirs, their_index)
        moved_by = {}  # program loop var -> the dimension of `ours` it indexes
        for dim, index in enumerate(our_index):
            if isinstance(index, Const) and index.value == 0:
                continue
            if not isinstance(index, Var) or index not in self.pairs:
                self.fail(f"{ours.name}'s index {index} must be one of its axes or 0")
            moved_by[self.pairs[index]] = dim
        strides = [0] * len(our_index)
        for var in self.program_loops:
            coef = offset.coefficient(var)
            if coef is None:
                self.fail(f"{theirs.name}'s offset is not linear in {var.name}")
            if var in moved_by:
                strides[moved_by[var]] = coef
            elif coef != 0:
                self.fail(f"{theirs.name} moves with {var.name}, which {ours.name} is not indexed by")
        binding = OperandBinding(theirs, offset.without(*self.program_loops), tuple(strides))
        previous = self.bindings.get(ours.name)
        if previous is None:
            self.bindings[ours.name] = binding
        elif previous.tensor is not theirs or previous.strides != binding.strides or \
                previous.origin.canonical() != binding.origin.canonical():
            self.fail(f"{ours.name} stands for two different accesses")


# ---------------------------------------------------------------------------------------------------------------
# An example intrinsic: a row of multiply-adds with a broadcast scalar.


def row_fma_f32(lanes: int = 16, depth: int = 1, fused: bool = False) -> TensorIntrinsic:
    """c[0:lanes] += sum over r < depth of a[r] * b[r, 0:lanes], as `depth` vector multiply-adds of a broadcast a[r].

    It is the inner block of a matmul ordered (..., k, j.inner) with j split by `lanes` (and k by `depth`).
    fused=False multiplies then adds, rounding like the scalar loop it replaces (bit-identical results);
    fused=True uses llvm.fma, one rounding per step: faster, and equal up to rounding.
    """
    a = placeholder((depth,), "a")
    b = placeholder((depth, lanes), "b")
    r = reduce_axis(depth, "r")
    c = compute((lanes,), lambda j: te_sum(a[r] * b[r, j], axis=r), name="c")
    f32 = ir.FloatType()
    vty = ir.VectorType(f32, lanes)

    def emit(builder: ir.IRBuilder, ops: dict[str, Operand]) -> None:
        def element(op: Operand, *index: int) -> ir.Value:
            offset = sum(i * s for i, s in zip(index, op.strides))
            return builder.gep(op.ptr, [ir.Constant(ir.IntType(64), offset)], source_etype=f32)

        acc = builder.load(ops["c"].ptr, typ=vty, align=4)
        for step in range(depth):
            scalar = builder.load(element(ops["a"], step), typ=f32, align=4)
            broadcast = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
            broadcast = builder.shuffle_vector(broadcast, ir.Constant(vty, ir.Undefined),
                                               ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
            row = builder.load(element(ops["b"], step, 0), typ=vty, align=4)
            acc = fma(builder, broadcast, row, acc) if fused else builder.fadd(acc, builder.fmul(broadcast, row))
        builder.store(acc, ops["c"].ptr, align=4)

    suffix = "_fused" if fused else ""
    return TensorIntrinsic(f"row_fma_f32x{lanes}_d{depth}{suffix}", c, emit, unit_stride=("b", "c"))
