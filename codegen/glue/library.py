"""Build a model's kernel library: LLVM objects for the kernels plus the project's C glue, linked into one .so.

The glue is generic (glue.h, runtime.c, the kinds' executors: codegen/glue/kinds.py); this module writes the
per-library part (the op tables and the CPU check) and runs the system C compiler and linker. The library needs only
libc: it does not link libonnxruntime, ORT hands it the API table when it calls RegisterCustomOps.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from onnxopt.errors import ToolchainError

from ..copy.desc import CopyKernelDesc, copy_source
from ..instructions import MATRIX_INSTRUCTIONS
from ..isa import AARCH64_HWCAPS, isa_of
from ..pool.desc import PoolKernelDesc, pool_source
from ..target import Target
from .contract import CT_DESC, cstr
from .descs import AF_MAX_SECOND, SB_MAX_PART, AfKernelDesc, CtKernelDesc, EwKernelDesc, SbKernelDesc, SeqKernelDesc
from .kinds import headers_source, runtime_translation_unit, source_files

_KIND = {"conv": "KIND_CONV", "conv_transpose": "KIND_CONV", "matmul": "KIND_MATMUL"}


def _pool_init(pool: dict | None) -> str:
    """The conv -> pool fields of an onnxopt_af_desc initializer."""
    if pool is None:
        return "0, 0, 0, {1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}"
    op = {"max": 1, "avg": 2}[pool["op"]]

    def arr(v):
        return "{" + ", ".join(str(int(x)) for x in v) + "}"

    return (f"{op}, {int(pool['ceil_mode'])}, {int(pool['count_include_pad'])}, {arr(pool['kernel'])}, "
            f"{arr(pool['strides'])}, {arr(pool['dilations'])}, {arr(pool['pads'])}")


def _c_array(ctype: str, name: str, values) -> str:
    body = ", ".join(str(v) for v in values) or "0"
    return f"static const {ctype} {name}[] = {{{body}}};\n"


def _compute_source(c: str, k: CtKernelDesc) -> tuple[str, str]:
    """(declarations and tables, the descriptor's initializer) of a compute op whose C names start with `c`: the
    initializer is CT_DESC's (codegen/glue/contract.py), by member name."""
    syms = [s for row in k.tiles for s in row]
    amx = [s for row in k.amx_tiles for s in row]
    amx_round = [k.amx_round] if amx and k.amx_round else []  # a convolution's AMX tiles have none
    amx16 = [s for row in k.amx_tiles16 for s in row]
    wino = [k.wino_in, k.wino_out] if k.winograd else []
    parts = [f"extern void {s}(const int64_t *);\n" for s in syms + amx + amx_round + amx16 + wino]
    parts.append(_c_array("int", f"{c}_in_types", k.in_types))
    parts.append(_c_array("int", f"{c}_out_types", k.out_types))
    parts.append(_c_array("tile_fn", f"{c}_tiles", syms))
    if amx:
        parts.append(_c_array("tile_fn", f"{c}_amx_tiles", amx))
    if amx16:
        parts.append(_c_array("tile_fn", f"{c}_amx_tiles16", amx16))
    parts.append(_c_array("int", f"{c}_extra_kind", k.extra_kinds))
    parts.append(_c_array("int64_t", f"{c}_extra_nstride", k.extra_nstride))
    sig = {"name": cstr(k.op_type), "kind": _KIND[k.kind], "n_in": len(k.in_types), "n_out": len(k.out_types),
           "in_types": f"{c}_in_types", "out_types": f"{c}_out_types"}
    init = CT_DESC.initializer({
        "sig": sig, "mi": k.mi, "ni": k.ni, "lanes": k.lanes, "tiles": f"{c}_tiles",
        "n_extra": len(k.extra_kinds), "extra_kind": f"{c}_extra_kind", "extra_nstride": f"{c}_extra_nstride",
        "oc": k.oc, "groups": k.groups, "kh": k.kernel[0], "kw": k.kernel[1], "sh": k.strides[0],
        "sw": k.strides[1], "dh": k.dilations[0], "dw": k.dilations[1], "pads": list(k.pads),
        "auto_pad": k.auto_pad, "ic_g": k.ic_g, "trans_a": k.trans_a, "packed_b": k.packed_b,
        "in_blocked": k.in_blocked, "out_blocked": k.out_blocked, "channel_vectors": k.channel_vectors,
        "transposed": k.transposed, "out_pad": list(k.output_padding), "wino_m": k.winograd,
        "wino_in": wino[0] if wino else None, "wino_out": wino[1] if wino else None,
        "amx_groups": len(k.amx_tiles), "amx_tiles": f"{c}_amx_tiles" if amx else None,
        "amx_round": k.amx_round or None, "amx_tiles16": f"{c}_amx_tiles16" if amx16 else None,
        "sched": list(k.schedule)})
    return "".join(parts), init


# Compute kernels with fewer FLOPs run on the calling thread (CT_INLINE_FLOPS in compute_exec.c): the default, and
# the larger value the optimizer also times on the chosen plan (driver/decision.py, _inline_choice). With
# onnxruntime's spinning off, ten 16 -> 16 1x1 convolutions at 56x56 (1.6 MFLOP each) took 272 us on one thread and
# 311 us on two (the original model: 200 and 271 us). With the same kernels, NASNet's compute-blocked plan ran
# 0.88-0.89x onnxruntime's speed with 1 MFLOP and 0.98-1.05x with 4 MFLOP; MobileNetV2's 1.03x and 0.97x, so neither
# is right everywhere.
INLINE_FLOPS = float(1 << 20)
INLINE_FLOPS_WIDE = float(1 << 22)


def library_source(kernels: list, target: Target, inline_flops: float = INLINE_FLOPS) -> str:
    ew = [k for k in kernels if isinstance(k, EwKernelDesc)]
    ct = [k for k in kernels if isinstance(k, CtKernelDesc)]
    parts = []
    for k in ew:
        for _, sym in k.variants:
            parts.append(f"extern void {sym}(void **, void **, int64_t);\n")
        parts.append(f"extern void {k.generic}(void **, void **, int64_t, const int64_t *);\n")
    for i, k in enumerate(ew):
        parts.append(_c_array("int", f"k{i}_in_types", k.in_types))
        parts.append(_c_array("int", f"k{i}_out_types", k.out_types))
        parts.append(_c_array("int", f"k{i}_in_sizes", k.in_sizes))
        parts.append(_c_array("int", f"k{i}_out_sizes", k.out_sizes))
        parts.append(_c_array("uint32_t", f"k{i}_masks", [m for m, _ in k.variants]))
        parts.append(_c_array("uint32_t", f"k{i}_deps", k.out_deps))
        parts.append(_c_array("row_fn", f"k{i}_variants", [s for _, s in k.variants] or ["NULL"]))
    for i, k in enumerate(ew):
        parts.append(f'static const onnxopt_ew_desc k{i}_desc = {{{{"{k.op_type}", KIND_ELEMENTWISE, '
                     f"{len(k.in_types)}, {len(k.out_types)}, k{i}_in_types, k{i}_out_types}}, {k.out_rank}, "
                     f"k{i}_in_sizes, k{i}_out_sizes, {len(k.variants)}, k{i}_masks, "
                     f"k{i}_variants, {k.generic}, k{i}_deps, {k.parallel_min}}};\n")
    for i, k in enumerate(ct):
        decls, init = _compute_source(f"c{i}", k)
        parts.append(decls)
        parts.append(f"static const onnxopt_ct_desc c{i}_desc = {init};\n")
    af = [k for k in kernels if isinstance(k, AfKernelDesc)]
    for i, k in enumerate(af):
        if not (1 <= len(k.seconds) <= AF_MAX_SECOND if k.pool is None else not k.seconds):
            raise ValueError(f"an AFUSION kernel has 1 to {AF_MAX_SECOND} second convolutions, or a pool and none, "
                             f"not {len(k.seconds)}")
        names = ["first"] + [f"second{b}" for b in range(len(k.seconds))]
        for part, sub in zip(names, [k.first] + list(k.seconds)):
            decls, init = _compute_source(f"a{i}_{part}", sub)
            parts.append(decls)
            parts.append(f"static const onnxopt_ct_desc a{i}_{part} = {init};\n")
        parts.append(_c_array("int", f"a{i}_in_types", k.in_types))
        parts.append(_c_array("int", f"a{i}_out_types", k.out_types))
        seconds = ", ".join(f"&a{i}_{n}" for n in names[1:])
        inputs = ", ".join(str(x) for x in k.second_inputs)
        parts.append(f'static const onnxopt_af_desc a{i}_desc = {{{{"{k.op_type}", KIND_AFUSION, {len(k.in_types)}, '
                     f"{len(k.out_types)}, a{i}_in_types, a{i}_out_types}}, &a{i}_first, {len(k.seconds)}, "
                     f"{{{seconds or 0}}}, {{{inputs or 0}}}, {k.band_rows}, {k.miso_extra}, {_pool_init(k.pool)}, "
                     f"{int(k.chain)}}};\n")
    sb = [k for k in kernels if isinstance(k, SbKernelDesc)]
    for i, k in enumerate(sb):
        if not 1 <= len(k.parts) <= SB_MAX_PART:
            raise ValueError(f"a sibling kernel has 1 to {SB_MAX_PART} convolutions, not {len(k.parts)}")
        for b, sub in enumerate(k.parts):
            decls, init = _compute_source(f"s{i}_part{b}", sub)
            parts.append(decls)
            parts.append(f"static const onnxopt_ct_desc s{i}_part{b} = {init};\n")
        parts.append(_c_array("int", f"s{i}_in_types", k.in_types))
        parts.append(_c_array("int", f"s{i}_out_types", k.out_types))
        members = ", ".join(f"&s{i}_part{b}" for b in range(len(k.parts)))
        parts.append(f'static const onnxopt_sb_desc s{i}_desc = {{{{"{k.op_type}", KIND_SIBLINGS, {len(k.in_types)}, '
                     f"{len(k.out_types)}, s{i}_in_types, s{i}_out_types}}, {len(k.parts)}, {{{members}}}, "
                     f"{{{', '.join(str(x) for x in k.part_inputs)}}}, "
                     f"{{{', '.join(str(x) for x in k.part_outputs)}}}}};\n")
    refs = [f"&k{i}_desc.sig" for i in range(len(ew))] + [f"&c{i}_desc.sig" for i in range(len(ct))]
    refs += [f"&a{i}_desc.sig" for i in range(len(af))] + [f"&s{i}_desc.sig" for i in range(len(sb))]
    pools = [k for k in kernels if isinstance(k, PoolKernelDesc)]
    parts.extend(pool_source(i, k) for i, k in enumerate(pools))
    refs += [f"&p{i}_desc.sig" for i in range(len(pools))]
    copies = [k for k in kernels if isinstance(k, CopyKernelDesc)]
    parts.extend(copy_source(i, k) for i, k in enumerate(copies))
    refs += [f"&y{i}_desc.sig" for i in range(len(copies))]
    # The kinds of onnxopt/kinds/: each description writes its own C.
    plugged = [k for k in kernels if hasattr(k, "c_source")]
    parts.extend(k.c_source(f"x{i}") for i, k in enumerate(plugged))
    refs += [f"&x{i}_desc.sig" for i in range(len(plugged))]
    seqs = [k for k in kernels if isinstance(k, SeqKernelDesc)]
    if seqs:
        sig_of = dict(zip([k.op_type for k in ew + ct + af + sb + pools + copies + plugged], refs))
        for i, k in enumerate(seqs):
            parts.append(_sequence_source(i, k, sig_of))
        refs += [f"&q{i}_desc.sig" for i in range(len(seqs))]
    parts.append(f"void *onnxopt_seq_arenas[{max(1, len(seqs))}];\n")
    parts.append(f"const int onnxopt_n_seqs = {len(seqs)};\n")
    # External linkage (hidden by -fvisibility=hidden): the runtime object, compiled once, reads these.
    parts.append(_c_array("onnxopt_sig *", "ONNXOPT_OPS", refs).replace("static const onnxopt_sig *",
                                                                         "const onnxopt_sig *const"))
    parts.append(f"const int onnxopt_n_ops = {len(kernels)};\n")
    parts.append(f"const double onnxopt_inline_flops = {float(inline_flops)!r};\n")
    parts.append(f'const char onnxopt_execution_provider[] = "{target.execution_provider}";\n')
    # 1: AMX tiles, run where granted (glue/matrix_engine.c); 2: emulated ones (tests), which need no permission
    amx = [k for k in kernels if getattr(k, "uses_amx", False)]
    parts.append(f"const int onnxopt_uses_amx = {2 if any(k.amx_emulated for k in amx) else int(bool(amx))};\n")
    # the AMX units its tiles run on, so the loader can say which run on this CPU (matrix_engine.c onnxopt_amx_units)
    parts.append(f"const int onnxopt_amx_units_used = {amx_units(k.matrix_instruction for k in amx)};\n")
    parts.append(_cpu_check(target))
    return headers_source() + "".join(parts)


AMX_UNIT_BITS = {"amx-int8": 1, "amx-bf16": 2, "amx-fp16": 4}  # matrix_engine.c's AMX_INT8, AMX_BF16, AMX_FP16


def amx_units(instructions) -> int:
    """The AMX units (matrix_engine.c's bits) that the named matrix instructions run on."""
    by = {i.name: i for i in MATRIX_INSTRUCTIONS}
    return sum({AMX_UNIT_BITS[f] for name in instructions for f in by[name].features if f in AMX_UNIT_BITS})


def _cpu_check(target: Target) -> str:
    """onnxopt_cpu_ok(): whether this CPU has every feature the kernels use, as the target's ISA row checks them
    (codegen/isa.py `runtime_check`): gcc's CPU model on x86-64, the kernel's hardware capabilities on aarch64. The
    check is inside the library itself, so a non-Python host on an older CPU also falls back to the function bodies
    instead of dying on SIGILL."""
    isa = isa_of(target)
    if isa.arch == "aarch64":
        checks = [AARCH64_HWCAPS[f] for f in isa.runtime_check]
        cond = " && ".join(f"(getauxval({at}) & {bit}ul)" for at, bit in checks) or "1"
        return f"#include <sys/auxv.h>\nint onnxopt_cpu_ok(void) {{\n  return {cond};\n}}\n"
    cond = " && ".join(f'__builtin_cpu_supports("{f}")' for f in isa.runtime_check) or "1"
    return f"int onnxopt_cpu_ok(void) {{\n  __builtin_cpu_init();\n  return {cond};\n}}\n"


def _sequence_source(i: int, k: SeqKernelDesc, sig_of: dict[str, str]) -> str:
    """The tables and the descriptor `q{i}_desc` of a sequence; `sig_of` maps op types to their sigs' C names."""
    parts = []
    for s, (op_type, ins, outs) in enumerate(k.steps):
        if op_type not in sig_of:
            raise ValueError(f"sequence {k.op_type}: step {s} runs {op_type}, which is not in the library")
        parts.append(_c_array("int", f"q{i}_in{s}", ins))
        parts.append(_c_array("int", f"q{i}_out{s}", outs))
    steps = ", ".join(f"{{{sig_of[op]}, {len(ins)}, {len(outs)}, q{i}_in{s}, q{i}_out{s}}}"
                      for s, (op, ins, outs) in enumerate(k.steps))
    parts.append(f"static const onnxopt_seq_step q{i}_steps[] = {{{steps}}};\n")
    parts.append(_c_array("int", f"q{i}_in_types", k.in_types))
    parts.append(_c_array("int", f"q{i}_out_types", k.out_types))
    parts.append(_c_array("int", f"q{i}_slot_output", k.slot_output))
    parts.append(_c_array("int", f"q{i}_slot_buffer", k.slot_buffer))
    n_buffers = max(k.slot_buffer, default=-1) + 1
    views = [k.slot_view[s] if s < len(k.slot_view) else None for s in range(len(k.slot_output))]
    parts.append(_c_array("int", f"q{i}_view_whole", [v.whole if v else -1 for v in views]))
    parts.append(_c_array("int", f"q{i}_view_axis", [v.axis if v else 0 for v in views]))
    for name in ("offset", "units", "total"):
        parts.append(_c_array("int64_t", f"q{i}_view_{name}", [getattr(v, name) if v else 0 for v in views]))
    bf16 = list(k.slot_bf16) + [0] * (len(k.slot_output) - len(k.slot_bf16))
    parts.append(_c_array("int", f"q{i}_slot_bf16", bf16))
    parts.append(f'static const onnxopt_seq_desc q{i}_desc = {{{{"{k.op_type}", KIND_SEQUENCE, {len(k.in_types)}, '
                 f"{len(k.out_types)}, q{i}_in_types, q{i}_out_types}}, {len(k.steps)}, q{i}_steps, "
                 f"{len(k.slot_output)}, q{i}_slot_output, q{i}_slot_buffer, {n_buffers}, {i}, "
                 f"q{i}_view_whole, q{i}_view_axis, q{i}_view_offset, q{i}_view_units, q{i}_view_total, "
                 f"q{i}_slot_bf16}};\n")
    return "".join(parts)


def runtime_source() -> str:
    """The glue every library shares (custom-op registration and the kinds' executors, codegen/glue/kinds.py): it
    reads the per-library tables of `library_source` through ONNXOPT_OPS, onnxopt_n_ops and onnxopt_cpu_ok."""
    return runtime_translation_unit()


def _cc(target: Target | None = None) -> str:
    """The C compiler for `target`'s machines: the system's, or for a foreign target (aarch64 on an x86-64 host) its
    cross compiler, $CC_<ARCH> (CC_AARCH64) or Debian's `<arch>-linux-gnu-gcc`."""
    if target is not None and target.foreign:
        cross = f"{target.arch}-linux-gnu-gcc"
        for name in (os.environ.get(f"CC_{target.arch.upper()}"), cross):
            if name and shutil.which(name):
                return name
        package = f"gcc-{target.arch.replace('_', '-')}-linux-gnu"
        raise ToolchainError(f"no C compiler for {target.arch} found ({cross}): install Debian's {package}, or "
                             f"point $CC_{target.arch.upper()} at one")
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise ToolchainError("no C compiler found (cc/gcc/clang): install one, for example `apt-get install gcc`, "
                         "or point $CC at it")


# The glue is built for the baseline ISA so that its CPU check itself runs anywhere.
_CFLAGS = ["-O2", "-fPIC", "-fvisibility=hidden", "-std=c11", "-Wall", "-Werror"]


def link_library(kernels: list, objects: list, target: Target, output: str,
                 inline_flops: float = INLINE_FLOPS) -> str:
    """Compile the library's tables, link them with the shared runtime object and the kernel objects into `output`;
    returns the library's sha256. An entry of `objects` is one object or a tuple of them (a compute kernel's tile
    sets, codegen/compute/tile_sets.py); an object several kernels share is linked once. `inline_flops`: compute
    kernels below it run on the calling thread."""
    if not inline_flops >= 0:
        raise ValueError(f"inline_flops must be a number >= 0, not {inline_flops!r}")
    cc = _cc(target)
    flat = [o for entry in objects for o in ((entry,) if isinstance(entry, (bytes, bytearray)) else entry)]
    objects = list(dict.fromkeys(bytes(o) for o in flat))
    with tempfile.TemporaryDirectory(prefix="onnxopt-link-") as tmp:
        src = os.path.join(tmp, "tables.c")
        objs = [os.path.join(tmp, f"kernels{i}.o") for i in range(len(objects))]
        write_sources(tmp, [(src, library_source(kernels, target, inline_flops).encode()), *zip(objs, objects)])
        tables_o = os.path.join(tmp, "tables.o")
        # Tables only (data and a CPU check): -O0 compiles them in a third of the time and changes nothing at run time.
        _run([cc, *_CFLAGS, "-O0", "-c", src, "-o", tables_o])
        so = os.path.join(tmp, "lib.so")
        _run([cc, "-shared", "-Wl,-Bsymbolic", "-Wl,-z,noexecstack", "-o", so, runtime_object(cc, tmp), tables_o,
              *objs, "-lm"])
        with open(so, "rb") as f:
            data = f.read()
        # A new file of an unpredictable name (mkstemp: O_EXCL, no link followed), renamed over `output` whole.
        fd, tmp_out = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".tmp",
                                       dir=os.path.dirname(os.path.abspath(output)))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            umask = os.umask(0)
            os.umask(umask)
            # Never writable by group or others, whatever the umask: the loader refuses such a library (anyone who
            # can write it chooses the code that runs).
            os.chmod(tmp_out, 0o755 & ~(umask | 0o022))
            os.replace(tmp_out, output)
        except BaseException:
            if os.path.exists(tmp_out):
                os.remove(tmp_out)
            raise
    return hashlib.sha256(data).hexdigest()


