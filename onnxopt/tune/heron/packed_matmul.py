"""The float32 matmul with a constant B packed in panels (codegen/compute, glue compute_exec.c): its schedule, as
data, and its candidates built and timed through the library's C entry point (glue entry_exec.c).

The kernel, C[M x N] = A[M x K] . B[K x N] with its epilogue:
    parallel over (panel tasks pt) x (row tasks mt)
      for each K block of kc                        B's block of one panel (kc x panel) in L1
        for each group of `group` panels            the group's blocks of B in L2 (or the task's panels: b_at = 1)
          for each row block of mi rows             A's mi x kc rows in L1, met by every panel of the group
            for each panel: the register tile       mi x ni vectors of C, ni vectors of B, mii broadcasts of A
The register tile (mi, ni, mii) is compiled code; kc, group and the task split are arguments of the call, so one
library a register tile serves every point that shares it.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .rules import Capacities
from .schedule import Cache, ComputeAt, Knob, Parallel, Schedule, Split, Tensorize, Unroll, Vectorize

# K a block: a candidate list (Heron's C3), as far as K
KC_CANDIDATES = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
ROLES = {"rows": "mi", "vectors": "ni", "broadcasts": "mii"}
KNOBS = ("mi", "ni", "mii", "kc", "pp", "mb", "group", "b_at")


def schedule(M: int, K: int, N: int, cap: Capacities) -> Schedule:
    """The packed-B matmul's schedule on a machine with capacities `cap` (its registers and lanes are the
    target's, its cache levels the machine model's)."""
    kcs = tuple(sorted({k for k in KC_CANDIDATES if k < K} | {K}))
    panels = -(-N // cap.lanes)  # the most panels (of one vector each)
    blocks = M  # the most row blocks (of one row each)
    steps = [
        Split("n", ("n_panels", "panel")),  # panels of whole vectors, the last zero-padded
        Split("panel", ("ni", "lanes"), cover=False),
        Vectorize("lanes"),
        Tensorize(("lanes",), "fma_outer_product"),
        Split("m", ("m_blocks", "mi")),  # row blocks of the register tile's rows, the last partial
        Split("n_panels", ("pt", "pp")),  # panel tasks x panels a task
        Split("m_blocks", ("mt", "mb")),  # row tasks x row blocks a task
        Split("pp", ("groups", "group")),  # a task's panels in L2 groups
        Split("k", ("kb", "kc")),  # K blocks
        Parallel(("pt", "mt"), "tasks"),
        Unroll(("mi", "ni")),
        Knob("mi", lo=1, hi=cap.registers),
        Knob("ni", lo=1, hi=4),
        Knob("mii", lo=1, hi=4),
        Knob("kc", values=kcs),
        # a task's panels and row blocks, and a group's panels: powers of two, or all of them
        Knob("pp", values=_powers(panels)),
        Knob("mb", values=_powers(blocks)),
        Knob("group", values=_powers(panels)),
        # the group's B blocks stay in L2 (at the group loop), or all the task's panels' do
        ComputeAt("b_panels", "b_at", ("group", "task"), (("group", "kc", "panel"), ("pp", "kc", "panel"))),
        Cache("acc", "registers", ("mi", "ni"), unit=1),
        Cache("b_vectors", "registers", ("ni",), unit=1),
        Cache("a_broadcasts", "registers", ("mii",), unit=1),
        Cache("b_block", "L1", ("kc", "panel")),
        Cache("a_rows", "L1", ("mi", "kc")),
        Cache("b_panels", "L2", ("@b_panels",)),
    ]
    return Schedule(f"packed_matmul_{M}x{K}x{N}", {"m": M, "k": K, "n": N}, steps, KNOBS)


def _powers(n: int) -> tuple[int, ...]:
    return tuple(sorted({1 << e for e in range(n.bit_length()) if 1 << e <= n} | {n}))


def capacities(target, levels: dict | None = None, max_tasks: int = 64) -> Capacities:
    """The target's register file and lanes (its micro-kernel's, never the host's), with cache levels from
    `levels` ({"L1": bytes, "L2": bytes}), else this machine's (one core's share)."""
    from onnxopt.codegen.microkernel.registry import select

    mk = select(target)
    if levels is None:
        from onnxopt.hardware.cpu import cache_levels

        found = {f"L{c.level}": c.instance_bytes for c in cache_levels()}
        levels = {"L1": found.get("L1", 32 << 10), "L2": found.get("L2", 1 << 20)}
    return Capacities(mk.registers, mk.lanes, dict(levels), max_tasks)


def kernel_point(a: dict) -> dict:
    """A solution's knobs as the kernel takes them: its register tile, and the call's schedule (K a block, panels
    a group, panel tasks, row tasks)."""
    return {"tile": (a["mi"], a["ni"], a["mii"]), "schedule": (a["kc"], _group(a), a["pt"], a["mt"])}


def _group(a: dict) -> int:
    return a["group"] if a["b_at"] == 0 else a["pp"]


# What the cost model learns from (name, the variables it reads, its value): the point as ratios, logs and
# footprints that mean the same at another shape, not raw variable values. `lanes` and the shape come with the point.
FEATURES = (
    ("rows", ("mi",), lambda a, s: a["mi"]),
    ("vectors", ("ni",), lambda a, s: a["ni"]),
    ("broadcasts", ("mii",), lambda a, s: a["mii"]),
    ("accumulators", ("mi", "ni"), lambda a, s: a["mi"] * a["ni"]),
    ("intensity", ("mi", "ni"), lambda a, s: a["mi"] * a["ni"] * s["lanes"] / (a["mi"] + a["ni"] * s["lanes"])),
    ("registers", ("mi", "ni", "mii"), lambda a, s: a["mi"] * a["ni"] + a["ni"] + a["mii"]),
    ("log_kc", ("kc",), lambda a, s: np.log2(a["kc"])),
    ("kc_of_k", ("kc",), lambda a, s: a["kc"] / s["K"]),
    ("k_blocks", ("kc",), lambda a, s: -(-s["K"] // a["kc"])),
    ("log_tasks", ("pp", "mb"), lambda a, s: np.log2(a["pt"] * a["mt"])),
    ("panel_tasks", ("pp",), lambda a, s: a["pt"]),
    ("row_tasks", ("mb",), lambda a, s: a["mt"]),
    ("row_waste", ("mi",), lambda a, s: (-(-s["M"] // a["mi"]) * a["mi"] - s["M"]) / s["M"]),
    ("column_waste", ("ni",), lambda a, s: (-(-s["N"] // (a["ni"] * s["lanes"])) * a["ni"] * s["lanes"] - s["N"])
     / s["N"]),
    ("log_group", ("group", "b_at", "pp"), lambda a, s: np.log2(max(1, _group(a)))),
    ("log_l1_bytes", ("kc", "ni", "mi"), lambda a, s: np.log2(4 * a["kc"] * (a["ni"] * s["lanes"] + a["mi"]))),
    ("log_l2_bytes", ("group", "kc", "ni", "b_at", "pp"),
     lambda a, s: np.log2(4 * _group(a) * a["kc"] * a["ni"] * s["lanes"])),
    ("b_at_task", ("b_at",), lambda a, s: a["b_at"]),
    ("log_flops", (), lambda a, s: np.log2(2.0 * s["M"] * s["N"] * s["K"])),
)
FEATURE_DEPS = [deps for _, deps, _ in FEATURES]


def features(a: dict, M: int, K: int, N: int, lanes: int) -> list[float]:
    s = {"M": M, "K": K, "N": N, "lanes": lanes}
    return [float(f(a, s)) for _, _, f in FEATURES]


# The analytic model's machine: FMAs and loads a cycle (two ports each on the x86 cores we target), the FMA's latency,
# bytes a cycle from L2 and from memory for one core, and what a task costs to start.
FMA_PORTS, LOAD_PORTS, FMA_LATENCY = 2, 2, 4
L2_BYTES_CYCLE, MEMORY_BYTES_CYCLE, TASK_CYCLES = 32.0, 8.0, 2000.0
NOMINAL_HZ = 3e9


def _k_step_cycles(rows: int, ni: int, mii: int) -> float:
    """Cycles a k step of a register tile takes: its FMAs on the FMA ports, its loads (rows broadcasts and ni B
    vectors) on the load ports, and no less than one FMA latency (each accumulator's chain waits on its last)."""
    return max(rows * ni / FMA_PORTS, (rows + ni) / LOAD_PORTS, FMA_LATENCY)


def predicted_seconds(a: dict, M: int, K: int, N: int, cap: Capacities, threads: int) -> float:
    """The analytic model (data movement and the register tile's issue rate) of one call at solution `a`: the
    tasks' compute spread over the threads, against the traffic from L2 (each row block reads its panels' B
    blocks from L2) and from memory (A read once per panel task, B once per row task, where they outgrow L2), plus
    the K blocks' partial sums and the tasks' start. It ranks the RandSAT samples of the default mode."""
    mi, ni, mii, kc = a["mi"], a["ni"], a["mii"], a["kc"]
    lanes = cap.lanes
    cols = ni * lanes
    panels = -(-N // cols)
    full, rest = divmod(M, mi)
    per_panel = K * (full * _k_step_cycles(mi, ni, mii) + (_k_step_cycles(rest, ni, mii) if rest else 0.0))
    compute = panels * per_panel
    tasks = a["pt"] * a["mt"]
    rounds = -(-tasks // max(1, threads))
    makespan = compute / tasks * rounds
    m_blocks = -(-M // mi)
    l2 = 4.0 * K * panels * cols * m_blocks / L2_BYTES_CYCLE / min(threads, tasks)
    a_bytes, b_bytes = 4.0 * M * K * a["pt"], 4.0 * K * panels * cols * a["mt"]
    memory = (a_bytes + b_bytes) / MEMORY_BYTES_CYCLE / min(threads, tasks) \
        if 4.0 * (M * K + K * N) > cap.levels.get("L2", 1 << 20) else 0.0
    k_blocks = -(-K // kc)
    sums = (k_blocks - 1) * 2 * 4.0 * M * panels * cols / L2_BYTES_CYCLE / min(threads, tasks)
    return (max(makespan, l2, memory) + sums + TASK_CYCLES * rounds) / NOMINAL_HZ


def matmul_model(M: int, K: int, N: int, seed: int = 0, bias: bool = False) -> onnx.ModelProto:
    """A one-MatMul model (with a bias Add) whose B is a constant: the region the search builds."""
    rng = np.random.default_rng(seed)
    b = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B")]
    nodes = [helper.make_node("MatMul", ["A", "B"], ["Y" if not bias else "P"])]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["P", "bias"], ["Y"]))
    g = helper.make_graph(nodes, "matmul", [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [M, N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(m)


def matmul_region(model: onnx.ModelProto, target):
    """The packed-B compute region the optimizer finds in `model` (its only one), op type computed."""
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.fusion.compute import ComputeRule

    mk = select(target)
    t = mk.packed_b_tile
    rule = ComputeRule(model, mk.tile.mi, panel=t.ni * t.lanes)
    regions = [r for r in rule.find_regions(set(), []) if r.compute is not None and r.compute.attrs.packed_b]
    if len(regions) != 1:
        raise ValueError(f"expected one packed-B matmul region, found {len(regions)}")
    r = regions[0]
    r.compute_op_type(target.name)
    return r


@dataclass
class Measured:
    seconds: float | None  # per call, the least of the repetitions; None when it failed
    error: str | None = None


@dataclass
class MatmulBench:
    """Builds the kernels of one GEMM shape, one library a register tile, and times points through the C entry
    point on `threads` threads, each point checked against numpy first."""

    M: int
    K: int
    N: int
    target: object
    threads: int = 1
    seed: int = 0
    min_time: float = 0.02
    repeats: int = 5
    check: bool = True
    # time each point against a reference point (measure()), not alone
    reference: bool = True
    _libs: dict = field(default_factory=dict, repr=False)
    _tmp: object = field(default=None, repr=False)

    def __post_init__(self):
        self.model = matmul_model(self.M, self.K, self.N, self.seed)
        self.region = matmul_region(self.model, self.target)
        rng = np.random.default_rng(self.seed + 1)
        self.a = np.ascontiguousarray(rng.standard_normal((self.M, self.K)).astype(np.float32))
        b = numpy_helper.to_array(next(t for t in self.model.graph.initializer if t.name == "B"))
        self.want = (self.a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        self.out = np.zeros((self.M, self.N), np.float32)
        self._tmp = tempfile.TemporaryDirectory(prefix="onnxopt-heron-")
        self.build_s = 0.0
        self._reference = None  # (the reference point, its first seconds)
        self._reference_calls = 1

    def close(self):
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _library(self, tile: tuple[int, int, int]):
        """(ctypes library, op type, packed B) of register tile `tile`, built on first use."""
        if tile in self._libs:
            return self._libs[tile]
        from onnxopt.codegen.compute.build import build_compute
        from onnxopt.codegen.glue.library import link_library
        from onnxopt.codegen.microkernel.register_tile import RegisterTile
        from onnxopt.fusion.compute import retile

        t0 = time.perf_counter()
        mi, ni, mii = tile
        try:
            v = retile(self.region, RegisterTile(mi, ni, mii, self.region_lanes))
            objs, desc = build_compute(v, self.target)
            path = os.path.join(self._tmp.name, f"t{mi}_{ni}_{mii}.so")
            link_library([desc], [objs], self.target, path)
            lib = ctypes.CDLL(path)
            fn = lib.onnxopt_matmul_entry
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            packed = np.ascontiguousarray(numpy_helper.to_array(
                next(x for x in v.compute.initializers if x.name == v.inputs[1])))
            entry = (lib, fn, v.op_type.encode(), packed)
        except Exception as e:  # noqa: BLE001 - a tile that does not build is a failed point
            entry = (None, None, None, f"build: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        self.build_s += time.perf_counter() - t0
        self._libs[tile] = entry
        return entry

    @property
    def region_lanes(self) -> int:
        from onnxopt.codegen.microkernel.registry import select

        return select(self.target).lanes

    def call(self, point: dict) -> int:
        lib, fn, op, packed = self._library(point["tile"])
        if fn is None:
            raise RuntimeError(packed)
        sched = (ctypes.c_int64 * 4)(*point["schedule"])
        outs = (ctypes.c_void_p * 1)(self.out.ctypes.data)
        return fn(op, 1, self.M, self.K, self.a.ctypes.data, packed.ctypes.data, None, outs, sched, self.threads)

    def measure(self, point: dict) -> Measured:
        """Seconds a call at `point` (its kernel checked against numpy first), at the reference's speed: the VM's
        speed changes within a tenth of a second, so the point's blocks of calls alternate with a reference
        point's (the default kernel), and the median ratio of the two, times the reference's own least time
        measured once, is the point's time: points measured minutes apart compare as if measured together."""
        if not self.reference:
            return self._measure(point)
        from onnxopt.codegen.microkernel.registry import select

        if self._reference is None:
            t = select(self.target).packed_b_tile
            ref = {"tile": (t.mi, t.ni, t.mii), "schedule": (0, 0, 0, 0)}
            # the least of three: the first calls pay for the pool's threads starting and the clock ramping up
            runs = [self._measure(ref) for _ in range(3)]
            first = min((r for r in runs if r.seconds is not None), key=lambda r: r.seconds, default=runs[0])
            if first.seconds is None:
                raise RuntimeError(f"the reference kernel failed: {first.error}")
            self._reference = (ref, first.seconds)
            self._reference_calls = max(1, int(self.min_time / self.repeats / first.seconds))
        ref, first = self._reference
        m = self._measure(point, alternate=ref)
        if m.seconds is None:
            return m
        return Measured(m.seconds * first)

    def _measure(self, point: dict, alternate: dict | None = None) -> Measured:
        try:
            self.out[...] = np.nan
            rc = self.call(point)
        except RuntimeError as e:
            return Measured(None, str(e))
        if rc != 0:
            return Measured(None, f"the entry point returned {rc}")
        if self.check:
            err = float(np.max(np.abs(self.out - self.want))) if self.out.size else 0.0
            bound = 1e-4 * max(1.0, float(np.max(np.abs(self.want)))) * max(1.0, np.sqrt(self.K) / 8)
            if not np.isfinite(err) or err > bound:
                return Measured(None, f"wrong results: max abs error {err:.3g}")
        # calls per repetition: about min_time / repeats each
        t0 = time.perf_counter()
        self.call(point)
        one = max(1e-7, time.perf_counter() - t0)
        n = max(1, int(self.min_time / self.repeats / one))
        times, others = [], []
        for _ in range(self.repeats):
            if alternate is not None:
                others.append(self._block(alternate, self._reference_calls))
            times.append(self._block(point, n))
        # alternating: the median of each block's time over the reference block's before it, robust to one
        # disturbed block on either side (a ratio of least times is not: one lucky block makes a winner)
        if alternate is not None:
            return Measured(float(np.median(np.asarray(times) / np.asarray(others))))
        # alone: the least, what the kernel takes undisturbed (other processes and the VM only ever add time)
        return Measured(float(np.min(times)))

    def _block(self, point: dict, n: int) -> float:
        """Seconds a call over a block of `n` calls, after one untimed call: in an alternation each block follows
        the other point's, whose packed B evicted this one's, and neither side should pay for that."""
        self.call(point)
        t0 = time.perf_counter()
        for _ in range(n):
            self.call(point)
        return (time.perf_counter() - t0) / n

    def confirm(self, points: list[dict], factor: int = 5) -> list[Measured]:
        """The points timed again over `factor` times longer: the best of thousands of noisy timings is partly
        luck (the winner's curse), so a search's winners are re-timed before they are trusted."""
        keep = self.min_time
        self.min_time = keep * factor
        try:
            return [self.measure(p) for p in points]
        finally:
            self.min_time = keep

    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K
