"""onnxopt/dtypes.py: the DType table agrees with onnx's, numpy's, LLVM's and the C compiler's idea of each type; the
elementwise view of it keeps its old answers; and a compute or pool region carries the graph's dtype to its
kernel's description."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from llvmlite import binding as llvm
from llvmlite import ir
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.elementwise import types
from onnxopt.dtypes import DTYPES, DType, dtype, from_onnx
from onnxopt.fusion.elementwise_ops import SUPPORTED
from onnxopt.fusion.params import ComputeAttrs, ComputeParams, PoolParams
from onnxopt.verify import KERNEL_ATOL, KERNEL_RTOL

from onnx_builders import make_model  # noqa: E402

ALL = list(DTYPES.values())
ids = [d.name for d in ALL]
MANTISSA = {"float16": 10, "bfloat16": 7}


def test_table_has_the_names_the_brief_lists():
    assert set(DTYPES) == {"float32", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                           "int64", "uint64", "float64", "bool"}
    assert all(isinstance(d, DType) and d.name == k for k, d in DTYPES.items())


@pytest.mark.parametrize("d", ALL, ids=ids)
def test_onnx_enum_numpy_type_and_itemsize_agree_with_onnx(d):
    want = helper.tensor_dtype_to_np_dtype(d.onnx)
    assert want.itemsize == d.itemsize
    assert want.name == d.name
    assert helper.tensor_dtype_to_string(d.onnx).startswith("TensorProto.")
    if d.numpy is not None:
        assert np.dtype(d.numpy) == want
        assert np.dtype(d.numpy).itemsize == d.itemsize
    assert from_onnx(d.onnx) is d and dtype(d.onnx) is d and dtype(d.name) is d


def test_onnx_enums_are_the_tensorproto_names():
    tp = TensorProto
    assert {n: DTYPES[n].onnx for n in ("float32", "float16", "bfloat16", "float64", "bool", "int8", "uint8")} == {
        "float32": tp.FLOAT, "float16": tp.FLOAT16, "bfloat16": tp.BFLOAT16, "float64": tp.DOUBLE,
        "bool": tp.BOOL, "int8": tp.INT8, "uint8": tp.UINT8}
    assert DTYPES["bfloat16"].onnx == 16 and DTYPES["float16"].onnx == 10


@pytest.mark.parametrize("d", ALL, ids=ids)
def test_llvm_memory_type_is_itemsize_bytes(d):
    td = llvm.create_target_data("e")
    assert d.memory.get_abi_size(td) == d.itemsize
    if d.name not in ("bool", "bfloat16"):  # those two are widened in registers (i1; float)
        assert d.llvm == d.memory


def test_register_types():
    assert DTYPES["bool"].llvm == ir.IntType(1)
    assert DTYPES["float16"].llvm == ir.HalfType()
    # llvmlite's ir has no bfloat type: in registers a bfloat16 is the float that holds it exactly
    assert DTYPES["bfloat16"].llvm == ir.FloatType() and DTYPES["bfloat16"].memory == ir.IntType(16)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_type_sizeof_is_itemsize(tmp_path):
    src = tmp_path / "sizes.c"
    src.write_text("#include <stdint.h>\n#include <stdbool.h>\n" + "".join(
        f'_Static_assert(sizeof({d.c}) == {d.itemsize}, "{d.name}");\n' for d in ALL))
    run = subprocess.run(["cc", "-std=c11", "-c", str(src), "-o", str(tmp_path / "sizes.o")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_accumulation_types():
    acc = {d.name: d.accumulator.name for d in ALL}
    assert acc["float16"] == acc["bfloat16"] == "float32"
    assert acc["int8"] == acc["uint8"] == "int32"
    assert all(acc[n] == n for n in acc if n not in ("float16", "bfloat16", "int8", "uint8"))


def test_tolerances():
    assert (DTYPES["float32"].rtol, DTYPES["float32"].atol) == (KERNEL_RTOL["float32"], KERNEL_ATOL["float32"])
    assert DTYPES["float32"].rtol < DTYPES["float16"].rtol < DTYPES["bfloat16"].rtol
    assert all(d.rtol == d.atol == 0 for d in ALL if not d.is_float)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_sixteen_bit_floats_round_trip_through_their_uint16_storage(name):
    d = DTYPES[name]
    if d.numpy is None:
        pytest.skip("ml_dtypes is not installed: bfloat16 has no numpy type")
    exact = np.array([0.0, -0.0, 1.0, -2.5, 0.15625, 2.0 ** -12, 96.0, np.inf, -np.inf], np.float32)
    stored = exact.astype(d.numpy).view(np.uint16)  # what a C uint16_t holds
    assert d.c == "uint16_t" and stored.dtype.itemsize == d.itemsize
    back = stored.view(d.numpy).astype(np.float32)
    np.testing.assert_array_equal(back, exact)
    assert np.isnan(np.array([np.nan], np.float32).astype(d.numpy).astype(np.float32))[0]
    if name == "bfloat16":  # the conversion note: a bfloat16 is the high half of the float32's bits
        np.testing.assert_array_equal(stored, (exact.view(np.uint32) >> 16).astype(np.uint16))
    # One rounding to the type stays within the tolerance the kernel check gives it (half an ulp of the mantissa).
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    err = np.abs(x.astype(d.numpy).astype(np.float32) - x)
    assert np.all(err <= 2.0 ** -(MANTISSA[name] + 1) * np.abs(x) + 1e-30)
    assert np.all(err <= d.atol + d.rtol * np.abs(x))


def test_lookup_by_numpy_type_and_enum():
    assert dtype(np.float32) is DTYPES["float32"]
    assert dtype(np.dtype("int8")) is DTYPES["int8"]
    assert dtype(np.bool_) is DTYPES["bool"]
    assert dtype(TensorProto.FLOAT16) is DTYPES["float16"]
    assert dtype(DTYPES["uint64"]) is DTYPES["uint64"]
    if DTYPES["bfloat16"].numpy is not None:
        assert dtype(DTYPES["bfloat16"].numpy) is DTYPES["bfloat16"]


@pytest.mark.parametrize("bad", ["float8", "half", "", 999, TensorProto.STRING, 2.5, object(), np.complex64])
def test_unknown_types_name_the_allowed_ones(bad):
    with pytest.raises(ValueError) as e:
        dtype(bad)
    assert "float32" in str(e.value) and "bfloat16" in str(e.value) and "uint64" in str(e.value)


def test_from_onnx_error_names_the_type():
    with pytest.raises(ValueError, match="STRING"):
        from_onnx(TensorProto.STRING)


# ---- the elementwise view ------------------------------------------------------------------------------------------


def test_elementwise_types_is_a_view_of_the_table():
    for name, d in DTYPES.items():
        assert types.LLVM_SCALAR[name] == d.llvm and types.MEMORY_SCALAR[name] == d.memory
        assert types.ITEMSIZE[name] == d.itemsize and types.ONNX_ENUM[name] == d.onnx
    # the old answers: bool is i1 in registers, i8 in memory; is_signed means a signed integer
    assert types.MEMORY_SCALAR["bool"] == ir.IntType(8) and types.LLVM_SCALAR["bool"] == ir.IntType(1)
    assert types.is_float("float32") and types.is_float("float64") and not types.is_float("int32")
    assert types.is_signed("int8") and not types.is_signed("uint8") and not types.is_signed("float32")
    assert not types.is_float("string") and not types.is_signed("string")
    assert types.vec("float32", 8) == ir.VectorType(ir.FloatType(), 8)


def test_elementwise_kernels_do_not_take_sixteen_bit_floats():
    assert not any({"float16", "bfloat16"} & dts for dts in SUPPORTED.values())
    from onnxopt.fusion.elementwise import ElementwiseRule

    vi = helper.make_tensor_value_info
    m = make_model([helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                   [vi("x", TensorProto.FLOAT16, [4, 8])], [vi("y", TensorProto.FLOAT16, [4, 8])])
    rejected: list[dict] = []
    assert ElementwiseRule(onnx.shape_inference.infer_shapes(m)).find_regions(rejected) == []


# ---- the dtype through the params to the description ---------------------------------------------------------------


def _conv_model(elem=TensorProto.FLOAT, np_type=np.float32):
    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal([8, 4, 3, 3]).astype(np_type), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    m = make_model(nodes, [vi("x", elem, [1, 4, 9, 9])], [vi("y", elem, [1, 8, 9, 9])], [w])
    return onnx.shape_inference.infer_shapes(m)


def _compute_region(model):
    from onnxopt.codegen.microkernel.registry import select
    from onnxopt.codegen.target import host_target
    from onnxopt.fusion.compute import ComputeRule

    rejected: list[dict] = []
    regions = ComputeRule(model, mi=select(host_target()).tile.mi).find_regions(set(), rejected)
    return regions, rejected


def test_compute_region_carries_the_graph_dtype_to_its_description():
    from onnxopt.codegen.compute.describe import describe_compute
    from onnxopt.codegen.target import host_target

    (region,), rejected = _compute_region(_conv_model())
    assert not rejected
    assert region.compute.dtype == "float32"
    assert {v.dtype for v in region.program.inputs + region.program.outputs} == {"float32"}
    desc, _ = describe_compute(region, "Conv_test", host_target())
    enum = dtype(region.compute.dtype).onnx
    assert enum == TensorProto.FLOAT
    assert desc.in_types == [enum] * len(region.inputs) and desc.out_types == [enum] * len(region.outputs)
    # The description follows the params, not a literal: the same region with another dtype declares that one.
    region.params = dataclasses.replace(region.compute, dtype="float16")
    desc16, _ = describe_compute(region, "Conv_test16", host_target())
    assert set(desc16.in_types) == set(desc16.out_types) == {TensorProto.FLOAT16}


def test_sixteen_bit_convolutions_stay_with_onnxruntime():
    regions, rejected = _compute_region(_conv_model(TensorProto.FLOAT16, np.float16))
    assert regions == [] and [r["reason"] for r in rejected] == ["Conv: not float32"]


def test_pool_region_carries_the_graph_dtype_to_its_description():
    from onnxopt.codegen.pool.build import build_pool
    from onnxopt.codegen.target import host_target
    from onnxopt.fusion.pool import PoolRule

    vi = helper.make_tensor_value_info
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                   [vi("x", TensorProto.FLOAT, [1, 8, 8, 8])], [vi("y", TensorProto.FLOAT, [1, 8, 4, 4])])
    (region,) = PoolRule(onnx.shape_inference.infer_shapes(m)).find_regions(set(), [])
    assert region.pool.dtype == "float32"
    region.compute_op_type("test")
    _, desc, _ = build_pool(region, host_target())
    assert desc.in_types == desc.out_types == [DTYPES["float32"].onnx]


def test_float32_op_types_do_not_change_and_other_dtypes_do():
    c = ComputeParams("conv", attrs=ComputeAttrs(oc=8))
    assert "dtype" not in c.op_type_text("t")
    assert c.op_type_text("t") == dataclasses.replace(c, dtype="float32").op_type_text("t")
    assert c.op_type_text("t") != dataclasses.replace(c, dtype="float16").op_type_text("t")
    p = PoolParams("max", attrs={"rank": 4})
    assert p.key() == ["max", [], [], {"rank": "4"}]
    assert dataclasses.replace(p, dtype="bfloat16").key()[-1] == "bfloat16"


def test_kind_params_carry_a_dtype():
    from onnxopt.kinds.attention.params import AttentionParams
    from onnxopt.kinds.layernorm.params import LayerNormParams
    from onnxopt.kinds.softmax.params import SoftmaxParams

    ln = LayerNormParams(1e-5, False, False, True)
    at = AttentionParams(0.125, False, "none")
    sm = SoftmaxParams("softmax", 1)
    assert ln.dtype == at.dtype == sm.dtype == "float32"
    # float32 keys are the ones from before the field (the softmax kind always had it in its key)
    assert ln.key() == [repr(1e-5), False, False, True] and at.key() == [repr(0.125), False, "none", "0.0", False]
    assert dataclasses.replace(ln, dtype="float16").key()[-1] == "float16"
    assert dataclasses.replace(at, dtype="float16").key()[-1] == "float16"
