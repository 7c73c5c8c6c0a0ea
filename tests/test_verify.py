"""The whole-model check's tolerance: rtol and atol per element, plus a fraction of the output's largest magnitude."""

import numpy as np
import pytest

from onnxopt.errors import UsageError
from onnxopt.verify import Tolerance, compare


def _logits(rng):
    # Large logits with one near zero, as a random-weight ResNet-50 gives (up to 1600).
    a = rng.standard_normal(1000).astype(np.float32) * 400
    a[7] = 2.0
    return a


def test_rounding_near_zero_is_judged_against_the_largest_magnitude():
    rng = np.random.default_rng(0)
    a = _logits(rng)
    b = a.copy()
    b[7] += 2.4e-6 * np.abs(a).max()  # float32 summation rounding of terms as large as the largest output
    d = compare(["y"], [a], [b], Tolerance())[0]
    assert d.ok and d.max_rel > 1e-3  # the plain rtol/atol check would refuse it
    assert not compare(["y"], [a], [b], Tolerance.parse(None, None, 0.0))[0].ok


def test_an_error_beyond_rounding_still_fails():
    rng = np.random.default_rng(1)
    a = _logits(rng)
    b = a.copy()
    b[7] += 1e-4 * np.abs(a).max()  # ten times the scale tolerance: a wrong answer, not rounding
    assert not compare(["y"], [a], [b], Tolerance())[0].ok
    c = a.copy()
    c[3] *= 1.002  # a large value off by 0.2%: beyond rtol whatever the scale term
    assert not compare(["y"], [a], [c], Tolerance())[0].ok


def test_nan_and_inf_do_not_make_the_scale_infinite():
    a = np.array([np.inf, np.nan, 1.0, 0.0], np.float32)
    b = np.array([np.inf, np.nan, 1.0, 1e-3], np.float32)
    assert not compare(["y"], [a], [b], Tolerance())[0].ok  # 1e-3 > 1e-4 + 1e-5 * 1


def test_per_dtype_and_bad_values():
    t = Tolerance.parse(None, None, ["float32:0"])
    assert t.stol["float32"] == 0.0 and t.stol["float16"] > 0
    with pytest.raises(UsageError, match="--scale-tol"):
        Tolerance.parse(None, None, ["float32:abc"])
