"""onnxopt.graph.fold: constant folding, its limits, and dead-node removal."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxopt.graph.fold import GROWTH_LIMIT_BYTES, fold_constants, names_used_by_subgraphs, remove_dead_nodes

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
vi = helper.make_tensor_value_info


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir=10, value_info=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits), value_info=list(value_info))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def copy(model):
    return onnx.ModelProto.FromString(model.SerializeToString())


def ops(model):
    return [n.op_type for n in model.graph.node]


def inits(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


# ---------------------------------------------------------------- Constant nodes


def test_constant_nodes_become_initializers():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([1, 2, 3], np.float32))),
        helper.make_node("Constant", [], ["f"], value_float=0.5),
        helper.make_node("Constant", [], ["fs"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["i"], value_int=4),
        helper.make_node("Constant", [], ["is"], value_ints=[1, 3]),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "f"], ["b"]),
        helper.make_node("Sub", ["b", "fs"], ["y"]),
        helper.make_node("Reshape", ["y", "is"], ["r"]),
        helper.make_node("Cast", ["i"], ["ic"], to=F32),
        helper.make_node("Add", ["r", "ic"], ["z"]),
    ]
    m = make_model(nodes, [vi("x", F32, [3])], [vi("z", F32, [1, 3])])
    x = np.array([0.5, -1.0, 2.0], np.float32)
    want = run(m, {"x": x})
    removed = fold_constants(m)
    assert "Constant" not in ops(m)
    assert removed == 6  # five Constants and the Cast of a constant
    got = inits(m)
    np.testing.assert_array_equal(got["c"], [1, 2, 3])
    assert got["f"].dtype == np.float32 and got["f"].shape == () and got["f"] == 0.5
    np.testing.assert_array_equal(got["fs"], [1, 2, 3])
    assert "i" not in got  # only the folded Cast read it: dead now
    np.testing.assert_array_equal(got["is"], [1, 3])
    np.testing.assert_array_equal(got["ic"], np.float32(4))
    np.testing.assert_allclose(run(m, {"x": x})[0], want[0])
    onnx.checker.check_model(m)


def test_returns_zero_when_nothing_folds():
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])])
    before = m.SerializeToString()
    assert fold_constants(m) == 0
    assert m.SerializeToString() == before


def test_graph_output_computed_from_constants():
    nodes = [helper.make_node("Add", ["c1", "c2"], ["k"]), helper.make_node("Relu", ["x"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2])], [vi("y", F32, [2]), vi("k", F32, [2])],
                   inits=[const("c1", [1, 2]), const("c2", [3, 4])])
    assert fold_constants(m) == 1
    assert ops(m) == ["Relu"]
    y, k = run(m, {"x": np.array([-1, 1], np.float32)})
    np.testing.assert_array_equal(k, [4, 6])
    np.testing.assert_array_equal(y, [0, 1])


def test_custom_domain_nodes_are_not_folded():
    nodes = [helper.make_node("Foo", ["c1"], ["k"], domain="my.domain"), helper.make_node("Add", ["x", "k"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2])], [vi("y", F32, [2])], inits=[const("c1", [1, 2])])
    m.opset_import.append(helper.make_opsetid("my.domain", 1))
    assert fold_constants(m) == 0
    assert ops(m) == ["Foo", "Add"]


# ---------------------------------------------------------------- Shape / Size


def test_shape_of_static_tensor_folds():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Shape", ["x"], ["tail"], start=1),
             helper.make_node("Reshape", ["z", "s"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2, 3, 4]), vi("z", F32, [24])],
                   [vi("y", F32, [2, 3, 4]), vi("n", I64, []), vi("tail", I64, [2])],
                   value_info=[vi("r", F32, [2, 3, 4])])
    fold_constants(m)
    assert "Shape" not in ops(m) and "Size" not in ops(m)
    got = inits(m)
    np.testing.assert_array_equal(got["s"], [2, 3, 4])
    assert got["s"].dtype == np.int64
    assert got["n"] == 24 and got["n"].dtype == np.int64
    np.testing.assert_array_equal(got["tail"], [3, 4])
    # Relu(x) is only used by the folded Shape: it is dead now
    assert ops(m) == ["Reshape"]
    x = np.zeros((2, 3, 4), np.float32)
    z = np.arange(24, dtype=np.float32)
    y, n, tail = run(m, {"x": x, "z": z})
    np.testing.assert_array_equal(y, z.reshape(2, 3, 4))


def test_shape_of_symbolic_tensor_does_not_fold():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Reshape", ["z", "s"], ["y"])]
    m = make_model(nodes, [vi("x", F32, ["N", 3]), vi("z", F32, ["M"])],
                   [vi("y", F32, ["N", 3]), vi("n", I64, [])])
    assert fold_constants(m) == 0
    assert ops(m) == ["Shape", "Size", "Reshape"]


def test_shape_of_tensor_without_value_info_folds_from_shape_inference():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Reshape", ["r", "s"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [2, 3])], [vi("y", F32, [2, 3])])  # no value_info for r
    assert fold_constants(m) == 1
    assert ops(m) == ["Relu", "Reshape"]
    np.testing.assert_array_equal(inits(m)[m.graph.node[1].input[1]], [2, 3])
    sym = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"])],
                     [vi("x", F32, ["N", 3])], [vi("s", I64, [2])])
    assert fold_constants(sym) == 0  # inference gives N: a run-time dim


def test_a_shape_known_only_after_folding_folds_in_the_same_call():
    """BERT as the torch exporter writes it (no value_info): the position ids are a Slice of a buffer whose end is
    Shape(input_ids), the embeddings' sum's shape is known only once that Slice has folded, and the head-merge
    Reshape's target comes from Shape(that sum). One fold_constants call leaves no shape arithmetic, evaluating each
    chain of constant nodes in one session, so the Reshape's output shape is static for the kernels."""
    ids = vi("ids", I64, [1, 8])
    nodes = [
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Slice", ["ids_shape", "one", "two"], ["seq"]),  # [8]
        helper.make_node("Slice", ["buffer", "zero", "seq", "one"], ["positions"]),  # [1, 8] of the [1, 512] ids
        helper.make_node("Gather", ["table", "positions"], ["pos_emb"]),  # [1, 8, 4]
        helper.make_node("Gather", ["table", "ids"], ["word_emb"]),
        helper.make_node("Add", ["word_emb", "pos_emb"], ["h"]),
        helper.make_node("Shape", ["h"], ["h_shape"]),
        helper.make_node("Gather", ["h_shape", "zero_s"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "zero"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["y"]),
    ]
    inits_ = [const("buffer", np.arange(512)[None], np.int64), const("table", np.random.default_rng(0).standard_normal(
        (512, 4)).astype(np.float32)), const("zero", [0], np.int64), const("one", [1], np.int64),
        const("two", [2], np.int64), const("zero_s", 0, np.int64), const("minus1", [-1], np.int64)]
    m = make_model(nodes, [ids], [vi("y", F32, None)], inits=inits_)
    x = np.random.default_rng(1).integers(0, 512, (1, 8)).astype(np.int64)
    want = run(m, {"ids": x})[0]
    fold_constants(m)
    assert ops(m) == ["Gather", "Add", "Reshape"]
    np.testing.assert_array_equal(inits(m)[m.graph.node[2].input[1]], [1, -1])
    np.testing.assert_array_equal(run(m, {"ids": x})[0], want)


def _reshape_chain_model(batch):
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): flatten all but the first dim."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["d0", "ax"], ["u"]),
        helper.make_node("Concat", ["u", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["y"]),
    ]
    return make_model(nodes, [vi("x", F32, [batch, 3, 4])], [vi("y", F32, [batch, 12])],
                      inits=[const("minus1", [-1], np.int64)])


