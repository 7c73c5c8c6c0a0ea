"""The kinds written before the kind folders, as rows of the same Kind type: found by the driver's own rules in
fusion/ (elementwise.py, compute.py with conv_transpose.py, winograd.py, afusion/, siblings.py; pool.py;
blocked_copy.py), lowered from codegen/. Their `find` is None: the plans call those rules directly.

What remains to move each into a folder of its own is said in docs/architecture.md ("Kinds")."""

from __future__ import annotations

from onnxopt.codegen.compute.build import build_compute
from onnxopt.codegen.copy.build import build_copy
from onnxopt.codegen.elementwise.build import build_elementwise
from onnxopt.codegen.pool.build import build_pool

from .base import Kind
from .schedule import Knob, ScheduleSpace, lanes_knob, params_apply


def _elementwise_space(region, target) -> ScheduleSpace:
    """The row loop's vector width (LLVM only: the C compiler picks its own) and the size from which a call runs on
    the pool, the kind's threshold first."""
    from onnxopt.codegen.elementwise.build import parallel_min

    base = parallel_min(region.program)
    split = Knob("parallel_min", tuple(dict.fromkeys((base, 1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22))),
                 "elements from which a call is split over onnxruntime's pool")
    defaults = {"parallel_min": base, "lanes": target.float32_lanes}
    if target.backend != "llvm":
        return ScheduleSpace("elementwise", (split,), params_apply(defaults))
    return ScheduleSpace("elementwise", (lanes_knob(target), split), params_apply(defaults))


def _pool_space(region, target) -> ScheduleSpace:
    """The most tasks a pool call is split into and the taps below which it stays on one thread, the measured
    defaults first (codegen/pool/desc.py)."""
    from onnxopt.codegen.pool.desc import INLINE_WORK, MAX_TASKS

    tasks = Knob("max_tasks", tuple(dict.fromkeys((MAX_TASKS, 1, 4, 16, 32, 128))),
                 "the most tasks a call is split into")
    inline = Knob("inline_work", tuple(dict.fromkeys((INLINE_WORK, 65536.0, 98304.0, 1572864.0))),
                  "taps below which a call runs on one thread")
    return ScheduleSpace("pool", (tasks, inline), params_apply({"max_tasks": MAX_TASKS, "inline_work": INLINE_WORK}))


def _copy_space(region, target) -> ScheduleSpace:
    """The most tasks a copy call is split into and the floats below which it stays on one thread, the defaults
    first (codegen/copy/desc.py)."""
    from onnxopt.codegen.copy.desc import INLINE_FLOATS, MAX_TASKS

    tasks = Knob("max_tasks", tuple(dict.fromkeys((MAX_TASKS, 1, 4, 16, 32, 128))),
                 "the most tasks a call is split into")
    inline = Knob("inline_floats", tuple(dict.fromkeys((INLINE_FLOATS, 4096, 16384, 262144))),
                  "floats written below which a call runs on one thread")
    return ScheduleSpace("copy", (tasks, inline), params_apply({"max_tasks": MAX_TASKS,
                                                                "inline_floats": INLINE_FLOATS}))


def _compute_space(region, target) -> ScheduleSpace:
    """A convolution's or matmul's register tile (codegen/microkernel: every legal MI x NI, the tile search's
    candidates), where the kernel takes any: a plain convolution, a matmul that reads B unpacked."""
    from onnxopt.codegen.microkernel.register_tile import candidate_tiles
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.fusion.compute import apply_tile

    c = region.compute
    if target.backend != "llvm":
        return ScheduleSpace("compute", note=f"no lowering on the {target.backend} backend")
    fixed = (c.op not in ("conv", "matmul") or c.attrs.in_blocked or c.attrs.out_blocked
             or c.attrs.packed_b or c.attrs.channel_vectors or c.attrs.winograd)
    if fixed:
        return ScheduleSpace("compute", note="its layout fixes the tile (blocked, packed B, Winograd, AFUSION and "
                                             "sibling parts: their parts' tiles)")
    mk = select(target)
    current = c.tile if c.tile is not None else mk.tile
    tiles = [current] + [t for t in candidate_tiles(mk.registers, mk.lanes, mk.masks_in_vector_registers, limit=8)
                         if (t.mi, t.ni, t.mii) != (current.mi, current.ni, current.mii)]

    def apply(r, point):
        if point["tile"] != (r.compute.tile or mk.tile):
            apply_tile(r, point["tile"])

    return ScheduleSpace("compute", (Knob("tile", tuple(tiles), "the register tile MI x NI vectors"),), apply)


def _c_elementwise(region, target):
    from onnxopt.backends.c.elementwise import build

    return build(region, target)


ELEMENTWISE = Kind(name="elementwise", find=None, build=build_elementwise, lowerings={"c": _c_elementwise},
                   schedule=_elementwise_space,
                   dtypes=("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                           "uint64", "bool"))
# Conv, ConvTranspose, MatMul and Gemm with their epilogues; AFUSION and sibling groups are its ops too.
COMPUTE = Kind(name="compute", find=None, build=build_compute, schedule=_compute_space)
POOL = Kind(name="pool", find=None, build=build_pool, schedule=_pool_space, dtypes=("float32", "uint8", "int8"))
COPY = Kind(name="copy", find=None, build=build_copy, schedule=_copy_space)

BUILTIN_KINDS: tuple[Kind, ...] = (ELEMENTWISE, COMPUTE, POOL, COPY)
BUILTIN_BY_FAMILY = {k.name: k for k in BUILTIN_KINDS}
