"""A/B of a glue switch read from the environment at each run, in one session of one fused model.

    python benchmarks/env_ab.py ORIGINAL.onnx FUSED.onnx VARIABLE VALUE [VALUE ...] [--threads 2] [--seconds 60]

The glue reads some settings at every run (`ONNXOPT_SEQUENCE_VIEWS`, `ONNXOPT_SEQUENCE_SECTION`, `ONNXOPT_WMAJOR`),
so one session can run both sides of a change: same weights, buffers and library, nothing rebuilt. Blocks of five
runs of each value, and of the original through onnxruntime, take turns until --seconds; printed are the medians
per run and each one's speedup over onnxruntime. Every value's output is first checked against onnxruntime's.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
from onnxopt.models import random_inputs

from onnxopt.runtime import written_session
from onnxopt.timing import make_session

BLOCK = 5


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("fused")
    ap.add_argument("variable")
    ap.add_argument("values", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args(argv)
    feeds = random_inputs(onnx.load(a.original, load_external_data=False))
    ref = make_session(a.original, a.threads)
    ours = written_session(a.fused, a.threads)  # as a user loads it
    want = ref.run(None, feeds)
    for v in a.values:
        os.environ[a.variable] = v
        for got, w in zip(ours.run(None, feeds), want):
            np.testing.assert_allclose(got, w, rtol=1e-3, atol=1e-3, err_msg=f"{a.variable}={v}")
    sides = ["onnxruntime"] + list(dict.fromkeys(a.values))
    times: dict[str, list[float]] = {k: [] for k in sides}
    end = time.time() + a.seconds
    while time.time() < end:
        for k in sides:
            s = ref if k == "onnxruntime" else ours
            if k != "onnxruntime":
                os.environ[a.variable] = k
            s.run(None, feeds)  # the switch's first run is not timed
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                s.run(None, feeds)
            times[k].append((time.perf_counter() - t0) / BLOCK)
    base = float(np.median(times["onnxruntime"]))
    for k in sides:
        m = float(np.median(times[k]))
        label = k if k == "onnxruntime" else f"{a.variable}={k}"
        print(f"{label}: {m * 1e3:.2f} ms ({base / m:.3f}x onnxruntime)")


if __name__ == "__main__":
    main()
