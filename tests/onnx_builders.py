"""Small onnx.helper shorthands shared by the tests."""

import numpy as np
from onnx import helper, numpy_helper


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
