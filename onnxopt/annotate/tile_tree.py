"""TileFlow's tile-tree analysis of fused dataflows (Zheng et al., MICRO 2023; the thesis' sections 3.4.2-3.5.1).

A fused dataflow is a tree of tiles. A tile sits at a memory level and is a loop nest over the problem's dimensions:
its loops split the part of each dimension its ancestors leave it, and what its loops leave is its children's (or,
in a leaf, the body's). In each step of its temporal loops its children run under one inter-tile primitive:

- Seq: one after another, each with the level's whole memory: what the next child does not touch is evicted;
- Shar: one after another, memory shared: a child's data stays for the next child that touches it;
- Para: at once on partitioned hardware (no dependences between them);
- Pipe: pipelined on partitioned hardware.

Spatial loops (Sp) run their iterations at once on separate processing elements; temporal ones (Tp, the default)
one after another. A leaf is one operator's perfect nest; its accesses index each tensor dimension by a sum of the
problem's dimensions (A[b, x + r], a 1-D convolution's window).

What the analysis gives, each checked in tests/annotate/test_tile_tree.py:
- the data moved into each tile's level from its parent's: sums of set differences of consecutive slices, evaluated
  at the boundary steps only (eq 3.9-3.11; figure 3.5's 168), equal to a step-by-step enumeration;
- a tensor produced and consumed inside one tile's subtree (the fused intermediate) never leaves that tile's level;
  written data leaves as stores, and written data touched again later (partial sums) comes back as loads;
- processing elements and footprint per primitive (eq 3.12, 3.13) and latency (eq 3.22, double buffering assumed);
- legality: a producer's reduction loop in a tile shared with its consumer is refused.

As in TileFlow, a tile keeps only its previous slice (small tiles are overestimated), and each tile's movement is
charged to the link from its parent's level (a CPU's caches are nested, so every link is direct). A slice that is not
a box (two accesses of one tensor with different windows) is taken as its bounding box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

PRIMITIVES = ("Seq", "Shar", "Para", "Pipe")


@dataclass(frozen=True)
class Loop:
    dim: str  # the problem dimension it walks
    trips: int
    spatial: bool = False  # Sp: its iterations at once on separate processing elements; Tp: one after another


@dataclass(frozen=True)
class Access:
    tensor: str
    index: tuple[tuple[tuple[str, int], ...], ...]  # per tensor dimension: ((problem dimension, coefficient), ...)
    write: bool = False

    def __post_init__(self):
        names = [n for terms in self.index for n, _ in terms]
        if len(names) != len(set(names)):  # a slice is then not a box (a diagonal, A[x, x])
            raise ValueError(f"{self.tensor}: a problem dimension may index one of its dimensions only, once")


def access(tensor: str, *index: str, write: bool = False) -> Access:
    """An access written as its index expressions: access("A", "b", "x + r"), access("I", "2*x + r")."""
    dims = []
    for expr in index:
        terms = []
        for term in expr.replace(" ", "").split("+"):
            coef, _, name = term.rpartition("*")
            terms.append((name, int(coef) if coef else 1))
        dims.append(tuple(terms))
    return Access(tensor, tuple(dims), write)


@dataclass(frozen=True)
class Tile:
    level: str
    loops: tuple[Loop, ...] = ()  # outermost first
    children: tuple["Tile", ...] = ()
    primitive: str = "Seq"  # how the children share the level (PRIMITIVES)
    op: str | None = None  # a leaf's operator
    accesses: tuple[Access, ...] = ()  # a leaf's
    flops: float = 2.0  # a leaf's flops a point of its iteration space (a multiply-add: 2)

    def __post_init__(self):
        if self.primitive not in PRIMITIVES:
            raise ValueError(f"unknown inter-tile primitive {self.primitive!r}: one of {', '.join(PRIMITIVES)}")
        if bool(self.children) == bool(self.accesses):
            raise ValueError(f"tile at {self.level}: a tile has children or (a leaf) accesses, not both or neither")

    def leaves(self) -> list["Tile"]:
        return [self] if not self.children else [x for c in self.children for x in c.leaves()]


@dataclass
class TileResult:
    tile: Tile
    parent_level: str  # the level its data comes from
    executions: int  # how many times it runs (its ancestors' trips, spatial ones included)
    loads: int  # elements moved into its level, over all executions
    stores: int  # elements moved out of it, over all executions
    footprint: int  # elements it holds at its level (eq 3.13)
    num_pe: int  # processing elements it uses (eq 3.12)
    latency: float  # seconds one execution takes (eq 3.22); NaN without an Arch


@dataclass
class Arch:
    """What latency needs: the bandwidth (bytes/s) each level delivers to the levels inside it, and one processing
    element's flops a second."""

    bandwidth: dict[str, float]
    pe_flops: float
    elem_bytes: int = 4

    @classmethod
    def per_thread(cls, machine, threads: int, dtype: str = "float32") -> "Arch":
        """One thread's share of a machine model with `threads` of them running: a core's peak, and each level's
        bandwidth split among the threads (one thread alone gets the single-core figure where it was measured)."""
        cores = max(1, machine.cores)
        running = max(1, min(threads, cores))
        peak = (machine.details.get("peak_flops_1core") or {}).get(dtype) or machine.peak_flops[dtype] / cores
        bandwidth = {lv.name: (lv.bandwidth_1core if running == 1 and lv.bandwidth_1core else lv.bandwidth / running)
                     for lv in machine.levels}
        return cls(bandwidth, peak)


