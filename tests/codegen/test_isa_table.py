"""The ISA table (codegen/isa.py): one row per instruction set, which every consumer reads.

- for each target, what the code answered before the table (micro-kernel, lanes, vector bits, dot instructions, the
  library's CPU check), written down here, and what the table answers now;
- the same for every set of the features that matter, against the old rules copied here;
- every consumer (select, available, Target.vector_bits and float32_lanes, the vector math, the int8 conv's table
  lookups, the library's CPU check) agrees with isa_of;
- a row added to ROWS changes what they answer with no other edit;
- the rows are best first, and each names a micro-kernel and instructions that exist.
"""

from __future__ import annotations

import itertools
import platform
import types

import pytest
from llvmlite import ir

from onnxopt.codegen import isa
from onnxopt.codegen.glue.library import _cpu_check
from onnxopt.codegen.instructions import INSTRUCTIONS, available, by_name
from onnxopt.codegen.microkernel.registry import MICRO_KERNELS, select
from onnxopt.codegen.target import AARCH64_TRIPLE, Target, host_target, parse_target
from onnxopt.codegen.vmath.isa import avx512_f32, set_features

X86 = platform.machine() in ("x86_64", "AMD64")
X86_TRIPLE = "x86_64-unknown-linux-gnu"

# ---- what the code answered before the table ----------------------------------------------------------------


def _gcc(*names: str) -> str:
    cond = " && ".join(f'__builtin_cpu_supports("{n}")' for n in names) or "1"
    return f"int onnxopt_cpu_ok(void) {{\n  __builtin_cpu_init();\n  return {cond};\n}}\n"


V3_CHECK = ("avx", "avx2", "bmi2", "fma", "sse4.1", "sse4.2")
V4_CHECK = ("avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl", "bmi2", "fma", "sse4.1",
            "sse4.2")
V4_VNNI_CHECK = ("avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl", "avx512vnni", "bmi2", "fma",
                 "sse4.1", "sse4.2")
SSE = "sse_fp32_outer_product"
AVX2 = "avx2_fp32_outer_product"
AVX512 = "avx512_fp32_outer_product"

# spec -> (ISA row, micro-kernel, float32 lanes, vector bits, dot instructions, _cpu_check's text), as the code
# answered before the table (the same code's output, written down), but for avx512vbmi, checked since the int8
# conv's tables are read with vpermi2b. `cpu=NAME` now brings the CPU's own features
# (target.py CPU_FEATURES; before, only a level's, and these three got the 128-bit row).
BEFORE = {
    "x86-64": ("sse", SSE, 4, 128, [], _gcc()),
    "x86-64-v2": ("sse", SSE, 4, 128, [], _gcc("sse4.1", "sse4.2")),
    "x86-64-v3": ("avx2", AVX2, 8, 256, ["avx2_u8s8"], _gcc(*V3_CHECK)),
    "x86-64-v4": ("avx512", AVX512, 16, 512, ["avx2_u8s8"], _gcc(*V4_CHECK)),
    "cpu=sapphirerapids": ("avx512", AVX512, 16, 512, ["avx512_vnni", "avx_vnni", "avx2_u8s8"],
                           _gcc(*sorted(V4_VNNI_CHECK + ("avx512bf16", "avx512vbmi")))),
    "cpu=znver4": ("avx512", AVX512, 16, 512, ["avx512_vnni", "avx2_u8s8"],
                   _gcc(*sorted(V4_VNNI_CHECK + ("avx512bf16", "avx512vbmi")))),
    "cpu=znver3": ("avx2", AVX2, 8, 256, ["avx2_u8s8"], _gcc(*V3_CHECK)),
    "cpu=x86-64,+avx,+avx2": ("avx2-nofma", SSE, 8, 256, ["avx2_u8s8"], _gcc("avx", "avx2")),
    "cpu=x86-64-v3,+avxvnni": ("avx2", AVX2, 8, 256, ["avx_vnni", "avx2_u8s8"], _gcc(*V3_CHECK)),
    "cpu=x86-64-v4,+avx512vnni": ("avx512", AVX512, 16, 512, ["avx512_vnni", "avx2_u8s8"], _gcc(*V4_VNNI_CHECK)),
    "aarch64": ("neon", SSE, 4, 128, [],
                "#include <sys/auxv.h>\nint onnxopt_cpu_ok(void) {\n  return (getauxval(AT_HWCAP) & 2ul);\n}\n"),
    "aarch64-dotprod": ("neon-dotprod", SSE, 4, 128, ["arm_sdot", "arm_udot"],
                        "#include <sys/auxv.h>\nint onnxopt_cpu_ok(void) {\n"
                        "  return (getauxval(AT_HWCAP) & 1048576ul) && (getauxval(AT_HWCAP) & 2ul);\n}\n"),
}
# _gcc writes the text the code wrote before the table; one of them literally:
assert _gcc("sse4.1", "sse4.2") == ('int onnxopt_cpu_ok(void) {\n  __builtin_cpu_init();\n  return '
                                    '__builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("sse4.2");\n}\n')
