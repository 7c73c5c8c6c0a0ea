"""Chimera's data-movement model for chains of compute-intensive operators (Zheng et al., HPCA 2023, Algorithm 1).

A chain such as attention's two batch GEMMs

    C[b, m, l] = sum_k A[b, m, k] * B[b, k, l]        E[b, m, n] = sum_l f(C)[b, m, l] * D[b, l, n]

runs as one loop nest over blocks: the ops' loops merged (m, l shared; k private to the first GEMM, n to the
second), tiled, and ordered. The order and the tiles decide how many elements move between a memory level and the
next; the intermediate C stays in the level's buffer. This module enumerates the orders, rejects the illegal ones
with a reason, computes the data volume (DV) and memory use (MU) of an order and tiles, solves the tiles in closed
form for one memory level, and nests the solution over several levels of the machine model.

What the paper leaves out and this module adds (each with its test):
- legality: a private loop outside a shared one recomputes the other op's work, or, with a nonlinear op between
  (softmax), feeds it partial sums: wrong. The literal search picks mnkl (the smallest DV) for exactly that reason;
- trip-1 loops: a loop with one block never moves its tile, so the reuse starts at the first loop with more than
  one block (`ignore_trip1`, the form a tile-trace simulator agrees with);
- Table III's form, DV without partial-tile rounding of the footprints (`table_form`), next to Algorithm 1's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tensor:
    name: str
    loops: tuple[str, ...]  # the loops that index it
    boundary: bool = True  # a chain input or output (moves); False: an intermediate that stays in the buffer


@dataclass(frozen=True)
class Op:
    name: str
    loops: tuple[str, ...]
    tensors: tuple[Tensor, ...]


@dataclass(frozen=True)
class Chain:
    """Ops in topological order over named loops; `middle` is the elementwise or row op between them (None,
    "relu", "softmax"), which decides whether partial sums of the intermediate may flow on."""

    extents: dict[str, int]
    ops: tuple[Op, ...]
    middle: str | None = None

    def shared(self) -> set[str]:
        return {x for x in self.extents if sum(x in op.loops for op in self.ops) > 1}

    def private(self, op: Op) -> tuple[str, ...]:
        return tuple(x for x in op.loops if x not in self.shared())


def gemm_chain(m: int, n: int, k: int, l: int, batch: int | None = None, middle: str | None = None) -> Chain:
    """Chimera's GEMM chain (its batch GEMM form when `batch` is given): C = A B, E = f(C) D."""
    b = ("b",) if batch is not None else ()
    extents = dict(zip(b + ("m", "n", "k", "l"), ((batch,) if b else ()) + (m, n, k, l)))
    gemm1 = Op("gemm1", b + ("m", "l", "k"), (Tensor("A", b + ("m", "k")), Tensor("B", b + ("k", "l")),
                                             Tensor("C", b + ("m", "l"), boundary=False)))
    gemm2 = Op("gemm2", b + ("m", "l", "n"), (Tensor("C", b + ("m", "l"), boundary=False),
                                             Tensor("D", b + ("l", "n")), Tensor("E", b + ("m", "n"))))
    return Chain(extents, (gemm1, gemm2), middle)


def orders(chain: Chain) -> list[tuple[str, ...]]:
    """Every order of the chain's loops, outermost first (I! of them)."""
    return list(itertools.permutations(chain.extents))


