"""optimize() end to end: real models, real kernels, real onnxruntime; and nothing lost on failure."""

import os
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxopt
import onnxopt.runtime as rt
from onnxopt.errors import InputError, UsageError, VerificationError
from onnxopt.models import build_model


def _run(path, feeds, runtime=False):
    s = rt.InferenceSession(path) if runtime else ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("name,kw,pattern", [
    # The activations after a convolution or matmul become its epilogue.
    ("mobilenetv3", {"image_size": 64}, "Conv -> Add -> Clip -> Mul -> Div"),
    ("yolo", {"image_size": 64}, "Conv -> Sigmoid -> Mul"),
    ("bert", {}, "MatMul -> Add -> Div -> Erf -> Add -> Mul -> Mul"),
    # Without compute fusion the same chains are elementwise regions of their own.
    ("mobilenetv3", {"image_size": 64, "skip_fusion": ["compute"]}, "Add -> Clip -> Mul -> Div"),
    ("yolo", {"image_size": 64, "skip_fusion": ["compute"]}, "Sigmoid -> Mul"),
])
def test_models_fuse_their_decomposed_activations(name, kw, pattern, tmp_path):
    kw = dict(kw)
    skip = kw.pop("skip_fusion", None)
    src = str(tmp_path / "m.onnx")
    onnx.save(build_model(name, **kw), src)
    out = str(tmp_path / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False, skip_fusion=skip)
    patterns = {r["ops"] for r in res.report["regions"]}
    assert pattern in patterns, patterns
    assert res.report["verification"]["ok"]
    assert sum(res.report["after"].values()) < sum(res.report["before"].values())
    fused = onnx.load(out)
    onnx.checker.check_model(fused, full_check=True)
    assert fused.functions and all(f.domain == "onnxopt" for f in fused.functions)
    from onnxopt.graph.ort_compat import max_ir_version

    assert fused.ir_version <= max_ir_version()


def test_nasnet_graph_rewrites_leave_no_pad_or_cell_relu_and_the_same_answer(tmp_path):
    """The factorized reductions' Pad -> Slice -> AveragePool chains become convolution strides (and one Slice);
    the cell outputs' Relus move into the kernels before the Concats (graph/subsample_conv.py,
    graph/unary_through_concat.py)."""
    src = str(tmp_path / "nasnet.onnx")
    onnx.save(build_model("nasnet_a", image_size=32), src)
    out = str(tmp_path / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False)
    assert res.report["rewrites"] == {"subsampling_into_convs": 3 * 3, "unary_through_concats": 3 * 3,
                                      "classifiers_as_convs": 1, "conv1d_as_conv2d": 0, "transpose_chains_merged": 0}
    assert res.report["verification"]["ok"]
    fused = onnx.load(out)
    plain = [m.op_type for m in fused.graph.node if m.domain == ""]
    assert "Pad" not in plain and "AveragePool" not in plain and plain.count("Slice") == 3
    assert "Relu" not in plain, plain  # every Relu is in a kernel
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(_run(out, feeds, runtime=True)[0], _run(src, feeds)[0], rtol=1e-3, atol=1e-3)


def test_large_weights_of_a_large_model_are_timed_cold(tmp_path, monkeypatch):
    """A classifier Gemm with 2 MB of weights, judged alone, in a model whose weights exceed the last-level cache
    (a machine with a 64 KiB one): its check times both sides with the caches flushed before each run, and the
    timing is stored apart from a warm one. (Whether the Gemm is then emitted is the whole-model timing's call.)"""
    from onnxopt.cost_cache import CostCache
    from onnxopt.hardware import measure

    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((512, 1024)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(1024).astype(np.float32), "b")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "fc",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], [w, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "costs.sqlite")

    def check(tag):
        res = onnxopt.optimize(model, str(tmp_path / f"{tag}.onnx"), cost_cache=path, min_speedup=0.0, threads=2)
        (gemm,) = [e["op_type"] for e in res.report["regions"] + res.report["rejected"] if e.get("ops") == "Gemm"]
        cache = CostCache(path)
        try:
            return [cache.get_region(gemm, [[1, 512]], 2, cold) is not None for cold in (False, True)]
        finally:
            cache.close()

    monkeypatch.setattr(measure, "cache_levels", lambda cpus=None: [measure.CacheLevel(3, 64 << 10, 1, 2)])
    assert check("cold") == [False, True]  # a cold timing only
    monkeypatch.undo()
    assert check("warm") == [True, True]  # this machine's cache holds 2 MB: timed warm, stored beside it


def test_bert_keeps_symbolic_dims(tmp_path):
    src = str(tmp_path / "bert.onnx")
    onnx.save(build_model("bert"), src)
    out = str(tmp_path / "fused.onnx")
    onnxopt.optimize(src, out, measure=False)
    fused = onnx.load(out)
    dims = [d.dim_param for d in fused.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]
    rng = np.random.default_rng(0)
    for seq in (7, 40):
        feeds = {i.name: rng.integers(0, 2, size=(2, seq)).astype(np.int64) for i in fused.graph.input}
        for a, b in zip(_run(src, feeds), _run(out, feeds, runtime=True)):
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)


