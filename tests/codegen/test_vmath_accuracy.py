"""Accuracy of the vector math over dense sweeps, against float64 references, on every target kind.

The AVX-512 path (vscalefps, vrcp14ps) and the portable path (exponent-field scaling, division) are both checked;
this CPU runs both.
"""

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from kernel_harness import fuse, make_model
from onnxopt.codegen.target import parse_target
from onnxopt.timing import make_session

_erf = np.vectorize(math.erf)
REFS = {
    "Exp": (np.exp, np.linspace(-87, 88, 200_001)),
    "Log": (np.log, np.concatenate([np.geomspace(1e-37, 1e37, 100_001), np.linspace(0.01, 10, 100_000)])),
    "Erf": (lambda x: _erf(x), np.linspace(-6, 6, 100_001)),
    "Tanh": (np.tanh, np.linspace(-20, 20, 200_001)),
    "Sigmoid": (lambda x: 1 / (1 + np.exp(-x)), np.linspace(-30, 30, 200_001)),
}
# Relative bound where the result is not tiny; absolute bound near zero crossings.
BOUND = {"Exp": 4e-7, "Log": 3e-7, "Erf": 4e-7, "Tanh": 4e-7, "Sigmoid": 4e-7}


@pytest.mark.parametrize("target", ["native", "x86-64-v3", "x86-64"])
@pytest.mark.parametrize("op", sorted(REFS))
def test_accuracy(op, target, tmp_path):
    ref, xs = REFS[op]
    x = xs.astype(np.float32)
    n = x.size
    model = make_model([helper.make_node(op, ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    fused, lib, _ = fuse(model, tmp_path, target=parse_target(target))
    got = make_session(fused, 1, library=lib).run(None, {"x": x})[0].astype(np.float64)
    want = ref(x.astype(np.float64))
    err = np.abs(got - want) / np.maximum(np.abs(want), 1e-6)
    assert err.max() < BOUND[op], f"{op} on {target}: max error {err.max():.3g} at x={x[err.argmax()]}"


@pytest.mark.parametrize("target", ["native", "x86-64"])
def test_exp_range_ends(target, tmp_path):
    x = np.array([-np.inf, -200, -104, -103.9, -87.4, 88.7, 88.73, 89, 1000, np.inf, np.nan, 0, -0.0], np.float32)
    model = make_model([helper.make_node("Exp", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])])
    fused, lib, _ = fuse(model, tmp_path, target=parse_target(target))
    got = make_session(fused, 1, library=lib).run(None, {"x": x})[0]
    with np.errstate(over="ignore"):
        want = np.exp(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-44, equal_nan=True)
