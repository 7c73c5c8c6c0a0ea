"""Small onnx.helper shorthands shared by the tests."""

import numpy as np
from onnx import helper, numpy_helper


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir_version=10):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
