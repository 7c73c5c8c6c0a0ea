"""Whether an operator can run on a tensorized instruction, and how (UNIT's inspector, §3).

1. Compute isomorphism (UNIT Algorithm 1): the instruction's expression tree and the operator's are walked
   together. Every node must have the same dtype; casts are nodes, so u8 x s8 does not match s8 x s8; an
   instruction leaf (a register) binds to one operator leaf only, and a second, different one fails. Mul and add
   also match with their operands swapped.
2. The array-access check: an injective map f from operator loops onto the instruction's loops (parallel to
   parallel, reduction to reduction) is feasible when, for every bound pair (operator access u, instruction operand
   v), the instruction loops that u's mapped loops become, S'(u) = {f(x) : x in vars(u)}, are among v's own loops
   S(v). The loops of v missing from S'(u) are lanes along which u is broadcast (one value fills them). A failure
   means one lane would need several addresses.
3. Candidates are tried innermost first (the operator's loops from its last outward), so the first feasible map is
   the one with the best locality; the rest are alternatives a tuner may try. An operator loop whose extent is not
   a multiple of the instruction loop's is padded up to one (`Mapping.padding`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .expr import Access, Binary, Cast, Computation, Const


@dataclass(frozen=True)
class Mapping:
    instruction: str
    loops: tuple[tuple[str, str], ...]  # (instruction loop, operator loop)
    bind: tuple[tuple[str, str], ...]  # (instruction tensor, operator tensor), the accumulator first
    broadcast: tuple[tuple[str, tuple[str, ...]], ...]  # instruction tensor -> the instruction loops it is broadcast along
    padding: tuple[tuple[str, int], ...] = ()  # operator loop -> its extent rounded up to the instruction loop's

    def loop_of(self, instruction_loop: str) -> str:
        return dict(self.loops)[instruction_loop]

    def broadcast_of(self, tensor: str) -> tuple[str, ...]:
        return dict(self.broadcast).get(tensor, ())


def isomorphic(ins, op, bind: dict) -> bool:
    """UNIT Algorithm 1: `bind` (instruction leaf -> operator leaf) is filled in place when they match."""
    if ins.dtype != op.dtype:
        return False
    if isinstance(ins, (Access, Const)) and isinstance(op, (Access, Const)):
        if isinstance(ins, Const) or isinstance(op, Const):
            return isinstance(ins, Const) and isinstance(op, Const) and ins.value == op.value
        if ins in bind:
            return bind[ins] == op  # one register, one array element
        bind[ins] = op
        return True
    if isinstance(ins, Cast) and isinstance(op, Cast):
        return isomorphic(ins.operand, op.operand, bind)
    if isinstance(ins, Binary) and isinstance(op, Binary) and ins.op == op.op:
        for lhs, rhs in ((op.lhs, op.rhs), (op.rhs, op.lhs)):  # both orders: mul and add commute
            trial = dict(bind)
            if isomorphic(ins.lhs, lhs, trial) and isomorphic(ins.rhs, rhs, trial):
                bind.clear()
                bind.update(trial)
                return True
    return False


def _binding(op: Computation, ins: Computation) -> dict | None:
    if ins.output.dtype != op.output.dtype:
        return None
    bind: dict = {}
    if not isomorphic(ins.body, op.body, bind):
        return None
    bind[ins.output] = op.output
    return bind


def _feasible(f: dict[str, str], bind: dict) -> dict[str, tuple[str, ...]] | None:
    """The broadcast lanes of each instruction tensor under f (operator loop -> instruction loop), or None."""
    broadcast = {}
    for v, u in bind.items():
        mapped = {f[x] for x in u.vars if x in f}
        own = v.vars
        if not mapped <= own:
            return None
        missing = tuple(sorted(own - mapped))
        if missing:
            broadcast[v.tensor] = missing
    return broadcast


def mappings(op: Computation, instruction) -> list[Mapping]:
    """Every feasible mapping of `op` onto `instruction` (an Instruction or its Computation), innermost first."""
    ins = getattr(instruction, "computation", instruction)
    bind = _binding(op, ins)
    if bind is None:
        return []
    candidates = []
    for il in ins.loops:
        same_kind = [lp for lp in reversed(op.loops) if lp.reduce == il.reduce]  # innermost first
        candidates.append(same_kind)
    found = []
    for choice in itertools.product(*candidates):
        names = [lp.name for lp in choice]
        if len(set(names)) != len(names):
            continue  # two instruction loops on one operator loop: not injective
        f = {lp.name: il.name for lp, il in zip(choice, ins.loops)}
        broadcast = _feasible(f, bind)
        if broadcast is None:
            continue
        padding = tuple((lp.name, -(-lp.extent // il.extent) * il.extent)
                        for lp, il in zip(choice, ins.loops) if lp.extent % il.extent)
        found.append(Mapping(
            instruction=getattr(instruction, "name", ins.name),
            loops=tuple((il.name, lp.name) for il, lp in zip(ins.loops, choice)),
            bind=tuple((v.tensor, u.tensor) for v, u in sorted(bind.items(), key=lambda kv: kv[0] != ins.output)),
            broadcast=tuple(sorted(broadcast.items())), padding=padding))
    return found


def find_mapping(op: Computation, instruction) -> Mapping | None:
    """The first feasible mapping (innermost loops), or None when the operator cannot use the instruction."""
    found = mappings(op, instruction)
    return found[0] if found else None