SPECS = [*BEFORE, "native"]


def _target(spec: str) -> Target:
    if not X86 and not spec.startswith("aarch64") and spec != "native":
        pytest.skip("the x86-64 targets are made on an x86-64 host only")
    return parse_target(spec)


# The rules the table replaced, copied from the code before it (target.py, microkernel/registry.py,
# instructions/__init__.py, vmath/isa.py, kinds/qconv/lower.py, glue/library.py).
_OLD_GCC_CPU_NAMES = {"sse4.1", "sse4.2", "avx", "avx2", "fma", "bmi2", "avx512f", "avx512vl", "avx512bw", "avx512dq",
                      "avx512cd", "avx512vnni", "avx512bf16",
                      "avx512vbmi"}  # added since: the int8 conv's vpermi2b lookups
_OLD_AARCH64_HWCAPS = {"neon": ("AT_HWCAP", 1 << 1), "dotprod": ("AT_HWCAP", 1 << 20), "sve": ("AT_HWCAP", 1 << 22),
                       "fp16": ("AT_HWCAP", 1 << 9), "i8mm": ("AT_HWCAP2", 1 << 13)}


def _old(t: Target) -> dict:
    bits = 512 if t.has("avx512f") else 256 if t.has("avx2") or t.has("avx") else 128
    mk = AVX512 if t.has("avx512f") else AVX2 if t.has("avx2") and t.has("fma") else SSE
    if t.arch == "aarch64":
        checks = [_OLD_AARCH64_HWCAPS[f] for f in t.features if f in _OLD_AARCH64_HWCAPS]
        cond = " && ".join(f"(getauxval({at}) & {bit}ul)" for at, bit in checks) or "1"
        check = f"#include <sys/auxv.h>\nint onnxopt_cpu_ok(void) {{\n  return {cond};\n}}\n"
    else:
        check = _gcc(*[f for f in t.features if f in _OLD_GCC_CPU_NAMES])
    return {"micro_kernel": mk, "lanes": bits // 32, "bits": bits,
            "instructions": [i.name for i in INSTRUCTIONS if i.available(t)], "check": check,
            "vmath_avx512": "avx512f" in t.features, "table_lookup": _old_table_lookup(t)}


def _old_table_lookup(t: Target) -> str:
    """The dword gathers wherever x86-64 has AVX2, as before; vpermi2b where it has AVX-512 VBMI and BW (new)."""
    if t.arch != "x86_64":
        return "lanes"
    if t.has("avx512vbmi") and t.has("avx512bw"):
        return "permute_bytes"
    return "gather_dwords" if t.has("avx2") else "lanes"


def _vmath_avx512(triple: str, features) -> bool:
    """What the vector math asks of a module of this triple and these features, for a 16-lane float vector."""
    module = ir.Module()
    module.triple = triple
    set_features(module, features)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    return avx512_f32(b, ir.Constant(ir.VectorType(ir.FloatType(), 16), None))


def _table_lookup(target: Target, monkeypatch) -> str:
    """The `table_lookup` the int8 conv's build records on its module for `target` (stopped right after it)."""
    from onnxopt.kinds.qconv import lower

    class Stop(Exception):
        pass

    made = []

    class Params:
        @property
        def depthwise(self):
            raise Stop

    def new_module(t, name):
        made.append(ir.Module(name))
        return made[-1]

    monkeypatch.setattr(lower, "instruction_for", lambda t: None)
    monkeypatch.setattr(lower, "new_module", new_module)
    with pytest.raises(Stop):
        lower.build(types.SimpleNamespace(params=Params(), op_type="q"), target)
    return made[0].table_lookup


