"""build_fused_model: fused nodes, function fallbacks, metadata, and plain-ORT equivalence without any kernels."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt import __version__
from onnxopt.emit.model import (
    DOMAIN,
    META_CPU_FLAGS,
    META_LIBRARY,
    META_SHA256,
    META_TARGET,
    META_VERSION,
    build_fused_model,
    stable_toposort,
)
from onnxopt.fusion.elementwise import ElementwiseRule
from onnxopt.graph import ort_compat

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info
TARGET = {"name": "test", "cpu": "generic"}


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir=10):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def session(model, optimize=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def fuse(model, target="t", library="model.onnx.so", sha="0" * 64, cpu_flags=("avx2", "fma")):
    """Shape inference, regions, op types, fused model: the pipeline's order without codegen."""
    work = onnx.shape_inference.infer_shapes(model, data_prop=True)
    regions = ElementwiseRule(work).find_regions([])
    for r in regions:
        r.compute_op_type(target)
    fused = build_fused_model(work, regions, library, sha, TARGET, list(cpu_flags))
    return work, regions, fused


def random_feeds(model, rng, bindings=None):
    feeds = {}
    init_names = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name in init_names:
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (bindings or {}).get(d.dim_param, 3)
                 for d in tt.shape.dim]
        if tt.elem_type == TensorProto.BOOL:
            feeds[i.name] = np.asarray(rng.random(shape) > 0.5)
        else:
            feeds[i.name] = np.asarray(rng.standard_normal(shape) * 4, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return feeds


def assert_same_outputs(original, fused, n=3, bindings=None, seed=0):
    rng = np.random.default_rng(seed)
    s_orig, s_fused, s_fused_noopt = session(original, False), session(fused), session(fused, False)
    names = [o.name for o in original.graph.output]
    assert [o.name for o in fused.graph.output] == names
    for _ in range(n):
        feeds = random_feeds(original, rng, bindings)
        want = s_orig.run(names, feeds)
        for s in (s_fused, s_fused_noopt):
            got = s.run(names, feeds)
            for w, g in zip(want, got):
                assert w.shape == g.shape and w.dtype == g.dtype
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def hardswish(x, p, three="three", zero="zero", six="six"):
    return [
        helper.make_node("Add", [x, three], [p + "a"], name=p + "add"),
        helper.make_node("Clip", [p + "a", zero, six], [p + "c"], name=p + "clip"),
        helper.make_node("Mul", [x, p + "c"], [p + "m"], name=p + "mul"),
        helper.make_node("Div", [p + "m", six], [p + "y"], name=p + "div"),
    ]


def two_region_model():
    """hardswish(x) -> Transpose -> Add(bias) -> SiLU: two different regions around a non-elementwise node."""
    nodes = hardswish("x", "hs_") + [
        helper.make_node("Transpose", ["hs_y"], ["t"], perm=[0, 2, 3, 1], name="transpose"),
        helper.make_node("Add", ["t", "bias"], ["b"], name="bias_add"),
        helper.make_node("Sigmoid", ["b"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["b", "s"], ["y"], name="silu_mul"),
    ]
    rng = np.random.default_rng(1)
    inits = [const("three", 3.0), const("zero", 0.0), const("six", 6.0), const("bias", rng.standard_normal(8))]
    return make_model(nodes, [vi("x", F32, ["N", 8, 4, 4])], [vi("y", F32, ["N", 4, 4, 8])], inits)


# ---------------------------------------------------------------- the two-region model


@pytest.fixture(scope="module")
def two_regions():
    model = two_region_model()
    work, regions, fused = fuse(model)
    return model, work, regions, fused


def test_two_regions_found(two_regions):
    _, _, regions, _ = two_regions
    assert [r.describe() for r in regions] == ["Add -> Clip -> Mul -> Div", "Add -> Sigmoid -> Mul"]
    assert regions[0].op_type != regions[1].op_type


def test_fused_nodes(two_regions):
    _, _, regions, fused = two_regions
    g = fused.graph
    assert [(n.domain, n.op_type) for n in g.node] == [
        (DOMAIN, regions[0].op_type), ("", "Transpose"), (DOMAIN, regions[1].op_type)]
    hs, _, silu = g.node
    assert list(hs.input) == ["x"] and list(hs.output) == ["hs_y"]
    assert list(silu.input) == ["t", "bias"] and list(silu.output) == ["y"]
    # Named after the first node each replaces (profiles of the fused model read like the original's), unique.
    assert hs.name != silu.name and hs.name.startswith(regions[0].nodes[0].name + "__onnxopt")
    assert [(o.domain, o.version) for o in fused.opset_import] == [("", 17), (DOMAIN, 1)]


def test_functions_carry_the_original_nodes(two_regions):
    _, _, regions, fused = two_regions
    funcs = {f.name: f for f in fused.functions}
    assert set(funcs) == {r.op_type for r in regions}
    hs = funcs[regions[0].op_type]
    assert hs.domain == DOMAIN
    assert list(hs.input) == ["x"] and list(hs.output) == ["hs_y"]
    assert [n.op_type for n in hs.node] == ["Constant"] * 3 + ["Add", "Clip", "Mul", "Div"]
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in hs.node if n.op_type == "Constant"}
    assert consts == {"three": 3.0, "zero": 0.0, "six": 6.0}
    assert [n.name for n in hs.node[3:]] == ["hs_add", "hs_clip", "hs_mul", "hs_div"]
    assert [(o.domain, o.version) for o in hs.opset_import] == [("", 17)]
    silu = funcs[regions[1].op_type]
    assert [n.op_type for n in silu.node] == ["Add", "Sigmoid", "Mul"]
    assert list(silu.input) == ["t", "bias"] and list(silu.output) == ["y"]


def test_inlined_constants_leave_the_graph(two_regions):
    _, _, _, fused = two_regions
    assert {t.name for t in fused.graph.initializer} == {"bias"}


def test_metadata(two_regions):
    _, _, _, fused = two_regions
    meta = {p.key: p.value for p in fused.metadata_props}
    assert meta[META_LIBRARY] == "model.onnx.so"
    assert meta[META_SHA256] == "0" * 64
    assert json.loads(meta[META_TARGET]) == TARGET
    assert meta[META_CPU_FLAGS] == "avx2,fma"
    assert meta[META_VERSION] == __version__
    assert set(meta) == {"onnxopt.library", "onnxopt.library_sha256", "onnxopt.target", "onnxopt.cpu_flags",
                         "onnxopt.version"}


def test_ir_version(two_regions):
    _, _, _, fused = two_regions
    assert 8 <= fused.ir_version <= ort_compat.max_ir_version()


def test_checker_full(two_regions):
    _, _, _, fused = two_regions
    onnx.checker.check_model(fused, full_check=True)
    # and a round trip through bytes changes nothing
    onnx.checker.check_model(onnx.ModelProto.FromString(fused.SerializeToString()), full_check=True)


def test_plain_ort_runs_the_function_fallbacks(two_regions):
    model, _, _, fused = two_regions
    assert_same_outputs(model, fused, bindings={"N": 2})
    assert_same_outputs(model, fused, bindings={"N": 5}, n=1, seed=7)


def test_original_model_untouched(two_regions):
    model, work, regions, _ = two_regions
    before = work.SerializeToString()
    build_fused_model(work, regions, "lib.so", "x", TARGET, [])
    assert work.SerializeToString() == before
    assert [n.op_type for n in model.graph.node][:4] == ["Add", "Clip", "Mul", "Div"]


# ---------------------------------------------------------------- sharing, options, edge cases


def test_identical_regions_share_one_function():
    nodes = hardswish("x1", "p_") + hardswish("x2", "q_")
    model = make_model(nodes, [vi("x1", F32, [2, 8]), vi("x2", F32, [2, 8])],
                       [vi("p_y", F32, [2, 8]), vi("q_y", F32, [2, 8])],
                       [const("three", 3.0), const("zero", 0.0), const("six", 6.0)])
    _, regions, fused = fuse(model)
    assert len(regions) == 2 and regions[0].op_type == regions[1].op_type
    fused_nodes = [n for n in fused.graph.node if n.domain == DOMAIN]
    assert len(fused_nodes) == 2 and {n.op_type for n in fused_nodes} == {regions[0].op_type}
    assert len(fused.functions) == 1
    assert len({n.name for n in fused_nodes}) == 2  # node names stay unique
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused)


