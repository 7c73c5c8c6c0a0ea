"""Tile sets: the compiled tile functions of compute kernels, shared by every kernel that needs the same ones.

A compute kernel's native code is only its tile functions (codegen/compute/tile.py, blocked_tile.py); the glue
does the rest. A tile function depends on the register tile, the epilogue program, the kinds of its epilogue inputs
and, for a depthwise convolution, the kernel width, stride and dilation; never on the image size, the channel
counts or the weights, which the glue passes at run time. Most convolutions of a network therefore run the same
tiles: Inception-v3's 94 convolutions (each with bias and Relu) need a handful of sets, not 94 x 3 (its NCHW,
blocked and AFUSION or sibling kernels). Compiling each set once is most of what code generation costs
(LLVM's passes and instruction selection, about 0.4 s a set on this machine's cores).

A set is named by a digest of what its code depends on (`TileSetRequest.key`), so its symbols are the same in
every kernel and every library that uses it; `link_library` links each distinct object once. The objects compiled
in this process are kept (`_COMPILED`, a bounded LRU); the pipeline builds the distinct sets of a model first, on
all cores, before the kernels that use them (`prebuild`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from onnxopt.fusion.region import EwProgram

from ..compile import compile_object, new_module
from ..target import Target
from ..vmath.isa import set_features
from .amx_tile import MAX_GROUPS as AMX_MAX_GROUPS
from .amx_conv_tile import define_amx_conv_functions
from .amx_tile import define_amx_tile_functions, has_out16
from .blocked_tile import define_blocked_tile_functions, define_depthwise_tile_functions
from .tile import TileSpec, define_tile_functions
from .winograd import define_winograd_functions

# Compiled sets kept in this process: enough for the largest model's kernels and its tile search, bounded because a
# long-lived process (the test suite, a batch conversion) builds thousands.
_MAX_COMPILED = 256
_COMPILED: OrderedDict[str, bytes] = OrderedDict()


@dataclass(frozen=True)
class TileSetRequest:
    """One set of tile functions: `kind` "nchw" (tile.py), "blocked" or "depthwise" (blocked_tile.py),
    "winograd" (winograd.py: a Winograd convolution's two transforms, the epilogue in the second), "amx"
    (amx_tile.py: a bfloat16 packed-B matmul on the matrix instruction `matrix`, its tiles as plain code when
    `emulated`) or "amx_conv" (amx_conv_tile.py: a bfloat16 blocked convolution on it)."""

    kind: str
    spec: TileSpec
    depthwise: tuple[int, int, int, int] = ()  # (mi, kw, sw, dw) of a depthwise set
    winograd: int = 0  # m of a winograd set: F(m, wino_kernel) (fusion/winograd.py)
    wino_kernel: tuple[int, int] = (3, 3)
    matrix: str = ""
    emulated: bool = False

    @property
    def key(self) -> str:
        return _digest(self)

    def prefix(self) -> str:
        return f"oxt_{self.kind[0]}_{self.key[:24]}"

    def names(self) -> list[list[str]]:
        """The symbols of the set's functions, as define_*_tile_functions lays them out (without defining them)."""
        p, tile = self.prefix(), self.spec.tile
        if self.kind == "depthwise":
            return [[f"{p}_d{m}", f"{p}_d{m}b"] for m in range(1, self.depthwise[0] + 1)]
        if self.kind == "winograd":
            return [[f"{p}_win", f"{p}_wout"]]
        if self.kind == "amx":
            tiles = [[f"{p}_x{g}v{nv}" for nv in range(1, tile.ni + 1)] for g in range(1, AMX_MAX_GROUPS + 1)]
            out16 = [[f"{n}h" for n in row] for row in tiles] if has_out16(self.spec, self.matrix) else []
            return tiles + [[f"{p}_round"]] + out16
        if self.kind == "amx_conv":
            return [[f"{p}_x{g}v{nv}" for nv in range(1, tile.ni + 1)] for g in range(1, AMX_MAX_GROUPS + 1)]
        tag = "b" if self.kind == "blocked" else "m"
        return [[f"{p}_{tag}{mi}v{nv}" for nv in range(1, tile.ni + 1)] for mi in range(1, tile.mi + 1)]

    def define(self, module, features) -> list[list[str]]:
        """Define the set's functions in `module`; returns their names (names())."""
        if self.kind == "depthwise":
            mi, kw, sw, dw = self.depthwise
            return define_depthwise_tile_functions(module, self.prefix(), self.spec, features, mi, kw, sw, dw)
        if self.kind == "amx":
            set_features(module, features)
            return define_amx_tile_functions(module, self.prefix(), self.spec, self.matrix, self.emulated)
        if self.kind == "amx_conv":
            set_features(module, features)
            return define_amx_conv_functions(module, self.prefix(), self.spec, self.matrix, self.emulated)
        if self.kind == "winograd":
            return define_winograd_functions(module, self.prefix(), self.spec, features, self.wino_kernel,
                                             self.winograd)
        define = define_blocked_tile_functions if self.kind == "blocked" else define_tile_functions
        return define(module, self.prefix(), self.spec, features)


def _canonical_program(prog: EwProgram) -> tuple:
    """The epilogue as its code sees it: values renamed by order of appearance (the names are graph tensor names,
    which differ from kernel to kernel and change nothing in the code), constants with their values."""
    names: dict[str, str] = {}

    def name(n: str) -> str:
        if not n:
            return n
        return names.setdefault(n, f"v{len(names)}")

    inputs = tuple((name(v.name), v.dtype) for v in prog.inputs)
    consts = tuple(sorted((name(k), repr(val), dt) for k, (val, dt) in prog.consts.items()))
    ops = tuple((op.op, tuple(name(a) for a in op.args), name(op.out), op.dtype, repr(op.attrs)) for op in prog.ops)
    outputs = tuple((name(v.name), v.dtype) for v in prog.outputs)
    return inputs, consts, ops, outputs


def _digest(req: TileSetRequest) -> str:
    s = req.spec
    t = s.tile
    parts = (req.kind, (t.mi, t.ni, t.mii, t.lanes), _canonical_program(s.epilogue), tuple(s.extra_kinds),
             bool(s.packed_a), tuple(req.depthwise), req.winograd, tuple(req.wino_kernel))
    if s.packed_b:  # a later field: the sets without it keep their names
        parts += ("packed_b", s.packed_b)
    if s.b_format != "f32":  # a lower-precision B (driver/precision.py): float32 sets keep their names
        parts += ("b_format", s.b_format)
    if req.matrix:  # AMX tiles: the instruction, and whether they are plain code (tests)
        parts += ("matrix", req.matrix, req.emulated)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _target_key(req: TileSetRequest, target: Target) -> str:
    return f"{req.key}|{target.triple}|{target.cpu}|{target.llvm_features}"


def compile_tile_set(req: TileSetRequest, target: Target) -> tuple[bytes, str]:
    """Compile the set on its own: (object code, LLVM IR text). The module is named by the set, so the same set
    compiles to the same bytes wherever it is built."""
    module = new_module(target, req.prefix())
    req.define(module, target.features)
    ir_text = str(module)
    return compile_object(ir_text, target, vectorize=False), ir_text  # vectors already


def tile_set_object(req: TileSetRequest, target: Target) -> bytes:
    """The set's object code, compiled once per process (and target)."""
    k = _target_key(req, target)
    obj = _COMPILED.get(k)
    if obj is None:
        obj = compile_tile_set(req, target)[0]
        remember(req, target, obj)
    else:
        _COMPILED.move_to_end(k)
    return obj


def remember(req: TileSetRequest, target: Target, obj: bytes) -> None:
    k = _target_key(req, target)
    _COMPILED[k] = obj
    _COMPILED.move_to_end(k)
    while len(_COMPILED) > _MAX_COMPILED:
        _COMPILED.popitem(last=False)


def is_compiled(req: TileSetRequest, target: Target) -> bool:
    return _target_key(req, target) in _COMPILED


def prebuild(requests: list[TileSetRequest], target: Target) -> list[tuple[TileSetRequest, Exception]]:
    """Compile the distinct sets of `requests` not compiled yet, on all cores (codegen/parallel.py), and keep them;
    returns the sets that failed, with their errors (their kernels fail again, and are reported, when built)."""
    from ..parallel import build_many

    todo = list({r.key: r for r in requests if not is_compiled(r, target)}.values())
    results = build_many([lambda r=r: (compile_tile_set(r, target)[0], None) for r in todo])
    failed = []
    for req, res in zip(todo, results):
        if isinstance(res, Exception):
            failed.append((req, res))
        else:
            remember(req, target, res[0])
    return failed
