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


@pytest.mark.parametrize("target", ["native", "x86-64"])
@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_sigmoid_and_tanh_never_make_a_denormal(op, target, tmp_path):
    """Far out on either side, the results are right to within FLT_MIN and never denormals: a denormal costs a
    microcode assist per instruction (YOLOv8n's first SiLU ran 3x slower on them), so below -87 the sigmoid is 0."""
    x = np.array([-np.inf, -1000, -104, -100, -88, -87.01, -86.9, -44.5, -20, -9.2, 9.2, 17.5, 20, 25, 44.5, 88,
                  100, 1000, np.inf, np.nan], np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])])
    fused, lib, _ = fuse(model, tmp_path, target=parse_target(target))
    got = make_session(fused, 1, library=lib).run(None, {"x": x})[0]
    tiny = np.finfo(np.float32).tiny
    assert not np.any((got != 0) & (np.abs(got) < tiny)), got
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = np.tanh(x64) if op == "Tanh" else 1 / (1 + np.exp(-x64))
    np.testing.assert_allclose(got, want, rtol=4e-7, atol=2 * tiny, equal_nan=True)


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64"])
def test_exp_of_nonpositive_inputs(level):
    """vexp_nonpositive (the softmax and attention kernels' exp of s - max): within the bound of Exp on [-87, 0], 0
    below (never a denormal or garbage from the exponent field), NaN through, exp(-inf) = 0."""
    from llvmlite import ir

    from onnxopt.codegen.compile import new_module
    from onnxopt.codegen.target import missing_cpu_flags
    from onnxopt.codegen.vmath.exp import vexp_nonpositive

    target = parse_target(level)
    if missing_cpu_flags(target.required_cpu_flags):
        pytest.skip(f"this CPU lacks {level}")
    lanes = 8 if level == "x86-64-v3" else 4
    module = new_module(target, "exp")
    vty = ir.VectorType(ir.FloatType(), lanes)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(), ir.PointerType(), ir.IntType(64)]),
                     "expn")
    x_ptr, y_ptr, n = fn.args
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    x = b.load(b.gep(x_ptr, [i], source_etype=ir.FloatType()), typ=vty, align=4)
    b.store(vexp_nonpositive(b, x), b.gep(y_ptr, [i], source_etype=ir.FloatType()), align=4)
    nxt = b.add(i, ir.Constant(ir.IntType(64), lanes))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    from kernel_harness import jit_function

    run, _engine = jit_function(str(module), target, "expn", 3)

    sweep = np.linspace(-87, 0, 200_000)
    special = [-np.inf, np.nan, -0.0, 0.0, -87.0, -87.01, -88.7, -104.0, -1e30]
    x = np.concatenate([sweep, special, np.zeros(-(len(sweep) + len(special)) % lanes)]).astype(np.float32)
    y = np.empty_like(x)
    run(x.ctypes.data, y.ctypes.data, x.size)
    want = np.exp(x[: sweep.size].astype(np.float64))
    err = np.abs(y[: sweep.size] - want) / want
    assert err.max() < BOUND["Exp"], f"max relative error {err.max():.3g} at x={x[err.argmax()]}"
    got = y[sweep.size: sweep.size + len(special)]
    assert got[0] == 0 and np.isnan(got[1]) and got[2] == 1 and got[3] == 1
    assert got[4] == pytest.approx(np.exp(-87.0), rel=4e-7) and np.all(got[5:] == 0)
