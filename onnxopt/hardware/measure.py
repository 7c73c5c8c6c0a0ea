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

import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from onnxopt.hardware.machine_model import Machine, MemoryLevel

# What the OS says about the CPU (cpu.py) and the kernels timed here (probe_kernels.py). The first and last lines
# keep the names the tests read importable from this module.
from .cpu import CacheLevel, _fallback_cache_levels, _parse_cpu_list, _parse_size  # noqa: F401
from .cpu import _mem_available, cache_levels, cpu_flags, cpu_mhz, cpu_name, isa_flags, usable_cpus
from .probe_kernels import (_amx_kernel, _bf16_kernel, _JitKernel, _fma_kernel, _int8_kernel, _is_x86, _read_kernel,
                            _scale_kernel, _vector_registers, request_amx)
from .probe_kernels import build_fma_kernel, kernel_assembly  # noqa: F401

_MEASURE_COUNT = 0  # how many times measure_machine ran in this process (the cache tests read it)


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
    out_bytes = info.get("out_bytes") or info["accumulators"] * 64

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
    if _is_x86(target):
        try:
            vk, vinfo = _int8_kernel(target)
        except RuntimeError as e:
            kernels["int8"] = {"error": str(e)}
        else:
            operands = np.full(32, 0x01010101, dtype=np.int32).tobytes()
            i8_1, i8_all = _peak(vk, vinfo, cpus, operands, peak_s, peak_reps)
            peak["int8"], peak_1["int8"] = i8_all, i8_1
            kernels["int8"] = dict(vinfo)
            # One chain: the instruction's latency, which bounds a tile with few accumulators (kinds/qconv/forms.py)
            ck, cinfo = _int8_kernel(target, accumulators=1)
            chain_1, _ = _peak(ck, cinfo, cpus[:1], operands, peak_s, peak_reps)
            kernels["int8"]["latency_s"] = cinfo["ops_per_iter"] / chain_1
        if target.has("avx512bf16"):  # the bf16 GEMMs' vdpbf16ps (--precision bf16)
            bk, binfo = _bf16_kernel(target)
            operands = np.full(32, 0x3F803F80, dtype=np.uint32).tobytes()  # bf16 pairs of 1.0
            peak_1["bfloat16"], peak["bfloat16"] = _peak(bk, binfo, cpus, operands, peak_s, peak_reps)
            kernels["bfloat16"] = dict(binfo)
        _measure_amx(target, cpus, peak_s, peak_reps, peak, peak_1, kernels)

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


# What the measurement measures: a change (2: an int8 peak on every target with a dot-product instruction, not
# only VNNI; 3: the AMX peaks; 4: the vdpbf16ps peak; 5: the int8 instruction's latency) invalidates the models
# cached by earlier code of the same version.
MEASUREMENTS = 5


# The machine model's name of each matrix instruction's peak, by its source dtype.
AMX_PEAKS = {"u8": "amx_int8", "bf16": "amx_bf16", "f16": "amx_fp16"}


def _measure_amx(target, cpus, peak_s, peak_reps, peak, peak_1, kernels) -> None:
    """The tile unit's peaks (int8, bf16, fp16: the best instruction of each the host has), where the CPU has AMX
    and Linux grants this process the tile state; else why not, in kernels["amx"]."""
    from onnxopt.codegen.instructions import matrix_available

    found = matrix_available(target)
    if not found:
        return
    granted, why = request_amx()
    if not granted:
        kernels["amx"] = {"error": why}
        return
    for ins in found:
        name = AMX_PEAKS.get(ins.source_dtypes[0])
        if name is None or name in peak:
            continue
        k, info = _amx_kernel(target, ins)
        info["out_bytes"] = 4 * 1024
        one, every = _peak(k, info, cpus, bytes(1024), peak_s, peak_reps)
        peak[name], peak_1[name] = every, one
        kernels[name] = dict(info)


def machine_key() -> str:
    import onnxopt

    ident = [cpu_name(), sorted(cpu_flags()), len(usable_cpus()), getattr(onnxopt, "__version__", "0"), MEASUREMENTS]
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


def cached_machine() -> Machine | None:
    """This machine's model where one was measured and cached already (quick or full), else None: for choices
    that may read it but must not start a measurement."""
    return _read_cache(cache_path())


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
