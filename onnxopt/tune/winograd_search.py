"""Winograd or direct, per convolution: each stride-1 convolution on the blocked kernel whose kernel has Winograd tiles
(3x3, 5x5, 1x7, 7x1, 1x3, 3x1; fusion/winograd.py) is built as the direct kernel and with each tile length its kernel
offers (3x3: F(2x2), F(4x4)), checked, and timed on its runtime shapes; the fastest wins if it beats the direct
kernel by the tile search's margin, twice. A lone NCHW convolution (no blocked tensor around it: a layer between ops
that are not ours) is timed as the NCHW kernel it has against Winograd tiles on the channel-vector kernel, NCHW in
and out (fusion/layout.py use_channel_vectors), whose reorders cost little beside F(4x4)'s savings.

Why time it rather than model it: Winograd trades multiply-adds for transforms and memory. With many channels the
products dominate and F(4x4) runs 2.3-2.4x faster than the direct kernel (64-256 channels at 56x56 to 14x14 here);
with few channels (16) the transforms dominate and Winograd loses; on a 7x7 image most of F(4x4)'s 8x8 coverage is
wasted. Where the line falls depends on the machine's caches and on the epilogue, and a timing per distinct
(op type, shapes) costs well under a second.

How it is timed matters as much. At batch 1, a model whose weights do not fit in the last-level cache reads each
layer's weights from memory once per inference, into caches full of the previous layers' dirty lines; a timing that
repeats one layer keeps its weights in the cache and favours the tile with the larger transformed weights. Such a
model's candidates are timed with the caches filled with dirty lines before every run (weights_cold_flush).

The choice is kept in the cost cache under the direct kernel's op type, the input shapes, the thread count and
whether the weights were timed cold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import onnx

from onnxopt.codegen.microkernel.registry import select
from onnxopt.fusion import winograd
from onnxopt.fusion.layout import with_channel_vectors

from .tile_search import (
    MARGIN,
    MIN_SEARCH_FLOPS,
    CannotRun,
    region_flops,
    time_candidates,
)


def weights_cold_flush(model, cache_bytes: int) -> int:
    """Bytes to read between timed runs so that they start with cold weights (0: time them warm). At batch 1 a
    model whose weights do not fit in the last-level cache reads each layer's weights from memory once per
    inference, and a timing that repeats one layer keeps them in the cache: it favours the kernel with the larger
    weights. ResNet-50's 14x14 and 7x7 convolutions chose F(4x4, 3x3), whose transformed weights are 4x the
    direct kernel's (9.4 and 37.7 MB); in the model F(2x2, 3x3) ran them in 600 and 1030 us against F(4x4)'s 730
    and 1420. Timed after a read-only flush they still chose F(4x4) at 7x7; after a flush that leaves the caches
    full of dirty lines, as the earlier layers leave them in the model, they choose F(2x2) at 14x14 and 7x7 and
    F(4x4) at 56x56 and 28x28, the model's own best. A model whose weights fit stays warm between inferences and
    is timed warm."""
    weights = 0
    for t in model.graph.initializer:  # from the dims: external data is not loaded here
        n = 1
        for d in t.dims:
            n *= d
        weights += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return 2 * cache_bytes if weights > cache_bytes else 0


def space(kernel) -> list[list[int]]:
    """The candidates for a kernel: 0 (the direct kernel) and its Winograd tile lengths."""
    return [[0]] + [[m] for m in winograd.sizes(kernel)]


@dataclass
class WinogradSearchResult:
    m: int  # 0: direct
    kernel: tuple = ()
    candidates: list[dict] = field(default_factory=list)  # {"winograd": m, "seconds": s | None, ...}
    nchw: bool = False  # an NCHW convolution: its Winograd tiles run on the channel-vector kernel
    cost_cache: str | None = None
    skipped: str | None = None
    built: dict = field(default_factory=dict, repr=False)  # op type -> (object code, glue description)
    build_s: float = 0.0
    measure_s: float = 0.0

    def to_report(self) -> dict:
        out = {"chosen": self.m, "kernel": list(self.kernel), "candidates": self.candidates}
        if self.nchw:
            out["nchw"] = True
        for k in ("cost_cache", "skipped"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        secs = {c["winograd"]: c.get("seconds") for c in self.candidates}
        if secs.get(0) and secs.get(self.m):
            out["gain"] = secs[0] / secs[self.m]
        return out


def search_winograd(region, model, target, threads: int | None = None, cache=None, *, info=None, bindings=None,
                    seed: int = 0, min_time: float = 0.1, min_flops: float = MIN_SEARCH_FLOPS,
                    margin: float = MARGIN, cache_only: str | None = None,
                    flush_bytes: int = 0) -> WinogradSearchResult:
    """Time the direct and Winograd kernels of one blocked convolution region and return the fastest's m.
    `flush_bytes` > 0: each run starts with its weights out of the caches (weights_cold_flush)."""
    from onnxopt.annotate.shapes import tensor_info
    from onnxopt.measure import region_feeds as _region_feeds

    mk = select(target)
    # A lone NCHW convolution (no blocked tensor around it) takes Winograd tiles on the channel-vector kernel, NCHW
    # in and out: its candidates are that kernel's tiles against the NCHW kernel it has.
    nchw = winograd.applies_on_channel_vectors(region, mk.lanes)
    why = None if nchw else winograd.applies(region)
    if why is not None:
        return WinogradSearchResult(0, skipped=why)
    kernel = tuple(region.compute.attrs.kernel)
    if winograd.check_opset(model) is not None:
        return WinogradSearchResult(0, kernel, skipped=winograd.check_opset(model))
    info = info if info is not None else tensor_info(model)
    bindings = bindings or {}
    flops = region_flops(region, info, bindings)
    if flops < min_flops:
        return WinogradSearchResult(0, kernel, skipped=f"{flops / 1e6:.2f} MFLOP: too small to matter")
    feeds = _region_feeds(region, info, bindings, seed, model)
    shapes = [list(v.shape) for v in feeds.values()]
    kspace = space(kernel)
    # cold and warm timings can choose differently: the cache keeps them apart
    key_space = kspace + ([["weights cold"]] if flush_bytes else []) + ([["nchw"]] if nchw else [])
    if cache is not None and cache.enabled:
        hit = cache.get_tile(region.op_type, shapes, threads, key_space)
        if hit is not None:
            return WinogradSearchResult(hit["tile"][0], kernel, hit["candidates"], cost_cache="hit", nchw=nchw)
    if cache_only:
        return WinogradSearchResult(0, kernel, skipped=cache_only)
    candidates = [{"winograd": key[0]} for key in kspace]
    variants = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    for cand in candidates:
        m = cand["winograd"]
        try:
            if m == 0:
                v = region
            else:
                base = (with_channel_vectors(replace(region, measured={}, rejected=None), mk.lanes, mk.tile.ni, opset)
                        if nchw else region)
                v = winograd.to_winograd(base, m, mk.lanes, mk.tile.ni)
        except Exception as e:  # noqa: BLE001 - a form that does not apply is left out
            cand["error"] = f"build: {type(e).__name__}: {e}"
            continue
        variants.append((cand, m, v))
    try:
        timing = time_candidates(region, variants, model, info, feeds, target, threads, 0, min_time=min_time,
                                 margin=margin, flush_bytes=flush_bytes)
    except CannotRun as e:
        return WinogradSearchResult(0, kernel, candidates, skipped=f"could not run: {e}")
    secs = {m: cand["seconds"] for cand, m in timing.timed}
    chosen = timing.chosen if secs else 0
    result = WinogradSearchResult(chosen, kernel, candidates, nchw=nchw,
                                  cost_cache="miss" if cache is not None and cache.enabled else None,
                                  built={d.op_type: (o, d) for o, d in zip(timing.objs, timing.descs)},
                                  build_s=timing.build_s, measure_s=time.perf_counter() - timing.t_measure)
    if cache is not None and cache.enabled and secs:
        cache.put_tile(region.op_type, shapes, threads, key_space, [chosen], candidates)
    return result
