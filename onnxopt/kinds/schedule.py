"""A kind's schedule space: every knob its kernel has, as data the kind exposes, with the default it picks today.

A `ScheduleSpace` is a product of knobs, each a finite list of valid values whose first is the default. `apply`
puts a region at a point (its parameters replaced, its op type recomputed), and the kind's lowering builds any point
of its space: the searches (tune/, and Heron's constrained search that the search issue builds on this) ask the
kind for its space instead of knowing knobs by name. Constraints between knobs that a kind's space has are in its
values (the int8 kinds' rows are those whose accumulators fit the registers), so every point listed is valid.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple  # the valid values, the kind's default first
    doc: str = ""

    @property
    def default(self):
        return self.values[0]


def _unchanged(region, point: dict) -> None:
    if point:
        raise ValueError(f"a space with no knobs has no point {point}")


@dataclass(frozen=True)
class ScheduleSpace:
    kind: str
    knobs: tuple[Knob, ...] = ()
    # apply(region, point): the region at that point (in place); point maps knob names to values
    apply: Callable = field(default=_unchanged, compare=False)
    # why the kernel has no knobs, or what of its schedule is not a knob yet
    note: str = ""

    def default(self) -> dict:
        return {k.name: k.default for k in self.knobs}

    def size(self) -> int:
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def points(self) -> Iterator[dict]:
        for values in itertools.product(*(k.values for k in self.knobs)):
            yield dict(zip((k.name for k in self.knobs), values))

    def sample(self, rng: random.Random) -> dict:
        return {k.name: rng.choice(k.values) for k in self.knobs}

    def check(self, point: dict) -> None:
        """Raises ValueError for a point outside the space."""
        names = {k.name for k in self.knobs}
        if set(point) != names:
            raise ValueError(f"the {self.kind} space's knobs are {sorted(names)}, not {sorted(point)}")
        for k in self.knobs:
            if point[k.name] not in k.values:
                raise ValueError(f"{self.kind}: {k.name}={point[k.name]!r} is not one of {list(k.values)}")

    def to_report(self) -> dict:
        out = {"knobs": {k.name: [repr(v) if not isinstance(v, (int, float, str)) else v for v in k.values]
                         for k in self.knobs}, "size": self.size()}
        if self.note:
            out["note"] = self.note
        return out


def lanes_knob(target, doc: str = "float32 lanes of the row loop's vectors (two or four registers: an unroll)"):
    """The vector width of a row kernel: the target's registers (the default), or two or four of them a step."""
    base = target.float32_lanes
    return Knob("lanes", (base, 2 * base, 4 * base), doc)


def params_apply(defaults: dict | None = None) -> Callable:
    """apply() for kinds whose knobs are fields of their (dataclass) parameters: the point's values replace them
    (a value equal to `defaults[knob]` is stored as 0, "the target's", so the default point is the kernel the kind
    builds unasked), and the op type is recomputed (the knobs are part of the key)."""
    from dataclasses import replace

    defaults = defaults or {}

    def apply(region, point: dict) -> None:
        values = {k: (0 if k in defaults and v == defaults[k] else v) for k, v in point.items()}
        region.params = replace(region.params, **values)
        if region.op_type_key:
            region.compute_op_type(region.op_type_key)

    return apply


def int8_rows(target, out_blocked: bool = False) -> tuple[int, ...]:
    """The rows an int8 tile unrolls (the qmatmul kind's rows of A, the qconv kind's output channels), 4 first:
    each row holds NR accumulators of the dot-product instruction (a panel of 16 lanes), and rows * NR + NR + 1
    vectors must fit the register file (UNIT §4.2's CPU schedule). A tile that writes the blocked int8 layout
    writes whole groups of 4 channels."""
    nr = max(1, 16 // (target.vector_bits // 32))
    registers = 32 if target.has("avx512f") or target.arch == "aarch64" else 16
    rows = [m for m in (4, 2, 6, 8) if m * nr + nr + 1 <= registers]
    if out_blocked:
        rows = [m for m in rows if m % 4 == 0]
    return tuple(rows)


# The most tasks an int8 call is split into (runtime.c grid_split): 16 by default.
INT8_TASKS = (16, 1, 2, 4, 8, 32, 64)


def int8_space(kind: str, region, target) -> ScheduleSpace:
    rows = int8_rows(target, bool(getattr(region.params, "out_blocked", False)))
    if getattr(region.params, "depthwise", False):
        return ScheduleSpace(kind, (Knob("tasks", INT8_TASKS, "the parallel extent"),), params_apply(),
                             note="a depthwise convolution runs its own tile: its rows are not a knob")
    return ScheduleSpace(kind, (Knob("mr", rows, "rows a tile unrolls, each NR accumulators of the instruction"),
                                Knob("tasks", INT8_TASKS, "the most tasks a call is split into")), params_apply())