def test_no_regions():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [4])], [vi("y", F32, [4])], ir=11)
    model.metadata_props.add(key="author", value="me")
    fused = build_fused_model(model, [], None, None, {}, [])
    assert len(fused.functions) == 0
    assert [o.domain for o in fused.opset_import] == [""]
    meta = {p.key: p.value for p in fused.metadata_props}
    assert meta == {"author": "me", META_VERSION: __version__}
    assert fused.ir_version == min(11, ort_compat.max_ir_version())
    assert [n.op_type for n in fused.graph.node] == ["Relu"]
    assert_same_outputs(model, fused, n=1)


def test_regions_without_library_file_have_no_library_metadata():
    model = two_region_model()
    model.metadata_props.add(key="producer_note", value="kept")
    _, regions, fused = fuse(model, library=None, sha=None)
    assert len(fused.functions) == 2
    meta = {p.key: p.value for p in fused.metadata_props}
    assert meta == {"producer_note": "kept", META_VERSION: __version__}
    assert_same_outputs(model, fused, n=1, bindings={"N": 1})


def test_old_ir_is_raised_for_functions():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [3, 4])], [vi("y", F32, [3, 4])], opset=13, ir=7)
    _, regions, fused = fuse(model)
    assert len(regions) == 1
    assert fused.ir_version == 8
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused, n=1)