def _now(t: Target, monkeypatch) -> dict:
    return {"micro_kernel": select(t).name, "lanes": t.float32_lanes, "bits": t.vector_bits,
            "instructions": [i.name for i in available(t)], "check": _cpu_check(t),
            "vmath_avx512": _vmath_avx512(t.triple, t.features), "table_lookup": _table_lookup(t, monkeypatch)}


@pytest.mark.parametrize("spec", list(BEFORE))
def test_each_target_answers_as_before(spec, monkeypatch):
    t = _target(spec)
    row, mk, lanes, bits, instructions, check = BEFORE[spec]
    assert isa.isa_of(t).name == row
    now = _now(t, monkeypatch)
    assert (now["micro_kernel"], now["lanes"], now["bits"], now["instructions"], now["check"]) == \
        (mk, lanes, bits, instructions, check)
    assert now == _old(t)


def test_native_answers_as_before(monkeypatch):
    t = host_target()
    assert _now(t, monkeypatch) == _old(t)


def _subsets(features):
    return [tuple(sorted(c)) for n in range(len(features) + 1) for c in itertools.combinations(features, n)]


def test_every_feature_set_answers_as_before(monkeypatch):
    """Every set of the features the old rules asked about (and avx512vbmi), on both architectures."""
    x86 = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avxvnni", "sse4.1", "bmi2", "avx512vbmi")
    arm = ("neon", "dotprod", "i8mm", "sve", "fp16")
    targets = [Target("t", X86_TRIPLE, "x86-64", f) for f in _subsets(x86)]
    targets += [Target("t", AARCH64_TRIPLE, "generic", f) for f in _subsets(arm)]
    for t in targets:
        assert _now(t, monkeypatch) == _old(t), t.features


def test_a_module_without_a_triple_still_gets_the_avx512_math():
    """set_features on a module llvmlite made without a triple: the features alone decide, as before."""
    assert _vmath_avx512("unknown-unknown-unknown", ("avx512f",))
    assert not _vmath_avx512("unknown-unknown-unknown", ("avx2", "fma"))
    assert not _vmath_avx512(AARCH64_TRIPLE, ("neon",))


# ---- every consumer reads the table -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_consumers_agree_with_isa_of(spec, monkeypatch):
    t = _target(spec)
    row = isa.isa_of(t)
    assert select(t).name == row.micro_kernel
    assert [i.name for i in available(t)] == list(row.dot_instructions)
    assert [i.name for i in available(t, ("u8", "s8"))] == \
        [n for n in row.dot_instructions if by_name(n).source_dtypes == ("u8", "s8")]
    assert (t.vector_bits, t.float32_lanes) == (row.vector_bits, row.lanes(4)) == (row.vector_bits, row.float32_lanes)
    assert row.lanes(1) == 4 * row.lanes(4) and row.lanes(2) == 2 * row.lanes(4)
    assert _vmath_avx512(t.triple, t.features) == (row.vmath == "avx512")
    assert _table_lookup(t, monkeypatch) == row.table_lookup
    check = _cpu_check(t)
    if row.arch == "aarch64":
        assert check.count("getauxval(") == len(row.runtime_check)
        assert all(f"& {isa.AARCH64_HWCAPS[f][1]}ul" in check for f in row.runtime_check)
    else:
        assert check == _gcc(*row.runtime_check)
    assert set(row.runtime_check) <= set(t.features)


# ---- a row added is all it takes ----------------------------------------------------------------------------


