"""A session can ask our library for only the ops it runs (make_session's `ops`, the "onnxopt.register_ops" session
config entry read by RegisterCustomOps in codegen/glue/ort_glue.c): the pipeline makes hundreds of one-kernel
sessions on a library of hundreds of kernels, and onnxruntime spends about 30 us a session on each op registered.
Checked on real fused models with their function fallbacks removed, so an op that was not registered cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxopt.driver.policy import custom_ops
from onnxopt.timing import REGISTER_OPS_MAX, make_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, needs_vectors, optimize_blocked, reference


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    c = Chain(3, 24, 24)
    x = c.conv("x", "a", 16, k=3, p=1)
    x = c.conv(x, "b", 24, k=1, p=0)
    model = c.model([c.conv(x, "c", 8, k=3, p=1, act=None)])
    res = optimize_blocked(model, tmp_path_factory.mktemp("reg"), sequences=False)
    bare = onnx.ModelProto()
    bare.CopyFrom(res.model)
    del bare.functions[:]  # no fallback: an op that is not registered cannot run
    return c, model, res, bare


@needs_vectors
def test_the_ops_asked_for_run(fused):
    chain, model, res, bare = fused
    ops = custom_ops(bare)
    assert len(ops) >= 2
    got = make_session(bare.SerializeToString(), 2, library=res.library, ops=ops).run(None, chain.feeds)[0]
    want = reference(model, chain.feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@needs_vectors
def test_an_op_not_asked_for_is_not_registered(fused):
    _, _, res, bare = fused
    ops = sorted(custom_ops(bare))
    with pytest.raises(Exception, match=ops[0]):
        make_session(bare.SerializeToString(), 2, library=res.library, ops=ops[1:])


@needs_vectors
def test_a_list_too_long_for_onnxruntime_registers_every_op(fused):
    chain, _, res, bare = fused
    padding = [f"Other_{i:06d}" for i in range(REGISTER_OPS_MAX // 10)]  # over onnxruntime's 8192 characters
    s = make_session(bare.SerializeToString(), 2, library=res.library, ops=padding)
    assert s.run(None, chain.feeds)[0].shape == reference(fused[1], chain.feeds)[0].shape