def test_input_shape_fixes_dims(tmp_path):
    src = str(tmp_path / "bert.onnx")
    onnx.save(build_model("bert"), src)
    out = str(tmp_path / "fused.onnx")
    onnxopt.optimize(src, out, measure=False, input_shape=["input_ids:1,16", "attention_mask:1,16",
                                                           "token_type_ids:1,16"])
    dims = [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 16]
    with pytest.raises(UsageError, match="model's inputs are"):
        onnxopt.optimize(src, str(tmp_path / "x.onnx"), input_shape=["nope:1,2"])


def test_never_writes_over_the_input(tmp_path):
    src = str(tmp_path / "m.onnx")
    onnx.save(build_model("mobilenetv3", image_size=32), src)
    before = open(src, "rb").read()
    with pytest.raises(UsageError, match="never writes over its input"):
        onnxopt.optimize(src, src)
    os.symlink(src, tmp_path / "link.onnx")
    with pytest.raises(UsageError):
        onnxopt.optimize(src, str(tmp_path / "link.onnx"))
    assert open(src, "rb").read() == before


def test_failed_verification_leaves_nothing(tmp_path):
    """GELU through our erf differs from onnxruntime's in the last bits: a zero tolerance must fail cleanly."""
    src = str(tmp_path / "bert.onnx")
    onnx.save(build_model("bert"), src)
    out = str(tmp_path / "out" / "fused.onnx")
    os.makedirs(os.path.dirname(out))
    with pytest.raises(VerificationError, match="nothing was written"):
        onnxopt.optimize(src, out, measure=False, rtol=0.0, atol=0.0, scale_tol=0.0)
    assert os.listdir(os.path.dirname(out)) == []


def test_unreadable_and_missing_inputs(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(InputError, match="not a readable ONNX model"):
        onnxopt.optimize(str(bad), str(tmp_path / "o.onnx"))
    with pytest.raises(InputError, match="no such file"):
        onnxopt.optimize(str(tmp_path / "missing.onnx"), str(tmp_path / "o.onnx"))


def test_external_data_round_trip(tmp_path):
    src = str(tmp_path / "ext.onnx")
    onnx.save_model(build_model("mobilenetv3", image_size=32), src, save_as_external_data=True,
                    location="ext.onnx.weights", size_threshold=0)
    out = str(tmp_path / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False)
    assert res.report["input"]["external_data"]
    assert os.path.exists(out + ".data")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"input": x}, runtime=True)[0], _run(src, {"input": x})[0],
                               rtol=1e-4, atol=1e-5)


def _hardswish(x, out, prefix):
    return [helper.make_node("Add", [x, "three"], [prefix + "a"]),
            helper.make_node("Clip", [prefix + "a", "zero", "six"], [prefix + "c"]),
            helper.make_node("Mul", [x, prefix + "c"], [prefix + "m"]),
            helper.make_node("Div", [prefix + "m", "six"], [out])]


def test_control_flow_and_custom_domains_pass_through(tmp_path):
    """An If whose branches read an outer tensor, and a custom-domain op defined by a model-local function."""
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("three", 3.0), ("six", 6.0),
                                                                            ("zero", 0.0))]
    then_g = helper.make_graph([helper.make_node("Neg", ["h"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2, 40])])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["h"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2, 40])])
    nodes = _hardswish("x", "h", "hs_") + [
        helper.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Scale2", ["branch"], ["y"], domain="mycompany"),
    ]
    func = helper.make_function("mycompany", "Scale2", ["X"], ["Y"], [helper.make_node("Add", ["X", "X"], ["Y"])],
                                [helper.make_opsetid("", 17)])
    g = helper.make_graph(nodes, "cf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 40]),
                                        helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 40])], initializer=consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mycompany", 1)],
                          functions=[func])
    m.ir_version = 8
    src = str(tmp_path / "cf.onnx")
    onnx.save(m, src)
    out = str(tmp_path / "fused.onnx")
    res = onnxopt.optimize(src, out, measure=False)
    assert res.report["fused_regions"] == 1
    fused = onnx.load(out)
    kinds = [(n.domain, n.op_type) for n in fused.graph.node]
    assert ("", "If") in kinds and ("mycompany", "Scale2") in kinds
    assert any(f.domain == "mycompany" for f in fused.functions)
    x = np.random.default_rng(0).standard_normal((2, 40)).astype(np.float32) * 4
    for c in (True, False):
        feeds = {"x": x, "cond": np.array(c)}
        np.testing.assert_allclose(_run(out, feeds, runtime=True)[0], _run(src, feeds)[0], rtol=1e-5, atol=1e-6)