def test_shape_chain_folds_to_constant_shape():
    m = _reshape_chain_model(2)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    want = run(m, {"x": x})[0]
    removed = fold_constants(m)
    assert ops(m) == ["Reshape"]
    assert removed == 6
    shape_input = m.graph.node[0].input[1]
    np.testing.assert_array_equal(inits(m)[shape_input], [2, -1])
    # intermediates that are no longer used are gone
    assert set(inits(m)) == {shape_input}
    np.testing.assert_array_equal(run(m, {"x": x})[0], want)
    onnx.checker.check_model(m, full_check=True)


def test_shape_chain_with_symbolic_batch_keeps_the_chain():
    m = _reshape_chain_model("N")
    fold_constants(m)
    # only the Constant nodes fold; the shape arithmetic depends on the run-time batch
    assert ops(m) == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    for b in (1, 5):
        x = np.ones((b, 3, 4), np.float32)
        assert run(m, {"x": x})[0].shape == (b, 12)


# ---------------------------------------------------------------- growth limit


def _constant_of_shape_model(shape):
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["big"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Add", ["x", "big"], ["y"])]
    return make_model(nodes, [vi("x", F32, [1])], [vi("y", F32, list(shape))],
                      inits=[const("shp", list(shape), np.int64)])


def test_large_constant_of_shape_is_not_folded():
    shape = (512, 1024)  # 2 MiB of float32
    assert 4 * np.prod(shape) > GROWTH_LIMIT_BYTES
    m = _constant_of_shape_model(shape)
    size_before = m.ByteSize()
    assert fold_constants(m) == 0
    assert ops(m) == ["ConstantOfShape", "Add"]
    assert m.ByteSize() < size_before + 1024
    y = run(m, {"x": np.array([1], np.float32)})[0]
    assert y.shape == shape and np.all(y == 2.5)


def test_a_chain_from_a_large_constant_of_shape_is_not_folded():
    """A chain folds in one session, but a node computed from a tensor refused for its size stays a node too (its
    own output is no larger than its inputs, so by itself it would have folded and grown the model)."""
    shape = (512, 1024)
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["big"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Mul", ["big", "two"], ["twice"]),
             helper.make_node("Add", ["x", "twice"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [1])], [vi("y", F32, list(shape))],
                   inits=[const("shp", list(shape), np.int64), const("two", 2.0)])
    size_before = m.ByteSize()
    assert fold_constants(m) == 0
    assert ops(m) == ["ConstantOfShape", "Mul", "Add"]
    assert m.ByteSize() < size_before + 1024
    np.testing.assert_array_equal(run(m, {"x": np.ones(1, np.float32)})[0], np.full(shape, 4.0, np.float32))


def test_small_constant_of_shape_is_folded():
    m = _constant_of_shape_model((4, 4))
    assert fold_constants(m) == 1
    assert ops(m) == ["Add"]
    np.testing.assert_array_equal(inits(m)["big"], np.full((4, 4), 1.5, np.float32))
    assert "shp" not in inits(m)  # the shape initializer became dead
    np.testing.assert_array_equal(run(m, {"x": np.array([1], np.float32)})[0], np.full((4, 4), 2.5))


def test_growth_limit_boundary():
    exactly = (256, 1024)  # exactly 1 MiB: allowed
    m = _constant_of_shape_model(exactly)
    assert fold_constants(m) == 1
    over = (256 * 1024 + 1,)  # 4 bytes over
    m = _constant_of_shape_model(over)
    assert fold_constants(m) == 0


def test_large_result_from_large_inputs_is_folded():
    """The limit is about growth: a big tensor computed from an equally big one is folded."""
    w = np.ones((512, 1024), np.float32)
    nodes = [helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("Add", ["x", "nw"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [1])], [vi("y", F32, [512, 1024])], inits=[const("w", w)])
    assert fold_constants(m) == 1
    assert ops(m) == ["Add"]
    assert "w" not in inits(m)


# ---------------------------------------------------------------- nondeterminism and overridable initializers


def test_random_ops_are_not_folded():
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[2, 2], seed=1.0),
        helper.make_node("RandomUniformLike", ["c"], ["u"], seed=2.0),
        helper.make_node("Add", ["r", "u"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    m = make_model(nodes, [vi("x", F32, [2, 2])], [vi("y", F32, [2, 2])], inits=[const("c", np.zeros((2, 2)))])
    assert fold_constants(m) == 0
    assert ops(m) == ["RandomNormal", "RandomUniformLike", "Add", "Add"]


def test_initializers_that_are_graph_inputs_are_not_constants():
    # IR-3 style: the weight is listed as an input too, so callers may override it
    nodes = [helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("Add", ["x", "nw"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [3]), vi("w", F32, [3])], [vi("y", F32, [3])],
                   inits=[const("w", [1, 2, 3])], ir=4, opset=9)
    assert fold_constants(m) == 0
    assert ops(m) == ["Neg", "Add"]
    assert "w" in inits(m)
    x = np.zeros(3, np.float32)
    np.testing.assert_array_equal(run(m, {"x": x})[0], [-1, -2, -3])
    np.testing.assert_array_equal(run(m, {"x": x, "w": np.array([5, 5, 5], np.float32)})[0], [-5, -5, -5])


# ---------------------------------------------------------------- subgraphs


def _if_model():
    """r = Relu(x) and k (a Constant) are read only inside the If branches, through outer scope."""
    then_g = helper.make_graph([helper.make_node("Add", ["r", "k"], ["t_out"])], "then", [],
                               [vi("t_out", F32, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["r", "k"], ["e_out"])], "else", [],
                               [vi("e_out", F32, [3])])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([1, 2, 3], np.float32))),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    return make_model(nodes, [vi("x", F32, [3]), vi("cond", TensorProto.BOOL, [])], [vi("y", F32, [3])])


