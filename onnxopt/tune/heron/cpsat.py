"""The constraint model on OR-Tools CP-SAT: RandSAT (Heron's sampler) and full enumeration.

RandSAT as Heron's code does it: a fresh model a call, the variables and constraints added in a shuffled order, a
random hint on every knob (one of its candidates, or a value of its range), one worker, presolve off, and the first
solution taken. It samples; it does not enumerate. An IN constraint is one boolean a candidate, exactly one true
(Heron's auxiliaries); a SELECT is an element constraint.
"""

from __future__ import annotations

import random

from ortools.sat.python import cp_model

from .constraints import Csp, Eq, In, Le, Prod, Select, Sum


class Infeasible(Exception):
    """The model (with the extra constraints given) has no solution."""


def _build(csp: Csp, extra, rng: random.Random | None):
    m = cp_model.CpModel()
    names = list(csp.vars)
    cons = list(csp.constraints) + list(extra or [])
    if rng is not None:
        rng.shuffle(names)
        rng.shuffle(cons)
    v = {}
    for n in names:
        var = csp.vars[n]
        v[n] = m.NewIntVar(var.lo, var.hi, n)

    def term(x):
        return x if isinstance(x, int) else v[x]

    for c in cons:
        if isinstance(c, Prod):
            factors = [v[f] for f in c.factors]
            if len(factors) == 1:
                m.Add(v[c.out] == factors[0])
                continue
            acc = factors[0]
            for i, f in enumerate(factors[1:-1]):  # n-ary products chained through auxiliaries
                lo = 1
                hi = 1
                for g in c.factors[:i + 2]:
                    hi *= max(1, csp.vars[g].hi)
                    lo *= csp.vars[g].lo
                nxt = m.NewIntVar(min(lo, 0), hi, f"{c.out}_chain{i}")
                m.AddMultiplicationEquality(nxt, [acc, f])
                acc = nxt
            m.AddMultiplicationEquality(v[c.out], [acc, factors[-1]])
        elif isinstance(c, Sum):
            m.Add(v[c.out] == sum(k * v[x] for k, x in c.terms) + c.const)
        elif isinstance(c, Eq):
            m.Add(v[c.var] == term(c.value))
        elif isinstance(c, Le):
            m.Add(term(c.lhs) <= term(c.rhs))
        elif isinstance(c, In):
            bools = [m.NewBoolVar(f"{c.var}_is_{x}") for x in c.values]
            m.AddExactlyOne(bools)
            for b, x in zip(bools, c.values):
                m.Add(v[c.var] == x).OnlyEnforceIf(b)
        elif isinstance(c, Select):
            m.AddElement(v[c.index], [v[x] for x in c.choices], v[c.out])
    return m, v


def _candidates(csp: Csp, name: str) -> list[int] | None:
    for c in csp.constraints:
        if isinstance(c, In) and c.var == name:
            return list(c.values)
    return None


def randsat(csp: Csp, rng: random.Random, extra=None) -> dict[str, int]:
    """One random solution of the model plus `extra` constraints. Raises Infeasible."""
    m, v = _build(csp, extra, rng)
    for k in csp.knobs:
        cands = _candidates(csp, k)
        var = csp.vars[k]
        m.AddHint(v[k], rng.choice(cands) if cands else rng.randint(var.lo, var.hi))
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_search_workers = 1
    p.cp_model_presolve = False
    p.random_seed = rng.randrange(1 << 30)
    p.randomize_search = True
    p.max_time_in_seconds = 10.0
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise Infeasible(f"{csp.name}: {solver.StatusName(status)}")
    return {n: int(solver.Value(x)) for n, x in v.items()}


def enumerate_knobs(csp: Csp, limit: int = 1_000_000) -> set[tuple[int, ...]]:
    """Every assignment of the knobs (in csp.knobs order) that extends to a solution: the space's points."""
    m, v = _build(csp, None, None)
    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_search_workers = 1
    found: set[tuple[int, ...]] = set()

    class Collect(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self):
            found.add(tuple(int(self.Value(v[k])) for k in csp.knobs))
            if len(found) >= limit:
                self.StopSearch()

    solver.Solve(m, Collect())
    return found


def complete(csp: Csp, knobs: dict[str, int]) -> dict[str, int] | None:
    """The solution with these knob values (every other variable follows from them), or None when they violate
    the model: how a search that moves knobs without the solver (a penalty GA, annealing) learns validity."""
    for k, x in knobs.items():
        var = csp.vars[k]
        if not var.lo <= x <= var.hi:
            return None
    m, _ = _build(csp, [Eq(k, int(x)) for k, x in knobs.items()], None)
    solver = cp_model.CpSolver()
    solver.parameters.num_search_workers = 1
    solver.parameters.max_time_in_seconds = 10.0
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {n: int(solver.Value(x)) for n, x in _.items()}
