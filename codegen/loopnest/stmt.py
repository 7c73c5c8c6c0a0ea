"""The loop-nest IR that a schedule lowers to and the code generator walks: loops, guards, stores, intrinsics."""

from __future__ import annotations

from dataclasses import dataclass, field

from .affine import Affine
from .expr import Expr, IterVar, format_expr, substitute


@dataclass(eq=False)
class Loop:
    """for var in [0, min(var.extent, *bounds)): body. `bounds` come from splits that over-cover their axis."""

    var: IterVar
    kind: str  # serial, vectorized, unrolled, parallel
    body: list
    bounds: list[Expr] = field(default_factory=list)

    @property
    def extent(self) -> int:
        return self.var.extent


@dataclass(eq=False)
class IfThen:
    cond: Expr
    body: list


@dataclass(eq=False)
class Store:
    tensor: object  # te.Tensor
    indices: tuple[Expr, ...]
    value: Expr

    def substituted(self, mapping) -> Store:
        return Store(self.tensor, tuple(substitute(i, mapping) for i in self.indices), substitute(self.value, mapping))


@dataclass(frozen=True)
class OperandBinding:
    """Where an intrinsic's tensor lives in the program: a buffer, the element offset of the intrinsic's origin
    (in terms of the loops outside the tensorized nest) and one stride per dimension of the intrinsic's tensor."""

    tensor: object
    origin: Affine
    strides: tuple[int, ...]


@dataclass(eq=False)
class Tensorized:
    """A loop nest replaced by a tensor intrinsic. When a loop of the nest is shortened by a bound (a partial tile),
    the original nest runs instead, so the result never depends on the tile fitting."""

    intrinsic: object  # tensorize.TensorIntrinsic
    operands: dict[str, OperandBinding]
    loops: list[Loop]
    fallback: list


def format_stmts(stmts: list, indent: int = 0) -> str:
    lines = []
    pad = "  " * indent
    for s in stmts:
        if isinstance(s, Loop):
            kind = "" if s.kind == "serial" else s.kind + " "
            bound = "".join(f", < {format_expr(b)}" for b in s.bounds)
            lines.append(f"{pad}{kind}for {s.var.name} in 0..{s.extent}{bound}:")
            lines.append(format_stmts(s.body, indent + 1))
        elif isinstance(s, IfThen):
            lines.append(f"{pad}if {format_expr(s.cond)}:")
            lines.append(format_stmts(s.body, indent + 1))
        elif isinstance(s, Store):
            index = ", ".join(format_expr(i) for i in s.indices)
            lines.append(f"{pad}{s.tensor.name}[{index}] = {format_expr(s.value)}")
        elif isinstance(s, Tensorized):
            names = ", ".join(f"{k}={b.tensor.name}@{b.origin}" for k, b in s.operands.items())
            lines.append(f"{pad}{s.intrinsic.name}({names})")
    return "\n".join(lines)
