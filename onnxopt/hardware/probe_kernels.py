"""The microbenchmark kernels of the machine model, written in LLVM IR and JIT-compiled: peak FMA, VNNI, read and
stream bandwidth (measure.py times them)."""

from __future__ import annotations

import ctypes
import functools
import re

from llvmlite import ir


def _is_x86(target) -> bool:
    return target.triple.startswith(("x86_64", "i386", "i686"))


def _vector_registers(target) -> int:
    if _is_x86(target):
        return 32 if target.has("avx512f") else 16
    return 32  # AArch64 NEON/SVE


def _fma_accumulators(target) -> int:
    # Enough independent chains to cover FMA latency x throughput (4 cycles x 2 units needs 8), leaving registers
    # for the two loop-invariant operands: 16 of 32 on AVX-512, 12 of 16 on AVX2.
    return 16 if _vector_registers(target) >= 32 else 12


def _has_hw_fma(target) -> bool:
    if _is_x86(target):
        return target.has("fma") or target.has("avx512f")
    return True  # AArch64 and the like: FMA is part of the base ISA


def _module(target, name: str) -> ir.Module:
    from onnxopt.codegen.compile import new_module

    return new_module(target, name)


def _counted_loop(builder: ir.IRBuilder, fn: ir.Function, count: ir.Value, name: str, body):
    """for (i = 0; i < count; ++i) body(builder, i); guarded for count <= 0. Leaves the builder after the loop."""
    i64 = ir.IntType(64)
    pre = builder.block
    head = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(i64, 0)), head, done)
    builder.position_at_end(head)
    i = builder.phi(i64, name=f"{name}.i")
    i.add_incoming(ir.Constant(i64, 0), pre)
    body(builder, i)
    nxt = builder.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, builder.block)
    builder.cbranch(builder.icmp_signed("<", nxt, count), head, done)
    builder.position_at_end(done)


def build_fma_kernel(target) -> tuple[str, dict]:
    """`void peak_fp32(i64 iters, float* in, float* out)`: per iteration, one FMA on each of `acc` vector chains
    (acc = acc * x + y, x and y loaded from `in`), then the chains are stored to `out` (acc * lanes floats)."""
    lanes = max(4, target.vector_bits // 32)
    nacc = _fma_accumulators(target)
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    ptr = ir.PointerType()
    m = _module(target, "peak_fp32")
    fma_fn = ir.Function(m, ir.FunctionType(vec, [vec, vec, vec]), name=f"llvm.fma.v{lanes}f32")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i64, ptr, ptr]), name="peak_fp32")
    iters, pin, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = b.load(b.gep(pin, [ir.Constant(i64, 0)], source_etype=vec), typ=vec)
    y = b.load(b.gep(pin, [ir.Constant(i64, 1)], source_etype=vec), typ=vec)
    accs = [b.alloca(vec, name=f"acc{k}") for k in range(nacc)]
    for k, a in enumerate(accs):
        # Distinct starting values so no two chains are the same computation.
        b.store(b.fadd(y, ir.Constant(vec, [float(k)] * lanes)), a)
    hw_fma = _has_hw_fma(target)

    def body(bb, _i):
        for a in accs:
            v = bb.load(a, typ=vec)
            r = bb.call(fma_fn, [v, x, y]) if hw_fma else bb.fadd(bb.fmul(v, x), y)
            bb.store(r, a)

    _counted_loop(b, fn, iters, "loop", body)
    for k, a in enumerate(accs):
        b.store(b.load(a, typ=vec), b.gep(pout, [ir.Constant(i64, k)], source_etype=vec))
    b.ret_void()
    # ops per loop iteration, all chains together
    return str(m), {"name": "peak_fp32", "lanes": lanes, "accumulators": nacc, "ops_per_iter": 2 * lanes * nacc,
                    "fma": hw_fma}


