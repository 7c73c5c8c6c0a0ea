"""A bf16 GEMM's output that only bf16 GEMMs read, kept in bfloat16 inside a sequence (emit/sequence.py
`_bf16_slots`, codegen/glue/sequence_exec.c): the writer's AMX tiles round it in their epilogue and the readers'
tiles read it as it lies, so the float32 tensor (and each reader's rounding pass over it) is never made. Each reader
rounded its A with the same instruction, so the answer is the float32 tensor's bit for bit
(ONNXOPT_SEQUENCE_BF16=0 turns it off); `onnxopt.runtime.bf16_tensors` counts the tensors kept so. On emulated tiles
on any host with the AMX target's vector code, on the real tiles where the CPU has AMX-BF16."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fresh_process import run_written
from onnx import TensorProto, helper, numpy_helper

import onnxopt
from onnxopt.codegen.glue.descs import CtKernelDesc
from onnxopt.codegen.target import host_cpu_flags
from onnxopt.emit.sequence import _bf16_slots

AMX_BF16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16"
HAS_BF16 = "avx512_bf16" in host_cpu_flags()
HAS_AMX_BF16 = {"amx_tile", "amx_bf16"} <= host_cpu_flags()
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0}
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector tiles)")


def _gemm(op: str, tiles16: bool = True, matrix: str = "tdpbf16ps") -> CtKernelDesc:
    return CtKernelDesc(op, "matmul", [1, 16, 1], [1], 1, 4, 16, [["t"]], [2], [0], packed_b=64,
                        matrix_instruction=matrix, amx_tiles=[["x"]], amx_tiles16=[["xh"]] if tiles16 else [])


def test_only_a_tensor_bf16_gemms_write_and_read_as_their_a_is_kept_in_bf16():
    descs = {"G1": _gemm("G1"), "G2": _gemm("G2"), "NoH": _gemm("NoH", tiles16=False),
             "F16": _gemm("F16", matrix="tdpfp16ps"), "LN": object()}
    # steps: (op, input refs (< 0: slot -1 - ref), output slots)
    steps = [("G1", [0], [0]), ("G2", [-1], [1]), ("LN", [-2], [2])]
    assert _bf16_slots(steps, descs, [-1, -1, 0], [None] * 3) == [1, 0, 0]  # slot 1 is read by LN
    assert _bf16_slots(steps, descs, [0, -1, 1], [None] * 3) == [0, 0, 0]  # slot 0 is a sequence output
    read_as_b = [("G1", [0], [0]), ("G2", [1, -1], [1])]  # read as the second input
    assert _bf16_slots(read_as_b, descs, [-1, 0], [None] * 2) == [0, 0]
    two_readers = [("G1", [0], [0]), ("G2", [-1], [1]), ("G1", [-1], [2])]
    assert _bf16_slots(two_readers, descs, [-1, 0, 1], [None] * 3) == [1, 0, 0]
    assert _bf16_slots([("G1", [0], [0]), ("LN", [-1], [1])], descs, [-1, 0], [None] * 2) == [0, 0]
    assert _bf16_slots([("NoH", [0], [0]), ("G2", [-1], [1])], descs, [-1, 0], [None] * 2) == [0, 0]
    assert _bf16_slots([("G1", [0], [0]), ("F16", [-1], [1])], descs, [-1, 0], [None] * 2) == [0, 0]


def _ffn(batch: int, m: int, k: int = 96, n: int = 160, seed: int = 0) -> onnx.ModelProto:
    """A transformer's FFN as the torch exporter writes it: MatMul + bias, GELU by Erf, MatMul + bias."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((n, k)) / math.sqrt(n)).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal(k) * 0.1).astype(np.float32), "b2"),
             numpy_helper.from_array(np.array(math.sqrt(2.0), np.float32), "s2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["y0"]),
             helper.make_node("Div", ["y0", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["y0", "e1"], ["p"]),
             helper.make_node("Mul", ["p", "half"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["h2"]), helper.make_node("Add", ["h2", "b2"], ["y"])]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m, k])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _written(tmp_path, batch: int, m: int, k: int = 96) -> tuple:
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "ffn.onnx"
    out.parent.mkdir()
    model = _ffn(batch, m, k)
    onnx.save(model, src)
    res = onnxopt.optimize(str(src), str(out), precision="bf16", target=AMX_BF16_TARGET, **FAST)
    assert res.report["verification"]["ok"] and len(res.report["sequences"]) == 1, res.report.get("sequences")
    assert [r.get("matrix_instruction") for r in res.report["regions"]] == ["tdpbf16ps"] * 2
    return model, out


@needs_bf16
@pytest.mark.parametrize("batch,m,kept", [(1, 64, True), (3, 32, True), (2, 40, False)])
def test_the_written_model_keeps_the_ffn_tensor_in_bf16_bit_for_bit(tmp_path, monkeypatch, batch, m, kept):
    """On emulated tiles, in a fresh process through the public loader: the GELU output is kept in bfloat16 where its
    rows come in whole tiles (40 rows a matrix do not: it stays float32), across batch items too, and the answer is
    the float32 tensor's, bit for bit."""
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model, out = _written(tmp_path, batch, m)
    x = np.random.default_rng(batch + m).standard_normal((batch, m, 96)).astype(np.float32)
    env = {"ONNXOPT_EMULATE_TILES": "1"}
    got, loader = run_written(out, x, tmp_path, env=env)
    off, loader_off = run_written(out, x, tmp_path, env={**env, "ONNXOPT_SEQUENCE_BF16": "0"})
    assert loader["amx"] == "emulated" and sum(loader["calls"].values()) == 1
    assert loader["bf16_tensors"] == (1 if kept else 0) and loader_off["bf16_tensors"] == 0
    np.testing.assert_array_equal(got, off)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * float(np.abs(want).max()))


@pytest.mark.skipif(not HAS_AMX_BF16, reason="this CPU has no AMX-BF16")
def test_on_real_tiles_the_ffn_tensor_is_kept_in_bf16_bit_for_bit(tmp_path):
    _, out = _written(tmp_path, 2, 128, k=256)
    x = np.random.default_rng(7).standard_normal((2, 128, 256)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    off, _ = run_written(out, x, tmp_path, env={"ONNXOPT_SEQUENCE_BF16": "0"})
    if loader["amx"] != "granted":
        pytest.skip(f"the tile state was not granted here: {loader['amx']}")
    assert loader["bf16_tensors"] == 1
    np.testing.assert_array_equal(got, off)