def test_existing_onnxopt_opset_not_duplicated():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [3, 4])], [vi("y", F32, [3, 4])])
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    _, _, fused = fuse(model)
    assert [o.domain for o in fused.opset_import].count(DOMAIN) == 1


def test_materialized_intermediate_output():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"]),
             helper.make_node("ReduceSum", ["s"], ["z"], keepdims=0)]
    model = make_model(nodes, [vi("x", F32, ["B", 16])], [vi("y", F32, ["B", 16]), vi("z", F32, [])])
    _, regions, fused = fuse(model)
    (r,) = regions
    assert r.outputs == ["s", "y"]
    fnode = next(n for n in fused.graph.node if n.domain == DOMAIN)
    assert list(fnode.output) == ["s", "y"]
    assert [n.op_type for n in fused.graph.node] == [r.op_type, "ReduceSum"]
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused, bindings={"B": 4})


def test_fused_node_moves_after_a_late_producer():
    # A (Relu) comes first, the Transpose it shares a region boundary with comes later: the fused node, put where
    # A was, needs the Transpose's output and must be reordered after it
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Transpose", ["x2"], ["t"], perm=[1, 0]),
             helper.make_node("Add", ["a", "t"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [3, 5]), vi("x2", F32, [5, 3])], [vi("y", F32, [3, 5])])
    _, regions, fused = fuse(model)
    (r,) = regions
    assert r.inputs == ["x", "t"]
    assert [n.op_type for n in fused.graph.node] == ["Transpose", r.op_type]
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused)


def test_scalar_pow_and_where_regions_run_in_plain_ort():
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Where", ["pos", "p", "x"], ["w"]),
             helper.make_node("Cast", ["w"], ["wd"], to=TensorProto.DOUBLE),
             helper.make_node("Cast", ["wd"], ["y"], to=F32)]
    model = make_model(nodes, [vi("x", F32, [6, 7])], [vi("y", F32, [6, 7])], [const("two", 2.0), const("zero", 0.0)])
    _, regions, fused = fuse(model)
    (r,) = regions
    assert len(r.nodes) == 5
    f = fused.functions[0]
    assert sorted(n.output[0] for n in f.node if n.op_type == "Constant") == ["two", "zero"]
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused)


def test_clip_attribute_form_at_opset_7():
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Clip", ["a"], ["c"], min=-1.0, max=1.0),
             helper.make_node("Mul", ["c", "x"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [4, 4])], [vi("y", F32, [4, 4])], opset=7, ir=7)
    _, regions, fused = fuse(model)
    (r,) = regions
    assert [n.op_type for n in fused.functions[0].node] == ["Add", "Clip", "Mul"]  # attrs: no Constant needed
    onnx.checker.check_model(fused, full_check=True)
    assert_same_outputs(model, fused)


