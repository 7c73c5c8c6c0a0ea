"""AMOS's performance model ranking the int8 convolution's mappings onto the dot-product instruction.

AMOS's mapper (codegen/instructions/mapping.py) enumerates 11 valid mappings of a stride-1 convolution onto the
instruction as the tile issues it (`instruction_as_issued`: pixels on the lanes, input channels on the 4 bytes);
the kernel implements two of them (MAPPINGS; find.py `implicit_refusal` says where the second runs):

- "packed": the lanes on {p, q}, 16 consecutive pixels of the image, after a layout transform (im2col: exec.c packs
  each panel's receptive fields, K * 16 bytes); the panels then run the wide tiles (lower.py `wide_shape`: 4 panels
  x 6 channels, 24 accumulators) where 4 panels of one image follow each other, else one panel x mr channels;
- "implicit": the lanes on {q} alone, 16 pixels of one output row, read by taps from a channel-grouped copy of the
  input (a layout transform of the input's size); a row's last panel leaves lanes idle, and its tile is one panel
  x mr channels.

The model is AMOS's (thesis ch. 5): Perf = L_top, L_l = S_l * max(L_{l-1}, R_{l-1}, W_{l-1}), L_0 = S_0 *
lat(intrinsic), R_l = DataIn_l / bw_l. Level 0 is the tile: its panel instructions (idle lanes included: AMOS's
zero-padded tails) at the slowest of three rates, all from the machine model: the measured int8 peak; the
instruction's measured latency over the tile's accumulators (each chain waits for its last result); and its loads
into registers (a vector per panel a row set, two where a window's vector straddles cache lines, a broadcast per
channel and 4 bytes of K) over L1's measured loads a second. The reads of the level above (the cache a task's group
of panels is sized for) are not modelled: the tiles' loads bound first on every measured shape. A layout transform
is its own loop nest before the tiles (AMOS's second pass inserts it), so its time adds: exec.c's byte shuffles, at
TRANSFORM_CYCLES_PER_BYTE a byte written, the one constant fitted rather than read from the machine model. On a
target with matrix tiles, the packed form's whole groups of 16 channels run there (kinds/qconv/amx.py).

Fit (benchmarks/qconv_forms.py, Zen 4, BENCHMARKS.md: 20 stride-1 shapes in both forms in three runs, two one-pixel
1x1s in a fourth): R^2 0.94-0.97 on time (0.5-0.8 on log time: the small kernels' requantization and call costs
are not modelled); its choice was the faster form on 17, 17 and 18 of 20-22 shapes, where the hand-set rule it
replaced (implicit for at most 64 channels, rows at least 80% full, never 1x1) had 14, 16 and 18; 1.02x the faster
form's time on average, 1.2x at worst. The rates are the host's machine model (`onnxopt machine`) at the target's
vector width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

PANEL = 16  # pixels a panel (params.PANEL), the 512-bit instruction's lanes
FORMS = ("packed", "implicit")


# Each form as one of AMOS's mappings (codegen/instructions/mapping.py) of the convolution O[k, p, q] += A[c, p + r,
# q + s] * W[k, c, r, s] onto the dot-product instruction as the tile issues it: the activations on the lanes, 4
# bytes a lane, and 4 weight bytes broadcast to every lane (d[i] += a[i, j] * b[j]). The instruction loop i takes
# the pixels, j the input channels; the other loops stay outside it.
MAPPINGS = {"packed": {"i": {"p", "q"}, "j": {"c"}}, "implicit": {"i": {"q"}, "j": {"c"}}}


def instruction_as_issued():
    """The tile's reading of the dot-product instruction: 16 lanes of 4 u8 activations by 4 broadcast s8 weights."""
    from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul

    return Computation("dot_broadcast_weights", (Loop("i", PANEL), Loop("j", 4, reduce=True)), access("d", "s32", "i"),
                       mul("s32", cast("s32", access("a", "u8", "i", "j")), cast("s32", access("b", "s8", "j"))))