def test_names_used_by_subgraphs_if():
    m = _if_model()
    assert names_used_by_subgraphs(m.graph) == {"r", "k"}


def test_names_used_by_subgraphs_loop_and_nested():
    # Loop body reads outer `a`; an If nested inside the body reads outer `b` and the body-local `acc`
    inner_then = helper.make_graph([helper.make_node("Add", ["acc", "b"], ["it"])], "it", [], [vi("it", F32, [2])])
    inner_else = helper.make_graph([helper.make_node("Identity", ["acc"], ["ie"])], "ie", [], [vi("ie", F32, [2])])
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "a"], ["acc"]),
         helper.make_node("If", ["c_in"], ["v_out"], then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vi("i", I64, []), vi("c_in", TensorProto.BOOL, []), vi("v_in", F32, [2])],
        [vi("c_out", TensorProto.BOOL, []), vi("v_out", F32, [2])],
    )
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)]
    m = make_model(nodes, [vi("x", F32, [2]), vi("trip", I64, []), vi("cond", TensorProto.BOOL, [])],
                   [vi("y", F32, [2])])
    used = names_used_by_subgraphs(m.graph)
    assert {"a", "b"} <= used
    assert not {"i", "c_in", "v_in", "x", "trip", "cond"} & used  # body inputs and explicit node inputs
    # the dead-node pass keeps both producers
    remove_dead_nodes(m)
    assert ops(m) == ["Relu", "Neg", "Loop"]
    x = np.array([1, -2], np.float32)
    got = run(m, {"x": x, "trip": np.array(2, np.int64), "cond": np.array(True)})[0]
    # two iterations: v = v + relu(x) + neg(x)
    np.testing.assert_allclose(got, x + 2 * (np.maximum(x, 0) - x))