def build_int8_kernel(target, instruction, accumulators: int | None = None) -> tuple[str, dict]:
    """`void peak_int8(i64 iters, i8* in, i32* out)`: independent chains of `instruction` (codegen/instructions: one
    vpdpbusd zmm is 64 u8 x s8 multiply-adds, the AVX2 sequence 32 a ymm), as many accumulators as keep the
    sequence's temporaries in registers (`accumulators`: that many; one gives the instruction's latency). Each step
    multiplies by its own accumulator's bytes: AVX2's products do not read the accumulator, and with constant
    operands LLVM would compute them once for the whole loop."""
    acc_t, src_t = instruction.vector_types()
    nacc = accumulators or (16 if target.vector_bits == 512 else 10)
    i64 = ir.IntType(64)
    ptr = ir.PointerType()
    m = _module(target, "peak_int8")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i64, ptr, ptr]), name="peak_int8")
    iters, pin, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a_op = b.load(b.gep(pin, [ir.Constant(i64, 0)], source_etype=src_t), typ=src_t)
    accs = [b.alloca(acc_t, name=f"acc{k}") for k in range(nacc)]
    for k, a in enumerate(accs):
        b.store(ir.Constant(acc_t, [k] * acc_t.count), a)

    def body(bb, _i):
        for a in accs:
            acc = bb.load(a, typ=acc_t)
            bb.store(instruction.emit(bb, acc, a_op, bb.bitcast(acc, src_t)), a)

    _counted_loop(b, fn, iters, "loop", body)
    for k, a in enumerate(accs):
        b.store(b.load(a, typ=acc_t), b.gep(pout, [ir.Constant(i64, k)], source_etype=acc_t))
    b.ret_void()
    macs = instruction.lanes * instruction.depth
    return str(m), {"name": "peak_int8", "instruction": instruction.name, "lanes": src_t.count,
                    "accumulators": nacc, "ops_per_iter": 2 * macs * nacc}


def build_bf16_kernel(target) -> tuple[str, dict]:
    """`void peak_bf16(i64 iters, i32* in, float* out)`: independent chains of vdpbf16ps zmm (avx512_bf16: 16 lanes,
    each the sum of 2 bf16 products added to a float32, 64 FLOPs an instruction), as the bf16 GEMM kernels use it
    (microkernel/outer_product.py, "bf16_dot")."""
    from onnxopt.codegen.vmath.irutil import intrinsic

    f32, i32, i64, ptr = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.PointerType()
    acc_t, src_t = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
    nacc = 16
    m = _module(target, "peak_bf16")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i64, ptr, ptr]), name="peak_bf16")
    iters, pin, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = b.load(b.gep(pin, [ir.Constant(i64, 0)], source_etype=src_t), typ=src_t)
    y = b.load(b.gep(pin, [ir.Constant(i64, 1)], source_etype=src_t), typ=src_t)
    accs = [b.alloca(acc_t, name=f"acc{k}") for k in range(nacc)]
    for k, a in enumerate(accs):
        b.store(ir.Constant(acc_t, [float(k)] * 16), a)

    def body(bb, _i):
        for a in accs:
            bb.store(intrinsic(bb, "llvm.x86.avx512bf16.dpbf16ps.512", acc_t, [bb.load(a, typ=acc_t), x, y]), a)

    _counted_loop(b, fn, iters, "loop", body)
    for k, a in enumerate(accs):
        b.store(b.load(a, typ=acc_t), b.gep(pout, [ir.Constant(i64, k)], source_etype=acc_t))
    b.ret_void()
    return str(m), {"name": "peak_bf16", "instruction": "vdpbf16ps", "accumulators": nacc,
                    "ops_per_iter": nacc * 16 * 2 * 2}


def build_amx_kernel(target, instruction) -> tuple[str, dict]:
    """`void peak_amx(i64 iters, i8* in, i32* out)`: a 2 x 2 block of C tiles, each += A_i x B_j with
    `instruction` (codegen/instructions/amx.py) per iteration, A and B loaded once: the tile unit's own rate, 4
    independent chains to cover its latency. Written as a tile program (tile_program.py), as the kernels are."""
    from onnxopt.codegen.instructions.tile_program import Dot, Load, Repeat, Store, TileProgram, Zero, affine

    m, n, k = instruction.shape
    c_shape, a_shape, b_shape = instruction.shapes_for(m, n, k)
    steps = [Zero(f"c{i}{j}") for i in range(2) for j in range(2)]
    steps += [Load(t, "in", affine(const=0), affine(const=64)) for t in ("a0", "a1", "b0", "b1")]
    steps.append(Repeat("i", affine("iters"), tuple(Dot(instruction, f"c{i}{j}", f"a{i}", f"b{j}")
                                                    for i in range(2) for j in range(2))))
    steps += [Store(f"c{i}{j}", "out", affine(const=(2 * i + j) * 1024), affine(const=64))
              for i in range(2) for j in range(2)]
    shapes = ([(f"c{i}{j}", c_shape) for i in range(2) for j in range(2)] + [("a0", a_shape), ("a1", a_shape)]
              + [("b0", b_shape), ("b1", b_shape)])
    program = TileProgram("peak_amx", tuple(shapes), tuple(steps), (instruction,))
    i64, ptr = ir.IntType(64), ir.PointerType()
    mod = _module(target, "peak_amx")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, ptr, ptr]), name="peak_amx")
    iters, pin, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    program.emit(b, {"in": pin, "out": pout}, {"iters": iters})
    b.ret_void()
    return str(mod), {"name": "peak_amx", "instruction": instruction.name, "tiles": 8,
                      "ops_per_iter": 4 * 2 * m * n * k}