def conv_computation(s: "ConvShape"):
    """The stride-1 convolution in the tensor language (codegen/instructions/expr.py), u8 activations by s8 weights,
    as the mapper reads it."""
    from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul

    loops = (Loop("k", s.cout), Loop("p", s.oh), Loop("q", s.ow), Loop("c", s.cin, reduce=True),
             Loop("r", s.kh, reduce=True), Loop("s", s.kw, reduce=True))
    return Computation("conv2d", loops, access("O", "s32", "k", "p", "q"),
                       mul("s32", cast("s32", access("A", "u8", "c", "p+r", "q+s")),
                           cast("s32", access("W", "s8", "k", "c", "r", "s"))))


@dataclass(frozen=True)
class ConvShape:
    cin: int
    cout: int
    oh: int
    ow: int
    kh: int
    kw: int
    batch: int = 1

    @property
    def k4(self) -> int:
        return self.kh * self.kw * (-(-self.cin // 4) * 4)


@dataclass(frozen=True)
class Rates:
    """What the model reads of the machine, per core: panel instructions a second at the peak (one panel
    instruction: 16 lanes x 4 bytes, 64 multiply-adds; two AVX2 sequences), the native instruction's latency
    (seconds), the vector width in lanes, vector loads a second from L1, the cores the call runs on, and the
    clock (peak panel instructions a second stand in for it: one a cycle on the 512-bit cores)."""

    peak_ins: float
    latency_s: float
    lanes: int
    l1_loads: float
    cores: int
    matrix_ins: float = 0.0  # panel instructions a second on the target's matrix tiles (AMX), 0 without them


# A tile instruction (tdpbusd: 16 x 16 x 64 multiply-adds, one each 16 cycles) against one 512-bit vpdpbusd a
# cycle: the matrix tiles' rate where the machine model has no measured AMX peak (a build for an AMX target here).
MATRIX_OVER_VECTOR = 16


def rates(machine=None, threads: int = 0, lanes: int = 0, matrix: bool = False) -> Rates:
    """The machine model's rates (this host's, measured once and cached, where `machine` is None); `lanes`: the
    target's float32 lanes (its vector width), else the machine's; `matrix`: the target runs the packed form's
    whole groups of 16 channels on matrix tiles (kinds/qconv/amx.py), at the measured AMX peak where there is one."""
    if machine is None:
        from onnxopt.hardware.measure import cached_machine, load_machine

        machine = cached_machine() or load_machine(quick=True)
    one = machine.details.get("peak_flops_1core", {}).get("int8") or machine.peak_flops.get("int8", 0) / max(
        1, machine.cores)
    peak_ins = (one or 2e11) / (2 * PANEL * 4)
    lanes = lanes or max(8, (machine.vector_bits or 256) // 32)
    latency = machine.details.get("kernels", {}).get("int8", {}).get("latency_s") or 4.0 / peak_ins
    l1 = next((x for x in machine.levels if x.name == "L1"), None)
    l1_bytes = (l1.bandwidth_1core or l1.bandwidth) if l1 is not None else 64.0 * peak_ins
    amx = machine.details.get("peak_flops_1core", {}).get("amx_int8") or 0.0
    matrix_ins = (amx / (2 * PANEL * 4) or MATRIX_OVER_VECTOR * peak_ins) if matrix else 0.0
    return Rates(peak_ins=peak_ins, latency_s=latency, lanes=lanes, l1_loads=l1_bytes / (4 * lanes),
                 cores=max(1, threads or machine.cores), matrix_ins=matrix_ins)


# The layout transforms (im2col's packed panels, the implicit form's channel-grouped copy) are byte shuffles in
# exec.c, bound by their instruction count rather than a bandwidth: cycles a byte written, fitted on the measured
# kernels of benchmarks/qconv_forms.py (BENCHMARKS.md). The one constant the machine model does not give.
TRANSFORM_CYCLES_PER_BYTE = 0.8
# The implicit tile's vectors start wherever a tap's window starts, 4 bytes a pixel: most of them straddle two
# cache lines, a split load that takes two load slots (the packed panels are read aligned).
SPLIT = 2


def tile_seconds(instructions: float, accumulators: int, loads_per_ins: float, r: Rates) -> float:
    """Level 0: `instructions` panel instructions on one core by a tile of `accumulators` panel rows in flight,
    `loads_per_ins` vector loads and broadcasts each: the slowest of the peak, the latency chains and L1's loads."""
    issue = max(1.0 / r.peak_ins, r.latency_s / accumulators)
    return instructions * max(issue, loads_per_ins / r.l1_loads)


def transform_seconds(nbytes: float, r: Rates) -> float:
    return nbytes * TRANSFORM_CYCLES_PER_BYTE / r.peak_ins


def predict_seconds(s: ConvShape, form: str, r: Rates | None = None, mr: int = 4) -> float:
    """The model's time of the kernel for convolution `s` in `form`, on `r.cores` cores."""
    r = r or rates()
    vectors = PANEL // r.lanes  # vector loads a panel
    groups = s.k4 // 4  # panel instructions a channel of a panel
    cin4 = -(-s.cin // 4) * 4
    if form == "packed":
        pixels = s.oh * s.ow
        panels = s.batch * -(-pixels // PANEL)
        if r.matrix_ins:  # whole groups of 16 channels on the matrix tiles, the rest on the instruction's tiles
            on_tiles = s.cout // 16 * 16
            t = panels * on_tiles * groups / r.matrix_ins
            t += tile_seconds(panels * (s.cout - on_tiles) * groups, mr, 1 + vectors / mr, r)
            return (t + transform_seconds(panels * PANEL * s.k4, r)) / r.cores
        # the wide tiles (16-lane targets): 4 panels x 6 channels, 24 rows in flight, 6 broadcasts and 4 vectors
        # a 24 panel instructions, where 4 panels of one image follow each other
        wide = panels // 4 * 4 if r.lanes == PANEL and pixels >= 4 * PANEL else 0
        t = tile_seconds(wide * s.cout * groups, 24, (6 + 4 * vectors) / 24, r)
        # the rest: one panel x mr channels
        t += tile_seconds((panels - wide) * s.cout * groups, mr, 1 + vectors / mr, r)
        return (t + transform_seconds(panels * PANEL * s.k4, r)) / r.cores
    if form == "implicit":
        panels = s.batch * s.oh * -(-s.ow // PANEL)
        t = tile_seconds(panels * s.cout * groups, mr, 1 + SPLIT * vectors / mr, r)
        relayout = s.batch * (s.oh + s.kh - 1) * (s.ow + s.kw - 1) * cin4
        return (t + transform_seconds(relayout, r)) / r.cores
    raise ValueError(f"form {form!r}: one of {FORMS}")


@functools.lru_cache(maxsize=256)
def candidates(s: ConvShape) -> tuple[str, ...]:
    """The forms whose mapping AMOS's mapper enumerates and validates (Algorithm 4) for convolution `s` (stride 1;
    find.py `implicit_refusal` says where the kernel runs the second)."""
    from onnxopt.codegen.instructions.mapping import mappings, valid

    op, ins = conv_computation(s), instruction_as_issued()
    found = {tuple(sorted((il, tuple(sorted(g))) for il, g in m.groups)) for m in mappings(op, ins)
             if valid(op, ins, m)}
    return tuple(f for f in FORMS
                 if tuple(sorted((il, tuple(sorted(g))) for il, g in MAPPINGS[f].items())) in found)


def rank(s: ConvShape, r: Rates | None = None, mr: int = 4) -> list[tuple[str, float]]:
    """The valid forms of `s` with the model's seconds, fastest first."""
    r = r or rates()
    return sorted(((f, predict_seconds(s, f, r, mr)) for f in candidates(s)), key=lambda x: x[1])


def choose(s: ConvShape, r: Rates | None = None, mr: int = 4) -> str:
    """The form the model predicts faster."""
    return rank(s, r, mr)[0][0]
