"""`onnxopt bench A B`: both models through onnxruntime in one process, same threads, interleaved.

ORT_ENABLE_ALL on both sides, intra-op spinning off (two sessions timed in turn otherwise fight for the cores),
warm-up, blocks of runs alternating A B A B (with --spinning: spinning on, one session alive at a time, in rounds),
medians and p10/p90 per run, and the ratio median(A) / median(B) (> 1: B is faster). Only ratios from one run are
meaningful; absolute times drift on shared machines.
"""

from __future__ import annotations

import math
import os

import onnx

from onnxopt.errors import InputError
from onnxopt.timing import make_session, time_in_turns, time_interleaved
from onnxopt.verify import compare, load_check_inputs, make_inputs, Tolerance

from . import check_library


def _load_side(path: str, threads: int | None, spinning: bool = False):
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    model = onnx.load(path, load_external_data=False)
    chk = check_library(path, model=model)
    lib = chk.path if chk.usable else None
    sess = make_session(path, threads, library=lib, spinning=spinning)
    return model, sess, lib


def bench(path_a: str, path_b: str, threads: int | None = None, min_time: float = 2.0, inputs=None,
          bindings: dict | None = None, seed: int = 0, spinning: bool = False) -> dict:
    """`spinning`: onnxruntime's intra-op spinning on (its default) instead of off; the sessions are then timed one
    at a time (timing.time_in_turns), since an idle session's spinning threads would take the cores."""
    threads = threads or os.cpu_count()
    model_a, sess_a, lib_a = _load_side(path_a, threads, spinning)
    _, sess_b, lib_b = _load_side(path_b, threads, spinning)
    given = load_check_inputs(inputs) if inputs else None
    feeds = make_inputs(model_a, bindings, seed, given)
    names = [o.name for o in sess_a.get_outputs()]
    diffs = compare(names, sess_a.run(names, feeds), sess_b.run(names, feeds), Tolerance())
    if spinning:
        del sess_a, sess_b
        ta, tb = time_in_turns([lambda: make_session(path_a, threads, library=lib_a, spinning=True),
                                lambda: make_session(path_b, threads, library=lib_b, spinning=True)],
                               feeds, min_time=min_time)
    else:
        # every block warmed, however long a run: a user's comparison is worth more than the seconds it saves
        ta, tb = time_interleaved([sess_a, sess_b], feeds, min_time=min_time, max_blocks=400, min_blocks=10,
                                  warm_below_s=math.inf)
    return {
        "a": {"path": path_a, "library": lib_a, **ta},
        "b": {"path": path_b, "library": lib_b, **tb},
        "speedup": ta["median"] / tb["median"],
        "threads": threads,
        "spinning": spinning,
        "outputs_match": all(d.ok for d in diffs),
        "max_abs_diff": max((d.max_abs for d in diffs), default=0.0),
    }
