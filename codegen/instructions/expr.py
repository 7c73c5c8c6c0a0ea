"""A tiny tensor language for what a dot-product instruction computes and what an operator computes (UNIT §2).

A `Computation` is a loop nest (each loop parallel or a reduction), one output element and one expression:

    output[index] += body        over every point of the loops

The expression is a tree of `Cast`, `Binary` (mul, add) and leaves: `Access` (an element of a named tensor at an
index whose dims are affine in the loop variables) and `Const`. Every node has a dtype, so the inspector
(inspector.py) can tell u8 x s8 from s8 x s8. `evaluate` runs a computation on numpy arrays: the reference each
instruction's implementation and each rewritten loop nest is checked against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

DTYPES = {"u8": np.uint8, "s8": np.int8, "s16": np.int16, "s32": np.int32, "f16": np.float16, "f32": np.float32}


@dataclass(frozen=True)
class Loop:
    name: str
    extent: int
    reduce: bool = False


@dataclass(frozen=True)
class Dim:
    """One dim of an index: sum of coef * var over `terms` plus `offset`; `affine` False for an index the access
    check cannot see through (a division, a modulo): it then names its variables but no coefficients."""

    terms: tuple[tuple[str, int], ...]
    offset: int = 0
    affine: bool = True

    @property
    def vars(self) -> set[str]:
        return {v for v, c in self.terms if c}

    def __str__(self):
        if not self.affine:
            return "f(" + ", ".join(sorted(self.vars)) + ")"
        parts = [(f"{c}*{v}" if c != 1 else v) for v, c in self.terms if c] + ([str(self.offset)] if self.offset else [])
        return "+".join(parts).replace("+-", "-") or "0"


def dim(text: str) -> Dim:
    """'4*i+j', 'x+r', 'k', '2*p-1'; anything with / or % is a non-affine dim of the names in it."""
    text = text.replace(" ", "")
    if "/" in text or "%" in text:
        names = tuple(sorted(set(re.findall(r"[A-Za-z_]\w*", text))))
        return Dim(tuple((n, 1) for n in names), affine=False)
    terms, offset = {}, 0
    for sign, term in re.findall(r"([+-]?)([^+-]+)", text):
        k = -1 if sign == "-" else 1
        if "*" in term:
            a, v = term.split("*")
            if a.isdigit():
                terms[v] = terms.get(v, 0) + k * int(a)
            else:
                terms[a] = terms.get(a, 0) + k * int(v)
        elif term.isdigit():
            offset += k * int(term)
        else:
            terms[term] = terms.get(term, 0) + k
    return Dim(tuple(terms.items()), offset)


@dataclass(frozen=True)
class Access:
    tensor: str
    dtype: str
    index: tuple[Dim, ...]

    @property
    def vars(self) -> set[str]:
        return set().union(*(d.vars for d in self.index)) if self.index else set()

    def __str__(self):
        return f"{self.tensor}[{', '.join(str(d) for d in self.index)}]"


@dataclass(frozen=True)
class Const:
    dtype: str
    value: float


@dataclass(frozen=True)
class Cast:
    dtype: str
    operand: object


@dataclass(frozen=True)
class Binary:
    op: str  # "mul" or "add"
    dtype: str
    lhs: object
    rhs: object


def access(tensor: str, dtype: str, *dims: str) -> Access:
    return Access(tensor, dtype, tuple(dim(d) for d in dims))


def mul(dtype: str, a, b) -> Binary:
    return Binary("mul", dtype, a, b)


def cast(dtype: str, x) -> Cast:
    return Cast(dtype, x)


@dataclass(frozen=True)
class Computation:
    name: str
    loops: tuple[Loop, ...]  # outermost first
    output: Access
    body: object
    notes: str = field(default="", compare=False)

    @property
    def loop(self) -> dict[str, Loop]:
        return {lp.name: lp for lp in self.loops}

    def accesses(self) -> list[Access]:
        """The body's memory leaves, left to right."""
        out = []

        def walk(e):
            if isinstance(e, Access):
                out.append(e)
            elif isinstance(e, Cast):
                walk(e.operand)
            elif isinstance(e, Binary):
                walk(e.lhs)
                walk(e.rhs)

        walk(self.body)
        return out

    def __str__(self):
        return f"{self.name}: {self.output} += {show(self.body)}  for {', '.join(_loop_text(lp) for lp in self.loops)}"


def _loop_text(lp: Loop) -> str:
    return f"{lp.name}<{lp.extent}{' reduce' if lp.reduce else ''}>"


def show(e) -> str:
    if isinstance(e, Access):
        return f"{e}:{e.dtype}"
    if isinstance(e, Const):
        return f"{e.value}:{e.dtype}"
    if isinstance(e, Cast):
        return f"{e.dtype}({show(e.operand)})"
    sym = "*" if e.op == "mul" else "+"
    return f"({show(e.lhs)} {sym} {show(e.rhs)})"


def evaluate(comp: Computation, arrays: dict[str, np.ndarray], out: np.ndarray) -> np.ndarray:
    """out (a copy) with comp's sum added: every access index is computed over the whole iteration space, so keep
    the extents small (instructions, test shapes). Integer arithmetic wraps in its dtype, as the hardware's does."""
    names = [lp.name for lp in comp.loops]
    grids = dict(zip(names, np.indices([lp.extent for lp in comp.loops], dtype=np.int64)))

    def index(acc: Access):
        if any(not d.affine for d in acc.index):
            raise ValueError(f"{acc}: evaluate needs affine indices")
        return tuple(sum((c * grids[v] for v, c in d.terms), np.zeros_like(grids[names[0]])) + d.offset
                     for d in acc.index)

    def value(e):
        if isinstance(e, Access):
            return arrays[e.tensor][index(e)].astype(DTYPES[e.dtype])
        if isinstance(e, Const):
            return np.full(grids[names[0]].shape, e.value, DTYPES[e.dtype])
        if isinstance(e, Cast):
            return value(e.operand).astype(DTYPES[e.dtype])
        x, y = value(e.lhs), value(e.rhs)
        with np.errstate(over="ignore"):
            return (x * y if e.op == "mul" else x + y).astype(DTYPES[e.dtype])

    result = out.copy()
    with np.errstate(over="ignore"):
        np.add.at(result, index(comp.output), value(comp.body).astype(result.dtype))
    return result
