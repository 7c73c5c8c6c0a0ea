"""Written models as a user loads them, against the same files with their library registered by hand.

    python benchmarks/written_models.py ORIGINAL.onnx WRITTEN.onnx [ORIGINAL WRITTEN ...] [--threads 2] [--min-time 4]
        [--input-shape input_ids:1,128 ...]

Per pair, three sessions timed interleaved in one process (onnxopt.timing.time_interleaved): the original through
onnxruntime, the written model through `onnxopt.runtime.written_session` (the public loader: the library found by
the model's own metadata), and the written model with its library registered directly with onnxruntime. The first
ratio is what a user gets; the last two agree when the loader picks the library up (issue 44: models written with
external data lost it). The kernel calls the library counted in one run of the loaded model are printed too.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx

from onnxopt.runtime import kernel_calls, registered_library, written_session
from onnxopt.timing import make_session, time_interleaved

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_sources import random_inputs  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="pairs: original, written")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=4.0)
    p.add_argument("--input-shape", action="append", default=[], help="NAME:d0,d1,... for symbolic dims (else 1)")
    a = p.parse_args(argv)
    if len(a.models) % 2:
        raise SystemExit("give the models in pairs: ORIGINAL WRITTEN")
    print("| model | external data | kernel calls a run | onnxruntime ms | as written ms | by hand ms | "
          "as written | by hand |\n|---|---|---|---|---|---|---|---|")
    for orig, written in zip(a.models[::2], a.models[1::2]):
        loaded = written_session(written, a.threads)
        lib = registered_library(loaded, loadable=True)
        by_hand = make_session(written, a.threads, library=os.path.abspath(written + ".so"))
        ref = make_session(orig, a.threads)
        feeds = random_inputs(ref, a.input_shape, np.random.default_rng(0))
        before = sum(kernel_calls(lib).values())
        loaded.run(None, feeds)
        calls = sum(kernel_calls(lib).values()) - before
        t = [r["median"] * 1e3 for r in time_interleaved([ref, loaded, by_hand], feeds, min_time=a.min_time)]
        external = os.path.exists(written + ".data")
        print(f"| {os.path.basename(written)} | {'yes' if external else 'no'} | {calls} | {t[0]:.2f} | {t[1]:.2f} | "
              f"{t[2]:.2f} | {t[0] / t[1]:.3f}x | {t[0] / t[2]:.3f}x |", flush=True)
        del loaded, by_hand, ref
    print(f"threads {a.threads}; onnx {onnx.__version__}")


if __name__ == "__main__":
    main()