@dataclass
class Analysis:
    tiles: list[TileResult]  # preorder, the root first
    links: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (from, to) -> [loads, stores]

    @property
    def latency(self) -> float:
        return self.tiles[0].latency


# ---- the iteration space ----

def _split(tile: Tile, allotted: dict[str, int]) -> tuple[dict[str, int], list[int]]:
    """What `tile`'s loops leave its children of each dimension, and each loop's stride (in the dimension's
    points). Raises where a loop's trips do not divide what it splits."""
    left = dict(allotted)
    strides = []
    for lp in tile.loops:
        if lp.dim not in left:
            raise ValueError(f"tile at {tile.level}: loop over {lp.dim!r}, which is not a problem dimension")
        if lp.trips < 1 or left[lp.dim] % lp.trips:
            raise ValueError(f"tile at {tile.level}: {lp.trips} trips do not divide the {left[lp.dim]} points of "
                             f"{lp.dim!r} left to it")
        left[lp.dim] //= lp.trips
        strides.append(left[lp.dim])
    return left, strides


def _step_values(tile: Tile, allotted: dict[str, int]) -> dict[str, np.ndarray]:
    """Each dimension's values in one step of `tile`'s temporal loops (at step 0): its spatial loops and what its
    loops leave vary together."""
    left, strides = _split(tile, allotted)
    values = {d: np.arange(n) for d, n in left.items()}
    for lp, stride in zip(tile.loops, strides):
        if lp.spatial:
            values[lp.dim] = (values[lp.dim][None, :] + stride * np.arange(lp.trips)[:, None]).ravel()
    return values


def _offset(tile: Tile, allotted: dict[str, int], step: tuple[int, ...]) -> dict[str, int]:
    """Each dimension's offset at a step of `tile`'s temporal loops (one index a temporal loop)."""
    _, strides = _split(tile, allotted)
    off = dict.fromkeys(allotted, 0)
    temporal = [(lp, s) for lp, s in zip(tile.loops, strides) if not lp.spatial]
    for (lp, stride), i in zip(temporal, step):
        off[lp.dim] += i * stride
    return off


# ---- slices: a box of per-dimension index sets, moved by an offset ----

