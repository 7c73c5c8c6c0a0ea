"""The recurrent kind's kernels (onnxopt/kinds/recurrent) against onnxruntime's LSTM and GRU, on the corpus's shapes.

    python benchmarks/recurrent_cells.py [--threads 2] [--min-time 2] [--bf16 | --against REV]

Per shape: a one-node model run by onnxruntime and the same model with the node as our kernel (built for this host,
its library registered), timed interleaved in one process. Prints the medians, the ratio, the GFLOP/s and the rate
at which the steps read R (the recurrent weights are read once a step: what bounds a batch-1 LSTM whose R does not
fit in L2). `--bf16` also times the kernel with its W and R stored as bfloat16 (`--precision bf16`,
kinds/recurrent/precision.py) in the same interleaved run, and gives its error against onnxruntime's float32.
`--against REV` builds each kernel with the tree at git revision REV too (`git archive`, in its own process) and
times onnxruntime, REV's kernel and this tree's interleaved: a change's effect as a ratio taken at one moment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from onnxopt.kinds.recurrent import KIND  # noqa: E402
from onnxopt.kinds.recurrent.precision import lower as lower_weights  # noqa: E402
from onnxopt.timing import make_session, time_interleaved  # noqa: E402

# (op, name, T, B, I, H, direction): the corpus's LSTMs and GRUs at batch 1, and at batch 8
SHAPES = [
    ("LSTM", "ddddocr_ocr (CRNN, 64x256 image)", 32, 1, 512, 512, "bidirectional"),
    ("LSTM", "silero_vad_lstm (16 windows)", 16, 1, 128, 128, "forward"),
    ("LSTM", "lstm_asr layer 1 (100 frames)", 100, 1, 256, 256, "bidirectional"),
    ("LSTM", "lstm_asr layers 2-3", 100, 1, 512, 256, "bidirectional"),
    ("GRU", "gru_kws layer 1 (98 frames)", 49, 1, 64, 128, "forward"),
    ("GRU", "gru_kws layer 2", 49, 1, 128, 128, "forward"),
    ("LSTM", "ddddocr_ocr at batch 8", 32, 8, 512, 512, "bidirectional"),
    ("LSTM", "lstm_asr layers 2-3 at batch 8", 100, 8, 512, 256, "bidirectional"),
    ("GRU", "gru_kws layer 2 at batch 8", 49, 8, 128, 128, "forward"),
    ("LSTM", "ddddocr_ocr's LSTM, one direction", 32, 1, 512, 512, "reverse"),
]


def _models(op, steps, batch, input_size, hidden, direction, folder, tag, bf16=False):
    from kind_harness import fuse_kind
    from onnx_builders import rnn_model

    model = rnn_model(steps, batch, input_size, hidden, direction, op=op, states=False, outputs=(True, True, True))
    fused, lib, _, _ = fuse_kind(KIND, model, folder, name=f"rnn_{tag}.so")
    if not bf16:
        return model, fused, lib
    kept = []  # why the lowering kept float32 (its error over the steps: precision.py bf16_error)
    low, low_lib, _, _ = fuse_kind(KIND, model, folder, name=f"rnn_{tag}_bf16.so",
                                   convert=lambda r: kept.append(lower_weights(r, "bfloat16", 17)))
    return model, fused, lib, low, low_lib, kept[0]


# One model's kernel built by another tree, in that tree's own process (its package first on the path).
BUILD_WITH_TREE = """
import sys, onnx
from kind_harness import fuse_kind
from onnxopt.kinds.recurrent import KIND
fused, _, _, _ = fuse_kind(KIND, onnx.load(sys.argv[1]), sys.argv[2], name=sys.argv[3])
onnx.save(fused, sys.argv[4])
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time the kernels REV's tree builds")
    a = ap.parse_args(argv)
    if a.bf16:
        return _bf16(a)
    if a.against:
        return _against(a)
    print("| cell | layer | T x B x I x H, direction | onnxruntime us | onnxopt us | speedup | onnxopt GFLOP/s | "
          "R read GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for i, (op, name, steps, batch, input_size, hidden, direction) in enumerate(SHAPES):
            model, fused, lib = _models(op, steps, batch, input_size, hidden, direction, folder, i)
            x = np.random.default_rng(0).standard_normal((steps, batch, input_size)).astype(np.float32)
            sessions = [make_session(model, a.threads), make_session(fused, a.threads, library=lib)]
            t = [r["median"] for r in time_interleaved(sessions, {"x": x}, min_time=a.min_time, max_blocks=100000)]
            d = 2 if direction == "bidirectional" else 1
            gates = 4 if op == "LSTM" else 3
            flops = 2.0 * steps * batch * d * gates * hidden * (input_size + hidden)
            r_bytes = steps * d * gates * hidden * hidden * 4
            ratios.append(t[0] / t[1])
            print(f"| {op} | {name} | {steps} x {batch} x {input_size} x {hidden}, {direction} | {t[0] * 1e6:.0f} | "
                  f"{t[1] * 1e6:.0f} | {t[0] / t[1]:.2f}x | {flops / t[1] / 1e9:.1f} | {r_bytes / t[1] / 1e9:.1f} |",
                  flush=True)
    print(f"geomean speedup {np.exp(np.mean(np.log(ratios))):.2f}x")


def _against(a) -> None:
    import onnx
    from tree_ab import _old_tree

    print(f"| cell | layer | T x B x I x H, direction | onnxruntime us | {a.against} us | this tree us | "
          f"{a.against} over onnxruntime | this tree over onnxruntime | this tree over {a.against} |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        pkg = _old_tree(a.against, os.path.join(folder, "old-tree"))
        tests = os.path.join(folder, "old-tree", "src", "tests")
        for i, (op, name, steps, batch, input_size, hidden, direction) in enumerate(SHAPES):
            model, fused, lib = _models(op, steps, batch, input_size, hidden, direction, folder, i)
            src, old = os.path.join(folder, f"rnn_{i}.onnx"), os.path.join(folder, f"rnn_{i}_old.onnx")
            onnx.save(model, src)
            subprocess.run([sys.executable, "-c", BUILD_WITH_TREE, src, folder, f"rnn_{i}_old.so", old], check=True,
                           cwd=pkg, env=dict(os.environ, PYTHONPATH=os.pathsep.join([pkg, tests])))
            x = np.random.default_rng(0).standard_normal((steps, batch, input_size)).astype(np.float32)
            sessions = [make_session(model, a.threads),
                        make_session(onnx.load(old), a.threads, library=os.path.join(folder, f"rnn_{i}_old.so")),
                        make_session(fused, a.threads, library=lib)]
            t = [r["median"] for r in time_interleaved(sessions, {"x": x}, min_time=a.min_time, max_blocks=100000)]
            ratios.append(t[1] / t[2])
            print(f"| {op} | {name} | {steps} x {batch} x {input_size} x {hidden}, {direction} | {t[0] * 1e6:.0f} | "
                  f"{t[1] * 1e6:.0f} | {t[2] * 1e6:.0f} | {t[0] / t[1]:.2f}x | {t[0] / t[2]:.2f}x | "
                  f"{t[1] / t[2]:.2f}x |", flush=True)
    print(f"geomean this tree over {a.against}: {np.exp(np.mean(np.log(ratios))):.2f}x")


def _bf16(a) -> None:
    print("| cell | layer | onnxruntime us | float32 kernel us | bfloat16 weights us | bf16 / fp32 kernel | "
          "bf16 vs onnxruntime | max error / max output |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for i, (op, name, steps, batch, input_size, hidden, direction) in enumerate(SHAPES):
            model, fused, lib, low, low_lib, kept = _models(op, steps, batch, input_size, hidden, direction, folder,
                                                            i, bf16=True)
            if kept:
                print(f"| {op} | {name} | {kept} | | | | | |", flush=True)
                continue
            x = np.random.default_rng(0).standard_normal((steps, batch, input_size)).astype(np.float32)
            sessions = [make_session(model, a.threads), make_session(fused, a.threads, library=lib),
                        make_session(low, a.threads, library=low_lib)]
            want, got = sessions[0].run(None, {"x": x})[0], sessions[2].run(None, {"x": x})[0]
            err = float(np.abs(got - want).max() / np.abs(want).max())
            t = [r["median"] for r in time_interleaved(sessions, {"x": x}, min_time=a.min_time, max_blocks=100000)]
            print(f"| {op} | {name} | {t[0] * 1e6:.0f} | {t[1] * 1e6:.0f} | {t[2] * 1e6:.0f} | {t[1] / t[2]:.2f}x | "
                  f"{t[0] / t[2]:.2f}x | {err:.2g} |", flush=True)


if __name__ == "__main__":
    main()