def test_nodes_feeding_subgraphs_are_kept():
    m = _if_model()
    x = np.array([-1, 0, 2], np.float32)
    want = [run(m, {"x": x, "cond": np.array(c)})[0] for c in (True, False)]
    fold_constants(m)
    assert "Relu" in ops(m)  # read only by the If body: still live
    assert "Constant" not in ops(m)
    assert "k" in inits(m)  # folded, and kept as an initializer the body can read
    for c, w in zip((True, False), want):
        np.testing.assert_array_equal(run(m, {"x": x, "cond": np.array(c)})[0], w)
    onnx.checker.check_model(m)


def test_subgraph_contents_are_left_alone():
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["tc"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
         helper.make_node("Mul", ["x", "tc"], ["t_out"])], "then", [], [vi("t_out", F32, [1])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e_out"])], "else", [], [vi("e_out", F32, [1])])
    m = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [vi("x", F32, [1]), vi("cond", TensorProto.BOOL, [])], [vi("y", F32, [1])])
    before = m.SerializeToString()
    assert fold_constants(m) == 0
    assert m.SerializeToString() == before


def test_remove_dead_nodes_on_if_model_keeps_feeders():
    m = _if_model()
    remove_dead_nodes(m)
    assert ops(m) == ["Relu", "Constant", "If"]


# ---------------------------------------------------------------- remove_dead_nodes


def test_remove_dead_nodes():
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Neg", ["x"], ["dead1"]),
        helper.make_node("Exp", ["dead1"], ["dead2"]),
        helper.make_node("Add", ["x", "w_used"], ["z"]),
        helper.make_node("Abs", ["x"], ["kept_by_caller"]),
        helper.make_node("Print", ["x"], [], domain="my.debug"),  # custom op with side effects only
    ]
    m = make_model(nodes, [vi("x", F32, [2])], [vi("y", F32, [2]), vi("z", F32, [2])],
                   inits=[const("w_used", [1, 1]), const("w_dead", [2, 2])])
    remove_dead_nodes(m, protected={"kept_by_caller"})
    assert ops(m) == ["Relu", "Add", "Abs", "Print"]
    assert set(inits(m)) == {"w_used"}
    remove_dead_nodes(m)
    assert ops(m) == ["Relu", "Add", "Print"]
    assert [o.name for o in m.graph.output] == ["y", "z"]