@dataclass(frozen=True)
class _Box:
    dims: tuple[np.ndarray, ...]  # the sorted distinct indices it covers in each tensor dimension

    def size(self) -> int:
        return math.prod(len(d) for d in self.dims)


def _dim_set(terms, values: dict[str, np.ndarray], off: dict[str, int]) -> np.ndarray:
    s = np.zeros(1, dtype=np.int64)
    for name, coef in terms:
        s = np.unique((s[:, None] + coef * (values[name] + off[name])[None, :]).ravel())
    return s


def _box(accesses: list[Access], values: dict[str, np.ndarray], off: dict[str, int] | None = None) -> _Box | None:
    """The slice of one tensor `accesses` touch with each dimension's `values` moved by `off` (None: they touch
    nothing); their bounding box where they differ."""
    if not accesses:
        return None
    off = off or dict.fromkeys(values, 0)
    boxes = [tuple(_dim_set(t, values, off) for t in a.index) for a in accesses]
    dims = tuple(np.unique(np.concatenate(ds)) if len(ds) > 1 else ds[0] for ds in zip(*boxes))
    return _Box(dims)


def _new(cur: _Box | None, prev: _Box | None) -> int:
    """|cur \\ prev| (None: an empty slice)."""
    if cur is None:
        return 0
    if prev is None:
        return cur.size()
    common = 1
    for a, b in zip(cur.dims, prev.dims):
        common *= len(np.intersect1d(a, b, assume_unique=True))
        if not common:
            break
    return cur.size() - common


# ---- data movement of one tile ----

def _children_of(tile: Tile) -> tuple[Tile, ...]:
    return tile.children or (tile,)  # a leaf's body is its one "child": its own accesses


def _tensor_accesses(tile: Tile, tensor: str) -> list[Access]:
    return [a for leaf in tile.leaves() for a in leaf.accesses if a.tensor == tensor]


def _movement(tile: Tile, allotted: dict[str, int], tensor: str) -> int:
    """Elements of `tensor` moved into `tile`'s level over one execution: the set differences of the sequence of
    its children's slices (each child's slice the whole of what it touches in a step), at the boundary steps."""
    children = _children_of(tile)
    values = _step_values(tile, allotted)
    temporal = [lp.trips for lp in tile.loops if not lp.spatial]
    accs = [_tensor_accesses(c, tensor) for c in children]
    if tile.primitive in ("Para", "Pipe") and tile.children:
        sequences = [[a] for a in accs if a]  # each partition its own memory
    elif tile.primitive == "Shar" or not tile.children:
        sequences = [[a for a in accs if a]]  # a child that does not touch it keeps it
    else:  # Seq: a child that does not touch it evicts it
        sequences = [accs]
    total = 0
    for seq in sequences:
        if not any(seq):
            continue

        def at(k, step):
            return _box(seq[k], values, _offset(tile, allotted, step))

        zero = (0,) * len(temporal)
        within = sum(_new(at(k, zero), at(k - 1, zero)) for k in range(1, len(seq)))
        total += _new(at(0, zero), None) + within
        outer = 1
        for i, trips in enumerate(temporal):
            if trips > 1:  # loop i advances while the loops inside it wrap
                prev = tuple(0 if j <= i else temporal[j] - 1 for j in range(len(temporal)))
                cur = tuple(1 if j == i else 0 for j in range(len(temporal)))
                total += (_new(at(0, cur), at(len(seq) - 1, prev)) + within) * (trips - 1) * outer
            outer *= trips
    return total


def _whole(tile: Tile, allotted: dict[str, int], tensor: str) -> int:
    """The distinct elements of `tensor` one execution of `tile` touches."""
    box = _box(_tensor_accesses(tile, tensor), {d: np.arange(n) for d, n in allotted.items()})
    return box.size() if box else 0


def _tensors(tile: Tile) -> list[str]:
    return list(dict.fromkeys(a.tensor for leaf in tile.leaves() for a in leaf.accesses))


