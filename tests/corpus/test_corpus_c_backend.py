"""The C backend (onnxopt/backends/c) on the real-model corpus's CI subset: every float model's elementwise chains
and row kinds (softmax, LayerNorm) built as plain C by the system compiler, written, and verified by the optimizer
with and without the library (the written files loaded through onnxopt.runtime; the library's Compute counters must
show each fused node ran). The kinds it has no lowering for stay onnxruntime's nodes."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

import onnxopt

C_KINDS = ("elementwise", "softmax", "layernorm")


def _float_models(corpus: Path) -> list[Path]:
    manifest = json.loads((corpus / "manifest.json").read_text())
    out = []
    for e in manifest:
        path = corpus / e["file"]
        if not e["small"] or not path.exists():
            continue
        ops = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
        if not ops & {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "MatMulInteger", "ConvInteger"}:
            out.append(path)
    return out


def test_the_c_backend_runs_the_corpus(corpus, tmp_path):
    models = _float_models(corpus)
    assert len(models) >= 6
    fused_kinds: dict[str, int] = {}
    for path in models:
        out = tmp_path / path.stem / "fused.onnx"
        out.parent.mkdir()
        result = onnxopt.optimize(str(path), str(out), target="c", measure=False, threads=2, verify_fallback=True,
                                  cost_cache=False)
        report = result.report
        assert report["target"]["backend"] == "c"
        for region in report["regions"]:
            kind = region["op_type"].rsplit("_", 1)[0].lower()  # the label: Elementwise_<hash>
            assert kind in C_KINDS, region["op_type"]  # no other kind has a C lowering
            fused_kinds[kind] = fused_kinds.get(kind, 0) + 1
        if report["regions"]:
            calls = report["verification"]["kernel_calls"]
            assert calls, report["verification"]
    # The corpus has elementwise chains (SiLU, hard-swish) and a softmax or a LayerNorm (PP-OCRv4 rec's SVTR).
    rows = fused_kinds.get("softmax", 0) + fused_kinds.get("layernorm", 0)
    assert fused_kinds.get("elementwise", 0) > 0 and rows > 0, fused_kinds
