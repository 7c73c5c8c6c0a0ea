"""The tensor-expression front end: placeholders, `compute` and reductions.

    A = placeholder((M, K), "A")
    B = placeholder((K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum(A[i, k] * B[k, j], axis=k), name="C")

A compute describes one output tensor as a function of its index. Its body may hold at most one reduction
(`sum`, `reduce_max`, `reduce_min`); elementwise work around it (`sum(...) / 9`, `sum(...) + bias[j]`) is an
epilogue, applied once the reduction of an element is complete. Computes read placeholders only: one compute is
one kernel.
"""

from __future__ import annotations

import inspect
import itertools
import numbers
from dataclasses import dataclass

from .expr import (
    TENSOR_DTYPES,
    Const,
    Expr,
    IterVar,
    Load,
    Reduce,
    as_expr,
    free_vars,
    transform,
    walk,
)

_creation_order = itertools.count()


class Tensor:
    """A dense row-major float32/int32 tensor: a placeholder (op is None) or the output of a ComputeOp."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, op: ComputeOp | None = None):
        if dtype not in TENSOR_DTYPES:
            raise TypeError(f"tensor {name}: dtype {dtype} is not supported ({', '.join(TENSOR_DTYPES)})")
        if any(not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"tensor {name}: shape {shape} must be positive integers")
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.op = op
        self.seq = next(_creation_order)  # placeholders are passed to kernels in creation order

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        out, step = [], 1
        for d in reversed(self.shape):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    def __getitem__(self, index) -> Load:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.ndim:
            raise IndexError(f"{self.name} has {self.ndim} dims, indexed with {len(index)}")
        exprs = tuple(as_expr(i) for i in index)
        for e in exprs:
            if e.dtype not in ("int32", "int64"):
                raise TypeError(f"{self.name}: index {e} is {e.dtype}, not an integer")
        return Load(self, exprs, self.dtype)

    def __repr__(self):
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


@dataclass(eq=False)
class ComputeOp:
    axes: tuple[IterVar, ...]
    reduce_axes: tuple[IterVar, ...]
    body: Expr  # the whole expression, Reduce included
    reduce: Reduce | None

    def epilogue(self, accumulated: Expr) -> Expr | None:
        """The body with the reduction replaced by `accumulated`; None when the body is the bare reduction."""
        if self.reduce is None or self.body is self.reduce:
            return None
        return transform(self.body, lambda node: accumulated if node is self.reduce else None)


def placeholder(shape, name: str = "A", dtype: str = "float32") -> Tensor:
    return Tensor(name, _dims(shape), dtype)


def _dims(shape) -> tuple[int, ...]:
    """Python ints (numpy integers too); anything else is left for Tensor to refuse."""
    return tuple(int(d) if isinstance(d, numbers.Integral) else d for d in shape)


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    if not isinstance(extent, int) or extent < 1:
        raise ValueError(f"reduce_axis {name}: extent must be a positive int, got {extent!r}")
    return IterVar(name, "int64", extent, "reduce")


def _reduction(op: str, body, axis) -> Reduce:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if not axes:
        raise ValueError(f"{op}: give at least one reduce axis")
    for a in axes:
        if not isinstance(a, IterVar) or a.kind != "reduce":
            raise TypeError(f"{op}: axis {a!r} is not a reduce_axis")
    body = as_expr(body)
    if body.dtype not in TENSOR_DTYPES:
        raise TypeError(f"{op} over a {body.dtype} value: {body}")
    return Reduce(op, body, axes, body.dtype)


def sum(body, axis) -> Reduce:
    return _reduction("sum", body, axis)


def reduce_max(body, axis) -> Reduce:
    return _reduction("max", body, axis)


def reduce_min(body, axis) -> Reduce:
    return _reduction("min", body, axis)


def reduction_identity(op: str, dtype: str) -> Const:
    """The value an accumulator starts from."""
    if op == "sum":
        return Const(0.0 if dtype == "float32" else 0, dtype)
    if dtype == "float32":
        return Const(float("-inf") if op == "max" else float("inf"), dtype)
    return Const(-(2**31) if op == "max" else 2**31 - 1, dtype)


def _axis_names(fcompute, rank: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if len(params) == rank and all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params):
        return [p.name for p in params]
    return [f"i{d}" for d in range(rank)]


def compute(shape, fcompute, name: str = "C") -> Tensor:
    """The tensor `name`[index] = fcompute(*index) over `shape`."""
    shape = _dims(shape)
    axes = tuple(IterVar(n, "int64", extent, "spatial") for n, extent in zip(_axis_names(fcompute, len(shape)), shape))
    body = as_expr(fcompute(*axes))
    if body.dtype not in TENSOR_DTYPES:
        raise TypeError(f"compute {name}: the body is {body.dtype}; a tensor holds {' or '.join(TENSOR_DTYPES)}")
    reductions = [n for n in walk(body) if isinstance(n, Reduce)]
    if len(reductions) > 1:
        raise ValueError(f"compute {name}: at most one reduction per compute, found {len(reductions)}")
    reduce = reductions[0] if reductions else None
    reduce_axes = reduce.axes if reduce is not None else ()
    _check_variables(name, body, reduce, axes, reduce_axes)
    _check_reads(name, body)
    op = ComputeOp(axes, reduce_axes, body, reduce)
    if reduce is not None and body is not reduce and body.dtype != reduce.dtype:
        # The output buffer holds the accumulator first, then the epilogue's result.
        raise TypeError(f"compute {name}: the epilogue changes the dtype {reduce.dtype} -> {body.dtype}")
    return Tensor(name, shape, body.dtype, op)


def _check_variables(name, body, reduce, axes, reduce_axes) -> None:
    if len(set(reduce_axes)) != len(reduce_axes):
        raise ValueError(f"compute {name}: a reduce axis is listed twice")
    inside = free_vars(reduce.body) if reduce is not None else set()
    outside = free_vars(_without_reduction(body, reduce))
    allowed = set(axes)
    for v in inside:
        if v not in allowed and v not in reduce_axes:
            raise ValueError(f"compute {name}: variable {v.name} is neither an axis nor one of the reduce axes")
    for v in outside:
        if v not in allowed:
            raise ValueError(f"compute {name}: variable {v.name} is used outside the reduction over it")


def _without_reduction(body, reduce) -> Expr:
    return transform(body, lambda node: Const(0, "int64") if node is reduce else None)


def _check_reads(name, body) -> None:
    for node in walk(body):
        if isinstance(node, Load) and node.tensor.op is not None:
            raise ValueError(f"compute {name} reads the computed tensor {node.tensor.name}: one compute per kernel, "
                             "inline it into the expression instead")


def inputs_of(tensor: Tensor) -> list[Tensor]:
    """The placeholders a compute reads, in creation order."""
    found = {n.tensor for n in walk(tensor.op.body) if isinstance(n, Load)}
    return sorted(found, key=lambda t: t.seq)