def test_remove_dead_nodes_keeps_graph_outputs_and_inputs():
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["unused"])]
    m = make_model(nodes, [vi("x", F32, [2]), vi("w", F32, [2])], [vi("y", F32, [2])],
                   inits=[const("w", [1, 2])])
    remove_dead_nodes(m)
    assert ops(m) == ["Identity"]
    assert "w" in inits(m)  # an initializer that is a graph input stays (it is part of the interface)


def test_multi_output_node_kept_when_one_output_is_live():
    nodes = [helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=0), helper.make_node("Relu", ["b"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [4])], [vi("y", F32, [2])], inits=[const("sp", [2, 2], np.int64)])
    remove_dead_nodes(m)
    assert ops(m) == ["Split", "Relu"]


# ---------------------------------------------------------------- end to end: same results


def _mixed_model():
    """Dynamic work interleaved with foldable pieces, as exporters write it."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Mul", ["w", "half"], ["w2"]),  # foldable
        helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]),  # foldable
        helper.make_node("MatMul", ["x", "w2t"], ["mm"]),
        helper.make_node("Shape", ["mm"], ["s"]),  # mm is static: folds
        helper.make_node("Slice", ["s", "st", "en"], ["last"]),  # foldable after Shape
        helper.make_node("Concat", ["m1", "last"], ["flat"], axis=0),
        helper.make_node("Reshape", ["mm", "flat"], ["r"]),
        helper.make_node("Sqrt", ["four"], ["two"]),  # foldable
        helper.make_node("Div", ["r", "two"], ["d"]),
        helper.make_node("Tanh", ["d"], ["y"]),
        helper.make_node("ReduceSum", ["d", "axes"], ["z"], keepdims=0),
    ]
    ins = [const("w", rng.standard_normal((5, 4))), const("st", [-1], np.int64), const("en", [10], np.int64),
           const("m1", [-1], np.int64), const("four", 4.0), const("axes", [1], np.int64)]
    m = make_model(nodes, [vi("x", F32, [2, 3, 4])], [vi("y", F32, [6, 5]), vi("z", F32, [6])], inits=ins,
                   value_info=[vi("mm", F32, [2, 3, 5])])
    return m


def test_folded_model_gives_the_same_outputs():
    m = _mixed_model()
    onnx.checker.check_model(m, full_check=True)
    orig = copy(m)
    removed = fold_constants(m)
    assert removed == len(orig.graph.node) - len(m.graph.node)
    assert ops(m) == ["MatMul", "Reshape", "Div", "Tanh", "ReduceSum"]
    onnx.checker.check_model(m, full_check=True)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((2, 3, 4)).astype(np.float32)
        for a, b in zip(run(orig, {"x": x}), run(m, {"x": x})):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_fold_is_idempotent():
    m = _mixed_model()
    fold_constants(m)
    once = m.SerializeToString()
    assert fold_constants(m) == 0
    assert m.SerializeToString() == once


def test_max_rounds_bounds_the_work():
    m = _reshape_chain_model(2)
    fold_constants(m, max_rounds=1)
    # one round: the Constants and the static Shape fold, but not what depends on them
    assert "Shape" not in ops(m) and "Constant" not in ops(m)
    assert "Gather" in ops(m)
    fold_constants(m)
    assert ops(m) == ["Reshape"]


def test_unfoldable_op_is_left_alone():
    # ORT refuses to evaluate this Reshape (3 elements into shape [7]): it must stay as it is
    nodes = [helper.make_node("Reshape", ["c", "bad"], ["k"]), helper.make_node("Add", ["x", "k"], ["y"])]
    m = make_model(nodes, [vi("x", F32, [3])], [vi("y", F32, [3])],
                   inits=[const("c", [1, 2, 3]), const("bad", [7], np.int64)])
    assert fold_constants(m) == 0
    assert ops(m) == ["Reshape", "Add"]


def test_one_unfoldable_node_does_not_block_the_others():
    nodes = [helper.make_node("Reshape", ["c", "bad"], ["k"]), helper.make_node("Add", ["x", "k"], ["y"]),
             helper.make_node("Neg", ["c2"], ["n"]), helper.make_node("Add", ["x", "n"], ["z"])]
    m = make_model(nodes, [vi("x", F32, [3])], [vi("y", F32, [3]), vi("z", F32, [3])],
                   inits=[const("c", [1, 2, 3]), const("bad", [7], np.int64), const("c2", [1, 2, 3])])
    fold_constants(m)
    assert "Neg" not in ops(m)
    assert "Reshape" in ops(m)
