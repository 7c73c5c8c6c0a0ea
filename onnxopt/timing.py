"""Interleaved timing of several onnxruntime sessions.

Sessions run A B A B... in short blocks, each side warmed up right before its block, with intra-op spinning off so
the idle side's threads do not steal the cores. With spinning on (onnxruntime's default), `time_in_turns` keeps one
session alive at a time instead. Only ratios measured in one run are compared.
"""

from __future__ import annotations

import functools
import time

import numpy as np

# The session config entry that names the ops a session needs from our library (codegen/glue/register.c), and the
# longest value onnxruntime accepts: a longer list is not set, and the library registers every op.
REGISTER_OPS_ENTRY = "onnxopt.register_ops"
REGISTER_OPS_MAX = 8192


CPU = "CPUExecutionProvider"


def session_options(threads: int | None = None, optimization: str = "all", spinning: bool = False):
    """onnxruntime SessionOptions with our settings: `threads` intra-op threads (None: onnxruntime's default), one
    inter-op thread, no spinning unless asked, quiet logs (errors come back as exceptions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # its errors come back as exceptions, which we report in one line of our own
    if threads:
        so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[optimization]
    return so


def make_session(model, threads: int | None = None, library: str | None = None, optimization: str = "all",
                 spinning: bool = False, ops=None, provider: str = CPU):
    """An onnxruntime session with our settings. `ops`: the op types of `library` that the model uses; only those
    are registered (each costs onnxruntime about 30 us a session, and a one-kernel check on a library of hundreds
    of kernels took 8 ms to create instead of 1). None registers them all. `provider`: the execution provider the
    session runs on, the target's (Target.execution_provider), where the library's ops are registered."""
    import onnxruntime as ort

    if provider not in ort.get_available_providers():  # onnxruntime would warn and run on the CPU instead
        raise RuntimeError(f"this onnxruntime has no {provider} (it has {', '.join(ort.get_available_providers())})")
    so = session_options(threads, optimization, spinning)
    if library:
        if ops is not None:
            asked = "," + ",".join(sorted(set(ops))) + ","
            if len(asked) <= REGISTER_OPS_MAX:
                so.add_session_config_entry(REGISTER_OPS_ENTRY, asked)
        so.register_custom_ops_library(library)
    if hasattr(model, "SerializeToString"):  # a ModelProto of any size (graph/large.py)
        from onnxopt.graph.large import inference_session

        return inference_session(model, so, [provider])
    return ort.InferenceSession(model, so, providers=[provider])


# A side whose one run takes at least this long is not warmed again before each block: the run after a switch of
# sessions was within 1-2% of the next on Inception-v3 (70 and 48 ms) and ResNet-50 (51 ms), and the two models'
# ratio within 1% either way, while the warm runs doubled their timings (half of Inception-v3's whole-model check).
# Shorter runs need it: MobileNetV2's original ran 2.1% slower on its first run after a switch (6.4 ms).
WARM_RUN_BELOW_S = 0.02


def time_interleaved(sessions, feeds, min_time: float = 0.3, block: int | None = None, max_blocks: int = 40,
                     min_blocks: int = 5, flush_bytes: int = 0, block_s: float = 0.01,
                     settled_outside: tuple[float, float] | None = None,
                     warm_below_s: float = WARM_RUN_BELOW_S) -> list[dict]:
    """Per session: median, p10, p90 and mean seconds per run, from interleaved blocks. `feeds`: one dict for
    all sessions, or a list with one per session (a kernel that takes its inputs in another layout). A block is
    `block` runs, else as many as take about `block_s` seconds. Each side is warmed with one run right before its
    block, unless one of its runs takes `warm_below_s` or more (the benchmarks, where time is cheaper than doubt,
    warm every block).

    `flush_bytes` > 0 times single runs, each right after writing one float in every 64-byte line of a buffer that
    large: the run starts with its weights out of the caches, and the caches full of dirty lines, as one layer of a
    model whose weights do not fit in them does.

    `settled_outside` (lo, hi): two sessions' timing stops after min_blocks once the first side's median over the
    second's is below lo or above hi, a verdict longer timing would not change (a kernel check's 0.2x kernel)."""
    per = list(feeds) if isinstance(feeds, (list, tuple)) else [feeds] * len(sessions)
    sessions = [_Bound(s, f) for s, f in zip(sessions, per)]
    feeds = None
    for s in sessions:  # first runs allocate and JIT-compile nothing of ours, but ORT plans memory
        s.run(None, feeds)
    if flush_bytes > 0:
        return _time_flushed(sessions, min_time, max_blocks, min_blocks, flush_bytes)
    one = []  # seconds of one warm run of each side
    for s in sessions:
        t = time.perf_counter()
        s.run(None, feeds)
        one.append(max(time.perf_counter() - t, 1e-6))
    if block is None:
        block = int(min(50, max(1, block_s / one[0])))  # ~10 ms blocks by default
    warm = [t < warm_below_s for t in one]
    samples = [[] for _ in sessions]
    start = time.perf_counter()
    blocks = 0
    while blocks < max_blocks and (blocks < min_blocks or time.perf_counter() - start < min_time):
        for k, s in enumerate(sessions):
            if warm[k]:
                s.run(None, feeds)  # warm this side right before timing it
            t0 = time.perf_counter()
            for _ in range(block):
                s.run(None, feeds)
            samples[k].append((time.perf_counter() - t0) / block)
        blocks += 1
        if settled_outside and blocks >= min_blocks and len(samples) == 2:
            ratio = float(np.median(samples[0]) / np.median(samples[1]))
            if not settled_outside[0] <= ratio <= settled_outside[1]:
                break
    return [_stats(xs, blocks=len(xs), runs_per_block=block) for xs in samples]


@functools.lru_cache(maxsize=1)
def _flush_buffer(flush_bytes: int) -> np.ndarray:
    """One buffer per size for the process: a Winograd search and a kernel check each time dozens of regions, and
    allocating and faulting in 64 MB for every one of them would cost more than the flushes."""
    return np.ones(max(1, flush_bytes // 4), np.float32)


def _time_flushed(sessions, min_time: float, max_rounds: int, min_rounds: int, flush_bytes: int) -> list[dict]:
    """Interleaved single runs, each after the caches are flushed (see time_interleaved)."""
    lines = _flush_buffer(flush_bytes)
    samples = [[] for _ in sessions]
    start = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - start < min_time):
        for k, s in enumerate(sessions):
            lines[::16] += 1.0  # one float of every 64-byte line: the caches fill with dirty lines, as in a model
            t0 = time.perf_counter()
            s.run(None, None)
            samples[k].append(time.perf_counter() - t0)
        rounds += 1
    return [_stats(xs, blocks=len(xs), runs_per_block=1, flushed_bytes=flush_bytes) for xs in samples]


def time_in_turns(makers, feeds, min_time: float = 2.0, rounds: int = 4) -> list[dict]:
    """Per session maker: median, p10, p90 and mean seconds per run, with only one session alive at a time.
    Onnxruntime's spinning threads (its default) keep spinning for a while after each run, so a second live session
    would lose cores to them; here each round makes each session in turn, warms it, times it for
    min_time / rounds seconds and releases it. `makers`: callables that return a new session."""
    samples = [[] for _ in makers]
    for _ in range(rounds):
        for k, make in enumerate(makers):
            s = make()
            for _ in range(3):  # memory planning, first-touch pages
                s.run(None, feeds)
            start, runs = time.perf_counter(), 0
            while runs == 0 or time.perf_counter() - start < min_time / rounds:  # one run per round at least
                t0 = time.perf_counter()
                s.run(None, feeds)
                samples[k].append(time.perf_counter() - t0)
                runs += 1
            del s
    return [_stats(xs, runs=len(xs), rounds=rounds) for xs in samples]


def _stats(seconds: list[float], **extra) -> dict:
    a = np.array(seconds)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "mean": float(a.mean()), **extra}


class _Bound:
    """A session with its own inputs, so the timing loop treats every session alike."""

    def __init__(self, session, feeds):
        self.session, self.feeds = session, feeds

    def run(self, names, _feeds):
        return self.session.run(names, self.feeds)


def time_pair_in_new_process(a: tuple, b: tuple, feeds_path: str, threads: int | None, min_time: float = 0.4,
                             max_blocks: int = 30, min_blocks: int = 6, provider: str = CPU) -> tuple[float, float]:
    """Median seconds per run of two models timed interleaved in a new Python process, as a user's process runs
    them: each of `a`, `b` is (model path, library path or None, op types to register or None); `feeds_path` an
    .npz of the inputs. A long optimizing process can run one model slower than a new one does: DenseNet-BC's
    model without its plain Concats measured 1.23-1.30x faster than with them in the fifth and sixth optimization of
    a benchmark process (in new sessions too), and 0.84-0.91x in new processes."""
    import json
    import subprocess
    import sys

    spec = {"a": list(a), "b": list(b), "feeds": feeds_path, "threads": threads, "min_time": min_time,
            "max_blocks": max_blocks, "min_blocks": min_blocks, "provider": provider}
    for side in ("a", "b"):
        if spec[side][2] is not None:
            spec[side][2] = sorted(spec[side][2])
    done = subprocess.run([sys.executable, "-m", "onnxopt.timing", json.dumps(spec)], capture_output=True, check=False,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"timing in a new process failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["a"], out["b"]


def _pair_main(spec_json: str) -> None:
    import json

    spec = json.loads(spec_json)
    with np.load(spec["feeds"]) as f:
        feeds = {k: f[k] for k in f.files}
    sessions = [make_session(p, spec["threads"], library=lib, ops=ops, provider=spec["provider"])
                for p, lib, ops in (spec["a"], spec["b"])]
    ta, tb = time_interleaved(sessions, feeds, min_time=spec["min_time"], max_blocks=spec["max_blocks"],
                              min_blocks=spec["min_blocks"])
    print(json.dumps({"a": ta["median"], "b": tb["median"]}))


if __name__ == "__main__":
    import sys

    _pair_main(sys.argv[1])
