"""Scalar expressions of the tensor language: constants, loop variables, arithmetic, comparisons, selects, loads.

Every node carries its dtype: "float32", "int32", "int64" (loop variables and index arithmetic) or "bool"
(comparisons). Mixed operands are promoted (anything with float32 becomes float32, int32 with int64 becomes int64);
Python numbers take the dtype of the other operand. Integer `/` and `//` are floor divisions and `%` is the floor
modulo, as in numpy, so index arithmetic means the same thing here and in a numpy reference.

Nodes compare by identity (`==` is not overloaded: use `equal`), so they can be dict keys; `structural_key` gives
a key that is equal for equal trees.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

NUMERIC = ("float32", "int32", "int64")
TENSOR_DTYPES = ("float32", "int32")


class Expr:
    """Base of all expression nodes. `_children` names the fields that hold sub-expressions."""

    dtype: str
    _children: tuple[str, ...] = ()

    def __add__(self, other):
        return binary("add", self, other)

    def __radd__(self, other):
        return binary("add", other, self)

    def __sub__(self, other):
        return binary("sub", self, other)

    def __rsub__(self, other):
        return binary("sub", other, self)

    def __mul__(self, other):
        return binary("mul", self, other)

    def __rmul__(self, other):
        return binary("mul", other, self)

    def __truediv__(self, other):
        return binary("div", self, other)

    def __rtruediv__(self, other):
        return binary("div", other, self)

    def __floordiv__(self, other):
        return binary("floordiv", self, other)

    def __rfloordiv__(self, other):
        return binary("floordiv", other, self)

    def __mod__(self, other):
        return binary("mod", self, other)

    def __rmod__(self, other):
        return binary("mod", other, self)

    def __neg__(self):
        return binary("sub", 0, self)

    def __lt__(self, other):
        return compare("<", self, other)

    def __le__(self, other):
        return compare("<=", self, other)

    def __gt__(self, other):
        return compare(">", self, other)

    def __ge__(self, other):
        return compare(">=", self, other)

    def __and__(self, other):
        return logical("and", self, other)

    def __or__(self, other):
        return logical("or", self, other)

    def __invert__(self):
        return Not(_expect_bool(self), "bool")

    def __bool__(self):
        # `a < b and c` or `if x > 0:` would silently pick a branch at build time.
        raise TypeError("an expression has no truth value here: use all_of/any_of, & and |, or if_then_else")

    def __repr__(self):
        return format_expr(self)


@dataclass(eq=False, repr=False)
class Const(Expr):
    value: int | float | bool
    dtype: str


@dataclass(eq=False, repr=False)
class Var(Expr):
    """A loop variable (int64)."""

    name: str
    dtype: str


@dataclass(eq=False, repr=False)
class IterVar(Var):
    """A loop variable with its range [0, extent) and kind: "spatial" (an output axis) or "reduce"."""

    extent: int
    kind: str


@dataclass(eq=False, repr=False)
class Binary(Expr):
    op: str  # add sub mul div floordiv mod max min
    a: Expr
    b: Expr
    dtype: str
    _children = ("a", "b")


@dataclass(eq=False, repr=False)
class Compare(Expr):
    op: str  # < <= > >= == !=
    a: Expr
    b: Expr
    dtype: str
    _children = ("a", "b")


@dataclass(eq=False, repr=False)
class Logical(Expr):
    op: str  # and or
    a: Expr
    b: Expr
    dtype: str
    _children = ("a", "b")


@dataclass(eq=False, repr=False)
class Not(Expr):
    a: Expr
    dtype: str
    _children = ("a",)


@dataclass(eq=False, repr=False)
class Select(Expr):
    """cond ? a : b. Only the chosen side's loads happen, so a guarded out-of-bounds read is safe (padding)."""

    cond: Expr
    a: Expr
    b: Expr
    dtype: str
    _children = ("cond", "a", "b")


@dataclass(eq=False, repr=False)
class Cast(Expr):
    a: Expr
    dtype: str
    _children = ("a",)


@dataclass(eq=False, repr=False)
class Call(Expr):
    """A math function of one float32 argument: exp or sqrt."""

    fn: str
    a: Expr
    dtype: str
    _children = ("a",)


@dataclass(eq=False, repr=False)
class Load(Expr):
    tensor: object  # a te.Tensor
    indices: tuple[Expr, ...]
    dtype: str
    _children = ("indices",)


@dataclass(eq=False, repr=False)
class Reduce(Expr):
    """op over `axes` (reduce IterVars) of `body`: "sum", "max" or "min"."""

    op: str
    body: Expr
    axes: tuple[IterVar, ...]
    dtype: str
    _children = ("body",)


# ---------------------------------------------------------------------------------------------------------------
# Construction helpers


