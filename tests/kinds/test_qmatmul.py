"""The qmatmul kind: int8 GEMMs of dynamically quantized models (MatMulInteger -> Cast -> scale -> bias -> ...) on
the target's dot-product instruction, exact in int32 and checked against onnxruntime and against exact integer
arithmetic."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from int8_models import matmul_exact, matmul_integer_model, matmul_operands, qlinear_matmul_case, quantized_cnn
from kind_harness import avx512_vnni_target, fuse_kind
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.instructions import available
from onnxopt.codegen.instructions.avx2_u8s8 import pairs_cannot_saturate
from onnxopt.codegen.target import host_target
from onnxopt.kinds import KINDS
from onnxopt.kinds.qmatmul import KIND
from onnxopt.kinds.qmatmul.find import find_regions, pack
from onnxopt.kinds.qmatmul.params import QUANT
from onnxopt.measure import exact_integer_reference
from onnxopt.timing import make_session

pytestmark = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


def _fp32_model(k, n, epilogue="bias", seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), "bias")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", k])]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "bias"], ["y"])]
    if epilogue == "gelu":
        for name, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
            inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
        nodes[-1].output[0] = "y0"
        nodes += [helper.make_node("Div", ["y0", "sqrt2"], ["g1"]), helper.make_node("Erf", ["g1"], ["g2"]),
                  helper.make_node("Add", ["g2", "one"], ["g3"]), helper.make_node("Mul", ["y0", "g3"], ["g4"]),
                  helper.make_node("Mul", ["g4", "half"], ["y"])]
    elif epilogue == "residual":
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", "tokens", n]))
        nodes[-1].output[0] = "y0"
        nodes.append(helper.make_node("Add", ["y0", "r"], ["y"]))
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def _quantized(tmp_path, model):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    return onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "q.onnx"))


def test_the_kind_is_registered_first():
    assert KIND in KINDS and KIND.first


@pytest.mark.parametrize("epilogue", ["bias", "gelu", "residual"])
@pytest.mark.parametrize("k,n", [(64, 40), (768, 200), (12, 3)])
def test_quantize_dynamic_output_matches_onnxruntime(tmp_path, epilogue, k, n):
    q = _quantized(tmp_path, _fp32_model(k, n, epilogue))
    fused, lib, region, _ = fuse_kind(KIND, q, tmp_path)
    kinds = [nd.op_type for nd in fused.graph.node]
    assert kinds[:2] == ["DynamicQuantizeLinear", "Mul"] and kinds[2].startswith("qmatmul_") and len(kinds) == 3
    rng = np.random.default_rng(k + n)
    feeds = {"x": rng.standard_normal((2, 37, k)).astype(np.float32)}
    if epilogue == "residual":
        feeds["r"] = rng.standard_normal((2, 37, n)).astype(np.float32)
    # The reference sums exactly, as the spec says (onnxruntime's AVX2 MatMulInteger saturates 16-bit pair sums:
    # measure.exact_integer_reference); the fallback runs onnxruntime's own MatMulInteger on the rebuilt B.
    want = make_session(exact_integer_reference(q), 1, optimization="none").run(None, feeds)[0]
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    alone = make_session(fused, 1).run(None, feeds)[0]
    ort_own = make_session(q, 1).run(None, feeds)[0]
    np.testing.assert_allclose(alone, ort_own, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(k4=st.integers(1, 200), n=st.integers(1, 70), m=st.integers(1, 40), lead=st.lists(st.integers(1, 3), max_size=2),
       za=st.integers(0, 255), extreme=st.booleans(), seed=st.integers(0, 2**16))
def test_exact_integer_sums_on_drawn_shapes(tmp_path_factory, k4, n, m, lead, za, extreme, seed):
    """Every drawn shape against exact integer arithmetic, with A and B at the corners of their ranges where drawn
    (where onnxruntime's own AVX2 kernel saturates its 16-bit pair sums, this kernel does not)."""
    k = 4 * k4
    rng = np.random.default_rng(seed)
    a, w = matmul_operands(rng, k, n, lead, m, extreme)
    tmp = tmp_path_factory.mktemp("q")
    model = matmul_integer_model(k, n, w, lead)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp)
    feeds = {"a": a, "scale": np.array(0.01, np.float32), "za": np.array(za, np.uint8)}
    got = make_session(fused, 2, library=lib).run(None, feeds)[0]
    np.testing.assert_array_equal(got, matmul_exact(a, w, za, 0.01, n))
    alone = make_session(fused, 1).run(None, feeds)[0]
    np.testing.assert_allclose(alone, make_session(model, 1, optimization="none").run(None, feeds)[0], rtol=1e-6)
    exact = make_session(exact_integer_reference(model), 1, optimization="none").run(None, feeds)[0]
    np.testing.assert_array_equal(exact, matmul_exact(a, w, za, 0.01, n))  # the driver's reference is the exact sum


