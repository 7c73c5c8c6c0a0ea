"""The int8 kinds' schedule search (onnxopt/tune/int8_schedule.py): its space per target, every schedule's kernel
exact, and the search choosing among checked and timed candidates."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from int8_models import conv_int, matmul_exact, matmul_integer_model, qdq_conv_model
from kind_harness import fuse_kind

from onnxopt.annotate.shapes import tensor_info
from onnxopt.codegen.instructions import available
from onnxopt.codegen.target import host_target, parse_target
from onnxopt.kinds.qconv import KIND as QCONV
from onnxopt.kinds.qmatmul import KIND as QMATMUL
from onnxopt.timing import make_session
from onnxopt.tune.int8_schedule import schedule_space, search_schedule

needs_int8 = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                                reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


def _conv(rng, cin=24, cout=30, k=3, hw=12):
    wt = rng.integers(-127, 128, (cout, cin, k, k)).astype(np.int8)
    sw = (rng.uniform(0.5, 2, cout) * 0.01).astype(np.float32)
    bias = rng.integers(-500, 500, cout).astype(np.int32)
    attrs = dict(kernel_shape=[k, k], pads=[1] * 4, strides=[1, 1], dilations=[1, 1])
    model = qdq_conv_model(wt, sw, bias, np.float32(0.02), np.array(5, np.uint8), np.float32(0.3), np.uint8(3), attrs,
                           (1, cin, hw, hw), True)
    x = rng.integers(0, 256, (1, cin, hw, hw)).astype(np.uint8)
    exact = conv_int(x, wt, 5, 0, [1, 1], [1] * 4, [1, 1])
    scale = (np.float32(0.02) * sw / np.float32(0.3)).astype(np.float32).reshape(1, -1, 1, 1)
    q = np.rint((exact + bias.reshape(1, -1, 1, 1)).astype(np.int32).astype(np.float32) * scale) + 3
    return model, {"xq": x}, np.clip(np.maximum(q, 3), 0, 255).astype(np.uint8)


def test_the_space_per_target():
    def rows(spec):
        return [(p.mr, p.tasks) for p in schedule_space(_Params(), parse_target(spec), 2)]

    assert rows("x86-64-v3") == [(4, 16), (4, 2), (2, 16), (2, 2), (6, 16), (6, 2)]  # 16 ymm: 2 vectors a row
    assert [m for m, _ in rows("x86-64-v4")][::2] == [4, 2, 6, 8]  # 32 zmm, one vector a row
    assert [m for m, _ in rows("aarch64-dotprod")][::2] == [4, 2, 6]  # 32 q registers, four vectors a row
    assert rows("x86-64-v3")[0] == (4, 16)  # the default first: the baseline the others must beat


@dataclass(frozen=True)
class _Params:  # the two fields the space varies
    mr: int = 4
    tasks: int = 16


@needs_int8
@pytest.mark.parametrize("mr,tasks", [(2, 16), (6, 2), (6, 16), (2, 1)])
def test_every_schedule_is_exact(tmp_path, mr, tasks):
    rng = np.random.default_rng(mr * 10 + tasks)
    model, feeds, want = _conv(rng)
    fused, lib, region, _ = fuse_kind(QCONV, model, tmp_path, params=lambda p: replace(p, mr=mr, tasks=tasks))
    assert (region.params.mr, region.params.tasks) == (mr, tasks)
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)
    w = rng.integers(-128, 128, (64, 37)).astype(np.int8)
    mm = matmul_integer_model(64, 37, w, [2])
    fused, lib, region, _ = fuse_kind(QMATMUL, mm, tmp_path, name="mm.so", params=lambda p: replace(p, mr=mr,
                                                                                                   tasks=tasks))
    a = rng.integers(0, 256, (2, 29, 64)).astype(np.uint8)
    got = make_session(fused, 2, library=lib).run(None, {"a": a, "scale": np.array(0.01, np.float32),
                                                          "za": np.array(7, np.uint8)})[0]
    np.testing.assert_array_equal(got, matmul_exact(a, w, 7, 0.01, 37))


@needs_int8
def test_the_search_times_checked_candidates_and_keeps_one_of_them(tmp_path):
    from onnxopt.graph.infer import infer

    target = host_target()
    model, feeds, want = _conv(np.random.default_rng(1), cin=64, cout=64, hw=20)
    work = infer(model)
    (region,) = QCONV.find(work, set(), [])
    region.compute_op_type(target.name)
    res = search_schedule(region, work, target, 2, info=tensor_info(work), bindings={}, min_time=0.05)
    assert res.skipped is None
    space = [(p.mr, p.tasks) for p in schedule_space(region.params, target, 2)]
    assert [(c["mr"], c["tasks"]) for c in res.candidates] == space
    assert all(c.get("seconds", 0) > 0 for c in res.candidates), res.candidates  # each ran and was exact
    assert (res.params.mr, res.params.tasks) in space
    fused, lib, _, _ = fuse_kind(QCONV, model, tmp_path, params=lambda p: res.params)
    np.testing.assert_array_equal(make_session(fused, 2, library=lib).run(None, feeds)[0], want)
    # a budget spent, or a depthwise convolution: no search, the default kept
    assert search_schedule(region, work, target, 2, info=tensor_info(work), bindings={},
                           cache_only="the tuning budget is spent").params == region.params
    assert "depthwise" in search_schedule(replace(region, params=replace(region.params, depthwise=True)), work,
                                          target, 2, info=tensor_info(work), bindings={}).skipped
