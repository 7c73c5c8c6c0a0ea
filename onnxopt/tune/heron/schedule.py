"""A kernel's schedule as data: the loop primitives its kernel applies (Heron's template step, S1-S3 and multi-level
tiling), from which rules.py derives the constraint model. A kernel writes its schedule, never a constraint.

Each primitive names loops (iterators with extents) and knobs (the tunable variables); rules.py reads:
- Split: C1, the parts' product equals the extent, or covers it with the last tile partial (`cover`);
- Fuse: C2, the fused loop's extent is the product of its parts';
- Knob: C3, a tunable variable's candidates (or range);
- ComputeAt: C4, a stage placed at one of several loops, its footprint the one at the loop chosen (SELECT);
- Cache: C5, a buffer held in a memory level (registers, L1, L2...): the footprints of a level's buffers sum to at
  most its capacity, from the machine model;
- Vectorize, Tensorize: C6, the instruction's shape and its target's quirks (instruction rules in rules.py);
- Parallel: the tasks are the product of the parallel loops, at most the target's task limit;
- Reorder, Unroll: recorded (loop order is implicit, as in Heron: a tile of extent 1 reorders).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Extent = str | int  # a loop or knob by name, or a constant


@dataclass(frozen=True)
class Split:
    axis: str
    parts: tuple[str, ...]  # outermost first
    cover: bool = True  # the product may exceed the extent by less than the innermost part (a partial last tile)


@dataclass(frozen=True)
class Fuse:
    axes: tuple[str, ...]
    into: str


@dataclass(frozen=True)
class Knob:
    var: str
    values: tuple[int, ...] | None = None  # candidates; None: the range [lo, hi]
    lo: int = 1
    hi: int | None = None  # None: the variable's own bound (a loop's extent)


@dataclass(frozen=True)
class ComputeAt:
    stage: str
    at: str  # the knob choosing the location: its value indexes `locations`
    locations: tuple[str, ...]  # loop names
    footprints: tuple[tuple[Extent, ...], ...]  # per location, the extents whose product is the stage's elements


@dataclass(frozen=True)
class Cache:
    buffer: str
    level: str  # "registers", "L1", "L2", ... (the machine model's capacities)
    extents: tuple[Extent, ...] = ()  # elements = their product; "@stage" takes a ComputeAt stage's footprint
    unit: int = 4  # bytes an element (registers: 1, counted in vector registers)


@dataclass(frozen=True)
class Vectorize:
    axis: str


@dataclass(frozen=True)
class Tensorize:
    axes: tuple[str, ...]  # the loops the instruction replaces, in its (m, n, k) order
    instruction: str  # a name in rules.INSTRUCTION_RULES


@dataclass(frozen=True)
class Parallel:
    axes: tuple[str, ...]
    into: str


@dataclass(frozen=True)
class Reorder:
    order: tuple[str, ...]


@dataclass(frozen=True)
class Unroll:
    axes: tuple[str, ...]


Primitive = Split | Fuse | Knob | ComputeAt | Cache | Vectorize | Tensorize | Parallel | Reorder | Unroll


@dataclass
class Schedule:
    """A kernel's loops (`axes`: the computation's iterators and their extents) and the primitives it applies."""

    name: str
    axes: dict[str, int]
    steps: list = field(default_factory=list)
    # knob name -> what the kernel calls it (the point a solution maps to: packed_matmul.py)
    knobs: tuple[str, ...] = ()

    def with_steps(self, steps) -> "Schedule":
        return Schedule(self.name, dict(self.axes), list(steps), self.knobs)
