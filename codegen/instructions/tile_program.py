"""Tile programs: what a kernel does with a matrix engine's tile registers, as data, run two ways.

A `TileProgram` is one tile configuration (the shape of each tile it names: LLVM writes the one `ldtilecfg` from
them) and a list of steps: `Zero`, `Load` and `Store` (rows of a tile from or to memory at a byte offset, `stride`
bytes apart), `Dot` (a MatrixInstruction on three tiles) and `Repeat` (its body `count` times, with a loop
variable). Offsets, strides and counts are `Affine`: sums of integer coefficients times products of named scalars
(the kernel's record slots and loop variables).

- `run` is the reference interpreter: the program on numpy buffers, each instruction through its description's
  `execute`, every load and store bounds-checked. It runs on any host, so the AMX kernels' packing and programs are
  tested where the CPU has no AMX.
- `emit` writes the same program as LLVM IR: `x86_amx` values and the instructions' shape-carrying intrinsics,
  `Repeat` as a loop carrying the tiles it updates. LLVM then allocates the tile registers and loads the
  configuration (`ldtilecfg`) at every call. With `fixed_registers` each tile is the register of its position in
  the configuration instead and the program loads none: the caller has loaded it (`configuration`), once for many
  calls.

The kernels (onnxopt/kinds/*/amx.py) build their program once and hand it to both, so what the tests interpret is
what the compiler gets. `emit(..., emulate=True)` writes the same steps as plain code instead (tiles in stack
buffers, the products as loops): a library built so (ONNXOPT_EMULATE_TILES=1, `emulating()`) runs its AMX
kernels, dispatch, rest of K and epilogues included, on any CPU; the tests build one to run those paths where the
CPU has no AMX. It is for tests: the emulated tiles are slow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from .matrix import MatrixInstruction, TileShape

MAX_TILES = 8  # tmm0-7
EMULATE_ENV = "ONNXOPT_EMULATE_TILES"


def emulating() -> bool:
    """Whether kernels are being built with emulated tiles (tests: ONNXOPT_EMULATE_TILES=1)."""
    return os.environ.get(EMULATE_ENV) == "1"


@dataclass(frozen=True)
class Affine:
    """sum of coef * product(names) over `terms`, plus `const`."""

    terms: tuple[tuple[int, tuple[str, ...]], ...] = ()
    const: int = 0

    def value(self, env: dict[str, int]) -> int:
        total = self.const
        for coef, names in self.terms:
            term = coef
            for n in names:
                term *= env[n]
            total += term
        return total

    @property
    def names(self) -> set[str]:
        return {n for _, names in self.terms for n in names}


def affine(*terms, const: int = 0) -> Affine:
    """affine((16, "r", "a_rs"), (64, "c"), const=8): 16*r*a_rs + 64*c + 8; a bare name is coefficient 1."""
    out = []
    for t in terms:
        if isinstance(t, str):
            out.append((1, (t,)))
        else:
            out.append((t[0], tuple(t[1:])))
    return Affine(tuple(out), const)


@dataclass(frozen=True)
class Zero:
    tile: str


@dataclass(frozen=True)
class Load:
    tile: str
    pointer: str
    offset: Affine
    stride: Affine


@dataclass(frozen=True)
class Store:
    tile: str
    pointer: str
    offset: Affine
    stride: Affine


@dataclass(frozen=True)
class Dot:
    instruction: MatrixInstruction
    c: str
    a: str
    b: str


@dataclass(frozen=True)
class Repeat:
    var: str
    count: Affine
    body: tuple


@dataclass(frozen=True)
class TileProgram:
    name: str
    shapes: tuple[tuple[str, TileShape], ...]  # the one configuration: each tile's shape
    steps: tuple
    instructions: tuple[MatrixInstruction, ...] = field(default=(), compare=False)

    def __post_init__(self):
        shape = dict(self.shapes)
        if len(shape) > MAX_TILES:
            raise ValueError(f"{self.name}: {len(shape)} tiles, the engine has {MAX_TILES}")
        for s in shape.values():
            s.check()
        for step in _walk(self.steps):
            used = [step.c, step.a, step.b] if isinstance(step, Dot) else [step.tile] if hasattr(step, "tile") else []
            for t in used:
                if t not in shape:
                    raise ValueError(f"{self.name}: tile {t} is used but not configured")
            if isinstance(step, Dot):
                step.instruction.check_shapes(shape[step.c], shape[step.a], shape[step.b])

    @property
    def shape(self) -> dict[str, TileShape]:
        return dict(self.shapes)

    def dots(self) -> list[Dot]:
        return [s for s in _walk(self.steps) if isinstance(s, Dot)]

    # ---------------------------------------------------------------- the reference interpreter
    def run(self, memory: dict[str, np.ndarray], scalars: dict[str, int]) -> None:
        """The program on `memory` (name -> a flat uint8 buffer, written in place), `scalars` the named values.
        A load or store outside its buffer raises IndexError: the program must not read past what it is given."""
        tiles = {name: np.zeros((s.rows, s.colsb), np.uint8) for name, s in self.shapes}
        self._run(self.steps, memory, dict(scalars), tiles)

    def _run(self, steps, memory, env, tiles) -> None:
        shape = self.shape
        for step in steps:
            if isinstance(step, Zero):
                tiles[step.tile][:] = 0
            elif isinstance(step, (Load, Store)):
                s = shape[step.tile]
                buf = memory[step.pointer]
                offset, stride = step.offset.value(env), step.stride.value(env)
                for r in range(s.rows):
                    at = offset + r * stride
                    if at < 0 or at + s.colsb > buf.size:
                        raise IndexError(f"{self.name}: {type(step).__name__.lower()} of tile {step.tile} row {r} "
                                         f"at byte {at} of {step.pointer} ({buf.size} bytes)")
                    if isinstance(step, Load):
                        tiles[step.tile][r] = buf[at:at + s.colsb]
                    else:
                        buf[at:at + s.colsb] = tiles[step.tile][r]
            elif isinstance(step, Dot):
                tiles[step.c][:] = step.instruction.execute(tiles[step.c], tiles[step.a], tiles[step.b])
            elif isinstance(step, Repeat):
                for i in range(step.count.value(env)):
                    env[step.var] = i
                    self._run(step.body, memory, env, tiles)
                env.pop(step.var, None)
            else:
                raise TypeError(f"not a tile step: {step!r}")

    # ---------------------------------------------------------------- LLVM IR
    def configuration(self) -> bytes:
        """The 64-byte `ldtilecfg` operand of `emit(fixed_registers=True)`: palette 1, tile i the i-th shape."""
        cfg = bytearray(64)
        cfg[0] = 1
        for i, (_, s) in enumerate(self.shapes):
            cfg[16 + 2 * i:18 + 2 * i] = s.colsb.to_bytes(2, "little")
            cfg[48 + i] = s.rows
        return bytes(cfg)

    def emit(self, b: ir.IRBuilder, pointers: dict[str, ir.Value], scalars: dict[str, ir.Value],
             emulate: bool = False, fixed_registers: bool = False) -> None:
        """The program at the builder's position; `pointers` and `scalars` (i64) name the values it reads.
        `emulate`: as plain code (`_emit_emulated`), for any CPU. `fixed_registers`: tile i of the configuration
        in tmm<i>, with no `ldtilecfg` of its own (the caller loads `configuration()`)."""
        from onnxopt.codegen.vmath.irutil import for_range

        if emulate:
            return self._emit_emulated(b, pointers, scalars)
        if fixed_registers:
            return self._emit_fixed(b, pointers, scalars)

        shape = self.shape
        i16, i64 = ir.IntType(16), ir.IntType(64)
        env = dict(scalars)

        def dims(t):
            return [ir.Constant(i16, shape[t].rows), ir.Constant(i16, shape[t].colsb)]

        def value(a: Affine) -> ir.Value:
            return _affine_ir(b, a, env)

        def address(step):
            return b.gep(pointers[step.pointer], [value(step.offset)], source_etype=ir.IntType(8))

        def run(steps, tiles: dict) -> dict:
            for step in steps:
                if isinstance(step, Zero):
                    tiles[step.tile] = _call(b, "llvm.x86.tilezero.internal", AMX_TILE, dims(step.tile))
                elif isinstance(step, Load):
                    tiles[step.tile] = _call(b, "llvm.x86.tileloadd64.internal", AMX_TILE,
                                             dims(step.tile) + [address(step), value(step.stride)])
                elif isinstance(step, Store):
                    _call(b, "llvm.x86.tilestored64.internal", ir.VoidType(),
                          dims(step.tile) + [address(step), value(step.stride), tiles[step.tile]])
                elif isinstance(step, Dot):
                    c, a = shape[step.c], shape[step.a]
                    sizes = [ir.Constant(i16, v) for v in (c.rows, c.colsb, a.colsb)]
                    tiles[step.c] = _call(b, step.instruction.intrinsic, AMX_TILE,
                                          sizes + [tiles[step.c], tiles[step.a], tiles[step.b]])
                elif isinstance(step, Repeat):
                    carried = sorted(t for t in _written(step.body) if t in tiles)

                    def body(i, values, step=step, carried=carried):
                        env[step.var] = i
                        inner = dict(tiles)
                        inner.update(zip(carried, values))
                        out = run(step.body, inner)
                        return [out[t] for t in carried]

                    done = for_range(b, ir.Constant(i64, 0), value(step.count), ir.Constant(i64, 1), body,
                                     [tiles[t] for t in carried])
                    tiles.update(zip(carried, done))
            return tiles

        run(self.steps, {})


    def _emit_fixed(self, b: ir.IRBuilder, pointers: dict, scalars: dict) -> None:
        """The program on named registers: the intrinsics that take a tile's number (clang's _tile_* builtins)."""
        from onnxopt.codegen.vmath.irutil import for_range

        i8, i64 = ir.IntType(8), ir.IntType(64)
        reg = {name: ir.Constant(i8, i) for i, (name, _) in enumerate(self.shapes)}
        env = dict(scalars)
        void = ir.VoidType()

        def call(name, args):
            return _call(b, name, void, args)

        def value(a: Affine) -> ir.Value:
            return _affine_ir(b, a, env)

        def run(steps) -> None:
            for step in steps:
                if isinstance(step, Zero):
                    call("llvm.x86.tilezero", [reg[step.tile]])
                elif isinstance(step, (Load, Store)):
                    at = b.gep(pointers[step.pointer], [value(step.offset)], source_etype=ir.IntType(8))
                    name = "llvm.x86.tileloadd64" if isinstance(step, Load) else "llvm.x86.tilestored64"
                    call(name, [reg[step.tile], at, value(step.stride)])
                elif isinstance(step, Dot):
                    call(step.instruction.intrinsic.replace(".internal", ""), [reg[step.c], reg[step.a], reg[step.b]])
                elif isinstance(step, Repeat):
                    def body(i, _, step=step):
                        env[step.var] = i
                        run(step.body)
                        return []

                    for_range(b, ir.Constant(i64, 0), value(step.count), ir.Constant(i64, 1), body)

        run(self.steps)

    def _emit_emulated(self, b: ir.IRBuilder, pointers: dict, scalars: dict) -> None:
        """Each tile a stack buffer of rows x 64 bytes; loads and stores row copies; a Dot the loops of its
        accumulation rule (`dot`)."""
        from onnxopt.codegen.vmath.irutil import for_range

        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        shape = self.shape
        env = dict(scalars)
        tiles = {name: b.alloca(i8, size=ir.Constant(i64, s.rows * 64), name=f"tile.{name}") for name, s in self.shapes}

        def c(v):
            return ir.Constant(i64, v)

        def value(a: Affine) -> ir.Value:
            return _affine_ir(b, a, env)

        def byte_at(base, offset):
            return b.gep(b.bitcast(base, i8.as_pointer()), [offset], source_etype=i8)

        def copy_rows(step, to_tile: bool) -> None:
            s = shape[step.tile]
            start, stride = value(step.offset), value(step.stride)

            def row(r, _):
                mem = byte_at(pointers[step.pointer], b.add(start, b.mul(r, stride)))
                reg = byte_at(tiles[step.tile], b.mul(r, c(64)))
                src, dst = (mem, reg) if to_tile else (reg, mem)

                def copy(k, _):
                    b.store(b.load(byte_at(src, k), typ=i8), byte_at(dst, k))
                    return []

                for_range(b, c(0), c(s.colsb), c(1), copy)
                return []

            for_range(b, c(0), c(s.rows), c(1), row)

        def flush(bits):
            """float32 bits with a zero exponent (a denormal) to the signed zero: the tile units' rule."""
            sign = b.and_(bits, ir.Constant(i32, 0x80000000 - (1 << 32)))
            tiny = b.icmp_unsigned("==", b.and_(bits, ir.Constant(i32, 0x7F800000)), ir.Constant(i32, 0))
            return b.select(tiny, sign, bits)

        def widen(tile, at, dtype):
            """The bf16 or fp16 element at byte `at` of `tile` as float32 (bf16 denormals read as zero)."""
            ptr = b.bitcast(byte_at(tile, at), ir.IntType(16).as_pointer())
            if dtype == "f16":
                return b.fpext(b.load(b.bitcast(ptr, ir.HalfType().as_pointer()), typ=ir.HalfType()), f32)
            bits = b.shl(b.zext(b.load(ptr, typ=ir.IntType(16)), i32), ir.Constant(i32, 16))
            return b.bitcast(flush(bits), f32)

        def dot(step) -> None:
            """C[m, n] over each lane group g of A's row m and B's row g: `pack` products a lane. Integers: 32-bit
            wrapping sums of sign- or zero-extended bytes. bf16/fp16: each product (exact in float32) added to the
            float32 sum in turn, each sum rounded and its denormal flushed (matrix.py `execute`)."""
            ins = step.instruction
            cs, as_ = shape[step.c], shape[step.a]
            size, (ta, tb) = ins.element_bytes, ins.source_dtypes
            if ins.accumulator_dtype == "f32":
                acc_ty = f32

                def read(tile, at, dtype):
                    return widen(tile, at, dtype)

                def add(total, x, w):
                    return b.bitcast(flush(b.bitcast(b.fadd(total, b.fmul(x, w)), i32)), f32)
            else:
                acc_ty = i32

                def read(tile, at, dtype):
                    return (b.sext if dtype == "s8" else b.zext)(b.load(byte_at(tile, at), typ=i8), i32)

                def add(total, x, w):
                    return b.add(total, b.mul(x, w))

            def element(m, n):
                at = b.bitcast(b.gep(tiles[step.c], [b.add(b.mul(m, c(64)), b.mul(n, c(4)))], source_etype=i8),
                               acc_ty.as_pointer())

                def group(g, acc):
                    total = acc[0]
                    for j in range(ins.pack):
                        x = read(tiles[step.a], b.add(b.mul(m, c(64)), b.add(b.mul(g, c(4)), c(size * j))), ta)
                        w = read(tiles[step.b], b.add(b.mul(g, c(64)), b.add(b.mul(n, c(4)), c(size * j))), tb)
                        total = add(total, x, w)
                    return [total]

                (total,) = for_range(b, c(0), c(as_.colsb // 4), c(1), group, [b.load(at, typ=acc_ty)])
                b.store(total, at)
                return []

            def row(m, _):
                for_range(b, c(0), c(cs.colsb // 4), c(1), lambda n, _: element(m, n))
                return []

            for_range(b, c(0), c(cs.rows), c(1), row)

        def run(steps) -> None:
            for step in steps:
                if isinstance(step, Zero):
                    def zero(k, _, tile=tiles[step.tile]):
                        b.store(ir.Constant(i8, 0), byte_at(tile, k))
                        return []

                    for_range(b, c(0), c(shape[step.tile].rows * 64), c(1), zero)
                elif isinstance(step, Load):
                    copy_rows(step, True)
                elif isinstance(step, Store):
                    copy_rows(step, False)
                elif isinstance(step, Dot):
                    dot(step)
                elif isinstance(step, Repeat):
                    def body(i, _, step=step):
                        env[step.var] = i
                        run(step.body)
                        return []

                    for_range(b, c(0), value(step.count), c(1), body)

        run(self.steps)


def _affine_ir(b: ir.IRBuilder, a: Affine, env: dict) -> ir.Value:
    """`a` as an i64 value, its names read from `env` (the scalars and loop variables)."""
    i64 = ir.IntType(64)
    total = ir.Constant(i64, a.const)
    for coef, names in a.terms:
        term = ir.Constant(i64, coef)
        for n in names:
            term = b.mul(term, env[n])
        total = b.add(total, term)
    return total


def _walk(steps):
    for s in steps:
        yield s
        if isinstance(s, Repeat):
            yield from _walk(s.body)


def _written(steps) -> set[str]:
    out = set()
    for s in _walk(steps):
        if isinstance(s, (Zero, Load)):
            out.add(s.tile)
        elif isinstance(s, Dot):
            out.add(s.c)
    return out


class AmxTileType(ir.Type):
    """LLVM's x86_amx: a tile register's value (llvmlite has no class for it)."""

    def _to_string(self):
        return "x86_amx"

    def __eq__(self, other):
        return isinstance(other, AmxTileType)

    def __hash__(self):
        return hash("x86_amx")


AMX_TILE = AmxTileType()


def _call(b: ir.IRBuilder, name: str, ret: ir.Type, args: list) -> ir.Value:
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]), name=name)
    return b.call(fn, args)