def _inside(tile: Tile, root: Tile, tensor: str) -> bool:
    """Whether `tensor` is a fused intermediate that lives and dies in `tile`'s subtree: every access of it in the
    tree is there, one leaf writes it and another reads it."""
    mine = [(leaf, a) for leaf in tile.leaves() for a in leaf.accesses if a.tensor == tensor]
    if len(mine) != len(_tensor_accesses(root, tensor)):
        return False
    writers = {id(leaf) for leaf, a in mine if a.write}
    return any(not a.write and (writers - {id(leaf)}) for leaf, a in mine)


def _loads_stores(tile: Tile, root: Tile, allotted: dict[str, int]) -> tuple[int, int]:
    """Elements loaded into and stored from `tile`'s level in one execution: what it reads comes in, what it writes
    goes out, and what it only writes but touches again (partial sums of an outer reduction) comes back in."""
    loads = stores = 0
    for t in _tensors(tile):
        if _inside(tile, root, t):
            continue
        accs = _tensor_accesses(tile, t)
        moved = _movement(tile, allotted, t)
        if any(not a.write for a in accs):
            loads += moved
        if any(a.write for a in accs):
            stores += moved
            if all(a.write for a in accs):
                loads += moved - _whole(tile, allotted, t)
    return loads, stores


# ---- resources and latency ----

def step_slice(tile: Tile, allotted: dict[str, int]) -> int:
    """Elements of every tensor one step of `tile`'s temporal loops touches: what its level holds at once."""
    values = _step_values(tile, allotted)
    return sum(_box(_tensor_accesses(tile, t), values).size() for t in _tensors(tile))


def _footprint(tile: Tile, allotted: dict[str, int]) -> int:
    if not tile.children:
        return step_slice(tile, allotted)
    left, _ = _split(tile, allotted)
    sizes = [_footprint(c, left) for c in tile.children]
    return max(sizes) if tile.primitive == "Seq" else sum(sizes)


def _num_pe(tile: Tile) -> int:
    own = math.prod(lp.trips for lp in tile.loops if lp.spatial)
    if not tile.children:
        return own
    pes = [_num_pe(c) for c in tile.children]
    return own * (max(pes) if tile.primitive in ("Seq", "Shar") else sum(pes))


def _points(leaf: Tile, allotted: dict[str, int]) -> int:
    """The points a leaf computes in one execution: the distinct elements it writes times the extents of the
    dimensions it reduces (a convolution's rows with their halo counted once), or, writing several tensors or none,
    the product of the dimensions it uses."""
    used = {n for a in leaf.accesses for terms in a.index for n, _ in terms}
    written = {a.tensor for a in leaf.accesses if a.write}
    if len(written) != 1:
        return math.prod(allotted[d] for d in used)
    out = [a for a in leaf.accesses if a.write]
    kept = {n for a in out for terms in a.index for n, _ in terms}
    box = _box(out, {d: np.arange(n) for d, n in allotted.items()})
    return box.size() * math.prod(allotted[d] for d in used - kept)


# ---- legality ----

def illegal(root: Tile) -> str | None:
    """Why the tree cannot run its ops fused, or None: a loop of a tile shared by a producer and its consumer may
    walk only the consumer's reduction dimensions, not the producer's (its consumer would read partial sums)."""
    def check(tile: Tile) -> str | None:
        leaves = tile.leaves()
        for p in leaves:
            out = [a for a in p.accesses if a.write]
            for o in out:
                if not any(a.tensor == o.tensor and not a.write for c in leaves if c is not p for a in c.accesses):
                    continue
                kept = {n for terms in o.index for n, _ in terms}
                reduction = {n for a in p.accesses for terms in a.index for n, _ in terms} - kept
                for lp in tile.loops:
                    if lp.dim in reduction and lp.trips > 1:
                        return (f"the tile at {tile.level} shares {o.tensor} between {p.op} and its consumer and "
                                f"walks {lp.dim}, a reduction of {p.op}: the consumer would read partial sums")
        for c in tile.children:
            why = check(c)
            if why:
                return why
        return None

    return check(root)