def test_region_around_an_if_body_reference():
    then_g = helper.make_graph([helper.make_node("Add", ["a", "a"], ["ob"])], "then", [], [vi("ob", F32, [4])])
    else_g = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["oe"])], "else", [], [vi("oe", F32, [4])])
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]),
             helper.make_node("If", ["cond"], ["i"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Mul", ["a", "i"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [4]), vi("cond", TensorProto.BOOL, [])], [vi("y", F32, [4])])
    _, _, fused = fuse(model)
    assert_same_outputs(model, fused)


# ---------------------------------------------------------------- stable_toposort


def _names(nodes):
    return [n.name for n in nodes]


def _chain():
    return [helper.make_node("Relu", ["x"], ["a"], name="A"),
            helper.make_node("Neg", ["a"], ["b"], name="B"),
            helper.make_node("Exp", ["x"], ["c"], name="C"),
            helper.make_node("Add", ["b", "c"], ["y"], name="D")]


def test_toposort_keeps_a_valid_order():
    nodes = _chain()
    assert _names(stable_toposort(nodes)) == ["A", "B", "C", "D"]
    assert stable_toposort([]) == []


def test_toposort_fixes_an_invalid_order():
    a, b, c, d = _chain()
    got = _names(stable_toposort([d, b, c, a]))
    assert got.index("A") < got.index("B") < got.index("D")
    assert got.index("C") < got.index("D")
    # the earliest-possible rule: C was ready before A in the given order
    assert got == ["C", "A", "B", "D"]


def test_toposort_independent_nodes_keep_order():
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"y{i}"], name=str(i)) for i in range(6)]
    assert _names(stable_toposort(nodes)) == [str(i) for i in range(6)]
    assert _names(stable_toposort(nodes[::-1])) == [str(i) for i in range(5, -1, -1)]


def test_toposort_raises_on_a_cycle():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="A"), helper.make_node("Neg", ["a"], ["b"], name="B"),
             helper.make_node("Exp", ["x"], ["c"], name="C")]
    with pytest.raises(RuntimeError, match="cycle"):
        stable_toposort(nodes)


def test_toposort_respects_subgraph_reads():
    then_g = helper.make_graph([helper.make_node("Identity", ["r"], ["t"])], "then", [], [vi("t", F32, [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [vi("e", F32, [2])])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if")
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu")
    assert _names(stable_toposort([if_node, relu])) == ["relu", "if"]


def test_toposort_ignores_empty_and_external_inputs():
    nodes = [helper.make_node("Clip", ["a", "", "hi"], ["y"], name="clip"),
             helper.make_node("Relu", ["x"], ["a"], name="relu")]
    assert _names(stable_toposort(nodes)) == ["relu", "clip"]


def test_kernels_alike_with_different_fallback_constants_get_op_types_of_their_own(tmp_path):
    """DenseNet-style BatchNormalization -> Relu on 8 and on 16 channels, with the untrained parameters (all ones and
    zeros): the folded kernels are alike, but each function fallback embeds its own layer's parameters, so one op
    type for both would give the 16-channel node the 8-channel function (onnxruntime then fails to load the model
    without the library). Each gets its own op type, and the model runs with and without the library."""
    import onnxopt

    rng = np.random.default_rng(3)

    def bn(name, x, y, c):
        inits = [const(f"{name}_{p}", v) for p, v in
                 (("g", np.ones(c)), ("b", np.zeros(c)), ("m", np.zeros(c)), ("v", np.ones(c)))]
        return [helper.make_node("BatchNormalization", [x] + [t.name for t in inits], [y + "_bn"], name=name),
                helper.make_node("Relu", [y + "_bn"], [y])], inits

    n1, i1 = bn("bn1", "x", "r1", 8)
    w1 = const("w1", rng.standard_normal((8, 8, 3, 3)) * 0.2)
    conv1 = helper.make_node("Conv", ["r1", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1])
    cat = helper.make_node("Concat", ["x", "c1"], ["cat"], axis=1)
    n2, i2 = bn("bn2", "cat", "r2", 16)
    w2 = const("w2", rng.standard_normal((8, 16, 1, 1)) * 0.2)
    conv2 = helper.make_node("Conv", ["r2", "w2"], ["y"], name="conv2")
    model = make_model(n1 + [conv1, cat] + n2 + [conv2], [vi("x", F32, [1, 8, 10, 10])], [vi("y", F32, [1, 8, 10, 10])],
                       i1 + i2 + [w1, w2])
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(model, src)
    res = onnxopt.optimize(src, out, measure=False, sequences=False)
    fused = onnx.load(out)
    bns = {r["nodes"][0]: r["op_type"] for r in res.report["regions"] if r["nodes"][0] in ("bn1", "bn2")}
    assert len(bns) == 2 and bns["bn1"] != bns["bn2"], bns
    x = {"x": rng.standard_normal((1, 8, 10, 10)).astype(np.float32)}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, x)[0]
    plain = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, x)[0]  # the functions
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5)
    assert len({f.name for f in fused.functions}) == len(fused.functions)
