"""Chains of Transposes and Reshapes that only add or drop dims of 1 become one Transpose
(graph/transpose_chains.py): DistilBERT's K^T, drawn chains against onnxruntime on the original, the chains left
alone, and DistilBERT's attention through onnxopt, where the merged Transpose is read in place by the attention
kernel and no Transpose is left to onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.graph.infer import static_shapes
from onnxopt.graph.transpose_chains import merge_transpose_chains

F = TensorProto.FLOAT
vi = helper.make_tensor_value_info


def _model(nodes, x_shape, out, inits=(), outputs=None):
    g = helper.make_graph(nodes, "g", [vi("x", F, x_shape)], outputs or [vi(out, F, None)], list(inits))
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                                               ir_version=8))


def _shape(name, dims):
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _merged(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    count = merge_transpose_chains(m, static_shapes(m))
    return m, count


def distilbert_k(h=12, s=16, d=8):
    """view [1, s, h, d] -> Transpose(0, 2, 1, 3) -> Reshape [h, s, d] -> Transpose(0, 2, 1) -> Reshape [1, h, d, s]
    -> Mul by a scale, as torch's dynamo exporter writes DistilBERT's K^T."""
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1, 3], name="t1"),
             helper.make_node("Reshape", ["t1", "s3"], ["r1"], name="r1"),
             helper.make_node("Transpose", ["r1"], ["t2"], perm=[0, 2, 1], name="t2"),
             helper.make_node("Reshape", ["t2", "s4"], ["kt"], name="r2"),
             helper.make_node("Mul", ["kt", "scale"], ["y"], name="scale")]
    inits = [_shape("s3", [h, s, d]), _shape("s4", [1, h, d, s]),
             numpy_helper.from_array(np.array(0.5, np.float32), "scale")]
    return _model(nodes, [1, s, h, d], "y", inits)


def test_distilberts_k_transpose_becomes_berts():
    model = distilbert_k()
    merged, count = _merged(model)
    assert count == 1
    ops = [(n.op_type, [list(a.ints) for a in n.attribute if a.name == "perm"]) for n in merged.graph.node]
    assert ops == [("Transpose", [[0, 2, 3, 1]]), ("Mul", [])]
    x = np.random.default_rng(0).standard_normal((1, 16, 12, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(merged, x)[0], _run(model, x)[0])


def test_a_chain_that_changes_the_rank_ends_in_one_reshape():
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t1", "s3"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["y"], perm=[2, 0, 1])]
    model = _model(nodes, [1, 5, 3, 4], "y", [_shape("s3", [3, 5, 4])])
    merged, count = _merged(model)
    assert count == 1 and [n.op_type for n in merged.graph.node] == ["Transpose", "Reshape"]
    x = np.random.default_rng(1).standard_normal((1, 5, 3, 4)).astype(np.float32)
    got, want = _run(merged, x)[0], _run(model, x)[0]
    assert got.shape == want.shape == (4, 3, 5)
    np.testing.assert_array_equal(got, want)


def test_chains_left_alone():
    # one Transpose: nothing to merge
    one = _model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [3, 4], "y")
    assert _merged(one)[1] == 0
    # a Reshape that merges two dims of size > 1 moves elements between them
    merging = _model([helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0, 2]),
                      helper.make_node("Reshape", ["t1", "s"], ["r"]),
                      helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])], [2, 3, 4], "y", [_shape("s", [3, 8])])
    assert _merged(merging)[1] == 0
    # an intermediate tensor that something else reads (here a graph output)
    model = distilbert_k()
    model.graph.output.append(vi("r1", F, None))
    assert _merged(model)[1] == 0


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_drawn_chains_give_onnxruntimes_answer(data):
    rank = data.draw(st.integers(2, 4))
    shape = [data.draw(st.sampled_from([1, 2, 3, 5])) for _ in range(rank)]
    x_shape = list(shape)
    nodes, inits, cur, transposes = [], [], "x", 0
    for k in range(data.draw(st.integers(2, 5))):
        if data.draw(st.booleans()):
            perm = data.draw(st.permutations(range(len(shape))))
            shape = [shape[p] for p in perm]
            nodes.append(helper.make_node("Transpose", [cur], [f"v{k}"], perm=list(perm)))
            transposes += 1
        else:  # a Reshape that adds or drops dims of 1
            core = [d for d in shape if d != 1]
            ones = data.draw(st.integers(0, 2))
            new = list(core)
            for _ in range(ones):
                new.insert(data.draw(st.integers(0, len(new))), 1)
            shape = new or [1]
            inits.append(_shape(f"s{k}", shape))
            nodes.append(helper.make_node("Reshape", [cur, f"s{k}"], [f"v{k}"]))
        cur = f"v{k}"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = _model(nodes, x_shape, "y", inits)
    merged, count = _merged(model)
    assert count == (1 if transposes >= 2 else 0)  # one chain, from the first Transpose to the end
    x = np.random.default_rng(2).standard_normal(x_shape).astype(np.float32)
    got, want = _run(merged, x)[0], _run(model, x)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_distilberts_attention_reads_its_k_in_place(tmp_path):
    """The sdpa form with its heads split, K^T made as DistilBERT's export makes it: written, the model runs no
    Transpose in onnxruntime, and the attention kernel ran (in a fresh process, through the loader)."""
    from attention_models import attention_model
    from fresh_process import kernel_ran, run_written

    b, h, m, d = 1, 4, 32, 16
    model = attention_model("sdpa", b, h, m, m, d, "none", guard=False, split_heads=True)
    nodes = list(model.graph.node)
    k = next(i for i, n in enumerate(nodes) if n.output[0] == "kt2")
    chain = [helper.make_node("Transpose", ["k_tokens"], ["kh"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["kh", "s3"], ["kh3"]),
             helper.make_node("Transpose", ["kh3"], ["kt3"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["kt3", "s4"], ["kt2"])]
    del model.graph.node[:]
    model.graph.node.extend(nodes[:k] + chain + nodes[k + 1:])
    model.graph.initializer.extend([_shape("s3", [h, m, d]), _shape("s4", [1, h, d, m])])
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "f.onnx")
    onnx.save(model, src)
    res = onnxopt.optimize(src, out, measure=False, threads=2)
    assert res.report["rewrites"]["transpose_chains_merged"] == 1
    written = onnx.load(out)
    assert not any(n.op_type == "Transpose" for n in written.graph.node)
    attention = [n.op_type for n in written.graph.node if n.op_type.startswith("attention_")]
    assert len(attention) == 1
    rng = np.random.default_rng(3)
    feeds = {f"{t}_tokens": rng.standard_normal((b, m, h, d)).astype(np.float32) for t in "qkv"}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, said = run_written(out, feeds, tmp_path)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert kernel_ran(written, attention[0], said["calls"])
