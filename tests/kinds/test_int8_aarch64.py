"""The int8 kinds for aarch64 (`--target aarch64-dotprod`): their tiles on sdot, the library cross-linked, and every
kernel run in onnxruntime's own aarch64 build under qemu-aarch64 (onnxopt/hardware/emulator.py) against exact
integer arithmetic, on shapes drawn from the same ranges as the x86 tests (test_qconv.py, test_qmatmul.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from int8_models import (conv_attrs, conv_int, conv_integer_model, conv_integer_operands, drop_shapes, grouping,
                         matmul_exact, matmul_integer_model, matmul_operands, qdq_conv_model, qdq_tail,
                         qgemm_case, qlinear_matmul_case, quantized_cnn)
from kind_harness import fuse_kind
from onnx import helper

from onnxopt.codegen.compile import compile_assembly
from onnxopt.codegen.glue.library import _cc
from onnxopt.codegen.target import parse_target
from onnxopt.errors import ToolchainError
from onnxopt.fusion.layout import to_blocked
from onnxopt.hardware import emulator
from onnxopt.kinds.qconv import KIND as QCONV
from onnxopt.kinds.qconv.find import forced_form
from onnxopt.kinds.qconv.layout import convert
from onnxopt.kinds.qmatmul import KIND as QMATMUL
from onnxopt.kinds.qmatmul.lower import instruction_for

TARGET = parse_target("aarch64-dotprod")


def _cross_cc() -> str | None:
    try:
        return _cc(TARGET)
    except ToolchainError as e:
        return str(e)


needs_cross_cc = pytest.mark.skipif(not _cross_cc().endswith("gcc"), reason="no aarch64 cross compiler "
                                    "(Debian's gcc-aarch64-linux-gnu; scripts/aarch64_sysroot.sh installs it)")
needs_qemu = pytest.mark.skipif(emulator.unavailable() is not None, reason=str(emulator.unavailable()))


def test_aarch64_targets():
    for spec in ("aarch64-dotprod", "cpu=neoverse-n1,+dotprod"):
        t = parse_target(spec)
        assert (t.arch, t.cpu, t.foreign, t.vector_bits) == ("aarch64", "neoverse-n1", True, 128)
        assert t.required_cpu_flags == ["asimd", "asimddp"]
        assert instruction_for(t).name == "arm_sdot"
    plain = parse_target("aarch64")
    assert plain.features == ("neon",) and plain.required_cpu_flags == ["asimd"]
    with pytest.raises(ValueError, match="no int8 dot-product instruction"):
        instruction_for(plain)  # Armv8.0 has none: the int8 units stay onnxruntime's


def _qdq_case(rng, cin, cout, r, s, stride, pad, dil, n, h, w, signed_in, signed_out, relu, per_channel, groups="one"):
    cin, cout, group = grouping(groups, cin, cout)
    attrs = conv_attrs(r, s, stride, pad, dil, h, w, group)
    if attrs is None:
        return None
    wt = rng.integers(-127, 128, (cout, cin // group, r, s)).astype(np.int8)
    sw = np.broadcast_to((rng.uniform(0.5, 2.0, cout if per_channel else 1) * 0.01).astype(np.float32),
                         (cout,)).astype(np.float32)
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    sx, sy = np.float32(0.02), np.float32(0.05 * np.sqrt(cin * r * s))
    zy = np.int8(rng.integers(-20, 20)) if signed_out else np.uint8(rng.integers(0, 256))
    xt = np.int8 if signed_in else np.uint8
    zx = np.array(int(rng.integers(0, 256)) - 128 * signed_in, xt)
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (n, cin, h, w), relu)
    x = (rng.integers(0, 256, (n, cin, h, w)) - 128 * signed_in).astype(xt)
    exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"], group)
    scale = (sx * sw / sy).astype(np.float32).reshape(1, -1, 1, 1)
    q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale).astype(np.int64)
    q = q + int(zy)
    if relu:
        q = np.maximum(q, int(zy))
    lo, hi = (-128, 127) if signed_out else (0, 255)
    return model, {"xq": x}, np.clip(q, lo, hi).astype(np.int8 if signed_out else np.uint8)


def _conv_integer_case(rng, cin, cout, r, s, stride, pad, dil, n, h, w, signed_in, unsigned_w, extreme, groups="one"):
    cin, cout, group = grouping(groups, cin, cout)
    attrs = conv_attrs(r, s, stride, pad, dil, h, w, group)
    if attrs is None:
        return None
    wshape = (cout, cin // group, r, s)
    wt, wz, x = conv_integer_operands(rng, wshape, (n, cin, h, w), unsigned_w, extreme)
    zx = int(rng.integers(0, 256))
    if signed_in:
        x, zx = (x.astype(np.int16) - 128).astype(np.int8), np.array(zx - 128, np.int8)
    else:
        zx = np.array(zx, np.uint8)
    model = conv_integer_model(wt, wz, attrs, (n, cin, h, w), helper.np_dtype_to_tensor_dtype(x.dtype))
    exact = conv_int(x, wt, zx, wz, attrs["strides"], attrs["pads"], attrs["dilations"], group)
    want = exact.astype(np.int32).astype(np.float32) * np.float32(0.01) + \
        np.linspace(-1, 1, cout).astype(np.float32).reshape(cout, 1, 1)
    return model, {"x": x, "zx": zx, "scale": np.array(0.01, np.float32)}, want


def _matmul_case(rng, k, n, m, lead, extreme, za_input):
    a, w = matmul_operands(rng, k, n, lead, m, extreme)
    za = int(rng.integers(0, 256)) if za_input else 0
    model = matmul_integer_model(k, n, w, lead, za_input)
    feeds = {"a": a, "scale": np.array(0.01, np.float32)}
    if za_input:
        feeds["za"] = np.array(za, np.uint8)
    return model, feeds, matmul_exact(a, w, za, 0.01, n)


def _cases(seed: int = 7) -> list:
    """(kind, model, feeds, exact result): the x86 tests' ranges (odd channels, groups and depthwise, padding,
    strides, dilations, batch 1-3, u8 and s8 activations and weights, corner values, per-channel scales, Relu, s8
    outputs), and every qconv form (the kind "packed" or "implicit": that form forced; depthwise has its own tile;
    the other stride-1 ones as the model chooses)."""
    rng = np.random.default_rng(seed)
    cases = []

    def geometry():
        return dict(cin=int(rng.integers(1, 25)), cout=int(rng.integers(1, 22)), r=int(rng.integers(1, 4)),
                    s=int(rng.integers(1, 4)), stride=int(rng.integers(1, 3)), pad=int(rng.integers(0, 3)),
                    dil=int(rng.integers(1, 3)), n=int(rng.integers(1, 4)), h=int(rng.integers(1, 12)),
                    w=int(rng.integers(1, 21)),
                    groups=str(rng.choice(["one", "one", "depthwise", "depthwise_x2", "two"])))

    def flag():
        return bool(rng.integers(0, 2))

    while len([c for c in cases if c[0] == "qdq"]) < 12:
        case = _qdq_case(rng, **geometry(), signed_in=flag(), signed_out=flag(), relu=flag(),
                         per_channel=flag())
        if case:
            cases.append(("qdq", *case))
    while len([c for c in cases if c[0] == "conv_integer"]) < 12:
        g = geometry()
        case = _conv_integer_case(rng, **g, signed_in=flag(), unsigned_w=flag(), extreme=flag())
        if case:
            cases.append(("conv_integer", *case))
    # the packed form past 64 output channels, and a deep implicit one
    cases.append(("packed", *_qdq_case(rng, 40, 70, 3, 3, 1, 1, 1, 1, 9, 13, False, False, True, True)))
    cases.append(("implicit", *_qdq_case(rng, 96, 24, 3, 3, 1, 1, 1, 2, 10, 18, True, False, False, True)))
    for i in range(10):
        cases.append(("matmul", *_matmul_case(rng, 4 * int(rng.integers(1, 200)), int(rng.integers(1, 71)),
                                              int(rng.integers(1, 41)), [int(v) for v in rng.integers(1, 4, i % 3)],
                                              extreme=i % 3 == 1, za_input=i != 4)))
    for k, n, lead, per_column in ((64, 40, [2, 7], True), (132, 19, [5], False)):
        cases.append(("matmul", *qlinear_matmul_case(rng, k, n, lead, per_column)))
    for m, k, n, trans_b, alpha in ((7, 48, 37, True, 1.0), (3, 100, 16, False, 0.75)):  # QGemm: its bias added
        cases.append(("matmul", *qgemm_case(rng, m, k, n, trans_b, True, True, alpha)))
    return cases


@needs_cross_cc
def test_the_tiles_run_on_sdot_and_the_library_is_aarch64(tmp_path):
    model, _, _ = _qdq_case(np.random.default_rng(0), 8, 12, 3, 3, 1, 1, 1, 1, 9, 13, False, False, True, True)
    fused, lib, region, ir_text = fuse_kind(QCONV, model, tmp_path, target=TARGET)
    asm = compile_assembly(ir_text, TARGET)
    assert "sdot\tv" in asm and "vpmaddubsw" not in asm
    with open(lib, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    assert b"getauxval" in open(lib, "rb").read()  # the library's CPU check reads the kernel's hardware caps
    mm, _, _ = _matmul_case(np.random.default_rng(1), 64, 40, 5, [], False, True)
    _, _, _, mm_ir = fuse_kind(QMATMUL, mm, tmp_path, name="mm.so", target=TARGET)
    assert "sdot\tv" in compile_assembly(mm_ir, TARGET)


@needs_qemu
def test_int8_kernels_are_exact_under_qemu(tmp_path):
    """Every case's kernel, alone in its model (the function bodies removed, so that only the kernel can run the
    node), in onnxruntime under qemu-aarch64 on an emulated Neoverse N1: bit for bit the exact integer result."""
    jobs, wants, forms = [], [], set()
    for i, (kind, model, feeds, want) in enumerate(_cases()):
        with forced_form(kind if kind in ("packed", "implicit") else None):
            fused, lib, region, _ = fuse_kind(QMATMUL if kind == "matmul" else QCONV, model, tmp_path,
                                              name=f"case{i}.so", target=TARGET)
        if kind != "matmul":
            forms.add("implicit" if region.params.implicit else "depthwise" if region.params.depthwise else
                      "grouped" if region.params.group > 1 else "packed")
        del fused.functions[:]
        path = str(tmp_path / f"case{i}.onnx")
        onnx.save(fused, path)
        jobs.append({"model": path, "library": lib, "inputs": feeds, "threads": 1 + i % 2})
        wants.append(want)
    assert forms == {"implicit", "depthwise", "grouped", "packed"}  # every form of the conv kernel is among them
    for i, (got, want) in enumerate(zip(emulator.run_sessions(jobs), wants)):
        assert got[0].dtype == want.dtype, i
        np.testing.assert_array_equal(got[0], want, err_msg=f"case {i}")


@needs_qemu
def test_blocked_int8_kernels_are_exact_under_qemu(tmp_path):
    """Kernels reading and writing the blocked int8 layout (kinds/qconv/layout.py) on sdot: packed and implicit
    forms, u8 activations flipped to s8 a word at a time and s8 ones as they are, bit for bit."""
    rng = np.random.default_rng(21)
    jobs, wants = [], []
    for i, (cin, cout, r, stride, pad, w, signed_in) in enumerate(((7, 9, 3, 2, 1, 13, False),
                                                                     (12, 70, 1, 1, 0, 20, True),
                                                                     (6, 5, 3, 1, 1, 16, False))):
        model, feeds, want = _qdq_case(rng, cin, cout, r, r, stride, pad, 1, 2, 6, w, signed_in, False, True, True)
        shapes = {"xq": list(feeds["xq"].shape), "y": list(want.shape)}
        with forced_form("implicit" if i == 2 else "packed"):
            fused, lib, region, _ = fuse_kind(QCONV, model, tmp_path, name=f"blocked{i}.so", target=TARGET,
                                              convert=lambda rg: convert(rg, True, True, shapes.get, 17))
        assert region.params.implicit == (i == 2)
        del fused.functions[:]
        drop_shapes(fused, {"xq", "y"})
        onnx.save(fused, tmp_path / f"blocked{i}.onnx")
        jobs.append({"model": str(tmp_path / f"blocked{i}.onnx"), "library": lib,
                     "inputs": {"xq": to_blocked(feeds["xq"], 4)}})
        wants.append(to_blocked(want, 4))
    for i, (got, want) in enumerate(zip(emulator.run_sessions(jobs), wants)):
        np.testing.assert_array_equal(got[0], want, err_msg=f"case {i}")


@needs_qemu
def test_tails_through_tables_are_exact_under_qemu(tmp_path):
    """A QDQ unit with its elementwise tail as tables (kinds/qconv/lookup.py: a load a lane on aarch64), on sdot and
    on the depthwise tile: the tables' bytes at the exact convolution's values, bit for bit."""
    from onnx import TensorProto, numpy_helper

    from onnxopt.timing import make_session

    rng = np.random.default_rng(23)
    jobs, wants = [], []
    for i, (cin, cout, group, kind) in enumerate(((9, 13, 1, "bn_hardswish"), (12, 12, 12, "silu"))):
        attrs = conv_attrs(3, 3, 1, 1, 1, 7, 11, group)
        wt = rng.integers(-127, 128, (cout, cin // group, 3, 3)).astype(np.int8)
        sw = (rng.uniform(0.5, 2.0, cout) * 0.01).astype(np.float32)
        bias = rng.integers(-3000, 3000, cout).astype(np.int32)
        sx, sy, zx, zy = np.float32(0.02), np.float32(0.3), np.array(7, np.uint8), np.uint8(100)
        model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (1, cin, 7, 11), False)
        tail, inits = qdq_tail(kind, cout, rng, False)
        model.graph.node.extend(tail)
        model.graph.initializer.extend(inits)
        del model.graph.output[:]
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.UINT8, None))
        model = onnx.shape_inference.infer_shapes(model)
        fused, lib, region, _ = fuse_kind(QCONV, model, tmp_path, name=f"tail{i}.so", target=TARGET)
        assert region.params.lut and region.params.depthwise == (group > 1)
        x = rng.integers(0, 256, (1, cin, 7, 11)).astype(np.uint8)
        exact = conv_int(x, wt, int(zx), 0, attrs["strides"], attrs["pads"], attrs["dilations"], group)
        scale = (sx * sw / sy).astype(np.float32).reshape(1, -1, 1, 1)
        q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale)
        q = np.clip(q.astype(np.int64) + int(zy), 0, 255).astype(np.uint8)
        tg = helper.make_graph(tail, "t", [helper.make_tensor_value_info("y", TensorProto.UINT8, list(q.shape))],
                               [model.graph.output[0]], inits + [numpy_helper.from_array(sy, "sy"),
                                                                 numpy_helper.from_array(zy, "zy")])
        wants.append(make_session(helper.make_model(tg, opset_imports=[helper.make_opsetid("", 17)]), 1)
                     .run(None, {"y": q})[0])
        del fused.functions[:]
        onnx.save(fused, tmp_path / f"tail{i}.onnx")
        jobs.append({"model": str(tmp_path / f"tail{i}.onnx"), "library": lib, "inputs": {"xq": x}})
    for i, (got, want) in enumerate(zip(emulator.run_sessions(jobs), wants)):
        np.testing.assert_array_equal(got[0], want, err_msg=f"case {i}")


@needs_qemu
def test_a_core_without_dot_products_runs_the_function_bodies(tmp_path):
    """On an emulated Cortex-A53 (Armv8.0, no sdot) the library's CPU check registers nothing: the model runs its
    function bodies and gives the same answer, and without them the node has no implementation (no SIGILL)."""
    model, feeds, want = _qdq_case(np.random.default_rng(3), 8, 12, 3, 3, 1, 1, 1, 1, 9, 13, False, False, True,
                                   True)
    fused, lib, _, _ = fuse_kind(QCONV, model, tmp_path, target=TARGET)
    onnx.save(fused, tmp_path / "with.onnx")
    del fused.functions[:]
    onnx.save(fused, tmp_path / "without.onnx")
    (got,) = emulator.run_sessions([{"model": str(tmp_path / "with.onnx"), "library": lib, "inputs": feeds}],
                                   cpu="cortex-a53")[0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ToolchainError, match="is not a registered function/op"):
        emulator.run_sessions([{"model": str(tmp_path / "without.onnx"), "library": lib, "inputs": feeds}],
                              cpu="cortex-a53")


@needs_qemu
def test_the_cli_cross_compiles_and_checks_the_model_under_qemu(tmp_path):
    """onnxruntime's quantize_static on a small CNN, optimized with --target aarch64-dotprod: an aarch64 library
    whose int8 kernels were not run here, and the whole model checked with it under emulation."""
    rng = np.random.default_rng(5)
    weights = {n: (rng.standard_normal(s) * 0.2).astype(np.float32)
               for n, s in (("w1", (16, 3, 3, 3)), ("b1", (16,)), ("w2", (24, 16, 3, 3)), ("b2", (24,)))}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["y"])]
    qpath = quantized_cnn(str(tmp_path), nodes, weights, (1, 3, 32, 32), rng)
    out = tmp_path / "fused.onnx"
    r = subprocess.run([sys.executable, "-m", "onnxopt", qpath, "-o", str(out), "--target",
                        "aarch64-dotprod", "--report", str(tmp_path / "report.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"]["triple"].startswith("aarch64") and "kernels_not_run" in report
    v = report["verification"]
    assert v["ok"] and v["library"] and v["emulated"].startswith("qemu-aarch64 -cpu neoverse-n1")
    assert sum(r["op_type"].startswith("qconv_") for r in report["regions"]) == 2
    with open(f"{out}.so", "rb") as f:
        assert int.from_bytes(f.read(20)[18:20], "little") == 183
    assert os.path.exists(out) and "under qemu-aarch64" in r.stdout + r.stderr