def trips(chain: Chain, tiles: dict[str, int]) -> dict[str, int]:
    return {x: -(-e // tiles[x]) for x, e in chain.extents.items()}


def illegal(chain: Chain, order: tuple[str, ...], tiles: dict[str, int] | None = None) -> str | None:
    """Why this order cannot run the chain as one fused nest, or None. A loop of one block (given `tiles`) is
    nowhere, so it is never in the way."""
    t = trips(chain, tiles) if tiles else {x: 2 for x in chain.extents}
    shared = chain.shared()
    for i, op in enumerate(chain.ops):
        for p in chain.private(op):
            outside = [s for s in shared if s in op.loops and order.index(p) < order.index(s) and t[p] > 1]
            if not outside:
                continue
            s = outside[0]
            if i == 0 and chain.middle in ("softmax", "relu"):
                return (f"{p} (private to {op.name}) is outside the shared loop {s}: {chain.ops[1].name} would read "
                        f"partial sums of the intermediate, and the {chain.middle} between them is not linear")
            if i == 0:
                return (f"{p} (private to {op.name}) is outside the shared loop {s}: {chain.ops[1].name}'s work "
                        f"would be repeated for every block of {p}")
            return (f"{p} (private to {op.name}) is outside the shared loop {s}: {chain.ops[i - 1].name} would be "
                    f"recomputed for every block of {p}")
    return None


@dataclass
class Movement:
    dv: int  # elements moved between this memory level and the next
    mu: int  # elements the level holds at once (the largest op's tiles, intermediates included)
    per_tensor: dict[str, int] = field(default_factory=dict)


def movement(chain: Chain, order: tuple[str, ...], tiles: dict[str, int], ignore_trip1: bool = False,
             table_form: bool = False) -> Movement:
    """Algorithm 1: per op in turn, each boundary tensor's tile footprint times the block counts of the op's loops
    from the innermost loop that indexes it outwards; the op's private loops then leave the order.

    `ignore_trip1`: loops of one block are skipped when looking for the first loop that indexes a tensor (its tile
    stays put across them). `table_form`: footprints times ceil(extent / tile) become whole extents where the
    loop indexes the tensor (Table III), so partial tiles are not counted twice."""
    t = trips(chain, tiles)
    perm = list(order)
    dv, mu, per = 0, 0, {}
    for op in chain.ops:
        inner_out = [x for x in reversed(perm) if x in op.loops]
        total_df = 0
        for ten in op.tensors:
            df = math.prod(tiles[x] for x in ten.loops)
            total_df += df
            if not ten.boundary:
                continue
            started, blocks = False, 1
            for x in inner_out:
                if not started and x in ten.loops and not (ignore_trip1 and t[x] == 1):
                    started = True
                if started and not (table_form and x in ten.loops):
                    blocks *= t[x]
            dm = (math.prod(chain.extents[x] for x in ten.loops) if table_form else df) * blocks
            per[ten.name] = per.get(ten.name, 0) + dm
            dv += dm
        mu = max(mu, total_df)
        perm = [x for x in perm if x not in chain.private(op)]
    return Movement(dv, mu, per)



# ---- tiles ----

def closed_form_tile(capacity: int, alpha: int) -> float:
    """The real-valued optimum T_M* = T_L* = sqrt(alpha^2 + MC) - alpha of min DV s.t. MU <= MC, with T_K = T_N
    = alpha (DV does not depend on them, so they sit at the micro-kernel's extent)."""
    return math.sqrt(alpha * alpha + capacity) - alpha


def balanced(tile: int, extent: int) -> int:
    """The smallest tile with the same number of blocks: the same DV in Table III's form, no ragged last block."""
    return -(-extent // -(-extent // tile))


def solve_tiles(chain: Chain, capacity: int, alpha: int, cores: int = 1, order: tuple[str, ...] | None = None,
                bound: dict[str, int] | None = None) -> dict[str, int]:
    """Integer tiles of a GEMM chain for a buffer of `capacity` elements: the closed form floor-rounded and capped
    by the extents (and by `bound`, an outer level's tiles), the m tile cut so the blocks of (b, m) give every
    core work, then the best of the neighbouring integer candidates that fit (min DV, then the floor-rounded one)."""
    ext = chain.extents
    bound = bound or ext
    order = order or (("b",) if "b" in ext else ()) + ("m", "l", "k", "n")
    t_star = closed_form_tile(capacity, alpha)
    small = {x: max(1, min(alpha, ext[x], bound[x])) for x in ("k", "n")}
    m_blocks = -(-cores // ext.get("b", 1))  # the m blocks each batch needs so that every core gets a block
    rows_per_core = -(-ext["m"] // m_blocks)
    cap = {"m": min(ext["m"], bound["m"], rows_per_core), "l": min(ext["l"], bound["l"])}
    best = None
    for dm in (0, -1, 1):
        for dl in (0, -1, 1):
            tiles = dict(small, m=max(1, min(cap["m"], math.floor(t_star) + dm)),
                         l=max(1, min(cap["l"], math.floor(t_star) + dl)))
            if "b" in ext:
                tiles["b"] = 1
            mv = movement(chain, order, tiles)
            if mv.mu > capacity and (tiles["m"], tiles["l"]) != (1, 1):
                continue
            score = (movement(chain, order, tiles, table_form=True).dv, abs(dm) + abs(dl))
            if best is None or score < best[0]:
                best = (score, tiles)
    return best[1]


# ---- several memory levels ----

@dataclass
class LevelPlan:
    name: str
    capacity: int  # elements one core's share of the level holds
    tiles: dict[str, int]
    dv: int  # elements moved between this level and the next farther one
    seconds: float  # dv over the farther level's bandwidth (one core's share)


def plan_levels(chain: Chain, machine, alpha: int, elem_bytes: int = 4,
                order: tuple[str, ...] | None = None) -> list[LevelPlan]:
    """Chimera's multi-level form (its problem 3, solved level by level): each cache level of the machine model
    (innermost first) gets tiles for its per-core capacity, nested inside the next level's tiles (dividing them);
    its cost is the data it moves over the bandwidth of the level that feeds it. The chain runs at the speed of
    the most expensive level (`bottleneck`)."""
    cores = max(1, machine.cores)
    levels = [lv for lv in machine.levels if lv.size_bytes]
    order = order or (("b",) if "b" in chain.extents else ()) + ("m", "l", "k", "n")
    tiles_out: list[dict[str, int]] = []
    bound = None
    for lv in reversed(levels):  # outermost first: inner tiles must divide the outer ones
        capacity = lv.size_bytes // cores // elem_bytes
        t = solve_tiles(chain, capacity, alpha, cores if bound is None else 1, order, bound)
        if bound is not None:
            t = {x: _divisor_at_most(bound[x], v) for x, v in t.items()}
        tiles_out.append(t)
        bound = t
    tiles_out.reverse()
    plans = []
    for i, (lv, t) in enumerate(zip(levels, tiles_out)):
        feeder = machine.levels[machine.levels.index(lv) + 1]
        dv = movement(chain, order, t, ignore_trip1=True).dv
        plans.append(LevelPlan(lv.name, lv.size_bytes // cores // elem_bytes, t, dv,
                               dv * elem_bytes / (feeder.bandwidth / cores)))
    return plans


def bottleneck(plans: list[LevelPlan]) -> LevelPlan:
    return max(plans, key=lambda p: p.seconds)


def _divisor_at_most(n: int, v: int) -> int:
    return max(d for d in range(1, min(n, v) + 1) if n % d == 0)


# ---- conv chains ----

@dataclass(frozen=True)
class ConvPair:
    """conv1 (ic -> oc1, k1 x k1, stride st1) -> conv2 (oc1 -> oc2, k2 x k2, stride st2), both dense, conv2's
    output out_h x out_w (Chimera's C1-C8)."""

    ic: int
    oc1: int
    oc2: int
    k1: int
    k2: int
    st1: int
    st2: int
    out_h: int
    out_w: int
    batch: int = 1


# A conv chain's tiles (Chimera's order b, h, w, oc1 | ic (conv1) | oc2 (conv2), kernels untiled, one item a block):
# h, w the second convolution's output rows and columns, c the intermediate's channels (oc1), i the input's (ic),
# o the output's (oc2).
CONV_TILES = ("h", "w", "c", "i", "o")


def conv_chain_movement(g: ConvPair, tiles: dict[str, int]) -> Movement:
    """Chimera's DV and MU of a conv chain in its order b, h, w, oc1 | ic | oc2. A block of th x tw output pixels needs
    th1 = (th - 1) * st2 + k2 intermediate rows (the halo included) and (th1 - 1) * st1 + k1 input rows (columns
    the same). Each spatial block reads both weights again; the input tile moves once per (oc1, ic) block; the output
    once per oc1 block (partial sums over the intermediate's channel blocks); the intermediate stays in the level."""
    th, tw, tc, ti, to = (min(tiles[x], e) for x, e in zip(CONV_TILES, (g.out_h, g.out_w, g.oc1, g.ic, g.oc2)))
    th1, tw1 = (th - 1) * g.st2 + g.k2, (tw - 1) * g.st2 + g.k2
    thi, twi = (th1 - 1) * g.st1 + g.k1, (tw1 - 1) * g.st1 + g.k1
    blocks = g.batch * -(-g.out_h // th) * -(-g.out_w // tw)
    c_blocks = -(-g.oc1 // tc)
    df = {"I": ti * thi * twi, "W1": tc * ti * g.k1 ** 2, "O1": tc * th1 * tw1, "W2": to * tc * g.k2 ** 2,
          "O2": to * th * tw}
    per = {"I": blocks * c_blocks * -(-g.ic // ti) * df["I"], "W1": blocks * g.oc1 * g.ic * g.k1 ** 2,
           "W2": blocks * g.oc2 * g.oc1 * g.k2 ** 2, "O2": g.batch * g.oc2 * g.out_h * g.out_w * c_blocks}
    mu = max(df["I"] + df["W1"] + df["O1"], df["O1"] + df["W2"] + df["O2"])
    return Movement(sum(per.values()), mu, per)


def _even_tiles(extent: int) -> list[int]:
    """The tiles of an extent that leave no ragged last block beyond what the block count forces (`balanced`)."""
    return sorted({balanced(t, extent) for t in range(1, extent + 1)})


def conv_chain_tiles(g: ConvPair, capacity: int, cores: int = 1, lanes: int = 1, band: bool = False) -> dict[str, int]:
    """The tiles of least DV whose MU fits `capacity` elements, with at least `cores` spatial blocks (none fits: the
    least MU). Channel tiles are whole vectors of `lanes` or the whole extent. `band`: the AFUSION kernel's form
    (codegen/glue/afusion_exec.c), whole rows and every channel, so that only the band height is free."""
    def channels(extent):
        return [extent] if band else sorted({min(extent, v) for v in range(lanes, extent + lanes, lanes)})
    widths = [g.out_w] if band else _even_tiles(g.out_w)
    best, least = None, None
    for th in _even_tiles(g.out_h):
        for tw in widths:
            if g.batch * -(-g.out_h // th) * -(-g.out_w // tw) < min(cores, g.batch * g.out_h * g.out_w):
                continue
            for tc in channels(g.oc1):
                for ti in channels(g.ic):
                    # the DV does not depend on the output channels' tile, only the MU: the largest that fits
                    for to in reversed(channels(g.oc2)):
                        t = dict(zip(CONV_TILES, (th, tw, tc, ti, to)))
                        mv = conv_chain_movement(g, t)
                        if mv.mu <= capacity:
                            key = (mv.dv, -(th * tw * tc * ti))  # least DV, then the larger blocks
                            if best is None or key < best[0]:
                                best = (key, t)
                            break
                        if least is None or mv.mu < least[0]:
                            least = (mv.mu, t)
    return (best or least)[1]


def conv_chain_flops(g: ConvPair, rows: int | None = None) -> int:
    """Multiply-adds x 2 of the chain; with bands of `rows` output rows, the first convolution's halo rows (computed
    by both neighbouring bands) included."""
    h1 = (g.out_h - 1) * g.st2 + g.k2  # the intermediate rows the output needs
    if rows:
        bands = -(-g.out_h // rows)
        h1 = bands * ((rows - 1) * g.st2 + g.k2)
    w1 = (g.out_w - 1) * g.st2 + g.k2
    return 2 * g.batch * (g.oc1 * h1 * w1 * g.ic * g.k1 ** 2 + g.oc2 * g.out_h * g.out_w * g.oc1 * g.k2 ** 2)


def conv_chain_levels(g: ConvPair, machine, lanes: int, threads: int | None = None, elem_bytes: int = 4,
                      band: bool = False) -> list[LevelPlan]:
    """The conv chain's tiles for each cache level of the machine model (a core's share of it, blocks for every
    thread), each level's data over the bandwidth of the level that feeds it (the threads split both: Chimera's
    multi-level cost; `bottleneck`)."""
    cores = max(1, machine.cores)
    plans = []
    for i, lv in enumerate(machine.levels[:-1]):
        if not lv.size_bytes:
            continue
        capacity = lv.size_bytes // cores // elem_bytes
        t = conv_chain_tiles(g, capacity, threads or cores, lanes, band)
        dv = conv_chain_movement(g, t).dv
        plans.append(LevelPlan(lv.name, capacity, t, dv, dv * elem_bytes / machine.levels[i + 1].bandwidth))
    return plans


def conv_chain_seconds(g: ConvPair, machine, lanes: int, threads: int, fused: bool = True,
                       elem_bytes: int = 4) -> tuple[float, str]:
    """Chimera's cost of the chain: the slowest of its compute at the machine's peak (the threads' share of it) and
    each cache level's data over the bandwidth that feeds it, and which one that is. fused=False: the two
    convolutions apart (each at its own best tiles, so the chain's DV), the intermediate written and read back
    once more at each level whose threads' share cannot hold it."""
    share = min(threads, machine.cores) / max(1, machine.cores)
    costs = {"compute": conv_chain_flops(g) / (machine.peak_flops["float32"] * share)}
    h1, w1 = (g.out_h - 1) * g.st2 + g.k2, (g.out_w - 1) * g.st2 + g.k2
    middle = g.batch * g.oc1 * h1 * w1
    for plan in conv_chain_levels(g, machine, lanes, threads, elem_bytes):
        extra = 0 if fused or middle <= plan.capacity * min(threads, machine.cores) else 2 * middle
        costs[plan.name] = plan.seconds + extra * elem_bytes / machine.levels[
            [lv.name for lv in machine.levels].index(plan.name) + 1].bandwidth
    worst = max(costs, key=costs.get)
    return costs[worst], worst


# ---- the row op between the GEMMs ----

def softmax_strategy(chain: Chain, tiles: dict[str, int]) -> tuple[str, str]:
    """How a softmax between the GEMMs runs with these tiles: ("row", why) when an l tile spans the whole row, else
    ("online", why): running max and sum per row, earlier partial results rescaled by exp(old max - new max)
    (exact, not an approximation)."""
    L = chain.extents["l"]
    if tiles["l"] >= L:
        return "row", f"the l tile ({tiles['l']}) spans the row ({L}): softmax sees every score of a row at once"
    return "online", (f"the l tile ({tiles['l']}) is shorter than the row ({L}): the row's max and sum run across "
                      "its blocks and the partial output is rescaled when the max grows")
