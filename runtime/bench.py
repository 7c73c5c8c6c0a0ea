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

from onnxopt.errors import InputError, UsageError
from onnxopt.timing import make_session, time_in_turns, time_interleaved
from onnxopt.verify import (LOW_PRECISION_TOLERANCE, Tolerance, check_given_inputs, compare, load_check_inputs,
                            make_inputs)

from . import check_library
from .kernel_calls import kernel_calls


def _load_side(path: str, threads: int | None, spinning: bool = False):
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file; give the path of an .onnx model")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise InputError(f"{path}: not a readable ONNX model ({str(e)[:200]})") from None
    chk = check_library(path, model=model)
    # The name bound to the checked file (check_library), never the path, which may have been swapped since.
    lib = chk.load_path if chk.usable else None
    try:
        sess = make_session(path, threads, library=lib, spinning=spinning)
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: onnxruntime cannot load it ({str(e).splitlines()[0][:300]})") from None
    return model, sess, (chk.path if chk.usable else None), lib, chk.precision


def _check_same_inputs(sess_a, sess_b, path_a: str, path_b: str) -> None:
    """Both sides are fed the same arrays: their inputs must agree in names, types and fixed dims."""
    a = {i.name: i for i in sess_a.get_inputs()}
    b = {i.name: i for i in sess_b.get_inputs()}
    if set(a) != set(b):
        raise UsageError(f"{path_a} and {path_b} have different inputs ({', '.join(a)} against {', '.join(b)}); "
                         "bench compares a model with its optimized form")
    for name in a:
        if a[name].type != b[name].type or len(a[name].shape) != len(b[name].shape) or any(
                isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a[name].shape, b[name].shape)):
            raise UsageError(f"input {name} is {a[name].type} {a[name].shape} in {path_a} but {b[name].type} "
                             f"{b[name].shape} in {path_b}; bench compares a model with its optimized form")


def bench(path_a: str, path_b: str, threads: int | None = None, min_time: float = 2.0, inputs=None,
          bindings: dict | None = None, seed: int = 0, spinning: bool = False) -> dict:
    """`spinning`: onnxruntime's intra-op spinning on (its default) instead of off; the sessions are then timed one
    at a time (timing.time_in_turns), since an idle session's spinning threads would take the cores."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise UsageError(f"--threads {threads}: give a whole number of threads, 1 or more")
    if not math.isfinite(min_time) or min_time <= 0:
        raise UsageError(f"--min-time {min_time}: give a finite number of seconds, more than 0")
    threads = threads or os.cpu_count()
    model_a, sess_a, lib_a, load_a, precision_a = _load_side(path_a, threads, spinning)
    model_b, sess_b, lib_b, load_b, precision_b = _load_side(path_b, threads, spinning)
    _check_same_inputs(sess_a, sess_b, path_a, path_b)
    given = load_check_inputs(inputs) if inputs else None
    if given:
        check_given_inputs(model_a, given)
    # The optimized side's inputs are at least as fixed as the original's (--input-shape fixed some): feeds of its
    # shapes suit both.
    feeds = make_inputs(model_b, bindings, seed, given)
    names = [o.name for o in sess_a.get_outputs()]
    calls_before = [kernel_calls(x) if x else {} for x in (load_a, load_b)]
    try:
        # a side whose weights were lowered (--precision) matches at the bf16 tolerance
        tol = Tolerance() if precision_a == precision_b == "fp32" else LOW_PRECISION_TOLERANCE
        diffs = compare(names, sess_a.run(names, feeds), sess_b.run(names, feeds), tol)
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors on inputs it cannot take
        raise InputError(f"the models do not run on these inputs ({str(e).splitlines()[0][:300]}); give real ones "
                         "with --input name:file.npy") from None
    # What each side's library ran in that one run: a library that is registered but whose kernels do not run
    # would time the function bodies.
    calls = [sum(kernel_calls(x).values()) - sum(b.values()) if x else 0 for x, b in zip((load_a, load_b), calls_before)]
    if spinning:
        del sess_a, sess_b
        ta, tb = time_in_turns([lambda: make_session(path_a, threads, library=load_a, spinning=True),
                                lambda: make_session(path_b, threads, library=load_b, spinning=True)],
                               feeds, min_time=min_time)
    else:
        # every block warmed, however long a run: a user's comparison is worth more than the seconds it saves
        ta, tb = time_interleaved([sess_a, sess_b], feeds, min_time=min_time, max_blocks=400, min_blocks=10,
                                  warm_below_s=math.inf)
    return {
        "a": {"path": path_a, "library": lib_a, "kernel_calls": calls[0], "precision": precision_a, **ta},
        "b": {"path": path_b, "library": lib_b, "kernel_calls": calls[1], "precision": precision_b, **tb},
        "speedup": ta["median"] / tb["median"],
        "threads": threads,
        "spinning": spinning,
        "outputs_match": all(d.ok for d in diffs),
        "max_abs_diff": max((d.max_abs for d in diffs), default=0.0),
    }
