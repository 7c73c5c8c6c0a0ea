"""Shared helpers of the loop-nest tests: the computes under test, numpy references and a JIT runner."""

from __future__ import annotations

import numpy as np
from onnxopt.codegen import loopnest as ln
from onnxopt.codegen.target import host_target


def run(schedule: ln.Schedule, *inputs: np.ndarray, begin: int = 0, end: int | None = None,
        out: np.ndarray | None = None) -> np.ndarray:
    """Build, JIT and run a schedule; the output starts as NaN (or a sentinel int) so unwritten elements show."""
    kernel = ln.build(schedule)
    return run_kernel(kernel, *inputs, begin=begin, end=end, out=out)


def run_kernel(kernel: ln.Kernel, *inputs: np.ndarray, begin: int = 0, end: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
    output_tensor = kernel.args[-1]
    if out is None:
        out = empty_output(output_tensor)
    ln.JitFunction(kernel)(*inputs, out, begin=begin, end=end)
    return out


SENTINEL_INT = -123456789


def empty_output(tensor: ln.Tensor) -> np.ndarray:
    if tensor.dtype == "float32":
        return np.full(tensor.shape, np.nan, np.float32)
    return np.full(tensor.shape, SENTINEL_INT, np.int32)


def random_floats(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float32)


def has_avx512() -> bool:
    return host_target().has("avx512f")


# -- computes ---------------------------------------------------------------------------------------------------


def matmul(m: int, k: int, n: int):
    A = ln.placeholder((m, k), "A")
    B = ln.placeholder((k, n), "B")
    r = ln.reduce_axis(k, "k")
    C = ln.compute((m, n), lambda i, j: ln.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C, r


def pool_output_size(size: int, window: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - window) // stride + 1


def max_pool(shape, window: int, stride: int, pad: int):
    n, c, h, w = shape
    X = ln.placeholder(shape, "X")
    oh, ow = pool_output_size(h, window, stride, pad), pool_output_size(w, window, stride, pad)
    ry, rx = ln.reduce_axis(window, "ry"), ln.reduce_axis(window, "rx")

    def body(b, ch, y, x):
        iy, ix = y * stride + ry - pad, x * stride + rx - pad
        inside = ln.all_of(iy >= 0, iy < h, ix >= 0, ix < w)
        return ln.reduce_max(ln.if_then_else(inside, X[b, ch, iy, ix], float("-inf")), axis=[ry, rx])

    return X, ln.compute((n, c, oh, ow), body, name="P"), (ry, rx)


def avg_pool(shape, window: int, stride: int, pad: int):
    """Average pool counting the padding (the divisor is always window*window)."""
    n, c, h, w = shape
    X = ln.placeholder(shape, "X")
    oh, ow = pool_output_size(h, window, stride, pad), pool_output_size(w, window, stride, pad)
    ry, rx = ln.reduce_axis(window, "ry"), ln.reduce_axis(window, "rx")

    def body(b, ch, y, x):
        iy, ix = y * stride + ry - pad, x * stride + rx - pad
        inside = ln.all_of(iy >= 0, iy < h, ix >= 0, ix < w)
        return ln.sum(ln.if_then_else(inside, X[b, ch, iy, ix], 0.0), axis=[ry, rx]) / float(window * window)

    return X, ln.compute((n, c, oh, ow), body, name="P"), (ry, rx)


def conv2d(x_shape, filters: int, kernel: int, stride: int, pad: int):
    n, c, h, w = x_shape
    X = ln.placeholder(x_shape, "X")
    W = ln.placeholder((filters, c, kernel, kernel), "W")
    oh, ow = pool_output_size(h, kernel, stride, pad), pool_output_size(w, kernel, stride, pad)
    rc, ry, rx = ln.reduce_axis(c, "rc"), ln.reduce_axis(kernel, "ry"), ln.reduce_axis(kernel, "rx")

    def body(b, f, y, x):
        iy, ix = y * stride + ry - pad, x * stride + rx - pad
        inside = ln.all_of(iy >= 0, iy < h, ix >= 0, ix < w)
        return ln.sum(ln.if_then_else(inside, X[b, rc, iy, ix], 0.0) * W[f, rc, ry, rx], axis=[rc, ry, rx])

    return X, W, ln.compute((n, filters, oh, ow), body, name="Y"), (rc, ry, rx)


# -- numpy references -------------------------------------------------------------------------------------------


def _windows(x: np.ndarray, window: int, stride: int, pad: int, fill: float):
    """Yields (ky, kx, the strided window slice) over a padded NCHW array."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oh = pool_output_size(x.shape[2], window, stride, pad)
    ow = pool_output_size(x.shape[3], window, stride, pad)
    for ky in range(window):
        for kx in range(window):
            yield ky, kx, xp[:, :, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]


def max_pool_ref(x, window, stride, pad):
    return np.max([s for _, _, s in _windows(x, window, stride, pad, -np.inf)], axis=0)


def avg_pool_ref(x, window, stride, pad):
    total = np.sum([s.astype(np.float64) for _, _, s in _windows(x, window, stride, pad, 0.0)], axis=0)
    return total / (window * window)


def conv2d_ref(x, w, stride, pad):
    out = 0.0
    for ky, kx, s in _windows(x.astype(np.float64), w.shape[2], stride, pad, 0.0):
        out = out + np.einsum("nchw,fc->nfhw", s, w[:, :, ky, kx].astype(np.float64))
    return out
