"""Tensorized instructions (codegen/instructions): each description against its implementation, and the inspector
(UNIT's compute isomorphism and array-access check) on the paper's worked example and its failure cases."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from kernel_harness import jit_function

from onnxopt.codegen.compile import new_module
from onnxopt.codegen.instructions import INSTRUCTIONS, available, by_name
from onnxopt.codegen.instructions.avx2_u8s8 import pairs_cannot_saturate, split_pairs
from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, dim, evaluate, mul
from onnxopt.codegen.instructions.inspector import find_mapping, mappings
from onnxopt.codegen.target import _llvm, host_target, missing_cpu_flags, parse_target

# ---- each instruction against its description ---------------------------------------------------------------


def _jit_instruction(ins, target, emit=None):
    """f(acc, a, b, out): out = emit(acc, a, b) on one vector of each, compiled for `target`."""
    module = new_module(target, "ins")
    acc_t, src_t = ins.vector_types()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 4), "run")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    acc = b.load(fn.args[0], typ=acc_t, align=1)
    a = b.load(fn.args[1], typ=src_t, align=1)
    w = b.load(fn.args[2], typ=src_t, align=1)
    b.store((emit or ins.emit)(b, acc, a, w), fn.args[3], align=1)
    b.ret_void()
    return jit_function(str(module), target, "run", 4)


def _operands(ins, rng, extremes=False):
    a_dt, b_dt = ins.source_dtypes
    n = ins.lanes * ins.depth
    lo = {"u8": 0, "s8": -128}
    hi = {"u8": 255, "s8": 127}
    if extremes:  # every lane at the corners: 255 * -128 and friends
        a = np.where(np.arange(n) % 2, hi[a_dt], lo[a_dt])
        b = np.where(np.arange(n) % 3, lo[b_dt], hi[b_dt])
    else:
        a = rng.integers(lo[a_dt], hi[a_dt] + 1, n)
        b = rng.integers(lo[b_dt], hi[b_dt] + 1, n)
    acc = rng.integers(-2**30, 2**30, ins.lanes)
    np_dt = {"u8": np.uint8, "s8": np.int8}
    return acc.astype(np.int32), a.astype(np_dt[a_dt]), b.astype(np_dt[b_dt])


def _reference(ins, acc, a, b):
    return evaluate(ins.computation, {"a": a, "b": b}, acc)


X86_INSTRUCTIONS = [i for i in INSTRUCTIONS if i.arch == "x86_64"]


@pytest.mark.parametrize("ins", X86_INSTRUCTIONS, ids=lambda i: i.name)
def test_x86_instruction_matches_its_description(ins):
    target = host_target()
    if not ins.available(target):
        pytest.skip(f"this CPU lacks {', '.join(f for f in ins.features if not target.has(f))} for {ins.name}")
    run, _engine = _jit_instruction(ins, target)
    rng = np.random.default_rng(0)
    for trial in range(200):
        acc, a, b = _operands(ins, rng, extremes=trial == 0)
        if ins.name == "avx2_u8s8":  # the saturating sequence is used only for weights whose pairs cannot saturate
            b = (b // 2).astype(np.int8) if not pairs_cannot_saturate(b) else b
            assert pairs_cannot_saturate(b)
        out = np.empty_like(acc)
        run(acc.ctypes.data, a.ctypes.data, b.ctypes.data, out.ctypes.data)
        np.testing.assert_array_equal(out, _reference(ins, acc, a, b))


def test_avx2_pairs_saturate_unless_split_and_the_split_is_exact():
    """vpmaddubsw saturates a pair's 16-bit sum where the weights allow it; split_pairs moves the excess of such pairs
    into exact corrections, after which the sequence plus the corrections is the exact dot product."""
    ins = by_name("avx2_u8s8")
    target = parse_target("x86-64-v3")
    if missing_cpu_flags(target.required_cpu_flags):
        pytest.skip("this CPU lacks AVX2")
    run, _engine = _jit_instruction(ins, target)
    acc = np.zeros(8, np.int32)
    a = np.full(32, 255, np.uint8)
    b = np.full(32, 127, np.int8)  # 255 * 127 * 2 = 64770 > 32767: vpmaddubsw saturates each pair
    assert not pairs_cannot_saturate(b)
    want = _reference(ins, acc, a, b)
    got = np.empty_like(acc)
    run(acc.ctypes.data, a.ctypes.data, b.ctypes.data, got.ctypes.data)
    assert np.all(got == 2 * 32767) and np.all(want == 4 * 255 * 127)
    rng = np.random.default_rng(1)
    for trial in range(300):
        acc, a, b = _operands(ins, rng, extremes=trial == 0)
        safe, where, residual = split_pairs(b)
        assert pairs_cannot_saturate(safe)
        run(acc.ctypes.data, a.ctypes.data, safe.ctypes.data, got.ctypes.data)
        fixed = got.astype(np.int64)
        np.add.at(fixed, where // 4, a[where].astype(np.int64) * residual)  # lane of element 4i + j is i
        np.testing.assert_array_equal(fixed.astype(np.int32), _reference(ins, acc, a, b))
    assert pairs_cannot_saturate(np.array([64, -64, -128, 0, 100, 28, 127, -128, -64, -64], np.int8))
    assert not pairs_cannot_saturate(np.array([64, 65], np.int8))
    assert not pairs_cannot_saturate(np.array([-64, -65], np.int8))


def test_avx2_pairs_of_opposite_signs_never_saturate():
    """The bound split_pairs relies on, on the hardware: with u8 inputs a pair's extremes are 255 * (its positive
    weights' sum) and 255 * (its negative ones'), so pairs of opposite signs (127 and -128) and same-sign pairs up
    to |b0 + b1| = 128 are exact at both extremes, and one more saturates."""
    ins = by_name("avx2_u8s8")
    target = parse_target("x86-64-v3")
    if missing_cpu_flags(target.required_cpu_flags):
        pytest.skip("this CPU lacks AVX2")
    run, _engine = _jit_instruction(ins, target)
    exact = [(127, -128), (-128, 127), (64, 64), (-64, -64), (-128, 0), (100, 28), (-1, -127), (1, -128)]
    b = np.array(exact * 2, np.int8).reshape(-1)  # 16 pairs: 8 lanes of two pairs
    acc, got = np.zeros(8, np.int32), np.zeros(8, np.int32)
    for sign in (1, -1):  # each input 255 where its weight has this sign, 0 elsewhere: a pair's extreme
        a = np.where(np.sign(b.astype(np.int32)) == sign, 255, 0).astype(np.uint8)
        run(acc.ctypes.data, a.ctypes.data, b.ctypes.data, got.ctypes.data)
        np.testing.assert_array_equal(got, _reference(ins, acc, a, b))
    for pair in ((64, 65), (-64, -65)):
        b = np.array(pair * 16, np.int8)
        a = np.full(32, 255, np.uint8)
        run(acc.ctypes.data, a.ctypes.data, b.ctypes.data, got.ctypes.data)
        assert not np.array_equal(got, _reference(ins, acc, a, b))


@pytest.mark.parametrize("name,mnemonic", [("arm_sdot", "sdot"), ("arm_udot", "udot")])
def test_arm_dot_products_compile_to_their_instruction(name, mnemonic):
    ins = by_name(name)
    llvm = _llvm()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = ir.Module("arm")
    module.triple = "aarch64-unknown-linux-gnu"
    acc_t, src_t = ins.vector_types()
    fn = ir.Function(module, ir.FunctionType(acc_t, [acc_t, src_t, src_t]), "dot")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(ins.emit(b, *fn.args))
    mod = llvm.parse_assembly(str(module))
    machine = llvm.Target.from_triple(module.triple).create_target_machine(cpu="neoverse-n1",
                                                                           features="+neon,+dotprod")
    asm = machine.emit_assembly(mod)
    assert f"{mnemonic}\tv0.4s, v1.16b, v2.16b" in asm


def test_descriptions_evaluate_like_their_definitions():
    rng = np.random.default_rng(2)
    for ins in INSTRUCTIONS:
        if ins.name == "wmma_f16":
            a = rng.standard_normal((16, 16)).astype(np.float16)
            b = rng.standard_normal((16, 16)).astype(np.float16)
            c = rng.standard_normal((16, 16)).astype(np.float32)
            got = evaluate(ins.computation, {"a": a, "b": b}, c)
            np.testing.assert_allclose(got, c + a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-5)
            assert ins.accumulate_in_place and ins.emit is None
            continue
        acc, a, b = _operands(ins, rng)
        want = acc.astype(np.int64) + (a.astype(np.int64) * b.astype(np.int64)).reshape(ins.lanes, 4).sum(axis=1)
        np.testing.assert_array_equal(_reference(ins, acc, a, b), want.astype(np.int32))


def test_available_follows_the_target():
    v3 = parse_target("x86-64-v3")
    assert [i.name for i in available(v3)] == ["avx2_u8s8"]
    vnni = parse_target("cpu=x86-64-v4,+avx512vnni")
    assert [i.name for i in available(vnni, ("u8", "s8"))][0] == "avx512_vnni"
    assert available(v3, ("s8", "s8")) == []  # sdot's operands, but not on x86


# ---- the inspector ------------------------------------------------------------------------------------------


def _conv_nhwc(a_dt="u8", b_dt="s8", out_dt="s32"):
    return Computation(
        "conv2d_nhwc", (Loop("x", 14), Loop("y", 14), Loop("k", 64), Loop("r", 3, True), Loop("s", 3, True),
                        Loop("rc", 30, True)),
        access("c", out_dt, "x", "y", "k"),
        mul(out_dt, cast(out_dt, access("a", a_dt, "x+r", "y+s", "rc")), cast(out_dt, access("b", b_dt, "r", "s", "k", "rc"))))


def test_unit_worked_example_conv_on_vnni():
    """UNIT §3: conv NHWC u8 x RSKC s8 maps k -> i, rc -> j, with the input broadcast along i."""
    m = find_mapping(_conv_nhwc(), by_name("avx512_vnni"))
    assert dict(m.loops) == {"i": "k", "j": "rc"}
    assert dict(m.bind) == {"d": "c", "a": "a", "b": "b"}
    assert m.broadcast_of("a") == ("i",) and m.broadcast_of("b") == () and m.broadcast_of("d") == ()
    assert dict(m.padding) == {"rc": 32}  # 30 channels padded to whole groups of 4


def test_dtypes_and_casts_must_match():
    assert find_mapping(_conv_nhwc("s8", "s8"), by_name("avx512_vnni")) is None  # s8 x s8 is not VNNI's u8 x s8
    sdot = find_mapping(_conv_nhwc("s8", "s8"), by_name("arm_sdot"))
    assert dict(sdot.loops) == {"i": "k", "j": "rc"}
    assert find_mapping(_conv_nhwc("u8", "s8"), by_name("arm_sdot")) is None
    fp = Computation("mm", (Loop("m", 4), Loop("n", 16), Loop("k", 8, True)), access("c", "f32", "m", "n"),
                     mul("f32", access("a", "f32", "m", "k"), access("b", "f32", "k", "n")))
    assert all(find_mapping(fp, ins) is None for ins in INSTRUCTIONS)


def test_one_register_binds_one_array():
    square = Computation("sq", (Loop("i", 16), Loop("j", 4, True)), access("d", "s32", "i"),
                         mul("s32", cast("s32", access("a", "u8", "4*i+j")), cast("s32", access("a", "u8", "4*i+j"))))
    # an instruction that squares one register cannot take two different arrays ...
    xy = Computation("xy", (Loop("m", 16), Loop("k", 4, True)), access("y", "s32", "m"),
                     mul("s32", cast("s32", access("x", "u8", "4*m+k")), cast("s32", access("w", "u8", "4*m+k"))))
    assert find_mapping(xy, square) is None
    # ... while an operator that squares one array still matches an instruction with two registers
    xx = Computation("xx", (Loop("m", 16), Loop("k", 4, True)), access("y", "s32", "m"),
                     mul("s32", cast("s32", access("x", "u8", "4*m+k")), cast("s32", access("x", "u8", "4*m+k"))))
    assert find_mapping(xx, by_name("arm_udot")) is not None


def test_mappings_are_injective_and_innermost_first():
    conv = _conv_nhwc()
    found = mappings(conv, by_name("avx512_vnni"))
    assert all(len({op for _, op in m.loops}) == len(m.loops) for m in found)
    assert [dict(m.loops)["i"] for m in found[:3]] == ["k", "k", "k"]  # the innermost parallel loop first
    assert [dict(m.loops)["j"] for m in found[:3]] == ["rc", "s", "r"]
    # a 2-D instruction cannot put both of its parallel lanes on the operator's one parallel loop
    gemv = Computation("gemv", (Loop("m", 16), Loop("k", 16, True)), access("y", "f32", "m"),
                       mul("f32", cast("f32", access("A", "f16", "m", "k")), cast("f32", access("x", "f16", "k"))))
    assert mappings(gemv, by_name("wmma_f16")) == []


def test_an_access_needing_two_addresses_on_one_lane_is_rejected():
    # y[m] += a[m] * b[k, m]: with k -> j, operand a of VNNI (a[4i + j]) would need the same a[m] on every j of a
    # lane, which is a broadcast along j: allowed. But output y indexed by the reduction loop cannot be a lane.
    odd = Computation("odd", (Loop("m", 16), Loop("k", 4, True)), access("y", "s32", "k"),
                      mul("s32", cast("s32", access("a", "u8", "m")), cast("s32", access("b", "s8", "k", "m"))))
    assert find_mapping(odd, by_name("avx512_vnni")) is None


def test_index_parser():
    assert str(dim("4*i+j")) == "4*i+j" and dim("x+r").vars == {"x", "r"}
    assert dim("2*p-1").offset == -1 and dict(dim("2*p-1").terms) == {"p": 2}
    d = dim("(p-r)/2")
    assert not d.affine and d.vars == {"p", "r"}
