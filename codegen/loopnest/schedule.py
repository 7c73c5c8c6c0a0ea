"""Schedule primitives over one compute: how its loops are split, ordered, fused and annotated.

A schedule never changes what is computed, only the order of the loops. It keeps the current leaf loops in order
(outermost first) and, for every axis that was split or fused, how its value follows from the leaves:

    split(x, f)   x = x.outer * f + x.inner;  when f does not divide x's extent, the leaves over-cover x and
                  the lowering guards the overshoot (x < extent) by shortening the innermost loop involved
    fuse(a, b)    a = fused // extent(b),  b = fused % extent(b)

The per-element order of a reduction is the lexicographic order of its reduce leaves, so splitting a reduce axis
(outer before inner) or moving spatial loops around it gives bit-identical results; swapping two reduce leaves
reassociates the sum, which is still a valid schedule but may change the last bits. Vectorizing a loop that a
reduction runs along falls back to a scalar loop for the same reason.
"""

from __future__ import annotations

from .expr import Expr, IterVar
from .te import Tensor

SERIAL = "serial"
VECTORIZED = "vectorized"
UNROLLED = "unrolled"
PARALLEL = "parallel"

# Unrolling copies the body once per iteration; more than this is almost surely a mistake in a search space.
MAX_UNROLL = 256


class ScheduleError(ValueError):
    """A schedule primitive was applied where it cannot be (not a leaf loop, fusing non-adjacent loops...)."""


