"""Small onnx.helper shorthands shared by the tests."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir_version=10):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def library_op_session(lib, op_type, inputs, outputs, threads=2):
    """An onnxruntime session of one op of a kernel library (domain onnxopt), its tensors of unknown shapes."""
    import onnxruntime as ort
    from onnx import TensorProto

    node = helper.make_node(op_type, list(inputs), list(outputs), domain="onnxopt")
    vi = helper.make_tensor_value_info
    model = helper.make_model(
        helper.make_graph([node], "g", [vi(x, TensorProto.FLOAT, None) for x in inputs],
                          [vi(y, TensorProto.FLOAT, None) for y in outputs]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxopt", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(lib)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def assert_fused_answers(src, out, feeds, rtol=1e-4, atol=1e-4):
    """The fused model `out` gives the original `src`'s first output, with its library and through its functions."""
    import onnxopt.runtime as rt
    import onnxruntime as ort

    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = rt.InferenceSession(out).run(None, feeds)[0]
    got_fn = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(got_fn, want, rtol=rtol, atol=atol)


def vad_model():
    """Silero VAD's shape of the problem: `sr` (a scalar int64) must be 8000 or 16000; any other value takes an
    else branch that fails in onnxruntime (a Gather out of bounds)."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["o_then"])], "then", [],
                               [helper.make_tensor_value_info("o_then", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Gather", ["x", "bad"], ["o_else"], axis=0)], "else", [],
                               [helper.make_tensor_value_info("o_else", TensorProto.FLOAT, None)])
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "k16"),
             numpy_helper.from_array(np.array(8000, np.int64), "k8"),
             numpy_helper.from_array(np.array([1000], np.int64), "bad"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32), "b")]
    nodes = [helper.make_node("Equal", ["sr", "k16"], ["is16"]), helper.make_node("Equal", ["sr", "k8"], ["is8"]),
             helper.make_node("Or", ["is16", "is8"], ["ok"]),
             helper.make_node("If", ["ok"], ["h"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["h", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
                                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rnn_model(steps, batch, input_size, hidden, direction="bidirectional", *, op="LSTM", states=True,
              outputs=(True, True, True), bias=True, seed=0, attrs=None, symbolic=False, opset=17):
    """An LSTM (or a GRU, linear_before_reset 1 unless `attrs` says otherwise) node with random constant W, R (and
    B), X [steps, batch, input_size] (T and N when symbolic), initial_h (and an LSTM's initial_c) as inputs when
    `states`, the outputs Y, Y_h (and Y_c) that `outputs` asks for; shapes inferred."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    gates, state_names = (4, ("h0", "c0")) if op == "LSTM" else (3, ("h0",))
    inits = [numpy_helper.from_array((rng.standard_normal((d, gates * hidden, input_size)) / np.sqrt(input_size))
                                     .astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((d, gates * hidden, hidden)) / np.sqrt(hidden))
                                     .astype(np.float32), "R")]
    ins = ["x", "W", "R"]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((d, 2 * gates * hidden)) * 0.5)
                                             .astype(np.float32), "B"))
        ins.append("B")
    else:
        ins.append("")
    t, b = ("T", "N") if symbolic else (steps, batch)
    graph_ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, input_size])]
    if states:
        ins += [""] + list(state_names)
        graph_ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [d, b, hidden]) for n in state_names]
    while not ins[-1]:
        ins.pop()
    names = [n if want else "" for n, want in zip(("y", "yh", "yc")[:len(state_names) + 1], outputs)]
    while names and not names[-1]:
        names.pop()
    attrs = dict(attrs or {})
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    node = helper.make_node(op, ins, names, name=op.lower(), hidden_size=hidden, direction=direction, **attrs)
    graph_outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n]
    g = helper.make_graph([node], "g", graph_ins, graph_outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)