def build_read_kernel(target, accumulators: int = 8) -> tuple[str, dict]:
    """`void bw_read(float* buf, i64 blocks, i64 reps, float* out)`: `reps` sweeps over `blocks` blocks of
    `accumulators` vectors each, summed into `accumulators` vector chains (reads only); the sum goes to `out`."""
    lanes = max(4, target.vector_bits // 32)
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    ptr = ir.PointerType()
    m = _module(target, "bw_read")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ptr, i64, i64, ptr]), name="bw_read")
    buf, blocks, reps, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    accs = [b.alloca(vec, name=f"acc{k}") for k in range(accumulators)]
    for a in accs:
        b.store(ir.Constant(vec, [0.0] * lanes), a)

    def sweep(bb, i):
        base = bb.mul(i, ir.Constant(i64, accumulators))
        for k, a in enumerate(accs):
            p = bb.gep(buf, [bb.add(base, ir.Constant(i64, k))], source_etype=vec)
            bb.store(bb.fadd(bb.load(a, typ=vec), bb.load(p, typ=vec, align=4)), a)

    def rep(bb, _r):
        _counted_loop(bb, fn, blocks, "sweep", sweep)

    _counted_loop(b, fn, reps, "rep", rep)
    total = b.load(accs[0], typ=vec)
    for a in accs[1:]:
        total = b.fadd(total, b.load(a, typ=vec))
    b.store(total, pout)
    b.ret_void()
    return str(m), {"name": "bw_read", "lanes": lanes, "accumulators": accumulators,
                    "block_bytes": 4 * lanes * accumulators}


def build_scale_kernel(target) -> tuple[str, dict]:
    """`void bw_scale(float* src, float* dst, i64 blocks, i64 reps, float a)`: dst = a * src, `reps` sweeps over
    `blocks` blocks of 8 vectors. The runtime factor keeps LLVM from turning the loop into memcpy."""
    lanes = max(4, target.vector_bits // 32)
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, lanes)
    ptr = ir.PointerType()
    per_block = 8
    m = _module(target, "bw_scale")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64, i64, f32]), name="bw_scale")
    src, dst, blocks, reps, a = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    av = b.insert_element(ir.Constant(vec, ir.Undefined), a, ir.Constant(ir.IntType(32), 0))
    av = b.shuffle_vector(av, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes),
                                                                            [0] * lanes))

    def sweep(bb, i):
        base = bb.mul(i, ir.Constant(i64, per_block))
        for k in range(per_block):
            idx = bb.add(base, ir.Constant(i64, k))
            v = bb.load(bb.gep(src, [idx], source_etype=vec), typ=vec, align=4)
            bb.store(bb.fmul(v, av), bb.gep(dst, [idx], source_etype=vec), align=4)

    def rep(bb, _r):
        _counted_loop(bb, fn, blocks, "sweep", sweep)

    _counted_loop(b, fn, reps, "rep", rep)
    b.ret_void()
    return str(m), {"name": "bw_scale", "lanes": lanes, "block_bytes": 4 * lanes * per_block}


def kernel_assembly(ir_text: str, target=None) -> str:
    """The optimized assembly of a generated kernel (for checks: the FMAs are there, nothing spills)."""
    from onnxopt.codegen.compile import compile_assembly
    from onnxopt.codegen.target import host_target

    return compile_assembly(ir_text, target or host_target())


