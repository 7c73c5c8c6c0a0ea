"""Band heights of the AFUSION kernels (onnxopt/fusion/afusion/siso.py `balanced_rows`): within the scratch limit,
and the tasks spread evenly over the threads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onnxopt.fusion.afusion.siso import balanced_rows


def test_even_split_instead_of_a_short_last_band():
    assert balanced_rows(18, 56, 1, 2) == 14  # 4 bands of 14, not 18, 18, 18, 2
    assert balanced_rows(7, 28, 1, 2) == 7
    assert balanced_rows(100, 7, 8, 2) == 7  # a batch gives the tasks: whole items


@given(st.integers(1, 64), st.integers(1, 300), st.integers(1, 8), st.integers(1, 16))
def test_within_the_limit_and_busy(max_rows, out_h, batch, threads):
    rows = balanced_rows(max_rows, out_h, batch, threads)
    assert 1 <= rows <= max(1, min(max_rows, out_h))
    tasks = batch * -(-out_h // rows)
    assert rows == 1 or tasks >= 2 * threads