def as_expr(value, like: Expr | None = None) -> Expr:
    """An Expr for `value`; a Python number takes the dtype of `like` when that is numeric."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, numbers.Integral):  # Python and numpy integers
        dtype = like.dtype if like is not None and like.dtype in NUMERIC else "int64"
        return Const(float(value) if dtype == "float32" else int(value), dtype)
    if isinstance(value, numbers.Real):
        return Const(float(value), "float32")
    raise TypeError(f"cannot use {value!r} ({type(value).__name__}) in an expression")


def cast(value, dtype: str) -> Expr:
    e = as_expr(value)
    if dtype not in NUMERIC:
        raise TypeError(f"cast to {dtype}: only {', '.join(NUMERIC)}")
    return e if e.dtype == dtype else Cast(e, dtype)


def _promote(a, b) -> tuple[Expr, Expr]:
    a = as_expr(a, b if isinstance(b, Expr) else None)
    b = as_expr(b, a)
    for e in (a, b):
        if e.dtype not in NUMERIC:
            raise TypeError(f"arithmetic on a {e.dtype} value: {e}")
    if a.dtype == b.dtype:
        return a, b
    common = "float32" if "float32" in (a.dtype, b.dtype) else "int64"
    return cast(a, common), cast(b, common)


def binary(op: str, a, b) -> Expr:
    a, b = _promote(a, b)
    is_int = a.dtype != "float32"
    if op == "div" and is_int:
        op = "floordiv"
    if op in ("floordiv", "mod") and not is_int:
        raise TypeError(f"'{op}' needs integer operands, got float32 (use / for float division)")
    return Binary(op, a, b, a.dtype)


def compare(op: str, a, b) -> Expr:
    a, b = _promote(a, b)
    return Compare(op, a, b, "bool")


def equal(a, b) -> Expr:
    return compare("==", a, b)


def not_equal(a, b) -> Expr:
    return compare("!=", a, b)


def _expect_bool(e) -> Expr:
    e = as_expr(e)
    if e.dtype != "bool":
        raise TypeError(f"expected a condition (a comparison), got a {e.dtype} value: {e}")
    return e


def logical(op: str, a, b) -> Expr:
    return Logical(op, _expect_bool(a), _expect_bool(b), "bool")


def all_of(*conds) -> Expr:
    """The conjunction of conditions (Python's `and` cannot be overloaded)."""
    if not conds:
        return Const(True, "bool")
    result = _expect_bool(conds[0])
    for c in conds[1:]:
        result = logical("and", result, c)
    return result


def any_of(*conds) -> Expr:
    if not conds:
        return Const(False, "bool")
    result = _expect_bool(conds[0])
    for c in conds[1:]:
        result = logical("or", result, c)
    return result


def maximum(a, b) -> Expr:
    """Elementwise max; a NaN operand gives NaN, as numpy.maximum."""
    return binary("max", a, b)


def minimum(a, b) -> Expr:
    return binary("min", a, b)


def if_then_else(cond, then_value, else_value) -> Expr:
    then_value, else_value = _promote(then_value, else_value)
    return Select(_expect_bool(cond), then_value, else_value, then_value.dtype)


def _float_call(fn: str, value) -> Expr:
    e = cast(as_expr(value, Const(0.0, "float32")), "float32")
    return Call(fn, e, "float32")


def exp(value) -> Expr:
    return _float_call("exp", value)


def sqrt(value) -> Expr:
    return _float_call("sqrt", value)


# ---------------------------------------------------------------------------------------------------------------
# Traversal


def children(e: Expr) -> list[Expr]:
    out = []
    for name in e._children:
        value = getattr(e, name)
        out.extend(value if isinstance(value, tuple) else [value])
    return out


def walk(e: Expr):
    """Every node of the tree, parents before children."""
    yield e
    for c in children(e):
        yield from walk(c)


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild the tree bottom-up; `fn(node)` returns a replacement or None to keep the (rebuilt) node."""
    replacement = fn(e)
    if replacement is not None:
        return replacement
    if not e._children:
        return e
    changes = {}
    for name in e._children:
        value = getattr(e, name)
        changes[name] = tuple(transform(v, fn) for v in value) if isinstance(value, tuple) else transform(value, fn)
    if all(changes[n] is getattr(e, n) for n in changes):
        return e
    return replace(e, **changes)


def substitute(e: Expr, mapping: dict[Var, Expr]) -> Expr:
    return transform(e, lambda node: mapping.get(node) if isinstance(node, Var) else None)


def free_vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def depends_on(e: Expr, var: Var) -> bool:
    return any(n is var for n in walk(e))


def has_load(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in walk(e))


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def structural_key(e: Expr):
    """A hashable key that is equal for structurally equal trees (vars and tensors by identity)."""
    if isinstance(e, Var):
        return ("var", id(e))
    if isinstance(e, Const):
        return ("const", e.value, e.dtype)
    head = [type(e).__name__, e.dtype]
    for f in fields(e):
        if f.name in e._children or f.name == "dtype":
            continue
        value = getattr(e, f.name)
        head.append(id(value) if not isinstance(value, (str, int, float, tuple)) else value)
    return tuple(head) + tuple(structural_key(c) for c in children(e))


# ---------------------------------------------------------------------------------------------------------------
# Printing

_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}


def format_expr(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Binary):
        if e.op in _SYMBOL:
            return f"({format_expr(e.a)} {_SYMBOL[e.op]} {format_expr(e.b)})"
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, (Compare, Logical)):
        return f"({format_expr(e.a)} {e.op} {format_expr(e.b)})"
    if isinstance(e, Not):
        return f"not {format_expr(e.a)}"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.a)})"
    if isinstance(e, Call):
        return f"{e.fn}({format_expr(e.a)})"
    if isinstance(e, Load):
        return f"{e.tensor.name}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        return f"{e.op}({format_expr(e.body)}, axis=[{', '.join(a.name for a in e.axes)}])"
    return type(e).__name__