def test_intermediate_graph_output_stays_materialized(tmp_path):
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("three", 3.0), ("six", 6.0),
                                                                            ("zero", 0.0))]
    g = helper.make_graph(_hardswish("x", "y", "p_"), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                            [3, 50])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 50]),
                           helper.make_tensor_value_info("p_c", TensorProto.FLOAT, [3, 50])], initializer=consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src = str(tmp_path / "m.onnx")
    onnx.save(m, src)
    out = str(tmp_path / "f.onnx")
    res = onnxopt.optimize(src, out, measure=False)
    assert set(res.report["regions"][0]["outputs"]) == {"y", "p_c"}
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32) * 4
    for a, b in zip(_run(src, {"x": x}), _run(out, {"x": x}, runtime=True)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_output_declared_without_shape(tmp_path):
    """onnxruntime runs a model whose output type has no shape; the ONNX checker does not. The fused model gets the
    inferred shape, so it passes the checker and gives the same answer."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False)
    assert res.report["fused_regions"] == 1
    fused = onnx.load(out)
    onnx.checker.check_model(fused)
    assert [d.dim_value for d in fused.graph.output[0].type.tensor_type.shape.dim] == [1, 8, 16, 16]
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x}, runtime=True)[0], _run(src, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_python_api_without_output_returns_model(tmp_path):
    res = onnxopt.optimize(build_model("mobilenetv3", image_size=32), measure=False)
    assert res.output is None and res.library is None
    assert any(n.domain == "onnxopt" for n in res.model.graph.node)
    assert not list(tmp_path.iterdir())


def test_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    """onnxruntime's symbolic shape inference saves debug models into the cwd when it gives up; we must not."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    src = str(tmp_path / "bert.onnx")
    onnx.save(build_model("bert"), src)
    onnxopt.optimize(src, str(tmp_path / "fused.onnx"), measure=False)
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize("option, value", [("search_budget", 0), ("tune_budget", -1), ("tune_budget", "abc")])
def test_budgets_must_be_seconds(option, value, tmp_path):
    """A budget that is no time at all is bad usage, said before any work is done, naming the Python keyword."""
    with pytest.raises(UsageError, match=rf"^{option}=.*: give a (finite )?number") as e:
        onnxopt.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "o.onnx"), **{option: value})
    assert "--" not in str(e.value)


def test_plan_runoff_keeps_the_more_fused_plan_only_by_a_margin():
    """_plan_runoff: the fastest plan duels the plan it is built on, then plans that measured within
    PLAN_RUNOFF_WITHIN and fuse more or less than it (the fastest first; not a plan built on it); in each duel the
    more fused plan is kept only if the median of its rounds wins by PLAN_MARGIN, and the winner meets the next.
    The duels' timings are given, not measured, to pin the rule (a pure function: no driver)."""
    from onnxopt.driver.policy import PLAN_MARGIN, PLAN_RUNOFF_WITHIN, RUNOFF_OPPONENTS, plan_runoff

    # in the order the pipeline builds them: compute-blocked first, although AFUSION fuses more
    bases = {"afusion": "compute-blocked", "horizontal": "compute-blocked"}
    assert RUNOFF_OPPONENTS == 2

    def cands(cb=0.72):  # (fused / original, name, regions, session, t_orig, t_plan), fastest first
        return sorted([(0.70, "afusion", [], "s_af", 1.0, 0.70), (cb, "compute-blocked", [], "s_cb", 1.0, cb),
                       (0.71, "elementwise", [], "s_ew", 1.0, 0.71), (0.74, "horizontal", [], "s_h", 1.0, 0.74)])

    def duels(gains):  # (session a, session b) -> the rounds' t_b / t_a
        met = []

        def duel(a, b):
            met.append((a[3], b[3]))
            return gains[(a[3], b[3])]
        return duel, met

    lose, win = [PLAN_MARGIN * 1.1, PLAN_MARGIN * 0.99, PLAN_MARGIN * 0.98], [PLAN_MARGIN * 1.01, 0.9, 1.2]
    # AFUSION meets its base first, loses on the median of three; compute-blocked then meets elementwise (the
    # fastest less fused plan) and beats it
    c = cands()
    duel, met = duels({("s_af", "s_cb"): lose, ("s_cb", "s_ew"): win})
    run = plan_runoff(c, duel, bases)
    assert met == [("s_af", "s_cb"), ("s_cb", "s_ew")]
    assert run["kept"] == "compute-blocked" and [d["kept"] for d in run["duels"]] == ["compute-blocked"] * 2
    assert run["duels"][0]["gain"] == pytest.approx(PLAN_MARGIN * 0.99)
    assert [x[1] for x in c][:1] == ["compute-blocked"]
    # AFUSION wins both duels; its base is met even when its plan timing was far behind
    c = cands(cb=0.70 * PLAN_RUNOFF_WITHIN * 1.2)
    duel, met = duels({("s_af", "s_cb"): win, ("s_af", "s_ew"): win})
    assert plan_runoff(c, duel, bases)["kept"] == "afusion"
    assert met == [("s_af", "s_cb"), ("s_af", "s_ew")] and c[0][1] == "afusion"
    # compute-blocked beats AFUSION, then has to beat elementwise by the margin too, and does not
    c = cands()
    duel, met = duels({("s_af", "s_cb"): lose, ("s_cb", "s_ew"): lose})
    assert plan_runoff(c, duel, bases)["kept"] == "elementwise" and c[0][1] == "elementwise"
    # far apart and not built on the other: no runoff
    far = [(0.70, "compute-blocked", [], "s_cb", 1.0, 0.70),
           (0.70 * PLAN_RUNOFF_WITHIN * 1.01, "elementwise", [], "s_ew", 1.0, 1)]
    assert plan_runoff(far, duels({})[0], bases) is None
    # the fastest fuses least: a more fused plan close behind meets it, and is kept only by the margin
    least = [(0.70, "elementwise", [], "s_ew", 1.0, 0.70), (0.71, "compute-blocked", [], "s_cb", 1.0, 0.71)]
    faster = [1.0 / g for g in win]  # elementwise's rounds against compute-blocked: compute-blocked wins
    duel, met = duels({("s_ew", "s_cb"): faster})
    run = plan_runoff(list(least), duel, bases)
    assert met == [("s_ew", "s_cb")] and run["kept"] == "compute-blocked"
    assert run["duels"][0]["gain"] == pytest.approx(1.0 / PLAN_MARGIN / 1.01)
    duel, met = duels({("s_ew", "s_cb"): [1.0 / g for g in lose]})  # compute-blocked 1.03x: short of the margin
    assert plan_runoff(list(least), duel, bases)["kept"] == "elementwise"
    # but a plan built on the fastest (AFUSION on compute-blocked) that measured behind it is not met
    base_first = [(0.70, "compute-blocked", [], "s_cb", 1.0, 0.70), (0.71, "afusion", [], "s_af", 1.0, 0.71)]
    assert plan_runoff(base_first, duels({})[0], bases) is None


