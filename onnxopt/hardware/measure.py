"""The measured machine model: microbenchmarks with generated kernels, cached on disk.

`measure_machine()` runs, on this CPU:

* a peak-compute kernel: a loop of independent FMA chains on registers only (16 accumulators of <16 x float> on
  AVX-512, 12 of <8 x float> on AVX2), on one core and on all cores at once; one FMA is 2 FLOPs per lane. With
  AVX-512 VNNI also an int8 kernel of `vpdpbusd` chains (one 512-bit vpdpbusd = 64 multiply-adds = 128 ops);
* a read-bandwidth kernel: a sum reduction with several vector accumulators over a buffer sized for each memory
  level (half of L1d, half of L2, half of L3, then well past L3 for DRAM), on one core and on all cores (each
  thread its own buffer);
* cache sizes from /sys/devices/system/cpu/*/cache, the ISA from /proc/cpuinfo.

The kernels are LLVM IR built with llvmlite, optimized by `onnxopt.codegen.compile` for the host target and JIT
compiled with MCJIT. They are called through ctypes, which releases the GIL, so Python threads calling them run in
parallel on all cores.

`load_machine()` measures once per machine and keeps the result as JSON in `$ONNXOPT_CACHE_DIR` (default
`~/.cache/onnxopt/`), keyed by the CPU model, its flags, the core count and the onnxopt version.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llvmlite import ir

from onnxopt.hardware.machine_model import Machine, MemoryLevel

# /proc/cpuinfo flags that matter to the kernels we emit (x86 and Arm spellings).
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx_vnni_int8",
    "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
    "asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2", "sme",
)

_MEASURE_COUNT = 0  # how many times measure_machine ran in this process (the cache tests read it)


# --------------------------------------------------------------------------------------------------------------
# What the OS says about the CPU


def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty off Linux)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                if ":" in line:
                    k, v = line.split(":", 1)
                    out.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return out


def cpu_name() -> str:
    info = _cpuinfo()
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if info.get(key):
            return info[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str]:
    info = _cpuinfo()
    flags = info.get("flags") or info.get("Features") or ""
    from onnxopt.codegen.target import cap_cpu_flags, host_cpu_flags

    if flags:
        return cap_cpu_flags(set(flags.split()))

    return host_cpu_flags()


def isa_flags() -> list[str]:
    have = cpu_flags()
    return [f for f in _ISA_FLAGS if f in have]


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_mhz() -> dict[str, float]:
    """Clock rates we can read: 'nominal' (/proc/cpuinfo 'cpu MHz') and 'max' (cpufreq's cpuinfo_max_freq)."""
    out: dict[str, float] = {}
    mhz = _cpuinfo().get("cpu MHz")
    if mhz:
        try:
            out["nominal"] = float(mhz)
        except ValueError:
            pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            out["max"] = int(f.read().strip()) / 1000.0  # kHz -> MHz
    except (OSError, ValueError):
        pass
    return out


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def _parse_cpu_list(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.update(range(int(a), int(b) + 1))
        else:
            cpus.add(int(part))
    return frozenset(cpus)


@dataclass(frozen=True)
class CacheLevel:
    level: int
    instance_bytes: int  # size of one instance (what one core can use)
    instances: int  # instances that serve the usable CPUs
    cpus_per_instance: int  # usable CPUs sharing one instance

    @property
    def total_bytes(self) -> int:
        return self.instance_bytes * self.instances


def cache_levels(cpus: list[int] | None = None) -> list[CacheLevel]:
    """Data/unified caches from sysfs, from the closest level; falls back to sysconf, then to common defaults."""
    cpus = cpus or usable_cpus()
    found: dict[int, dict[frozenset[int], int]] = {}
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
        try:
            entries = sorted(base.glob("index*"))
        except OSError:
            entries = []
        for d in entries:
            try:
                kind = (d / "type").read_text().strip()
                if kind == "Instruction":
                    continue
                level = int((d / "level").read_text())
                size = _parse_size((d / "size").read_text())
                shared = _parse_cpu_list((d / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                continue
            found.setdefault(level, {})[shared or frozenset([cpu])] = size
    usable = set(cpus)
    out = []
    for level in sorted(found):
        inst = found[level]
        size = max(inst.values())
        sharing = max(1, max(len(s & usable) for s in inst))
        out.append(CacheLevel(level, size, len(inst), sharing))
    if out:
        return out
    return _fallback_cache_levels(len(cpus))


def _fallback_cache_levels(ncpu: int) -> list[CacheLevel]:
    """lscpu's usual answer where sysfs is missing: glibc's sysconf, else 32 KiB L1d, 1 MiB L2 per core and
    2 MiB of shared L3 per core."""
    names = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE", 3: "SC_LEVEL3_CACHE_SIZE"}
    defaults = {1: 32 << 10, 2: 1 << 20, 3: (2 << 20) * ncpu}
    out = []
    for level, name in names.items():
        size = 0
        try:
            size = int(os.sysconf(name)) if name in os.sysconf_names else 0
        except (OSError, ValueError):
            size = 0
        size = size if size > 0 else defaults[level]
        shared = level == 3
        out.append(CacheLevel(level, size, 1 if shared else ncpu, ncpu if shared else 1))
    return out


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --------------------------------------------------------------------------------------------------------------
# Generated kernels


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


def build_vnni_kernel(target, operand_type: str = "i32") -> tuple[str, dict]:
    """`void peak_int8(i64 iters, i32* in, i32* out)`: chains of `vpdpbusd zmm` (64 u8 x s8 multiply-adds each)."""
    nacc = 16
    i32, i64, i8 = ir.IntType(32), ir.IntType(64), ir.IntType(8)
    acc_t = ir.VectorType(i32, 16)
    op_t = acc_t if operand_type == "i32" else ir.VectorType(i8, 64)
    ptr = ir.PointerType()
    m = _module(target, "peak_int8")
    dp = ir.Function(m, ir.FunctionType(acc_t, [acc_t, op_t, op_t]), name="llvm.x86.avx512.vpdpbusd.512")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i64, ptr, ptr]), name="peak_int8")
    iters, pin, pout = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    a_op = b.load(b.gep(pin, [ir.Constant(i64, 0)], source_etype=op_t), typ=op_t)
    b_op = b.load(b.gep(pin, [ir.Constant(i64, 1)], source_etype=op_t), typ=op_t)
    accs = [b.alloca(acc_t, name=f"acc{k}") for k in range(nacc)]
    for k, a in enumerate(accs):
        b.store(ir.Constant(acc_t, [k] * 16), a)

    def body(bb, _i):
        for a in accs:
            bb.store(bb.call(dp, [bb.load(a, typ=acc_t), a_op, b_op]), a)

    _counted_loop(b, fn, iters, "loop", body)
    for k, a in enumerate(accs):
        b.store(b.load(a, typ=acc_t), b.gep(pout, [ir.Constant(i64, k)], source_etype=acc_t))
    b.ret_void()
    return str(m), {"name": "peak_int8", "lanes": 64, "accumulators": nacc, "ops_per_iter": 128 * nacc}


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
def _vnni_kernel(target) -> tuple[_JitKernel, dict]:
    err = None
    for operand in ("i32", "i8"):  # LLVM changed the operand type of the VNNI intrinsics; accept either
        try:
            text, info = build_vnni_kernel(target, operand)
            k = _JitKernel(text, "peak_int8", [_I64, _P, _P], target)
        except Exception as e:  # noqa: BLE001 - try the other spelling
            err = e
            continue
        info["asm"] = _asm_stats(k.asm, "vpdpbusd")
        if info["asm"]["count"]:
            return k, info
    raise RuntimeError(f"could not build a vpdpbusd kernel: {err}")


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


def _aligned(nbytes: int, dtype=np.float32, fill: float = 1.0, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    a = raw[off:off + nbytes].view(dtype)
    a.fill(fill)  # touch every page where it will be used
    return a


def _run_threads(cpus: list[int], setup, call, repeats: int) -> list[float]:
    """Run `call(state)` on len(cpus) threads at once, each pinned to its CPU with its own `setup(index)` state,
    `repeats` times; returns the wall time of each round (first start to last end)."""
    n = len(cpus)
    barrier = threading.Barrier(n)
    starts = [[0.0] * n for _ in range(repeats)]
    ends = [[0.0] * n for _ in range(repeats)]
    errors: list[BaseException] = []

    def worker(idx: int):
        try:
            try:
                os.sched_setaffinity(0, {cpus[idx]})  # the calling thread only
            except (AttributeError, OSError):
                pass
            state = setup(idx)
            for r in range(repeats):
                barrier.wait()
                starts[r][idx] = time.perf_counter()
                call(state)
                ends[r][idx] = time.perf_counter()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [max(ends[r]) - min(starts[r]) for r in range(repeats)]


def _calibrate(run_once, work0: int, target_s: float) -> int:
    """Grow the amount of work until one call takes about target_s."""
    work = work0
    for _ in range(20):
        t0 = time.perf_counter()
        run_once(work)
        dt = time.perf_counter() - t0
        if dt >= target_s * 0.5:
            break
        work = work * 2 if dt < 1e-4 else max(work + 1, int(work * target_s / dt * 1.05))
    else:
        return work
    return max(1, int(work * target_s / max(dt, 1e-9)))


def _peak(kernel: _JitKernel, info: dict, cpus: list[int], in_bytes: bytes, target_s: float,
          repeats: int) -> tuple[float, float]:
    """(1-core, all-core) op/s of a register-only kernel."""
    out_bytes = info["accumulators"] * 64

    def setup(_i):
        pin = _aligned(len(in_bytes), np.uint8, 0)
        pin[:] = np.frombuffer(in_bytes, dtype=np.uint8)
        return pin, _aligned(out_bytes, np.uint8, 0)

    pin, pout = setup(0)
    iters = _calibrate(lambda n: kernel(n, pin.ctypes.data, pout.ctypes.data), 1000, target_s)

    def call(state):
        kernel(iters, state[0].ctypes.data, state[1].ctypes.data)

    ops = float(iters) * info["ops_per_iter"]
    one = ops / min(_run_threads(cpus[:1], setup, call, repeats))
    if len(cpus) == 1:
        return one, one
    allc = ops * len(cpus) / min(_run_threads(cpus, setup, call, repeats))
    if allc < 0.9 * one * len(cpus):
        # Not linear: SMT siblings, or other work on some core. Try once more after a pause and keep the better.
        time.sleep(0.05)
        allc = max(allc, ops * len(cpus) / min(_run_threads(cpus, setup, call, repeats)))
    return one, allc


def _fp32_operands(lanes: int) -> bytes:
    # acc = acc * x + y converges to y / (1 - x) ~ 1: no overflow, no denormals.
    return np.array([0.9999999] * lanes + [1e-7] * lanes, dtype=np.float32).tobytes()


def _read_bandwidth(kernel: _JitKernel, info: dict, cpus: list[int], bytes_per_thread: int, target_s: float,
                    repeats: int) -> float:
    block = info["block_bytes"]
    blocks = max(1, bytes_per_thread // block)
    nbytes = blocks * block

    def setup(_i):
        return _aligned(nbytes), _aligned(64)

    if target_s > 0:
        buf, out = setup(0)
        reps = _calibrate(lambda r: kernel(buf.ctypes.data, blocks, r, out.ctypes.data), 1, target_s)
        del buf, out
    else:
        reps = 1  # one sweep per call (DRAM: the buffer is large enough on its own)

    def call(state):
        kernel(state[0].ctypes.data, blocks, reps, state[1].ctypes.data)

    best = min(_run_threads(cpus, setup, call, repeats))
    return float(nbytes) * reps * len(cpus) / best


def _stream_bandwidth(kernel: _JitKernel, info: dict, cpus: list[int], bytes_per_thread: int, target_s: float,
                      repeats: int) -> float:
    """Read + write bandwidth: the working set (source + destination) is `bytes_per_thread` per thread."""
    block = info["block_bytes"]
    blocks = max(1, bytes_per_thread // 2 // block)
    nbytes = blocks * block

    def setup(_i):
        # Offset the destination from the source by a cache line and a bit: buffers at the same offset modulo
        # 4 KiB make every store look like it aliases a later load (4K aliasing) and halve the L1 figure.
        dst = _aligned(nbytes + 4096)[(1024 + 64) // 4:][: nbytes // 4]
        return _aligned(nbytes), dst

    if target_s > 0:
        src, dst = setup(0)
        reps = _calibrate(lambda r: kernel(src.ctypes.data, dst.ctypes.data, blocks, r, 0.5), 1, target_s)
        del src, dst
    else:
        reps = 1

    def call(state):
        kernel(state[0].ctypes.data, state[1].ctypes.data, blocks, reps, 0.5)

    best = min(_run_threads(cpus, setup, call, repeats))
    return 2.0 * nbytes * reps * len(cpus) / best


# --------------------------------------------------------------------------------------------------------------
# The machine


def measure_machine(quick: bool = False) -> Machine:
    """Measure this machine's peaks and bandwidths with generated kernels (a few seconds; quick: about one)."""
    global _MEASURE_COUNT
    from onnxopt.codegen.target import host_target

    t_start = time.perf_counter()
    _MEASURE_COUNT += 1
    target = host_target()
    cpus = usable_cpus()
    ncpu = len(cpus)
    flags = cpu_flags()
    caches = cache_levels(cpus)

    peak_s, peak_reps = (0.02, 2) if quick else (0.1, 3)
    bw_s, bw_reps = (0.01, 3) if quick else (0.02, 6)

    fma_k, fma_info = _fma_kernel(target)
    fp32_1, fp32_all = _peak(fma_k, fma_info, cpus, _fp32_operands(fma_info["lanes"]), peak_s, peak_reps)
    peak = {"float32": fp32_all}
    peak_1 = {"float32": fp32_1}
    kernels = {"float32": {k: v for k, v in fma_info.items()}}
    if "avx512_vnni" in flags and target.has("avx512vnni") and _is_x86(target):
        try:
            vk, vinfo = _vnni_kernel(target)
        except RuntimeError as e:
            kernels["int8"] = {"error": str(e)}
        else:
            operands = np.full(32, 0x01010101, dtype=np.int32).tobytes()
            i8_1, i8_all = _peak(vk, vinfo, cpus, operands, peak_s, peak_reps)
            peak["int8"], peak_1["int8"] = i8_all, i8_1
            kernels["int8"] = dict(vinfo)

    rk, rinfo = _read_kernel(target)
    kernels["read"] = dict(rinfo)
    # (name, total capacity, bytes for the 1-core run, bytes per thread for the all-core run, seconds per call)
    plan = []
    for c in caches:
        per_thread = max(rinfo["block_bytes"], c.instance_bytes // 2 // c.cpus_per_instance)
        plan.append((f"L{c.level}", c.total_bytes, c.instance_bytes // 2, per_thread, bw_s, bw_reps))
    last = max((c.total_bytes for c in caches), default=32 << 20)
    dram_total = max(4 * last, 128 << 20) if quick else max(8 * last, 256 << 20)
    avail = _mem_available()
    if avail:
        dram_total = min(dram_total, max(64 << 20, avail // 4))
    # One sweep of a DRAM-sized buffer per call (seconds 0: no calibration beyond one pass).
    plan.append(("DRAM", None, dram_total, dram_total // ncpu, 0.0, 2 if quick else 3))

    def measure_level(i: int) -> tuple[float, float]:
        _, _, one_bytes, per_thread, secs, reps = plan[i]
        bw1 = _read_bandwidth(rk, rinfo, cpus[:1], one_bytes, secs, reps)
        bwa = _read_bandwidth(rk, rinfo, cpus, per_thread, secs, reps) if ncpu > 1 else bw1
        return bwa, bw1

    bws = [measure_level(i) for i in range(len(plan))]
    sk, sinfo = _scale_kernel(target)
    kernels["stream"] = dict(sinfo)
    streams = []
    for _, _, one_bytes, per_thread, secs, reps in plan:
        s1 = _stream_bandwidth(sk, sinfo, cpus[:1], one_bytes, secs, reps)
        sa = _stream_bandwidth(sk, sinfo, cpus, per_thread, secs, reps) if ncpu > 1 else s1
        streams.append((max(sa, s1), s1))
    # A shared (virtual) machine can slow one run down; a closer level measured slower than a farther one is
    # measured again and the better numbers are kept.
    for i in range(len(plan) - 1):
        if bws[i][0] < bws[i + 1][0] or bws[i][1] < bws[i + 1][1]:
            again = measure_level(i)
            bws[i] = (max(bws[i][0], again[0]), max(bws[i][1], again[1]))
    # All cores together can do at least what one does; a lower all-core number means other work shared the cores
    # while we measured. Keep the capability, and record what was seen.
    contended = {}
    for dt in list(peak):
        if peak[dt] < peak_1[dt]:
            contended[f"peak_{dt}"] = peak[dt]
            peak[dt] = peak_1[dt]
    for i, (name, *_rest) in enumerate(plan):
        if bws[i][0] < bws[i][1]:
            contended[f"bandwidth_{name}"] = bws[i][0]
            bws[i] = (bws[i][1], bws[i][1])
    levels = [MemoryLevel(name, total, bwa, bw1, sa, s1)
              for (name, total, *_), (bwa, bw1), (sa, s1) in zip(plan, bws, streams)]
    sizes = {name: {"buffer_1core": one, "buffer_per_thread": per} for name, _, one, per, *_ in plan}
    for c in caches:
        sizes[f"L{c.level}"].update(instance_bytes=c.instance_bytes, instances=c.instances,
                                    cpus_per_instance=c.cpus_per_instance)

    regs = _vector_registers(target)
    details = {
        "peak_flops_1core": peak_1,
        "cpu_mhz": cpu_mhz(),
        "cpus": cpus,
        "llvm_cpu": target.cpu,
        "triple": target.triple,
        "kernels": kernels,
        "buffers": sizes,
        "quick": quick,
        "all_core_below_1core": contended,
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    return Machine(name=cpu_name(), cores=ncpu, isa=isa_flags(), peak_flops=peak, levels=levels,
                   vector_bits=target.vector_bits, registers=regs, source="measured", details=details)


# --------------------------------------------------------------------------------------------------------------
# The on-disk cache


def cache_dir() -> Path:
    d = os.environ.get("ONNXOPT_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "onnxopt"


def machine_key() -> str:
    import onnxopt

    ident = [cpu_name(), sorted(cpu_flags()), len(usable_cpus()), getattr(onnxopt, "__version__", "0")]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def cache_path() -> Path:
    return cache_dir() / f"machine-{machine_key()}.json"


def _read_cache(path: Path) -> Machine | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return Machine.from_dict(data["machine"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, m: Machine) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"key": machine_key(), "machine": m.to_dict()}, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_machine(refresh: bool = False, quick: bool = False) -> Machine:
    """This machine's model: from the cache when present, else measured once and cached.

    refresh=True measures again. A cached quick measurement serves quick requests only; a full request replaces it.
    """
    path = cache_path()
    if not refresh:
        m = _read_cache(path)
        if m is not None and (quick or not m.details.get("quick", False)):
            return m
    m = measure_machine(quick=quick)
    try:
        _write_cache(path, m)
    except OSError:
        pass  # a read-only home still gets a (measured) model
    return m