@pytest.mark.parametrize("n", [64, 49, 70, 200])
def test_wide_tiles_are_exact(tmp_path, n):
    """On a 16-lane target the tile takes 4 panels (64 columns) at once and up to 6 rows (lower.py wide_shape):
    exact against integer arithmetic for a whole group of panels (64), one whose last panel is partial (49), a
    group and a one-panel rest (70), and many groups (200); at row counts that give 6-row tiles, nearly equal ones
    (32 rows: 6, 6, 5, 5, 5, 5) and one-row tiles; with A and B at the corners of their ranges, where B has
    corrections in several panels of a group."""
    target = avx512_vnni_target()
    k, rng = 132, np.random.default_rng(n)
    a, w = matmul_operands(rng, k, n, [1], 37, extreme=True)
    assert (pack(w)["fix_offsets"][1:] > pack(w)["fix_offsets"][:-1]).sum() >= 2  # corrections in 2+ panels
    model = matmul_integer_model(k, n, w, [1])
    fused, lib, region, ir_text = fuse_kind(KIND, model, tmp_path, target=target)
    assert f"{region.op_type}_w6" in ir_text and f"{region.op_type}_w1" in ir_text
    for m in (37, 32, 6, 1):
        rows = np.ascontiguousarray(a[:, :m])
        feeds = {"a": rows, "scale": np.array(0.01, np.float32), "za": np.array(7, np.uint8)}
        for threads in (1, 2):
            got = make_session(fused, threads, library=lib).run(None, feeds)[0]
            np.testing.assert_array_equal(got, matmul_exact(rows, w, 7, 0.01, n), err_msg=f"n {n} m {m}")


def test_wide_tiles_requantize_exactly(tmp_path):
    """QLinearMatMul (QUANT: per-column scales, read across the group's 4 panels) on the wide tiles: bit for bit."""
    model, feeds, want = qlinear_matmul_case(np.random.default_rng(5), 96, 150, [2, 13], True)
    fused, lib, region, ir_text = fuse_kind(KIND, model, tmp_path)
    if available(host_target(), ("u8", "s8"))[0].lanes == 16:
        assert f"{region.op_type}_w6" in ir_text
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)


def test_packing_round_trips_and_no_pair_can_saturate():
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (96, 37)).astype(np.int8)
    t = pack(w)
    assert t["packed"].shape == (3, 24, 16, 4) and pairs_cannot_saturate(t["packed"])
    safe = t["packed"].transpose(1, 3, 0, 2).reshape(96, 48)[:, :37].astype(np.int32)
    safe[t["fix_index"][:, 0], t["fix_index"][:, 1]] += t["fix_update"]
    np.testing.assert_array_equal(safe, w)
    np.testing.assert_array_equal(t["colsum"][:37], w.astype(np.int32).sum(axis=0))
    assert t["fix_offsets"][0] == 0 and t["fix_offsets"][-1] == len(t["fix_entries"])
    per_panel = np.diff(t["fix_offsets"])
    for p in range(3):  # each panel's entries: k, the column within the panel, the residual
        e = t["fix_entries"][t["fix_offsets"][p]:t["fix_offsets"][p + 1]]
        assert len(e) == per_panel[p] and np.all((e[:, 1] >= 0) & (e[:, 1] < 16))


def test_refusals_say_why():
    w = np.ones((6, 5), np.int8)
    rejected = []
    assert find_regions(matmul_integer_model(6, 5, w, []), set(), rejected) == []
    assert "multiple of 4" in rejected[0]["reason"]
    m = matmul_integer_model(8, 5, np.ones((8, 5), np.int8), [])
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(3, np.int8), "wz"))
    rejected = []
    assert find_regions(m, set(), rejected) == [] and "zero point" in rejected[0]["reason"]
    m = matmul_integer_model(8, 5, np.ones((8, 5), np.int8), [])
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT8
    rejected = []
    assert find_regions(m, set(), rejected) == [] and "u8 activations" in rejected[0]["reason"]


