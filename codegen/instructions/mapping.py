"""AMOS's mappings (thesis ch. 5, ASPLOS'22): which groups of an operator's loops can run as an intrinsic's
iterations, every one of them enumerated and validated.

An intrinsic here is a Computation whose sources index each dim by one of its own loops (Tensor Core's
d[i, j] += a[i, k] * b[k, j]; VNNI read as a GEMV, d[i] += a[j] * b[i, j]). The rules, established from AMOS's
matcher and mapping generator (its Table 5.3 counts are the golden tests):

1. The operator's expression must be the intrinsic's (expr trees, dtypes and casts: inspector.isomorphic); its
   first load binds to the intrinsic's first source, its second to the second.
2. A match point gives each intrinsic loop one distinct operator loop of the same kind (parallel or reduction).
   In each source's index, a mapped loop becomes its intrinsic loop and an unmapped one its first value (0).
   Then every index variable of the intrinsic source must find a dim of the rewritten operator index of the form
   alpha * var + beta with alpha > 0 (strides and dilations fine; a sum of two intrinsic loops, or a flipped kernel
   index such as 2 - r, is not), each dim used once, in any order (transposed layouts fine); every dim left over
   must be constant. So a loop that indexes both sources (a group, a depthwise channel, a per-sample weight) is
   never mapped.
3. A mapping is any non-empty set of match points merged per intrinsic loop: the union of their operator loops is
   fused into that intrinsic loop, the other loops stay outside. Distinct merged mappings are counted once.

`valid` is the thesis's Algorithm 4 on boolean matrices (X: arrays x loops, Y: intrinsic loops x loops, Z:
operands x intrinsic loops; valid when Z*Y = X and X*Y^T = Z over the mapped loops). Every mapping above passes
it, but it cannot see index structure (two loops sharing one dim, a negative coefficient), so it alone admits more.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .expr import Access, Computation, Dim
from .inspector import isomorphic


@dataclass(frozen=True)
class AmosMapping:
    """Per intrinsic loop, the operator loops fused into it (the rest stay outer loops)."""

    groups: tuple[tuple[str, frozenset[str]], ...]  # (intrinsic loop, operator loops)

    def of(self, intrinsic_loop: str) -> frozenset[str]:
        return dict(self.groups)[intrinsic_loop]

    @property
    def mapped(self) -> frozenset[str]:
        return frozenset().union(*(g for _, g in self.groups))


def _sources(op: Computation, intrinsic: Computation) -> list[tuple[Access, Access]] | None:
    """(intrinsic source, operator access) pairs, the intrinsic's sources in load order, or None if the expressions
    differ. AMOS binds loads in order: the first tried binding is the unswapped one."""
    bind: dict = {}
    if intrinsic.output.dtype != op.output.dtype or not isomorphic(intrinsic.body, op.body, bind):
        return None
    return [(v, bind[v]) for v in intrinsic.accesses()]


def _rewrite(d: Dim, to_intrinsic: dict[str, str]) -> dict[str, int]:
    """The dim with mapped loops renamed to intrinsic loops and unmapped ones at 0: {var: coefficient}."""
    out: dict[str, int] = {}
    for v, c in d.terms:
        if c and v in to_intrinsic:
            out[to_intrinsic[v]] = out.get(to_intrinsic[v], 0) + c
    return {v: c for v, c in out.items() if c}


def _source_matches(op_access: Access, intrinsic_access: Access, to_intrinsic: dict[str, str]) -> bool:
    if not all(d.affine for d in op_access.index):
        return False
    dims = [_rewrite(d, to_intrinsic) for d in op_access.index]
    used = [False] * len(dims)
    for d in intrinsic_access.index:
        (var,) = d.vars  # an intrinsic indexes each dim by one of its loops
        k = next((k for k, x in enumerate(dims) if not used[k] and list(x) == [var] and x[var] > 0), None)
        if k is None:
            return False
        used[k] = True
    return all(used[k] or not dims[k] for k in range(len(dims)))


def match_points(op: Computation, intrinsic) -> list[tuple[tuple[str, str], ...]]:
    """Every assignment of one operator loop to each intrinsic loop that the sources' indices accept:
    ((intrinsic loop, operator loop), ...) in the intrinsic's loop order."""
    ins = getattr(intrinsic, "computation", intrinsic)
    pairs = _sources(op, ins)
    if pairs is None:
        return []
    points = []
    for choice in itertools.permutations(op.loops, len(ins.loops)):
        if any(lp.reduce != il.reduce for lp, il in zip(choice, ins.loops)):
            continue
        to_intrinsic = {lp.name: il.name for lp, il in zip(choice, ins.loops)}
        if all(_source_matches(u, v, to_intrinsic) for v, u in pairs):
            points.append(tuple((il.name, lp.name) for il, lp in zip(ins.loops, choice)))
    return points


def mappings(op: Computation, intrinsic) -> list[AmosMapping]:
    """Every distinct mapping: the non-empty sets of match points, merged per intrinsic loop."""
    ins = getattr(intrinsic, "computation", intrinsic)
    points = match_points(op, ins)
    seen, out = set(), []
    for r in range(1, len(points) + 1):
        for chosen in itertools.combinations(points, r):
            groups = tuple((il.name, frozenset(dict(p)[il.name] for p in chosen)) for il in ins.loops)
            if groups not in seen:
                seen.add(groups)
                out.append(AmosMapping(groups))
    return out


def valid(op: Computation, intrinsic, mapping: AmosMapping) -> bool:
    """Algorithm 4 over the mapped loops: for each mapped loop l on intrinsic loop t and each bound pair (operator
    array, intrinsic operand), the array is indexed by l exactly when the operand is indexed by t; and each operand
    uses t exactly when some loop mapped to t indexes its array."""
    ins = getattr(intrinsic, "computation", intrinsic)
    pairs = _sources(op, ins)
    if pairs is None:
        return False
    pairs = pairs + [(ins.output, op.output)]
    on = {lp: il for il, group in mapping.groups for lp in group}
    for v, u in pairs:
        for lp, il in on.items():  # Z * Y == X on the mapped columns
            if (lp in u.vars) != (il in v.vars):
                return False
        for il, group in mapping.groups:  # X * Y^T == Z
            if (il in v.vars) != any(lp in u.vars for lp in group):
                return False
    return True


def implemented(op: Computation, instructions, loops: dict[str, str]):
    """(instruction, mapping): the first of `instructions` with a valid mapping of `op` that puts each intrinsic loop
    on exactly the operator loop `loops` names (the mapping a kernel's tile program implements), or (None, why).
    Ranking several valid mappings is the schedule search's."""
    tried = []
    for ins in instructions:
        for m in mappings(op, ins.computation):
            if valid(op, ins.computation, m) and all(m.of(il) == frozenset({lp}) for il, lp in loops.items()):
                return ins, m
        tried.append(ins.name)
    if not tried:
        return None, "no matrix instruction"
    return None, f"no mapping onto {', '.join(tried)} that the kernel implements"
