"""Affine forms of integer index expressions: sum(coefficient * atom) + constant.

Vectorization, guards and tensorize all ask the same question of an index: how does it change when one loop
variable steps by one? An atom is a loop variable or a sub-expression that is not linear (a product of variables,
`x // 4`, `x % 4`). Two rewrites keep the forms that scheduling produces linear:

* `(x // d) * d + x % d` is `x` (for any x, with floor semantics), so an index split by `fuse` into `f // n` and
  `f % n` flattens back to `f` in a row-major offset, and a fused loop stays contiguous;
* `x // d` and `x % d` fold when every coefficient of x is a multiple of d.
"""

from __future__ import annotations

from .expr import Binary, Cast, Const, Expr, Var, as_expr, depends_on, structural_key


class Affine:
    """sum(coef * atom) + const over int64 values. `terms` maps a canonical key to [atom, coef, inner], where
    inner is the Affine of x for the atoms x // d and x % d (so those two can be recognised and merged)."""

    def __init__(self, terms: dict | None = None, const: int = 0):
        self.terms = {k: v for k, v in (terms or {}).items() if v[1] != 0}
        self.const = const

    @staticmethod
    def atom(e: Expr, key=None, inner: Affine | None = None) -> Affine:
        return Affine({key if key is not None else _atom_key(e): [e, 1, inner]})

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def __add__(self, other: Affine) -> Affine:
        terms = {k: list(v) for k, v in self.terms.items()}
        for k, (atom, coef, inner) in other.terms.items():
            if k in terms:
                terms[k][1] += coef
            else:
                terms[k] = [atom, coef, inner]
        return _merge_div_mod(Affine(terms, self.const + other.const))

    def scale(self, factor: int) -> Affine:
        return Affine({k: [a, c * factor, i] for k, (a, c, i) in self.terms.items()}, self.const * factor)

    def coefficient(self, var: Var) -> int | None:
        """How much the value changes when `var` steps by one; None if var also occurs non-linearly."""
        coef = 0
        for atom, c, _ in self.terms.values():
            if atom is var:
                coef = c
            elif depends_on(atom, var):
                return None
        return coef

    def without(self, *variables: Var) -> Affine:
        """This form with the (linear) terms of `variables` removed: its value where they are zero."""
        return Affine({k: v for k, v in self.terms.items() if not any(v[0] is var for var in variables)}, self.const)

    def canonical(self):
        return (frozenset((k, v[1]) for k, v in self.terms.items()), self.const)

    def to_expr(self) -> Expr:
        result = None
        for atom, coef, _ in self.terms.values():
            term = atom if coef == 1 else atom * coef
            result = term if result is None else result + term
        if result is None:
            return Const(self.const, "int64")
        return result + self.const if self.const else result

    def __repr__(self):
        parts = [f"{c}*{a}" for a, c, _ in self.terms.values()]
        return " + ".join(parts + [str(self.const)])


def _atom_key(e: Expr):
    return ("var", id(e)) if isinstance(e, Var) else ("expr", structural_key(e))


def _floor_div_mod_atom(op: str, inner: Affine, divisor: int) -> Affine:
    if inner.is_constant:
        value = inner.const // divisor if op == "floordiv" else inner.const % divisor
        return Affine(const=value)
    if all(c % divisor == 0 for _, c, _ in inner.terms.values()) and inner.const % divisor == 0:
        # Exact: floor(d*y / d) = y and (d*y) mod d = 0.
        return Affine() if op == "mod" else _divide_exact(inner, divisor)
    e = Binary(op, inner.to_expr(), Const(divisor, "int64"), "int64")
    return Affine.atom(e, key=(op, inner.canonical(), divisor), inner=inner)


def _divide_exact(a: Affine, divisor: int) -> Affine:
    return Affine({k: [x, c // divisor, i] for k, (x, c, i) in a.terms.items()}, a.const // divisor)


def _merge_div_mod(a: Affine) -> Affine:
    """Rewrite k*d*(x // d) + k*(x % d) into k*x, until nothing merges."""
    while True:
        for key, (_, coef_div, inner) in a.terms.items():
            if key[0] != "floordiv":
                continue
            mod_key = ("mod",) + key[1:]
            divisor = key[2]
            mod = a.terms.get(mod_key)
            if mod is None or coef_div != mod[1] * divisor:
                continue
            rest = Affine({k: v for k, v in a.terms.items() if k not in (key, mod_key)}, a.const)
            a = rest + inner.scale(mod[1])
            break
        else:
            return a


def linearize(e: Expr) -> Affine:
    """The affine form of an integer expression (non-linear parts become atoms)."""
    if isinstance(e, Const) and e.dtype in ("int32", "int64"):
        return Affine(const=int(e.value))
    if isinstance(e, Var):
        return Affine.atom(e)
    if isinstance(e, Cast) and e.dtype == "int64" and e.a.dtype == "int64":
        return linearize(e.a)
    if isinstance(e, Binary) and e.dtype == "int64":
        a, b = linearize(e.a), linearize(e.b)
        if e.op == "add":
            return a + b
        if e.op == "sub":
            return a + b.scale(-1)
        if e.op == "mul" and (a.is_constant or b.is_constant):
            return b.scale(a.const) if a.is_constant else a.scale(b.const)
        if e.op in ("floordiv", "mod") and b.is_constant and b.const > 0:
            if b.const == 1:
                return a if e.op == "floordiv" else Affine()
            return _floor_div_mod_atom(e.op, a, b.const)
    return Affine.atom(e)


def flat_offset(tensor, indices) -> Affine:
    """The row-major element offset of tensor[indices]."""
    total = Affine()
    for index, stride in zip(indices, tensor.strides):
        total = total + linearize(as_expr(index)).scale(stride)
    return total
