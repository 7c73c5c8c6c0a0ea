"""Heron's constraint model: integer variables and six constraint types (PROD, SUM, EQ, LE, IN, SELECT), kept
independent of the solver so that a plain-Python evaluator (`satisfied`) checks any assignment the solver gives.

Variables have a kind, as in Heron: "arch" (fixed by the problem or the target), "loop" (a loop's extent after the
schedule's splits), "knob" (tunable), "aux" (introduced by a rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Var:
    name: str
    lo: int
    hi: int
    kind: str  # "arch", "loop", "knob", "aux"


@dataclass(frozen=True)
class Prod:  # out = product of factors
    out: str
    factors: tuple[str, ...]


@dataclass(frozen=True)
class Sum:  # out = sum of coef * var, plus const
    out: str
    terms: tuple[tuple[int, str], ...]
    const: int = 0


@dataclass(frozen=True)
class Eq:  # var = value (a constant or a variable)
    var: str
    value: int | str


@dataclass(frozen=True)
class Le:  # lhs <= rhs (each a constant or a variable)
    lhs: int | str
    rhs: int | str


@dataclass(frozen=True)
class In:  # var is one of values
    var: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class Select:  # out = choices[index]
    out: str
    index: str
    choices: tuple[str, ...]


Constraint = Prod | Sum | Eq | Le | In | Select
TYPES = ("PROD", "SUM", "EQ", "LE", "IN", "SELECT")


def type_name(c: Constraint) -> str:
    return {Prod: "PROD", Sum: "SUM", Eq: "EQ", Le: "LE", In: "IN", Select: "SELECT"}[type(c)]


@dataclass
class Csp:
    """A constraint satisfaction problem: what rules.derive makes of a schedule. `knobs` are the tunable
    variables, in the schedule's order; every other variable follows from them and the constants."""

    name: str
    vars: dict[str, Var] = field(default_factory=dict)
    constraints: list = field(default_factory=list)
    knobs: list[str] = field(default_factory=list)

    def var(self, name: str, lo: int, hi: int, kind: str) -> str:
        old = self.vars.get(name)
        if old is not None:  # a second rule narrows it
            lo, hi = max(lo, old.lo), min(hi, old.hi)
            kind = old.kind if old.kind != "aux" else kind
        if lo > hi:
            raise ValueError(f"{self.name}: variable {name} has an empty domain [{lo}, {hi}]")
        self.vars[name] = Var(name, lo, hi, kind)
        if kind == "knob" and name not in self.knobs:
            self.knobs.append(name)
        return name

    def add(self, c: Constraint) -> None:
        self.constraints.append(c)

    def size(self) -> dict:
        """Variables and constraints, by kind and type (Heron reports GEMM 173 / 372, C2D 304 / 702)."""
        kinds: dict[str, int] = {}
        for v in self.vars.values():
            kinds[v.kind] = kinds.get(v.kind, 0) + 1
        types: dict[str, int] = {}
        for c in self.constraints:
            types[type_name(c)] = types.get(type_name(c), 0) + 1
        return {"variables": len(self.vars), "constraints": len(self.constraints), "by_kind": kinds,
                "by_type": types}

    def copy(self) -> "Csp":
        return Csp(self.name, dict(self.vars), list(self.constraints), list(self.knobs))


def _value(x, a: dict) -> int:
    return x if isinstance(x, int) else a[x]


def satisfied(csp: Csp, a: dict, extra: list | None = None) -> list[str]:
    """The constraints (and variable bounds) that assignment `a` violates, as text; [] when it satisfies them all.
    Independent of the solver: the tests check every solution with it."""
    bad = []
    for v in csp.vars.values():
        if v.name not in a:
            bad.append(f"{v.name} unassigned")
        elif not v.lo <= a[v.name] <= v.hi:
            bad.append(f"{v.name}={a[v.name]} outside [{v.lo}, {v.hi}]")
    if bad:
        return bad
    for c in list(csp.constraints) + list(extra or []):
        if isinstance(c, Prod):
            p = 1
            for f in c.factors:
                p *= a[f]
            ok = a[c.out] == p
        elif isinstance(c, Sum):
            ok = a[c.out] == sum(k * a[v] for k, v in c.terms) + c.const
        elif isinstance(c, Eq):
            ok = a[c.var] == _value(c.value, a)
        elif isinstance(c, Le):
            ok = _value(c.lhs, a) <= _value(c.rhs, a)
        elif isinstance(c, In):
            ok = a[c.var] in c.values
        else:
            i = a[c.index]
            ok = 0 <= i < len(c.choices) and a[c.out] == a[c.choices[i]]
        if not ok:
            bad.append(repr(c))
    return bad