def write_sources(folder: str, files: list[tuple[str, bytes]]) -> None:
    """Write a compile's inputs into its temporary folder; a full disk or a file-size limit there is the
    environment's (exit 2, saying where), not a bug."""
    try:
        for path, data in files:
            with open(path, "wb") as f:
                f.write(data)
    except OSError as e:
        raise ToolchainError(f"could not write the kernels' sources to {os.path.dirname(folder)} ({e.strerror}): "
                             "free space there (or raise the file-size limit), or point TMPDIR at a folder with "
                             "room") from None


def runtime_object(cc: str, tmp: str) -> str:
    """The compiled runtime glue (about 1.5 s of cc per library before it was shared): kept in
    `$ONNXOPT_CACHE_DIR/glue/` (else ~/.cache/onnxopt/glue/) under the hash of its source, the compiler and the flags,
    so a library is its small tables file plus the kernels. Where the cache cannot be written, it is compiled into
    `tmp` each time."""
    src_text = runtime_source()
    contents = []
    for path in source_files():  # the translation unit only names them
        with open(path) as f:
            contents.append(f.read())
    key = hashlib.sha256("\0".join([src_text, *contents, _cc_identity(cc), *_CFLAGS]).encode()).hexdigest()[:24]
    from onnxopt.cost_cache import default_path

    cached = os.path.join(os.path.dirname(default_path()), "glue", f"runtime-{key}.o")
    if os.path.exists(cached):
        return cached
    src = os.path.join(tmp, "runtime.c")
    write_sources(tmp, [(src, src_text.encode())])
    obj = os.path.join(tmp, "runtime.o")
    _run([cc, *_CFLAGS, "-c", src, "-o", obj])
    try:  # publish it atomically: processes converting models at the same time may race here
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=os.path.basename(cached) + ".", suffix=".tmp", dir=os.path.dirname(cached))
        try:
            with os.fdopen(fd, "wb") as f, open(obj, "rb") as src:
                shutil.copyfileobj(src, f)
            os.replace(part, cached)
        except BaseException:
            if os.path.exists(part):
                os.remove(part)
            raise
    except OSError:
        return obj
    return cached


_CC_IDS: dict[str, str] = {}


def _cc_identity(cc: str) -> str:
    if cc not in _CC_IDS:
        r = subprocess.run([cc, "--version"], capture_output=True, text=True)
        _CC_IDS[cc] = f"{shutil.which(cc)}|{r.stdout.splitlines()[0] if r.stdout else ''}"
    return _CC_IDS[cc]


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ToolchainError(f"could not run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        raise ToolchainError(f"{' '.join(cmd[:2])}... failed:\n{r.stderr.strip()[-2000:]}")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