def test_repeated_kernels_are_checked_once_and_still_verified(tmp_path):
    """Two convolutions with the same kernel and shapes but their own weights: the second region reuses the first
    one's check, and the whole model (each with its weights) still matches onnxruntime."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
             for i in range(2)]
    nodes = []
    for i in range(2):
        nodes += [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"y{i}"], name=f"relu{i}")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                          [vi(f"y{i}", TensorProto.FLOAT, [1, 16, 12, 12]) for i in range(2)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(m, src)
    res = onnxopt.optimize(src, out, measure=False, plan="compute", skip_fusion=["horizontal"])
    convs = [e for e in res.report["regions"] if e["ops"] == "Conv -> Relu"]
    assert len(convs) == 2 and convs[0]["op_type"] == convs[1]["op_type"]
    assert ["checked_as" in e for e in convs] == [False, True]
    assert res.report["verification"]["ok"]
    feeds = {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)}
    for a, b in zip(_run(out, feeds, runtime=True), _run(src, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_final_check_falls_back_to_the_next_plan():
    """_final_check: the chosen plan is timed once more, longer; when it is not WHOLE_MODEL_MARGIN faster than the
    original, the next plan that measured faster gets the same check, and nothing is emitted only when none
    passes. A pass within the noise of the bar (by less than CONFIRM_BELOW) is timed twice
    more in fresh sessions and the median of the three decides; so is a failure that contradicts the plan's own
    timing (CONTRADICTED_ABOVE). Timings given, not measured, to pin the rule (a pure function: no driver)."""
    from onnxopt.driver.policy import CONFIRM_BELOW, CONTRADICTED_ABOVE, WHOLE_MODEL_MARGIN, final_check

    attempts = [("elementwise", ["r1"], 1.0), ("compute-blocked", ["r2", "r3"], 1.0)]  # plan timings: no contradiction
    clear = WHOLE_MODEL_MARGIN * CONFIRM_BELOW * 1.01  # passes with room to spare: no second timing
    close = WHOLE_MODEL_MARGIN * 1.01  # passes within the noise
    near = WHOLE_MODEL_MARGIN * 0.99  # fails within the noise: no second timing unless the plan timing said more
    far = WHOLE_MODEL_MARGIN * 0.9  # fails clearly: no second timing

    def timed(**gains):  # plan name -> speedup, or the speedups of its successive timings
        asked = []

        def final_time(name, fresh):
            g = gains[name] if isinstance(gains[name], tuple) else (gains[name],) * 3
            asked.append((name, fresh))
            return 1.0, 1.0 / g[sum(1 for n, _ in asked if n == name) - 1]
        return final_time, asked

    final_time, asked = timed(elementwise=far, **{"compute-blocked": clear})
    passed, finals = final_check(attempts, final_time, 1.0)
    assert passed == 1 and asked == [("elementwise", False), ("compute-blocked", False)]
    assert [f["speedup"] for f in finals] == [pytest.approx(far), pytest.approx(clear)]
    final_time, asked = timed(elementwise=clear, **{"compute-blocked": 1.3})
    assert final_check(attempts, final_time, 1.0)[0] == 0 and asked == [("elementwise", False)]
    final_time, asked = timed(elementwise=far, **{"compute-blocked": far})
    assert final_check(attempts, final_time, 1.0)[0] is None and len(asked) == 2
    # within the noise: two more timings in fresh sessions, the median decides
    final_time, asked = timed(elementwise=(close, close, 0.9), **{"compute-blocked": clear})
    passed, finals = final_check(attempts, final_time, 1.0)
    assert passed == 0 and asked == [("elementwise", False), ("elementwise", True), ("elementwise", True)]
    assert finals[0]["retimed"] == [pytest.approx(close), pytest.approx(close), pytest.approx(0.9)]
    final_time, asked = timed(elementwise=(close, 0.97, 0.95), **{"compute-blocked": clear})
    passed, finals = final_check(attempts, final_time, 1.0)
    assert passed == 1 and finals[0]["speedup"] == pytest.approx(0.97)
    final_time, asked = timed(elementwise=(near, 1.2, 1.15), **{"compute-blocked": clear})  # agrees with its plan
    passed, finals = final_check(attempts, final_time, 1.0)
    assert passed == 1 and "retimed" not in finals[0] and len(asked) == 2
    barely = [("elementwise", ["r1"], WHOLE_MODEL_MARGIN * CONTRADICTED_ABOVE * 1.001), attempts[1]]
    final_time, asked = timed(elementwise=(near, 1.2, 1.15), **{"compute-blocked": clear})  # a failure undone
    passed, finals = final_check(barely, final_time, 1.0)
    assert passed == 0 and finals[0]["speedup"] == pytest.approx(1.15) and len(asked) == 3
    # a plan left empty by its drop trials is not timed
    final_time, asked = timed(**{"compute-blocked": 1.3})
    assert final_check([("elementwise", [], 1.0), attempts[1]], final_time, 1.0)[0] == 1
    assert asked == [("compute-blocked", False)]
    # a clear failure that contradicts the plan's own timing (a burst of load) is timed twice more; one that agrees
    # with it is not
    contradicted = [("elementwise", ["r1"], 1.17), attempts[1]]
    final_time, asked = timed(elementwise=(0.9, 1.15, 1.16), **{"compute-blocked": clear})
    passed, finals = final_check(contradicted, final_time, 1.0)
    assert passed == 0 and finals[0]["retimed"] == [pytest.approx(0.9), pytest.approx(1.15), pytest.approx(1.16)]
    assert finals[0]["speedup"] == pytest.approx(1.15) and len(asked) == 3
    final_time, asked = timed(elementwise=(far, far, 1.2), **{"compute-blocked": clear})
    passed, finals = final_check(contradicted, final_time, 1.0)
    assert passed == 1 and finals[0]["speedup"] == pytest.approx(far)
    final_time, asked = timed(elementwise=far, **{"compute-blocked": clear})
    passed, finals = final_check([("elementwise", ["r1"], far), attempts[1]], final_time, 1.0)
    assert passed == 1 and "retimed" not in finals[0] and len(asked) == 2


def test_final_check_confirms_in_fresh_sessions(tmp_path, monkeypatch):
    """A real run where every pass counts as within the noise (CONFIRM_BELOW raised): each plan
    checked is timed twice more in new sessions of both models, the report keeps the three timings, and the median
    stands."""
    from onnxopt.driver import policy

    monkeypatch.setattr(policy, "CONFIRM_BELOW", 1e6)
    res = onnxopt.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "o.onnx"), min_speedup=0.01,
                           threads=1, tile_search=False, cost_cache=False)
    checks = res.report["whole_model"]["final_checks"]
    assert checks and all(len(c["retimed"]) == 3 and min(c["retimed"]) > 0 for c in checks)
    # where the decision's seconds went: each phase timed, within the report's model-check time
    phases = res.report["whole_model"]["seconds"]
    assert set(phases) == {"plans_s", "runoff_s", "drop_trials_s", "inline_choice_s", "final_checks_s"}
    assert min(phases.values()) >= 0 and phases["final_checks_s"] > 0
    assert sum(phases.values()) <= res.report["timings"]["model_check_s"]
    assert all(c["speedup"] == pytest.approx(sorted(c["retimed"])[1]) for c in checks)
    # each plan's model was built once: the retimes made new sessions from its file
    made = res.report["whole_model"]["plan_models"]
    assert 1 <= made["built"] < made["sessions"]



def test_drop_trials_need_a_second_look_in_new_sessions():
    """_drop_trials: a kernel type leaves the plan only when the model without it measured faster twice, the second
    time in new sessions of both models (the trial's made first), so a stale session of the plan cannot make a drop
    look good. Sessions are stand-ins that name their regions and creation order; the timings are given, not
    measured, to pin the rule (the real sessions run in the whole-model tests)."""
    from types import SimpleNamespace

    from onnxopt.driver.policy import _drop_trials

    regions = [SimpleNamespace(op_type=k) for k in ("Copy", "Conv", "Conv", "Pool")]
    made, lists = [], []

    def session(regs):
        made.append(frozenset(r.op_type for r in regs))
        lists.append(regs)
        return (made[-1], len(made))  # the types the model keeps, and when the session was made

    def run(times):  # times: {dropped type: [(plan s, trial s) of each look]}
        made.clear()
        lists.clear()
        looks = {k: iter(v) for k, v in times.items()}

        def compare(a, b):
            assert a[0] > b[0]  # the plan against the plan less one type
            return next(looks[next(iter(a[0] - b[0]))])

        decisions, why = {"dropped": []}, {}
        kept, s = _drop_trials(regions, session(regions), ["Copy", "Pool", "Conv"], session, compare, decisions, why)
        return kept, s, decisions, why

    # Copy: faster without it once, not on the second look -> kept; Pool: twice -> dropped; Conv: slower -> kept
    kept, s, decisions, why = run({"Copy": [(1.3, 1.0), (1.0, 1.1)], "Pool": [(1.0, 0.9), (1.0, 0.95)],
                                   "Conv": [(0.9, 1.0)]})
    assert [r.op_type for r in kept] == ["Copy", "Conv", "Conv"]
    assert decisions["dropped"] == [{"op_type": "Pool", "gain": pytest.approx(2.0 / 1.85)}]
    assert [t["gains"] for t in decisions["trials"]] == [[pytest.approx(1.3), pytest.approx(1.0 / 1.1)],
                                                         [pytest.approx(1.0 / 0.9), pytest.approx(1.0 / 0.95)],
                                                         [pytest.approx(0.9)]]
    assert set(why) == {id(regions[3])} and "faster without this kernel (1.08x)" in why[id(regions[3])]
    # each second look made the trial's session, then the plan's; the plan goes on with the trial's second session
    everything, no_copy, no_pool = frozenset({"Copy", "Conv", "Pool"}), frozenset({"Conv", "Pool"}), \
        frozenset({"Copy", "Conv"})
    assert made[:7] == [everything, no_copy, no_copy, everything, no_pool, no_pool, everything]
    assert s == (no_pool, 6)
    # the plan's second-look sessions come from copies of its regions: a library the runoff chose for the plan's
    # list (by its id) must not time it against a trial on another library
    assert lists[3] == regions and lists[3] is not regions and lists[6] is not regions
    # a first look within 1% is not a loss: no second look, nothing dropped
    kept, _, decisions, _ = run({"Copy": [(1.0, 0.995)], "Pool": [(1.0, 1.0)], "Conv": [(1.0, 1.2)]})
    assert kept == regions and decisions["dropped"] == [] and all(len(t["gains"]) == 1 for t in decisions["trials"])


def test_drop_trials_take_their_second_look_where_asked():
    """_drop_trials with `second_look` (the pipeline's: a new process): the second look is that function's, given
    a copy of the plan's regions and the trial's, and the trial's first session goes on with the plan."""
    from types import SimpleNamespace

    from onnxopt.driver.policy import _drop_trials

    regions = [SimpleNamespace(op_type=k) for k in ("Copy", "Conv")]
    looks = []

    def second_look(plan_regions, trial_regions):
        looks.append((plan_regions, trial_regions))
        return {"Copy": (1.0, 1.1), "Conv": (1.0, 0.9)}[next(r.op_type for r in plan_regions
                                                             if r not in trial_regions)]

    def session(regs):
        return frozenset(r.op_type for r in regs)

    decisions = {"dropped": []}
    kept, s = _drop_trials(regions, session(regions), ["Copy", "Conv"], session, lambda a, b: (1.2, 1.0),
                           decisions, {}, second_look)
    # Copy: the first look wanted it gone, the second did not; Conv: both did
    assert [r.op_type for r in kept] == ["Copy"] and s == frozenset({"Copy"})
    assert [t["gains"] for t in decisions["trials"]] == [[pytest.approx(1.2), pytest.approx(1 / 1.1)],
                                                         [pytest.approx(1.2), pytest.approx(1 / 0.9)]]
    assert looks[0][0] == regions and looks[0][0] is not regions


def test_second_looks_run_in_a_new_process(tmp_path, monkeypatch):
    """A real run whose first looks all say "faster without" (the pipeline's `compare` is wrapped to say so): every
    second look then times the plan's and the trial's model files, with their libraries, in a new process, and the
    report holds both gains of each trial and no fallback to this process."""
    from onnxopt.driver import decision, policy

    real = policy._drop_trials

    def first_looks_say_drop(current, s_cur, kinds, session, compare, decisions, why, second_look=None):
        assert second_look is not None
        return real(current, s_cur, kinds, session, lambda a, b: (1.1, 1.0), decisions, why, second_look)

    monkeypatch.setattr(decision, "_drop_trials", first_looks_say_drop)
    res = onnxopt.optimize(build_model("mobilenetv3", image_size=32), str(tmp_path / "o.onnx"), min_speedup=0.01,
                           threads=1, tile_search=False, cost_cache=False)
    w = res.report["whole_model"]
    assert w.get("trials") and all(len(t["gains"]) == 2 and t["gains"][1] > 0 for t in w["trials"])
    assert "second_look_errors" not in w


def test_drop_trials_stop_at_their_budget(monkeypatch):
    """Past DROP_TRIALS_S the remaining kernel types are left in the plan and listed as untried."""
    from types import SimpleNamespace

    from onnxopt.driver import policy as pipeline

    monkeypatch.setattr(pipeline, "DROP_TRIALS_S", 0.05)
    regions = [SimpleNamespace(op_type=k) for k in ("A", "B")]

    def compare(a, b):  # each look takes 0.1 s and finds the model faster without the type
        time.sleep(0.1)
        return 1.0, 0.5

    decisions = {"dropped": []}
    kept, _ = pipeline._drop_trials(regions, None, ["A", "B"], lambda regs: None, compare, decisions, {})
    # the first trial runs (the budget is checked before each), the rest wait
    assert decisions["untried"] == ["B"] and [r.op_type for r in kept] == ["B"]


def test_inline_choice_is_not_timed_when_the_small_kernels_cannot_pay():
    """_inline_choice skips its timing when the small kernels, measured alone, take too little of the model for the
    wide library to win by INLINE_MARGIN even if they took no time (Inception-v3: 2.1 ms of 56 ms)."""
    from types import SimpleNamespace

    from onnxopt.driver.policy import INLINE_MARGIN, inline_gain_bound
    from onnxopt.pipeline import _Optimizer

    def kernel(flops, seconds):
        return SimpleNamespace(compute=object(), measured={"flops": flops, "measured_fused_s": seconds})

    small = [kernel(2e6, 0.001), kernel(3e6, 0.0011)]
    assert inline_gain_bound(small, 0.056) == pytest.approx(0.056 / (0.056 - 0.0021))
    assert inline_gain_bound(small, None) == float("inf")
    assert inline_gain_bound(small, 0.002) == float("inf")  # alone they took longer than the model: no bound
    untimed = SimpleNamespace(compute=object(), measured={"flops": 1e6})
    assert inline_gain_bound(small + [untimed], 0.056) == float("inf")  # a kernel not timed alone: no bound

    def compare(a, b, **kw):
        raise AssertionError("timed although the bound says it cannot pay")

    entry, wide = _Optimizer._inline_choice(None, small + [kernel(5e9, 0.05)], "lib.so", {}, compare, 0.056)
    assert wide is None and entry["skipped"].startswith("the small kernels take too little")
    assert inline_gain_bound(small, 0.02) > INLINE_MARGIN  # NASNet-like: the timing decides


def test_plan_files_past_their_budget_are_deleted_oldest_first(tmp_path):
    """evict_plan_files: the plan models kept for new sessions hold the weights each; past the budget the oldest go,
    files and entries, and the newest stays even alone over it."""
    from onnxopt.driver.policy import evict_plan_files

    entries = {}
    for i, size in enumerate((400, 300, 200)):
        path = tmp_path / f"plan{i}.onnx"
        path.write_bytes(b"x" * size)
        entries[("lib", i)] = (str(path), "lib", set(), [])
    evict_plan_files(entries, 600)
    assert list(entries) == [("lib", 1), ("lib", 2)]
    assert not (tmp_path / "plan0.onnx").exists() and (tmp_path / "plan1.onnx").exists()
    evict_plan_files(entries, 100)
    assert list(entries) == [("lib", 2)] and (tmp_path / "plan2.onnx").exists()


def test_drop_trials_want_more_to_drop_a_kernel_between_two_of_ours():
    """A kernel type whose regions read one of our kernels' outputs and feed another (its drop would end a
    sequence) leaves only when both looks measure the model SPLIT_DROP_MARGIN faster without it; one at the edge
    of our kernels needs DROP_MARGIN."""
    from types import SimpleNamespace

    from onnxopt.driver.policy import DROP_MARGIN, SPLIT_DROP_MARGIN, _between_ours, _drop_trials

    def reg(kind, ins, outs):
        return SimpleNamespace(op_type=kind, inputs=ins, outputs=outs)

    # conv -> bn -> conv2 (bn between ours), conv2 -> head (the head ends the plan)
    regions = [reg("Conv", ["x"], ["a"]), reg("Bn", ["a"], ["b"]), reg("Conv2", ["b"], ["c"]),
               reg("Head", ["c"], ["y"])]
    assert _between_ours("Bn", regions) and _between_ours("Conv2", regions)
    assert not _between_ours("Head", regions) and not _between_ours("Conv", regions)
    gain = (1 + SPLIT_DROP_MARGIN) / 2  # above DROP_MARGIN, below SPLIT_DROP_MARGIN
    assert DROP_MARGIN < gain < SPLIT_DROP_MARGIN

    def session(regs):
        return frozenset(r.op_type for r in regs)

    decisions = {"dropped": []}
    kept, _ = _drop_trials(regions, session(regions), ["Bn", "Head"], session, lambda a, b: (gain, 1.0),
                           decisions, {}, lambda p, t: (gain, 1.0))
    assert [r.op_type for r in kept] == ["Conv", "Bn", "Conv2"]
    assert [d["op_type"] for d in decisions["dropped"]] == ["Head"]
    assert decisions["trials"][0] == {"op_type": "Bn", "gains": [pytest.approx(gain)], "margin": SPLIT_DROP_MARGIN}


def test_a_pool_of_one_kernel_passes_on_its_median():
    """pool_passes: regions of one kernel's code on the same shapes all pass where the median of their speedups
    reaches the bar; else each on its own (a pure function: no driver)."""
    from onnxopt.driver.policy import pool_passes

    assert pool_passes([1.1, 0.95, 1.05], 1.0) == (1.05, [True, True, True])  # the 0.95 outvoted
    assert pool_passes([0.9, 1.02, 0.95], 1.0) == (0.95, [False, True, False])  # each on its own, as alone
    assert pool_passes([0.97], 1.0) == (0.97, [False])
    assert pool_passes([1.0, 0.5], 1.0) == (0.75, [True, False])


class _Region:
    """What KernelStage._judge_pool reads of a region."""

    def __init__(self, name):
        self.op_type, self.node_names, self.rejected, self.measured = f"MatMul_{name}", [name], None, {}
        self.inputs, self.outputs, self.shape, self.compute = [f"x{name}"], [f"y{name}"], [1, 64, 96], None

    def describe(self):
        return "MatMul -> Add"


@pytest.mark.parametrize("speedups, kept", [((1.1, 0.95, 1.05), 3), ((0.9, 1.02, 0.95), 1)])
def test_a_pools_verdicts_reach_every_region_and_its_duplicates(speedups, kept):
    """KernelStage._judge_pool on three timed regions of one kernel (their own op types) and a duplicate of the
    first's op type: the pool's verdicts, the report's pool entry, the duplicate taking its op type's verdict."""
    from types import SimpleNamespace

    from onnxopt.driver.kernels import KernelStage

    stage = SimpleNamespace(opts=SimpleNamespace(min_speedup=1.0), report={"regions": [], "rejected": []},
                            tile_info={}, _timed={}, _timed_by_key={})
    for name in ("_reject", "_reuse_verdict"):
        setattr(stage, name, getattr(KernelStage, name).__get__(stage))
    regions = [_Region(str(i)) for i in range(3)]
    members = [(r, (r.op_type, "shapes"), {"op_type": r.op_type, "speedup": s}) for r, s in zip(regions, speedups)]
    dup = _Region("0")
    members.append((dup, (dup.op_type, "shapes"), None))
    accepted, verdicts = [], {}
    KernelStage._judge_pool(stage, members, verdicts, accepted)
    assert sum(r in accepted for r in regions) == kept
    assert (dup in accepted) == (regions[0] in accepted)
    median = sorted(speedups)[1]
    for e in stage.report["regions"]:  # the duplicate's entry is a copy of the first's, marked so
        assert e["pooled"] == {"regions": 3, "median_speedup": median}
    assert len(stage.report["regions"]) == kept + (regions[0] in accepted)
    for e in stage.report["rejected"]:
        assert f"the median of 3 regions of this kernel and shapes {median:.2f}x" in e["reason"]


def test_the_kernel_key_leaves_the_fallback_constants_out():
    """Regions of one kernel on their own weights differ in op type where their fallbacks embed their own constants
    but share the kernel key; another shape is another kernel."""
    from onnxopt.fusion.compute import ComputeRule

    def region(k, seed):
        b = (np.random.default_rng(seed).standard_normal((k, 32))).astype(np.float32)
        g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "g",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [8, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [8, 32])],
                              [onnx.numpy_helper.from_array(b, "B")])
        m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
        r = next(r for r in ComputeRule(m, 6, panel=32).find_regions(set(), []) if r.compute is not None)
        r.compute_op_type("x86-64")
        return r

    a, b = region(64, 1), region(64, 2)
    a.fallback_key, b.fallback_key = "one", "two"
    a.compute_op_type("x86-64"), b.compute_op_type("x86-64")
    assert a.op_type != b.op_type and a.kernel_key() == b.kernel_key()
    a.compute_op_type("x86-64-v3")  # another target: other code
    assert a.kernel_key() != b.kernel_key()
