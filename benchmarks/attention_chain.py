"""The attention chain alone: the fused kernel (onnxopt/kinds/attention) against onnxruntime running the chain's ops.

    python benchmarks/attention_chain.py [--threads 2] [--min-time 3] [--seqs 128,256,512] [--heads 12] [--dim 64]
                                         [--products float32|bfloat16]

One layer's Q, K, V (batch 1) in, the context out, in the form torch's exporter writes (sqrt scale on Q and K^T, an
additive padding mask, Softmax, the NaN guard, MatMul with V) and in the older form (Div of the scores, a Transpose of
K). Both sides are timed interleaved in one process (onnxopt.timing.time_interleaved), onnxruntime with all its graph
optimizations. Prints per shape: the medians, the speedup, and the fused kernel's GFLOP/s (4 * heads * seq^2 * dim
flops: the two GEMMs). `--products bfloat16` times the kernel with both products on AMX tiles (kinds/attention/amx.py;
this CPU needs AMX-BF16) instead of the float32 one; run the script once each way and compare the speedups (two
libraries of the kind do not load in one process).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

import onnx

from onnxopt.codegen.glue.library import link_library
from onnxopt.codegen.target import host_target
from onnxopt.emit.model import build_fused_model
from onnxopt.kinds.attention import KIND
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from attention_models import attention_model, feeds_for  # noqa: E402


def fuse(model, folder, products="float32"):
    model = onnx.shape_inference.infer_shapes(model)
    target = host_target()
    regions = KIND.find(model, set(), [])
    r = regions[0]
    r.params = dataclasses.replace(r.params, products=products)
    r.compute_op_type(target.name + target.llvm_features)
    obj, desc, _ = KIND.build(r, target)
    lib = os.path.join(folder, f"{r.op_type}.so")
    sha = link_library([desc], [obj], target, lib)
    return build_fused_model(model, regions, os.path.basename(lib), sha, target.to_dict(),
                             target.required_cpu_flags), lib


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=3.0)
    p.add_argument("--seqs", default="128,256,512")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--products", choices=("float32", "bfloat16"), default="float32")
    a = p.parse_args(argv)
    print(f"products {a.products}\n| form | seq | onnxruntime ms | fused ms | speedup | fused GFLOP/s |\n"
          "|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for form, guard in (("sdpa", True), ("bert", False)):
            for seq in (int(s) for s in a.seqs.split(",")):
                model = attention_model(form, 1, a.heads, seq, seq, a.dim, "add", guard)
                fused, lib = fuse(model, tmp, a.products)
                feeds = feeds_for(model)
                ort_s = make_session(model, a.threads)
                ours = make_session(fused, a.threads, library=lib)
                t_ort, t_ours = time_interleaved([ort_s, ours], feeds, min_time=a.min_time)
                flops = 4.0 * a.heads * seq * seq * a.dim
                print(f"| {form} | {seq} | {t_ort['median'] * 1e3:.3f} | {t_ours['median'] * 1e3:.3f} | "
                      f"{t_ort['median'] / t_ours['median']:.2f}x | {flops / t_ours['median'] / 1e9:.1f} |")


if __name__ == "__main__":
    main()