class Schedule:
    def __init__(self, tensor: Tensor):
        if tensor.op is None:
            raise ScheduleError(f"{tensor.name} is a placeholder; schedule the compute that produces an output")
        self.tensor = tensor
        self.op = tensor.op
        self.leaves: list[IterVar] = [*self.op.axes, *self.op.reduce_axes]
        self.kinds: dict[IterVar, str] = {}
        self._split: dict[IterVar, tuple[IterVar, IterVar, int]] = {}  # parent -> (outer, inner, factor)
        self._fused_into: dict[IterVar, IterVar] = {}  # outer or inner -> fused
        self._fused_parts: dict[IterVar, tuple[IterVar, IterVar]] = {}  # fused -> (outer, inner)
        self.tensorize_at: tuple[IterVar, object] | None = None  # (leaf, TensorIntrinsic)

    # -- the axes a user starts from

    @property
    def axes(self) -> tuple[IterVar, ...]:
        return self.op.axes

    @property
    def reduce_axes(self) -> tuple[IterVar, ...]:
        return self.op.reduce_axes

    # -- primitives

    def split(self, axis: IterVar, factor: int) -> tuple[IterVar, IterVar]:
        """axis -> (outer, inner) with inner of extent `factor`; inner replaces axis right after outer."""
        self._check_leaf(axis, "split")
        if not isinstance(factor, int) or factor < 1:
            raise ScheduleError(f"split {axis.name}: factor must be a positive int, got {factor!r}")
        self._check_not_annotated(axis, "split")
        outer = IterVar(f"{axis.name}.outer", "int64", -(-axis.extent // factor), axis.kind)
        inner = IterVar(f"{axis.name}.inner", "int64", factor, axis.kind)
        self._split[axis] = (outer, inner, factor)
        at = self.leaves.index(axis)
        self.leaves[at:at + 1] = [outer, inner]
        return outer, inner

    def reorder(self, *axes: IterVar) -> None:
        """Put `axes` in this order, in the positions they occupy now (other loops stay where they are)."""
        for a in axes:
            self._check_leaf(a, "reorder")
        if len(set(axes)) != len(axes):
            raise ScheduleError("reorder: an axis is listed twice")
        positions = sorted(self.leaves.index(a) for a in axes)
        for position, a in zip(positions, axes):
            self.leaves[position] = a

    def fuse(self, outer: IterVar, inner: IterVar) -> IterVar:
        """Two adjacent loops (outer directly around inner) -> one loop over both."""
        self._check_leaf(outer, "fuse")
        self._check_leaf(inner, "fuse")
        at = self.leaves.index(outer)
        if at + 1 >= len(self.leaves) or self.leaves[at + 1] is not inner:
            raise ScheduleError(f"fuse: {inner.name} must be the loop directly inside {outer.name}")
        if outer.kind != inner.kind:
            raise ScheduleError(f"fuse: cannot fuse a {outer.kind} axis with a {inner.kind} axis")
        self._check_not_annotated(outer, "fuse")
        self._check_not_annotated(inner, "fuse")
        fused = IterVar(f"{outer.name}.{inner.name}.fused", "int64", outer.extent * inner.extent, outer.kind)
        self._fused_into[outer] = self._fused_into[inner] = fused
        self._fused_parts[fused] = (outer, inner)
        self.leaves[at:at + 2] = [fused]
        return fused

    def vectorize(self, axis: IterVar) -> None:
        """Emit the loop as SIMD vectors of the target's width (scalar when its accesses are not contiguous)."""
        self._annotate(axis, VECTORIZED)

    def unroll(self, axis: IterVar) -> None:
        self._check_leaf(axis, "unroll")
        if axis.extent > MAX_UNROLL:
            raise ScheduleError(f"unroll {axis.name}: extent {axis.extent} > {MAX_UNROLL}; split it first")
        self._annotate(axis, UNROLLED)

    def parallel(self, axis: IterVar) -> None:
        """Mark the outermost loop as the one callers split between threads (see the package docstring)."""
        self._check_leaf(axis, "parallel")
        if axis.kind != "spatial":
            raise ScheduleError(f"parallel {axis.name}: threads would race on a reduction; pick a spatial axis")
        if any(k == PARALLEL for a, k in self.kinds.items() if a is not axis):
            raise ScheduleError("parallel: only one loop can be parallel")
        self._annotate(axis, PARALLEL)

    def tensorize(self, axis: IterVar, intrinsic) -> None:
        """Replace the loop nest from `axis` inwards by `intrinsic` (checked against its description at lowering)."""
        self._check_leaf(axis, "tensorize")
        self.tensorize_at = (axis, intrinsic)

    # -- what lowering needs

    def value_of(self, iv: IterVar) -> Expr:
        """The value of any axis (original, split or fused) in terms of the leaf loops."""
        if iv in self._split:
            outer, inner, factor = self._split[iv]
            return self.value_of(outer) * factor + self.value_of(inner)
        if iv in self._fused_into:
            fused = self._fused_into[iv]
            outer, inner = self._fused_parts[fused]
            value = self.value_of(fused)
            return value // inner.extent if iv is outer else value % inner.extent
        return iv

    def overshoot_guards(self) -> list[tuple[Expr, int]]:
        """(value, extent) pairs meaning value < extent: one per split whose factor does not divide the extent."""
        return [(self.value_of(parent), parent.extent)
                for parent, (outer, _, factor) in self._split.items() if outer.extent * factor != parent.extent]

    def kind_of(self, leaf: IterVar) -> str:
        return self.kinds.get(leaf, SERIAL)

    def __str__(self) -> str:
        from .lower import lower

        return str(lower(self))

    # -- checks

    def _annotate(self, axis: IterVar, kind: str) -> None:
        self._check_leaf(axis, kind)
        self.kinds[axis] = kind

    def _check_leaf(self, axis, primitive: str) -> None:
        if not isinstance(axis, IterVar) or axis not in self.leaves:
            name = getattr(axis, "name", repr(axis))
            raise ScheduleError(f"{primitive}: {name} is not a current loop of {self.tensor.name} "
                                f"(loops: {', '.join(a.name for a in self.leaves)})")

    def _check_not_annotated(self, axis: IterVar, primitive: str) -> None:
        if axis in self.kinds or (self.tensorize_at and self.tensorize_at[0] is axis):
            raise ScheduleError(f"{primitive} {axis.name}: the loop is already annotated; {primitive} before annotating")
