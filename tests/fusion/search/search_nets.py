"""A small ONNX graph builder for the search tests (test_candidates.py, test_backtrack.py): convolutions with
random weights, elementwise ops, SqueezeNet fire modules. The search reads shapes and wiring, not weight values."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


class Net:
    def __init__(self, seed=0):
        self.nodes, self.inits, self.inputs = [], [], []
        self.rng = np.random.default_rng(seed)

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, F32, shape))
        return name

    def conv(self, name, x, cin, cout, k=1, stride=1, pad=None, group=1, bias=False):
        w = numpy_helper.from_array(self.rng.standard_normal((cout, cin // group, k, k)).astype(np.float32),
                                    f"{name}.w")
        self.inits.append(w)
        ins = [x, w.name]
        if bias:
            self.inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), f"{name}.b"))
            ins.append(f"{name}.b")
        pad = k // 2 if pad is None else pad
        self.nodes.append(helper.make_node("Conv", ins, [f"{name}.y"], name=name, kernel_shape=[k, k],
                                           strides=[stride, stride], pads=[pad] * 4, group=group))
        return f"{name}.y"

    def op(self, op_type, name, inputs, **attrs):
        self.nodes.append(helper.make_node(op_type, list(inputs), [f"{name}.y"], name=name, **attrs))
        return f"{name}.y"

    def clip6(self, name, x):
        lo = numpy_helper.from_array(np.array(0, np.float32), f"{name}.lo")
        hi = numpy_helper.from_array(np.array(6, np.float32), f"{name}.hi")
        self.inits += [lo, hi]
        return self.op("Clip", name, [x, lo.name, hi.name])

    def fire(self, p, x, cin, squeeze, expand):
        s = self.op("Relu", f"{p}.sr", [self.conv(f"{p}.squeeze", x, cin, squeeze, 1)])
        e1 = self.op("Relu", f"{p}.e1r", [self.conv(f"{p}.e1", s, squeeze, expand, 1)])
        e3 = self.op("Relu", f"{p}.e3r", [self.conv(f"{p}.e3", s, squeeze, expand, 3)])
        return self.op("Concat", f"{p}.cat", [e1, e3], axis=1)

    def model(self, *outputs):
        outs = [helper.make_tensor_value_info(o, F32, None) for o in outputs]
        g = helper.make_graph(self.nodes, "g", self.inputs, outs, initializer=self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
