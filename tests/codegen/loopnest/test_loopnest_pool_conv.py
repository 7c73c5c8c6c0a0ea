"""Max/average pooling and NCHW convolution with padding (if_then_else guards) and strides."""

import numpy as np
import pytest
from loopnest_util import (
    avg_pool,
    avg_pool_ref,
    conv2d,
    conv2d_ref,
    max_pool,
    max_pool_ref,
    random_floats,
    run,
    run_kernel,
)
from onnxopt.codegen import loopnest as ln


def pool_default(s, reduce_axes):
    pass


def pool_vectorize_x(s, reduce_axes):
    n, c, y, x = s.axes
    s.reorder(n, c, y, *reduce_axes, x)
    s.vectorize(x)


def pool_tiles(s, reduce_axes):
    n, c, y, x = s.axes
    ry, rx = reduce_axes
    yo, yi = s.split(y, 2)
    xo, xi = s.split(x, 4)
    s.reorder(n, c, yo, xo, ry, yi, rx, xi)
    s.unroll(yi)
    s.vectorize(xi)
    f = s.fuse(n, c)
    s.parallel(f)


def pool_fused_output(s, reduce_axes):
    n, c, y, x = s.axes
    f = s.fuse(y, x)
    fo, fi = s.split(f, 8)
    s.reorder(n, c, fo, *reduce_axes, fi)
    s.unroll(fi)


POOL_SCHEDULES = [pool_default, pool_vectorize_x, pool_tiles, pool_fused_output]
# (window, stride, pad): stride 1 vectorizes with masked padding reads, stride 2 falls back to scalar.
POOL_CONFIGS = [(3, 1, 1), (3, 2, 1), (2, 2, 0)]


@pytest.mark.parametrize("config", POOL_CONFIGS, ids=lambda c: "w{}s{}p{}".format(*c))
@pytest.mark.parametrize("apply", POOL_SCHEDULES, ids=lambda f: f.__name__)
def test_max_pool(apply, config):
    window, stride, pad = config
    shape = (2, 3, 11, 13)
    _X, P, reduce_axes = max_pool(shape, window, stride, pad)
    s = ln.Schedule(P)
    apply(s, reduce_axes)
    x = random_floats(np.random.default_rng(0), *shape)
    np.testing.assert_array_equal(run(s, x), max_pool_ref(x, window, stride, pad))


@pytest.mark.parametrize("config", POOL_CONFIGS, ids=lambda c: "w{}s{}p{}".format(*c))
@pytest.mark.parametrize("apply", POOL_SCHEDULES, ids=lambda f: f.__name__)
def test_avg_pool(apply, config):
    window, stride, pad = config
    shape = (1, 4, 9, 19)
    _X, P, reduce_axes = avg_pool(shape, window, stride, pad)
    s = ln.Schedule(P)
    apply(s, reduce_axes)
    x = random_floats(np.random.default_rng(1), *shape)
    got = run(s, x)
    np.testing.assert_allclose(got, avg_pool_ref(x, window, stride, pad), rtol=1e-6, atol=1e-6)
    _, P0, _ = avg_pool(shape, window, stride, pad)
    np.testing.assert_array_equal(got, run(ln.Schedule(P0), x))


def test_padded_vector_loop_uses_masked_reads():
    _X, P, reduce_axes = max_pool((1, 1, 8, 40), 3, 1, 1)
    s = ln.Schedule(P)
    pool_vectorize_x(s, reduce_axes)
    kernel = ln.build(s)
    assert kernel.notes == [] and "llvm.masked.load" in kernel.ir

    _X, P, reduce_axes = max_pool((1, 1, 8, 40), 3, 2, 1)
    s = ln.Schedule(P)
    pool_vectorize_x(s, reduce_axes)
    notes = ln.build(s).notes
    assert len(notes) == 1 and "stride 2" in notes[0]


def conv_default(s, reduce_axes):
    pass


def conv_tiled(s, reduce_axes):
    n, f, y, x = s.axes
    rc, ry, rx = reduce_axes
    fo, fi = s.split(f, 2)
    xo, xi = s.split(x, 4)
    s.reorder(n, fo, y, xo, rc, ry, rx, fi, xi)
    s.unroll(fi)
    s.vectorize(xi)


def conv_split_channels(s, reduce_axes):
    n, f, y, x = s.axes
    rc, ry, rx = reduce_axes
    co, ci = s.split(rc, 2)  # 3 channels: a partial tile, order kept
    s.reorder(n, f, co, y, ci, ry, rx, x)
    s.vectorize(x)
    s.parallel(n)


def conv_fused_spatial(s, reduce_axes):
    n, f, y, x = s.axes
    nf = s.fuse(n, f)
    yx = s.fuse(y, x)
    s.parallel(nf)
    _yo, yi = s.split(yx, 16)
    s.vectorize(yi)


def conv_fused_window(s, reduce_axes):
    n, f, y, x = s.axes
    rc, ry, rx = reduce_axes
    window = s.fuse(ry, rx)  # one loop over the 3x3 window, still in (ry, rx) order
    wo, wi = s.split(window, 4)
    s.reorder(n, f, y, rc, wo, wi, x)
    s.unroll(wi)
    s.vectorize(x)


CONV_SCHEDULES = [conv_default, conv_tiled, conv_split_channels, conv_fused_spatial, conv_fused_window]


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("apply", CONV_SCHEDULES, ids=lambda f: f.__name__)
def test_conv2d_padding(apply, stride):
    x_shape, filters, kernel_size, pad = (2, 3, 9, 11), 5, 3, 1
    _X, _W, Y, reduce_axes = conv2d(x_shape, filters, kernel_size, stride, pad)
    s = ln.Schedule(Y)
    apply(s, reduce_axes)
    rng = np.random.default_rng(2)
    x, w = random_floats(rng, *x_shape), random_floats(rng, filters, x_shape[1], kernel_size, kernel_size)
    kernel = ln.build(s)
    got = run_kernel(kernel, x, w)
    np.testing.assert_allclose(got, conv2d_ref(x, w, stride, pad), rtol=1e-5, atol=1e-5)
    # Every schedule here keeps the (rc, ry, rx) order per output element: bit-identical to the default.
    _, _, Y0, _ = conv2d(x_shape, filters, kernel_size, stride, pad)
    np.testing.assert_array_equal(got, run(ln.Schedule(Y0), x, w))


def test_conv2d_parallel_halves():
    x_shape = (4, 2, 7, 7)
    _X, _W, Y, reduce_axes = conv2d(x_shape, 3, 3, 2, 1)
    s = ln.Schedule(Y)
    conv_split_channels(s, reduce_axes)
    kernel = ln.build(s)
    assert kernel.parallel and kernel.range_extent == 4
    rng = np.random.default_rng(3)
    x, w = random_floats(rng, *x_shape), random_floats(rng, 3, 2, 3, 3)
    want = conv2d_ref(x, w, 2, 1)
    out = run_kernel(kernel, x, w, begin=1, end=3)
    np.testing.assert_allclose(out[1:3], want[1:3], rtol=1e-5, atol=1e-5)
    assert np.isnan(out[0]).all() and np.isnan(out[3]).all()
    run_kernel(kernel, x, w, begin=0, end=1, out=out)
    run_kernel(kernel, x, w, begin=3, end=4, out=out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