@pytest.mark.parametrize("spec,mnemonic,reg", [("cpu=x86-64-v4,+avx512vnni", "vpdpbusd", "zmm"),
                                               ("cpu=x86-64-v3,+avxvnni", "{vex}\tvpdpbusd", "ymm"),
                                               ("x86-64-v3", "vpmaddubsw", "ymm")])
def test_the_tile_compiles_to_each_targets_instruction(tmp_path, spec, mnemonic, reg):
    """The tiles of every x86 target, whether or not this CPU can run them (VNNI hosts run the tests above on
    vpdpbusd): each takes the target's best u8 x s8 instruction, one per accumulator and K group."""
    from onnxopt.codegen.compile import compile_assembly, new_module
    from onnxopt.codegen.target import parse_target
    from onnxopt.kinds.qmatmul.lower import define_tile, instruction_for

    target = parse_target(spec)
    q = _quantized(tmp_path, _fp32_model(64, 40, "gelu"))
    (region,) = find_regions(q, set(), [])
    ins = instruction_for(target)
    module = new_module(target, "q")
    define_tile(module, "tile", region.params, region.program, ins.emit, ins.lanes, region.params.mr)
    asm = compile_assembly(str(module), target)
    per_step = region.params.mr * (16 // ins.lanes)  # accumulators of the mr-row tile
    assert asm.count(mnemonic) >= per_step and f"%{reg}" in asm


@pytest.mark.parametrize("k,n,lead,per_column", [(64, 40, [2, 7], True), (128, 33, [5], False), (12, 3, [1, 3], True)])
def test_qlinearmatmul_requantizes_exactly(tmp_path, k, n, lead, per_column):
    """The QOperator format's QLinearMatMul: the int8 GEMM with QLinearMatMul's requantization per column, bit for
    bit the spec's result (onnxruntime's AVX2 kernel saturates its pair sums and is off by up to 32 steps here); the
    fallback is the QLinearMatMul on the rebuilt B."""
    model, feeds, want = qlinear_matmul_case(np.random.default_rng(k + n), k, n, lead, per_column)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert [nd.op_type[:8] for nd in fused.graph.node] == ["qmatmul_"] and region.params.mode == QUANT
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)
    np.testing.assert_array_equal(make_session(fused, 1).run(None, feeds)[0],
                                  make_session(model, 1).run(None, feeds)[0])
    steps = make_session(exact_integer_reference(model), 1, optimization="none").run(None, feeds)[0]
    assert np.all(np.abs(want - steps.astype(np.float64)) <= 0.5 + 1e-3)  # the driver's stepped reference


@pytest.mark.parametrize("qoperator", [False, True])
def test_a_statically_quantized_mlp_is_fused_in_either_format(tmp_path, qoperator):
    """quantize_static of MatMul -> Add -> Relu -> MatMul: QDQ MatMul units (their DequantizeLinear -> MatMul ->
    QuantizeLinear) or QLinearMatMuls, each one int8 GEMM kernel; the model checks out against onnxruntime's own
    spread from the spec."""
    from onnxopt import optimize

    rng = np.random.default_rng(3)
    weights = {"w1": (rng.standard_normal((64, 48)) * 0.2).astype(np.float32),
               "b1": (rng.standard_normal(48) * 0.1).astype(np.float32),
               "w2": (rng.standard_normal((48, 32)) * 0.2).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["y"])]
    qpath = quantized_cnn(str(tmp_path), nodes, weights, (2, 16, 64), rng, qoperator=qoperator)
    ops = [nd.op_type for nd in onnx.load(qpath).graph.node]
    assert ops.count("QLinearMatMul" if qoperator else "MatMul") == 2
    result = optimize(qpath, str(tmp_path / "out.onnx"), measure=False)
    assert sum(r["op_type"].startswith("qmatmul_") for r in result.report["regions"]) == 2
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 9), k4=st.integers(1, 40), n=st.integers(1, 40), trans_b=st.booleans(),
       per_column=st.booleans(), bias=st.booleans(), alpha=st.sampled_from([1.0, 0.5, 1.7]),
       seed=st.integers(0, 2**16))