def test_a_row_added_changes_every_answer(monkeypatch):
    x86 = Target("t", X86_TRIPLE, "x86-64-v4", tuple(sorted(("avx", "avx2", "avx512f", "avx512bw", "avx512vnni",
                                                               "fma", "sse4.1"))))
    arm = Target("t", AARCH64_TRIPLE, "neoverse-n2", ("dotprod", "i8mm", "neon"))
    assert (select(x86).name, [i.name for i in available(x86)]) == (AVX512, ["avx512_vnni", "avx2_u8s8"])
    assert "avx2" in _cpu_check(x86) and x86.vector_bits == 512
    assert "AT_HWCAP2" in _cpu_check(arm)

    new_x86 = isa.IsaConfig("test-avx512-narrow", "x86_64", ("avx512f", "avx512vnni"), vector_bits=256,
                            micro_kernel=AVX2, dot_instructions=("avx2_u8s8",), runtime_check=("avx512f",))
    new_arm = isa.IsaConfig("test-neon-i8mm", "aarch64", ("i8mm",), vector_bits=128, micro_kernel=SSE,
                            dot_instructions=("arm_udot",), runtime_check=("i8mm",))
    monkeypatch.setattr(isa, "ROWS", (new_x86, new_arm) + isa.ROWS)

    assert isa.isa_of(x86).name == "test-avx512-narrow" and isa.isa_of(arm).name == "test-neon-i8mm"
    assert select(x86).name == AVX2
    assert [i.name for i in available(x86)] == ["avx2_u8s8"]
    assert _cpu_check(x86) == _gcc("avx512f")
    assert (x86.vector_bits, x86.float32_lanes) == (256, 8)
    assert [i.name for i in available(arm)] == ["arm_udot"]
    assert _cpu_check(arm) == "#include <sys/auxv.h>\nint onnxopt_cpu_ok(void) {\n  return (getauxval(AT_HWCAP2) & " \
        f"{1 << 13}ul);\n}}\n"
    # A target the new rows do not fit still gets its old row.
    v3 = Target("t", X86_TRIPLE, "x86-64-v3", ("avx", "avx2", "fma"))
    assert isa.isa_of(v3).name == "avx2" and select(v3).name == AVX2

    monkeypatch.undo()
    assert isa.isa_of(x86).name == "avx512" and select(x86).name == AVX512


# ---- the rows themselves ------------------------------------------------------------------------------------


def test_rows_are_best_first():
    """isa_of takes the first row that fits: a row requiring a subset of what a later row (of an architecture it
    matches) requires would hide that row."""
    rows = isa.ROWS
    assert len({r.name for r in rows}) == len(rows)
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a.arch in (b.arch, isa.ANY_ARCH):
                assert not set(a.requires) <= set(b.requires), f"{a.name} hides {b.name}"
    assert rows[-1].arch == isa.ANY_ARCH and rows[-1].requires == ()  # every target has a row


def test_rows_name_what_exists():
    kernels = {mk.name: mk for mk in MICRO_KERNELS}
    vocabulary = {"x86_64": set(isa.GCC_CPU_NAMES), "aarch64": set(isa.AARCH64_HWCAPS), isa.ANY_ARCH: set()}
    for row in isa.ROWS:
        mk = kernels[row.micro_kernel]
        assert set(mk.requires) <= set(row.requires), row.name  # the row's targets can run its micro-kernel
        assert mk.lanes <= row.float32_lanes, row.name
        for name in row.dot_instructions:
            assert by_name(name).arch == row.arch, (row.name, name)
        assert len(set(row.dot_instructions)) == len(row.dot_instructions)
        from onnxopt.codegen.instructions import MATRIX_INSTRUCTIONS

        matrix = {i.name: i for i in MATRIX_INSTRUCTIONS}
        for name in row.matrix_instructions:  # tiles, on a row of their architecture, dispatched at run time
            assert matrix[name].arch == row.arch and set(matrix[name].features) <= set(isa.DISPATCHED_AT_RUN_TIME)
        assert row.vmath in ("avx512", "portable")
        assert row.vector_bits in (128, 256, 512) and row.lanes(4) * 32 == row.vector_bits
        assert set(row.runtime_check) <= vocabulary[row.arch], row.name
        assert set(row.requires) <= set(row.runtime_check), row.name  # the library checks what the row needs


def test_the_table_does_not_look_at_the_host():
    """Two targets of another width than the host's get their own rows' widths."""
    narrow = Target("t", X86_TRIPLE, "x86-64", ())
    wide = Target("t", X86_TRIPLE, "x86-64-v4", ("avx2", "avx512f", "fma"))
    assert (narrow.vector_bits, wide.vector_bits) == (128, 512)
    assert (select(narrow).name, select(wide).name) == (SSE, AVX512)
