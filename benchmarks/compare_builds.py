"""Two builds of the OptiFX networks against each other and onnxruntime, in one interleaved timing per network.

    python benchmarks/compare_builds.py BEFORE_DIR AFTER_DIR [--threads 2] [--min-time 8] [--only resnet50,...]

BEFORE_DIR and AFTER_DIR are `optifx_networks.py --out` directories (each holds `<network>.onnx`, the original, and
`<network>_default.onnx` with its library). Per network the original through onnxruntime and the two default builds
run interleaved in one process (`onnxopt.timing.time_interleaved`, blocks of each in turn until --min-time), so a
change's effect is a ratio taken at one moment: on this shared host the same MobileNetV2 build measured 5.51 ms and
4.90 ms in two retimes half an hour apart. Prints each network's medians, speedups and after / before, then the
geomean speedup of each build over onnxruntime.
"""

from __future__ import annotations

import argparse
import math
import os

import onnx
from onnxopt.models import random_inputs

from onnxopt.runtime import written_session
from onnxopt.timing import make_session, time_interleaved

NETWORKS = ["resnet50", "inception_v3", "densenet_bc", "mobilenetv2", "squeezenet", "nasnet_a", "unet16"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=8.0)
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    nets = a.only.split(",") if a.only else NETWORKS  # any model the two directories hold (tree_ab.py's too)
    logs = [0.0, 0.0]
    for n in nets:
        orig = os.path.join(a.before, f"{n}.onnx")
        builds = [os.path.join(d, f"{n}_default.onnx") for d in (a.before, a.after)]
        missing = [p for p in [orig, *builds] if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"{missing[0]} is missing: give two `optifx_networks.py --out` directories")
        feeds = random_inputs(onnx.load(orig, load_external_data=False))
        # A build that left the model unchanged has no library: it is the original, timed as itself.
        sessions = [make_session(orig, a.threads)] + [
            written_session(b, a.threads) for b in builds]  # as a user loads them
        t = [r["median"] for r in time_interleaved(sessions, feeds, min_time=a.min_time, max_blocks=100000)]
        logs = [logs[0] + math.log(t[0] / t[1]), logs[1] + math.log(t[0] / t[2])]
        print(f"{n}: onnxruntime {t[0] * 1e3:.2f} ms, before {t[1] * 1e3:.2f} ms ({t[0] / t[1]:.3f}x), "
              f"after {t[2] * 1e3:.2f} ms ({t[0] / t[2]:.3f}x), after / before {t[1] / t[2]:.3f}x", flush=True)
    print(f"geomean over onnxruntime: before {math.exp(logs[0] / len(nets)):.3f}x, "
          f"after {math.exp(logs[1] / len(nets)):.3f}x ({len(nets)} networks, {a.threads} threads)")


if __name__ == "__main__":
    main()