def _asm_stats(asm: str, opcode: str) -> dict:
    return {"opcode": opcode, "count": len(re.findall(rf"\b{opcode}\w*\b", asm)),
            "spills": asm.count("Spill") + asm.count("Reload")}


class _JitKernel:
    """A JIT-compiled kernel; keeps its execution engine alive as long as the ctypes function is used."""

    def __init__(self, ir_text: str, name: str, argtypes: list, target):
        from onnxopt.codegen.compile import optimize
        from onnxopt.codegen.target import _llvm

        llvm = _llvm()
        mod = optimize(ir_text, target)
        tm = llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.llvm_features, opt=3, codemodel="jitdefault")
        self.asm = tm.emit_assembly(mod)
        self.engine = llvm.create_mcjit_compiler(mod, tm)
        self.engine.finalize_object()
        addr = self.engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"JIT: no address for {name}")
        self.fn = ctypes.CFUNCTYPE(None, *argtypes)(addr)  # CFUNCTYPE: the call releases the GIL

    def __call__(self, *args):
        return self.fn(*args)


_P = ctypes.c_void_p
_I64 = ctypes.c_int64


@functools.lru_cache(maxsize=None)
def _fma_kernel(target) -> tuple[_JitKernel, dict]:
    text, info = build_fma_kernel(target)
    k = _JitKernel(text, "peak_fp32", [_I64, _P, _P], target)
    info["asm"] = _asm_stats(k.asm, "vfmadd" if _is_x86(target) and info["fma"] else "fmla")
    return k, info


@functools.lru_cache(maxsize=None)
def _int8_kernel(target, accumulators: int | None = None) -> tuple[_JitKernel, dict]:
    """The int8 peak kernel on the best u8 x s8 instruction the target has (RuntimeError when none); with
    `accumulators`, that many independent chains (one: the instruction's latency)."""
    from onnxopt.codegen.instructions import available

    found = available(target, ("u8", "s8"))
    if not found:
        raise RuntimeError(f"target {target.name} has no u8 x s8 dot-product instruction")
    text, info = build_int8_kernel(target, found[0], accumulators)
    k = _JitKernel(text, "peak_int8", [_I64, _P, _P], target)
    info["asm"] = _asm_stats(k.asm, "vpdpbusd" if found[0].name.endswith("vnni") else "vpmaddubsw")
    return k, info


@functools.lru_cache(maxsize=None)
def _bf16_kernel(target) -> tuple[_JitKernel, dict]:
    text, info = build_bf16_kernel(target)
    k = _JitKernel(text, "peak_bf16", [_I64, _P, _P], target)
    info["asm"] = _asm_stats(k.asm, "vdpbf16ps")
    return k, info


@functools.lru_cache(maxsize=None)
def _amx_kernel(target, instruction) -> tuple[_JitKernel, dict]:
    text, info = build_amx_kernel(target, instruction)
    k = _JitKernel(text, "peak_amx", [_I64, _P, _P], target)
    info["asm"] = _asm_stats(k.asm, instruction.name)
    return k, info


def request_amx() -> tuple[bool, str]:
    """Ask Linux for the tile state in this process (what the kernel libraries do when registered:
    codegen/glue/matrix_engine.c), so that the probes may run AMX: (granted, why not)."""
    import errno
    import os
    import platform

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, "AMX is asked of Linux on x86-64 only"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(158), ctypes.c_long(0x1023), ctypes.c_long(18)) == 0:  # ARCH_REQ_XCOMP_PERM
        return True, ""
    err = ctypes.get_errno()
    return False, f"Linux refused the tile state ({errno.errorcode.get(err, err)}: {os.strerror(err)})"


@functools.lru_cache(maxsize=None)
def _read_kernel(target) -> tuple[_JitKernel, dict]:
    text, info = build_read_kernel(target)
    k = _JitKernel(text, "bw_read", [_P, _I64, _I64, _P], target)
    info["asm"] = _asm_stats(k.asm, "vadd" if _is_x86(target) else "fadd")
    return k, info


def _scale_kernel(target) -> tuple[_JitKernel, dict]:
    text, info = build_scale_kernel(target)
    k = _JitKernel(text, "bw_scale", [_P, _P, _I64, _I64, ctypes.c_float], target)
    return k, info


# --------------------------------------------------------------------------------------------------------------
# Running kernels on 1 and on all cores
