"""The rules that derive a schedule's constraint model (Heron's C1-C6), from the schedule's primitives, the machine
model's capacities and the instruction's description. Nothing here knows a kernel: a kernel that changes its
schedule changes its model, and a new target adds its capacities and, where it has quirks, an instruction row.

C1 Split   -> PROD(extent, parts), or with a partial last tile: PROD(padded, parts), LE(extent, padded),
              padded - inner + 1 <= extent (SUM, LE)
C2 Fuse    -> PROD(fused, parts)
C3 Knob    -> IN(knob, candidates), or its range as the variable's bounds
C4 ComputeAt -> PROD(footprint_j, extents at location j) per location; SELECT(footprint, at, [footprint_j])
C5 Cache   -> PROD(elements, extents); SUM(bytes, unit x elements); per level SUM(total, bytes...) and
              LE(total, capacity)
C6 Vectorize / Tensorize -> EQ(axis, the instruction's shape), and its quirks (INSTRUCTION_RULES)
   Parallel -> PROD(tasks, axes), LE(tasks, the target's task limit)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .constraints import Csp, Eq, In, Le, Prod, Select, Sum
from .schedule import Cache, ComputeAt, Fuse, Knob, Parallel, Schedule, Split, Tensorize, Vectorize


@dataclass(frozen=True)
class Capacities:
    """What C5 and C6 read of the machine: vector registers and their lanes, each memory level's bytes (one core's
    share), the most tasks a kernel is split into."""

    registers: int
    lanes: int
    levels: dict = field(default_factory=dict)  # "L1", "L2", ... -> bytes
    max_tasks: int = 64

    def capacity(self, level: str) -> int:
        if level == "registers":
            return self.registers
        if level not in self.levels:
            raise ValueError(f"the machine model has no level {level!r} (it has {sorted(self.levels)})")
        return int(self.levels[level])


@dataclass(frozen=True)
class InstructionRule:
    """C6: the shape an instruction fixes on the loops it replaces (per position of Tensorize.axes; None: free,
    "lanes": the target's vector lanes) and its quirks on the knobs Tensorize names by role.
    `shapes`: alternatives (m, n, k) of which one holds (WMMA's three fragment shapes)."""

    name: str
    shape: tuple = ()
    shapes: tuple[tuple[int, int, int], ...] = ()
    quirks: tuple = ()  # callables (csp, roles, capacities) -> None, adding constraints


def _vectors_per_tile(csp: Csp, roles: dict, cap: Capacities) -> None:
    # The glue's tile record holds at most 4 vectors a row (contract.py CT_NV_MAX), and a row of vectors covers
    # whole 64-float blocks (register_tile.py BLOCK_FLOATS).
    ni = roles["vectors"]
    csp.add(In(ni, tuple(n for n in range(1, 5) if 64 % (n * cap.lanes) == 0)))


def _broadcasts_divide_rows(csp: Csp, roles: dict, cap: Capacities) -> None:
    # The micro-kernel broadcasts MII values of A at a time over MI rows (outer_product.py): MI = MII x q.
    mi, mii = roles["rows"], roles["broadcasts"]
    q = csp.var(f"{mi}_per_{mii}", 1, csp.vars[mi].hi, "aux")
    csp.add(Prod(mi, (mii, q)))


def _wmma_product(csp: Csp, roles: dict, cap: Capacities) -> None:
    # Heron's Table 3: a fragment holds m x n x k = 4096 products
    m, n, k = roles["m"], roles["n"], roles["k"]
    mn = csp.var(f"{m}_x_{n}", 1, 1024, "aux")
    csp.add(Prod(mn, (m, n)))
    mnk = csp.var(f"{m}_x_{n}_x_{k}", 4096, 4096, "aux")
    csp.add(Prod(mnk, (mn, k)))


INSTRUCTION_RULES = {
    # the float32 outer product (microkernel/outer_product.py): one FMA is 1 x lanes x 1, its loop the lanes'
    "fma_outer_product": InstructionRule("fma_outer_product", shape=("lanes",),
                                         quirks=(_vectors_per_tile, _broadcasts_divide_rows)),
    # VNNI's vpdpbusd: 1 x 16 x 4 (Heron's DL Boost row)
    "vnni_dot": InstructionRule("vnni_dot", shape=(1, 16, 4)),
    # WMMA fp16: m16n16k16, m32n8k16, m8n32k16
    "wmma_f16": InstructionRule("wmma_f16", shapes=((16, 16, 16), (32, 8, 16), (8, 32, 16)),
                                quirks=(_wmma_product,)),
}


def derive(schedule: Schedule, cap: Capacities, roles: dict | None = None) -> Csp:
    """The constraint model of `schedule` on a machine with capacities `cap`. `roles` names the knobs an
    instruction's quirks constrain (e.g. {"rows": "mi", "vectors": "ni", "broadcasts": "mii"})."""
    csp = Csp(schedule.name)
    roles = dict(roles or {})
    extent = dict(schedule.axes)
    for axis, n in schedule.axes.items():
        csp.var(axis, n, n, "arch")
    knob_steps = {s.var: s for s in schedule.steps if isinstance(s, Knob)}
    footprints: dict[str, str] = {}
    level_bytes: dict[str, list[str]] = {}
    quirks = []

    def loop(name: str, hi: int) -> str:
        kind = "knob" if name in knob_steps else "loop"
        return csp.var(name, 1, max(1, hi), kind)

    for step in schedule.steps:
        if isinstance(step, Split):  # C1
            n = extent[step.axis]
            for p in step.parts:
                extent[p] = n
                loop(p, n)
            if step.cover:
                if len(step.parts) != 2:
                    raise ValueError(f"{schedule.name}: a covering split has two parts, not {step.parts}")
                outer, inner = step.parts
                padded = csp.var(f"{step.axis}_padded", 1, 2 * n, "aux")
                csp.add(Prod(padded, (outer, inner)))
                csp.add(Le(step.axis, padded))
                slack = csp.var(f"{step.axis}_slack", 1, 2 * n, "aux")
                csp.add(Sum(slack, ((1, padded), (-1, inner)), 1))
                csp.add(Le(slack, step.axis))
                csp.add(Le(inner, step.axis))  # no tile larger than the loop
            else:
                csp.add(Prod(step.axis, step.parts))
        elif isinstance(step, Fuse):  # C2
            n = 1
            for a in step.axes:
                n *= extent[a]
            extent[step.into] = n
            loop(step.into, n)
            csp.add(Prod(step.into, step.axes))
        elif isinstance(step, Knob):  # C3
            hi = step.hi if step.hi is not None else (csp.vars[step.var].hi if step.var in csp.vars else step.lo)
            if step.values:
                lo, hi = min(step.values), max(step.values)
                csp.var(step.var, lo, hi, "knob")
                csp.add(In(step.var, tuple(step.values)))
            else:
                csp.var(step.var, step.lo, hi, "knob")
            extent.setdefault(step.var, csp.vars[step.var].hi)
        elif isinstance(step, ComputeAt):  # C4
            csp.var(step.at, 0, len(step.locations) - 1, "knob")
            choices = []
            for loc, ext in zip(step.locations, step.footprints):
                choices.append(_product(csp, f"{step.stage}_at_{loc}", ext, extent))
            hi = max(csp.vars[c].hi for c in choices)
            out = csp.var(f"{step.stage}_footprint", 1, hi, "aux")
            csp.add(Select(out, step.at, tuple(choices)))
            footprints[step.stage] = out
        elif isinstance(step, Cache):  # C5
            if step.extents and isinstance(step.extents[0], str) and step.extents[0].startswith("@"):
                elems = footprints[step.extents[0][1:]]
            else:
                elems = _product(csp, f"{step.buffer}_elements", step.extents, extent)
            cap.capacity(step.level)  # a level the machine model has
            b = csp.var(f"{step.buffer}_{'registers' if step.level == 'registers' else 'bytes'}", 0,
                        csp.vars[elems].hi * step.unit, "aux")
            csp.add(Sum(b, ((step.unit, elems),)))
            level_bytes.setdefault(step.level, []).append(b)
        elif isinstance(step, Vectorize):  # C6
            csp.add(Eq(step.axis, cap.lanes))
        elif isinstance(step, Tensorize):  # C6
            rule = INSTRUCTION_RULES[step.instruction]
            if rule.shape:
                for axis, size in zip(step.axes, rule.shape):
                    if size is not None:
                        csp.add(Eq(axis, cap.lanes if size == "lanes" else int(size)))
            if rule.shapes:
                for j, axis in enumerate(step.axes):
                    csp.add(In(axis, tuple(sorted({s[j] for s in rule.shapes}))))
            # the quirks read knobs later steps may declare: applied once every loop is known
            quirks += [(q, {**roles, **dict(zip("mnk", step.axes))}) for q in rule.quirks]
        elif isinstance(step, Parallel):
            n = 1
            for a in step.axes:
                n *= max(1, csp.vars[a].hi)
            tasks = csp.var(step.into, 1, max(1, n), "aux")
            csp.add(Prod(tasks, step.axes))
            csp.add(Le(tasks, cap.max_tasks))
    for quirk, named in quirks:
        quirk(csp, named, cap)
    for level, parts in level_bytes.items():  # C5: a level's buffers together
        hi = sum(csp.vars[p].hi for p in parts)
        total = csp.var(f"{level}_used", 0, max(0, hi), "aux")
        csp.add(Sum(total, tuple((1, p) for p in parts)))
        csp.add(Le(total, cap.capacity(level)))
    return csp


def _product(csp: Csp, name: str, extents, extent: dict) -> str:
    """A variable equal to the product of `extents` (loops or knobs by name, or constants)."""
    names, const = [], 1
    for e in extents:
        if isinstance(e, int):
            const *= e
        else:
            names.append(e)
    if const != 1 or not names:
        c = csp.var(f"const_{const}", const, const, "arch")
        names.append(c)
    hi = 1
    for n in names:
        hi *= csp.vars[n].hi
    out = csp.var(name, 1, max(1, hi), "aux")
    csp.add(Prod(out, tuple(names)))
    return out