# ---- the whole tree ----

def analyze(root: Tile, extents: dict[str, int], arch: Arch | None = None, outer: str = "DRAM") -> Analysis:
    """Every tile's movement, footprint, processing elements and latency, and the traffic of each link."""
    results: list[TileResult] = []

    def visit(tile: Tile, allotted: dict[str, int], parent_level: str, executions: int) -> TileResult:
        # a tile at its parent's level moves nothing: its data is already there
        loads, stores = _loads_stores(tile, root, allotted) if tile.level != parent_level else (0, 0)
        res = TileResult(tile, parent_level, executions, loads * executions, stores * executions,
                         _footprint(tile, allotted), _num_pe(tile), float("nan"))
        results.append(res)
        left, _ = _split(tile, allotted)
        runs = executions * math.prod(lp.trips for lp in tile.loops)
        kids = [visit(c, left, tile.level, runs) for c in tile.children]
        if arch is not None:
            bw = arch.bandwidth[parent_level]  # what the tile's level reads from and writes back to
            load_s, store_s = loads * arch.elem_bytes / bw, stores * arch.elem_bytes / bw
            steps = math.prod(lp.trips for lp in tile.loops if not lp.spatial)
            if not tile.children:
                inner = steps * _points(tile, left) * tile.flops / arch.pe_flops
            else:
                lat = [k.latency for k in kids]
                inner = steps * (sum(lat) if tile.primitive in ("Seq", "Shar") else max(lat))
            res.latency = max(load_s, inner, store_s)
        return res

    why = illegal(root)
    if why:
        raise ValueError(f"illegal tile tree: {why}")
    visit(root, dict(extents), outer, 1)
    links: dict[tuple[str, str], list[int]] = {}
    for r in results:
        v = links.setdefault((r.parent_level, r.tile.level), [0, 0])
        v[0] += r.loads
        v[1] += r.stores
    return Analysis(results, links)


def enumerate_movement(tile: Tile, extents: dict[str, int], tensor: str) -> int:
    """`_movement` step by step, every step's slices as sets of elements: the reference the boundary-step sums are
    checked against (small nests only)."""
    children = _children_of(tile)
    left, strides = _split(tile, extents)
    temporal = [(lp, s) for lp, s in zip(tile.loops, strides) if not lp.spatial]
    spatial = [(lp, s) for lp, s in zip(tile.loops, strides) if lp.spatial]

    def elements(child: Tile, off: dict[str, int]) -> set:
        out = set()
        for a in _tensor_accesses(child, tensor):
            dims = list(left)
            for inner in np.ndindex(*[left[d] for d in dims]):
                for sp in np.ndindex(*[lp.trips for lp, _ in spatial]) if spatial else [()]:
                    v = {d: off[d] + i for d, i in zip(dims, inner)}
                    for (lp, s), j in zip(spatial, sp):
                        v[lp.dim] += j * s
                    out.add(tuple(sum(c * v[n] for n, c in terms) for terms in a.index))
        return out

    seq = []
    for step in np.ndindex(*[lp.trips for lp, _ in temporal]) if temporal else [()]:
        off = dict.fromkeys(extents, 0)
        for (lp, s), i in zip(temporal, step):
            off[lp.dim] += i * s
        seq.append([elements(c, off) for c in children])
    if tile.primitive in ("Para", "Pipe") and tile.children:
        chains = [[step[k] for step in seq] for k in range(len(children))]
    elif tile.primitive == "Shar" or not tile.children:
        chains = [[s for step in seq for s in step if s]]
    else:
        chains = [[s for step in seq for s in step]]
    total = 0
    for chain in chains:
        prev: set = set()
        for s in chain:
            total += len(s - prev)
            prev = s
    return total
