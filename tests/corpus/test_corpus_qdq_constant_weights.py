"""A Paddle export quantized by onnxruntime's quantize_static (QDQ), from the corpus's CI subset: its weights are
Constant nodes, which the quantizer quantizes at run time as activations (u8, a zero point, per tensor). The
pipeline folds those quantizers (graph/quantized_weights.py) and the qconv kind takes every convolution, u8 weights
included (issue 46, item 4); the written model is verified with and without its library, and the input is left as
it was."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target

import onnxopt

MODEL = "ppocr_mobile_v2_cls_qdq"


@pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                    reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")
def test_paddle_qdq_model_fuses_every_conv(corpus, tmp_path):
    (entry,) = [e for e in json.loads((corpus / "manifest.json").read_text()) if e["name"] == MODEL]
    src = corpus / entry["file"]
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    original = onnx.load(str(src))
    convs = sum(n.op_type == "Conv" for n in original.graph.node)
    assert convs > 0 and any(n.op_type == "Constant" for n in original.graph.node)  # the Constant-weight form
    out = tmp_path / "fused.onnx"
    res = onnxopt.optimize(str(src), str(out), input_shape=entry["input_shape"], measure=False, threads=2,
                           cost_cache=False)
    report = res.report
    if report.get("kernels_not_run"):
        pytest.skip(f"this host cannot run the target's kernels: {report['kernels_not_run']}")
    assert report["rewrites"]["quantized_weights_folded"] >= convs
    assert not [r["reason"] for r in report["rejected"] if r["reason"].startswith("Conv")], report["rejected"]
    notes = [r["weights"] for r in report["regions"] if "weights" in r]
    assert len(notes) == convs, notes  # one qconv region a convolution, each saying how its u8 weights were stored
    written = onnx.load(str(out))
    assert not any(n.op_type == "Conv" for n in written.graph.node)
    assert report["verification"]["ok"] and report["verification"]["library"], report["verification"]
    assert report["verification"]["kernel_calls"] > 0
    assert report["fallback_verification"]["ok"], report["fallback_verification"]
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
