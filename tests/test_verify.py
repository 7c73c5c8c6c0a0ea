"""The whole-model check's tolerance: rtol and atol per element, plus a fraction of the output's largest magnitude."""

import warnings

import numpy as np
import pytest

from onnxopt.errors import UsageError
from onnxopt.verify import Tolerance, compare, finite_scale


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


def test_an_infinite_tolerance_still_refuses_a_wrong_answer():
    """A tolerance made from an output that overflowed (its scale inf) would pass anything: compare judges by the
    dtype's default check instead, scaled by the finite values."""
    a = np.array([np.inf, 1.0, 2.0, -3.0], np.float32)
    wrong = np.array([np.inf, 1.0, 2.5, -3.0], np.float32)
    for atol in (np.inf, np.nan):
        tol = Tolerance({"float32": 1e-4}, {"float32": atol}, {})
        assert compare(["y"], [a], [a.copy()], tol)[0].ok
        assert not compare(["y"], [a], [wrong], tol)[0].ok
    assert not compare(["y"], [a], [wrong], Tolerance({"float32": np.inf}, {"float32": 1e-5}, {}))[0].ok


def test_the_kernel_check_on_weights_that_overflow():
    """The kernel check's tolerance (the reference's scale times the kernel's error bound) on a reference with
    inf where float32 overflowed: a wrong finite value is still refused."""
    from onnxopt.tune.tile_search import kernel_tolerance

    want = np.array([[1.0, np.inf], [-np.inf, 5.0]], np.float32)
    got = want.copy()
    got[1, 1] = 7.0
    tol = kernel_tolerance([want], 2e-6)
    assert compare(["y"], [want], [want.copy()], tol)[0].ok
    d = compare(["y"], [want], [got], tol)[0]
    assert not d.ok and d.max_abs == 2.0


@pytest.mark.parametrize("got,ok", [
    ([np.inf, -np.inf, np.nan, 1.0], True),
    ([-np.inf, -np.inf, np.nan, 1.0], False),  # an inf of the other sign
    ([np.inf, -3e38, np.nan, 1.0], False),  # a finite value where the reference is inf
    ([np.inf, -np.inf, 0.0, 1.0], False),  # a number where the reference is NaN
    ([np.inf, -np.inf, np.nan, np.nan], False),  # NaN where the reference is a number
    ([np.inf, -np.inf, np.nan, np.inf], False),
])
def test_inf_and_nan_positions_must_match_exactly(got, ok):
    want = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    d = compare(["y"], [want], [np.array(got, np.float32)], Tolerance())[0]
    assert d.ok == ok
    if not ok:
        assert "inf or NaN" in d.detail and "1 of 4" in d.detail


def test_huge_magnitudes_of_opposite_sign_fail_without_warnings():
    want = np.array([3e38, -3e38], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not compare(["y"], [want], [-want], Tolerance())[0].ok
        assert compare(["y"], [want], [want.copy()], Tolerance())[0].ok


def test_finite_scale_ignores_inf_and_nan():
    assert finite_scale([np.array([np.inf, -2.0, np.nan], np.float32), np.array([1.0])]) == 2.0
    assert finite_scale([np.array([np.inf, np.nan]), np.array([], np.float32)]) == 0.0


def test_a_string_tolerance_is_one_value():
    assert Tolerance.parse("1e-2", "float32:1e-3", None).rtol["float32"] == 1e-2
    assert Tolerance.parse("1e-2", "float32:1e-3", None).atol["float32"] == 1e-3