def test_qgemm_requantizes_exactly(tmp_path_factory, m, k4, n, trans_b, per_column, bias, alpha, seed):
    """com.microsoft QGemm (the QOperator format's Gemm): B transposed or not, an int32 bias a column, alpha, u8
    output (onnxruntime's QGemm gives s8 only for s8 A); bit for bit QGemm's own definition (the bias added to the
    exact int32 sums, then alpha * a_scale * b_scale / y_scale), and the fallback is onnxruntime's QGemm on the
    rebuilt B."""
    from int8_models import qgemm_case

    tmp_path = tmp_path_factory.mktemp("qgemm")
    model, feeds, want = qgemm_case(np.random.default_rng(seed), m, 4 * k4, n, trans_b, per_column, bias, alpha)
    fused, lib, region, _ = fuse_kind(KIND, model, tmp_path)
    assert [nd.op_type[:8] for nd in fused.graph.node] == ["qmatmul_"] and region.params.has_bias == bias
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)
    steps = make_session(exact_integer_reference(model), 1, optimization="none").run(None, feeds)[0]
    assert np.all(np.abs(want - steps.astype(np.float64)) <= 0.5 + 1e-3)  # the driver's stepped reference
    # The function body (QGemm on the rebuilt B, untransposed): onnxruntime's AVX2 kernel may saturate its pair
    # sums, so it is compared with the QGemm as it was, which runs the same kernel on the same B.
    np.testing.assert_array_equal(make_session(fused, 1).run(None, feeds)[0],
                                  make_session(model, 1).run(None, feeds)[0])


@pytest.mark.parametrize("qoperator", [False, True])
def test_a_statically_quantized_gemm_mlp_is_fused_in_either_format(tmp_path, qoperator):
    """quantize_static of Gemm(transB) -> Relu -> Gemm, as the torch exporter writes a classifier's Linear layers:
    QDQ Gemm units (their bias an int32 DequantizeLinear, the Relu between the Gemm and its QuantizeLinear) or the
    contrib QGemm, each one int8 GEMM kernel with its bias; the model checks out against the spec."""
    from onnxopt import optimize

    rng = np.random.default_rng(5)
    weights = {"w1": (rng.standard_normal((48, 64)) * 0.2).astype(np.float32),
               "b1": (rng.standard_normal(48) * 0.1).astype(np.float32),
               "w2": (rng.standard_normal((48, 20)) * 0.2).astype(np.float32),
               "b2": (rng.standard_normal(20) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["a1"], transB=1), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["y"])]
    qpath = quantized_cnn(str(tmp_path), nodes, weights, (3, 64), rng, qoperator=qoperator)
    ops = [nd.op_type for nd in onnx.load(qpath).graph.node]
    assert ops.count("QGemm" if qoperator else "Gemm") == 2
    result = optimize(qpath, str(tmp_path / "out.onnx"), measure=False)
    regions = [r for r in result.report["regions"] if r["op_type"].startswith("qmatmul_")]
    assert len(regions) == 2, result.report.get("rejected")
    assert result.report["verification"]["ok"] and result.report["fallback_verification"]["ok"]
    fused = onnx.load(tmp_path / "out.onnx")
    assert not [nd.op_type for nd in fused.graph.node if nd.op_type in ("Gemm", "QGemm")]
    if qoperator:  # the written model's native kernels are QGemm's exact integer arithmetic, end to end
        x = {"x": rng.standard_normal((3, 64)).astype(np.float32)}
        got = make_session(fused, 2, library=str(tmp_path / "out.onnx.so")).run(None, x)[0]
        want = make_session(exact_integer_reference(onnx.load(qpath)), 1, optimization="none").run(None, x)[0]
        np.testing.assert_array_equal(got, want)


def test_qgemm_as_the_spec_defines_it_and_its_inferred_shape():
    """The whole-model check's float reference for a QGemm (graph/quantized.py qlinear_as_float: DequantizeLinear ->
    Gemm with alpha, transB undone, the bias scaled -> QuantizeLinear) lands within a step of QGemm's exact result,
    and shape inference (graph/infer.py) gives a QGemm's output its [M, N] and type through its standard twin."""
    from int8_models import qgemm_case

    from onnxopt.graph.infer import infer
    from onnxopt.graph.quantized import qlinear_as_float

    model, feeds, want = qgemm_case(np.random.default_rng(11), 5, 32, 20, True, True, True, 1.7)
    got = make_session(qlinear_as_float(model), 1, optimization="none").run(None, feeds)[0]
    assert np.max(np.abs(got.astype(np.int32) - want.astype(np.int32))) <= 1
    model.graph.node[0].output[0] = "q"
    model.graph.node.append(helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"]))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    (vi,) = [v for v in infer(model).graph.value_info if v.name == "q"]
    assert vi.type.tensor_type.elem_type == TensorProto.UINT8
    assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [5, 20]
