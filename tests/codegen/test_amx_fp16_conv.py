"""float16 convolutions on AMX-FP16 tiles (`tdpfp16ps`, Granite Rapids; `--precision fp16` on an AMX-FP16 target).

The bfloat16 convolution's tile program (codegen/compute/amx_conv_tile.py) on the float16 instruction: the weights in
pairs of input channels padded to 32 (fusion/layout.py `lower_blocked_conv` with b_dtype "float16"), the input
copied into blocks of 32 channels as float16 (the glue's cb_copy32_row, vcvtps2ph). Where the tiles cannot run (a CPU
without AMX-FP16, as every development host is, or an OS that does not grant the tile state), the glue unpacks the
pairs once a call into float32 for the float32 tiles (`cb_unpack_f16_pairs`). With the tiles built
as plain code (ONNXOPT_EMULATE_TILES=1) the written model runs its AMX path here, in a fresh process through the
public loader, bit-exact to the instruction's rule; built for the real tiles, this CPU runs the fallback, exact to
float32 arithmetic on the float16 weights (or, where the CPU has AMX-FP16, the tiles within float32 accumulation's
bound)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from amx_rules import tile_rule
from fresh_process import run_written
from onnx import TensorProto, numpy_helper
from test_amx_conv import CASES, im2col, two_convs, weights_in_k_order

import onnxopt
from onnxopt.codegen.target import host_cpu_flags

AMX_FP16_TARGET = "cpu=x86-64-v4,+avx512bf16,+avx512vnni,+amx-tile,+amx-bf16,+amx-fp16"
HAS_BF16 = "avx512_bf16" in host_cpu_flags()
HAS_AMX_FP16 = {"amx_tile", "amx_fp16"} <= host_cpu_flags()
FAST = {"measure": False, "threads": 2, "cost_cache": False, "tune_budget": 0, "plan": "compute-blocked"}
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16 (the AMX target's vector code)")


def f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _build(tmp_path, model):
    src, out = tmp_path / "src.onnx", tmp_path / "w" / "out.onnx"
    onnx.save(model, src)
    out.parent.mkdir(exist_ok=True)
    return onnxopt.optimize(str(src), str(out), precision="fp16", target=AMX_FP16_TARGET, **FAST), out


def _operands(x, sel, params):
    """(the convolution's input columns in the tiles' K order, its float16 weights in that order, OH, OW)."""
    wt = params[0]
    h = np.einsum("oi,ihw->ohw", sel[:, :, 0, 0], x[0]).astype(np.float32)  # exact: one 1.0 a row
    blocks = -(-h.shape[0] // 32)
    cols, oh, ow = im2col(h, wt.shape[2], wt.shape[3], *params[2:], blocks)
    return cols, weights_in_k_order(f16(wt), blocks), oh, ow


@needs_bf16
@pytest.mark.parametrize("ic, layer, h, w", CASES)
def test_the_whole_path_on_emulated_amx_fp16_tiles_in_a_fresh_process(tmp_path, monkeypatch, ic, layer, h, w):
    monkeypatch.setenv("ONNXOPT_EMULATE_TILES", "1")
    model, sel, params = two_convs(ic, layer, h, w)
    res, out = _build(tmp_path, model)
    conv = [r for r in res.report["regions"] if "conv" in r["nodes"]]
    assert conv and conv[0].get("matrix_instruction") == "tdpfp16ps", res.report["precision"]["float32_regions"]
    assert res.report["verification"]["ok"] and res.report["fallback_verification"]["ok"]
    padded = [int(t.dims[1]) for t in onnx.load(out).graph.initializer if t.data_type == TensorProto.FLOAT16]
    assert -(-ic // 32) * 32 * layer[1] ** 2 in padded  # input channels padded to whole blocks of 32
    x = f16(np.random.default_rng(1).standard_normal((1, 32, h, w)))
    got, loader = run_written(out, x, tmp_path, env={"ONNXOPT_EMULATE_TILES": "1"})
    assert loader["amx"] == "emulated" and sum(loader["calls"].values()) >= 1, loader
    cols, wk, oh, ow = _operands(x, sel, params)
    want = np.maximum((tile_rule(cols, wk, "f16") + params[1][None, :]).astype(np.float32), 0)
    np.testing.assert_array_equal(got, want.T.reshape(1, -1, oh, ow))  # tdpfp16ps's rule on every output


@needs_bf16
@pytest.mark.parametrize("tiny", [False, True], ids=["normal", "subnormal"])
@pytest.mark.parametrize("ic, layer, h, w", CASES[:3])
def test_where_the_tiles_cannot_run_the_pairs_are_unpacked_for_the_float32_kernel(tmp_path, ic, layer, h, w, tiny):
    """Built for the real tiles: on a CPU without AMX-FP16 the loader says so and the float32 kernel runs on the
    unpacked weights, the input as it is (not rounded to float16: the answers are float32 sums of x times the
    float16 weights); where the CPU has AMX-FP16, the tiles run within float32 accumulation's bound. `tiny`: weights
    of about 1e-6, float16 subnormals, which the unpacking must widen exactly (not flush)."""
    model, sel, params = two_convs(ic, layer, h, w, seed=5)
    if tiny:
        params = (params[0] * np.float32(1e-5),) + tuple(params[1:])
        w_init = next(t for t in model.graph.initializer if t.name == "w")
        w_init.CopyFrom(numpy_helper.from_array(params[0], "w"))
        assert np.mean(np.abs(f16(params[0])) < 2.0 ** -14) > 0.9  # mostly subnormal in float16
    _, out = _build(tmp_path, model)
    x = np.random.default_rng(2).standard_normal((1, 32, h, w)).astype(np.float32)
    got, loader = run_written(out, x, tmp_path)
    assert sum(loader["calls"].values()) >= 1, loader
    cols, wk, oh, ow = _operands(x, sel, params)
    if HAS_AMX_FP16 and loader["amx"] == "granted":
        cols = f16(cols)
    else:  # the float32 fallback ran
        assert loader["amx_units"].get("AMX-FP16") != "runs", loader
    a64, w64 = cols.astype(np.float64), wk.astype(np.float64)
    sums64 = a64 @ w64 + params[1][None, :].astype(np.float64)
    bound = (cols.shape[1] + 2) * 2.0 ** -24 * (np.abs(a64) @ np.abs(w64)) + 2.0 ** -24 * np.abs(sums64)
    exact = np.maximum(sums64, 0)
    assert np.all(np.abs(got - exact.T.reshape(got.shape)) <= bound.T.reshape(got.shape))
