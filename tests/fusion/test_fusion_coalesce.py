"""coalesce() and expected_masks(): the glue's dimension coalescing, checked against numpy broadcasting."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxopt.fusion.elementwise import coalesce, expected_masks


def visited_offsets(dims, strides):
    """Element offsets each input is read at, iterating the coalesced space row-major (innermost last)."""
    out = []
    for idx in itertools.product(*[range(d) for d in dims]):
        out.append(sum(i * s for i, s in zip(idx, strides)))
    return out


def numpy_offsets(in_shape, out_shape):
    """What numpy broadcasting reads: the flat index into the input for each output element, row-major."""
    src = np.arange(math.prod(in_shape), dtype=np.int64).reshape(in_shape)
    return np.broadcast_to(src, out_shape).ravel().tolist()


def check(in_shapes, out_shape):
    dims, strides = coalesce([tuple(s) for s in in_shapes], tuple(out_shape))
    assert len(strides) == len(in_shapes)
    assert all(len(s) == len(dims) for s in strides)
    assert math.prod(dims) == math.prod(out_shape)
    for s, st_ in zip(in_shapes, strides):
        assert visited_offsets(dims, st_) == numpy_offsets(s, out_shape)
    return dims, strides


# ---------------------------------------------------------------- examples


def test_nchw_with_per_channel():
    dims, strides = check([(2, 3, 4, 5), (1, 3, 1, 1)], (2, 3, 4, 5))
    assert dims == [2, 3, 20]
    assert strides == [[60, 20, 1], [0, 1, 0]]
    assert expected_masks([(2, 3, 4, 5), (1, 3, 1, 1)], (2, 3, 4, 5)) == [0b01]


def test_same_shapes_collapse_to_one_dim():
    dims, strides = check([(2, 3, 4), (2, 3, 4), (2, 3, 4)], (2, 3, 4))
    assert dims == [24]
    assert strides == [[1], [1], [1]]
    assert expected_masks([(2, 3, 4)] * 3, (2, 3, 4)) == [0b111]


def test_scalar_input():
    dims, strides = check([(4, 5), ()], (4, 5))
    assert dims == [20]
    assert strides == [[1], [0]]
    assert expected_masks([(4, 5), ()], (4, 5)) == [0b01]
    assert expected_masks([(), (4, 5)], (4, 5)) == [0b10]


def test_lower_rank_input_broadcasts_on_the_left():
    dims, strides = check([(2, 3, 4), (4,)], (2, 3, 4))
    assert dims == [6, 4]
    assert strides == [[4, 1], [0, 1]]
    assert expected_masks([(2, 3, 4), (4,)], (2, 3, 4)) == [0b11]


def test_inner_broadcast():
    dims, strides = check([(3, 4), (3, 1)], (3, 4))
    assert dims == [3, 4]
    assert strides == [[4, 1], [1, 0]]
    assert expected_masks([(3, 4), (3, 1)], (3, 4)) == [0b01]


def test_unit_dims_are_dropped():
    dims, strides = check([(1, 5, 1, 6), (1, 1, 1, 6)], (1, 5, 1, 6))
    assert dims == [5, 6]
    assert strides == [[6, 1], [0, 1]]


def test_all_ones():
    assert coalesce([(1, 1), (1,)], (1, 1)) == ([1], [[0], [0]])
    assert coalesce([()], ()) == ([1], [[0]])
    assert expected_masks([(1, 1)], (1, 1)) == [0]


def test_outer_product():
    dims, strides = check([(3, 1), (1, 4)], (3, 4))
    assert dims == [3, 4]
    assert strides == [[1, 0], [0, 1]]
    assert expected_masks([(3, 1), (1, 4)], (3, 4)) == [0b10]


# ---------------------------------------------------------------- symbolic dims


def test_symbolic_same_shape():
    assert expected_masks([("N", "C"), ("N", "C")], ("N", "C")) == [0b11]


def test_symbolic_per_channel():
    assert expected_masks([("N", "C", "H", "W"), (1, "C", 1, 1)], ("N", "C", "H", "W")) == [0b01]
    assert expected_masks([("N", 8), (8,)], ("N", 8)) == [0b11]
    assert expected_masks([("N", 1), ("N", 8)], ("N", 8)) == [0b10]


def test_symbolic_scalar_and_mixed():
    assert expected_masks([("B", "T", 64), ()], ("B", "T", 64)) == [0b01]
    assert expected_masks([("B", "T", 64), ("T", 64), (1, 1, 64)], ("B", "T", 64)) == [0b111]
    assert expected_masks([("B", "T", 1), ("B", "T", "D")], ("B", "T", "D")) == [0b10]


def test_masks_are_one_int_per_region():
    masks = expected_masks([("N", 4), (4,), ("N", 1)], ("N", 4))
    assert isinstance(masks, list) and len(masks) == 1
    assert masks == [0b011]


# ---------------------------------------------------------------- property: same elements as numpy


@st.composite
def broadcast_case(draw):
    rank = draw(st.integers(0, 5))
    out = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    n_in = draw(st.integers(1, 4))
    ins = []
    for _ in range(n_in):
        r = draw(st.integers(0, rank))
        tail = out[rank - r:]
        ins.append(tuple(d if draw(st.booleans()) else 1 for d in tail))
    # the output shape is what they broadcast to; make sure at least one input spans it
    ins[0] = tuple(out)
    draw(st.randoms()).shuffle(ins)
    return ins, tuple(out)


@settings(max_examples=300, deadline=None)
@given(broadcast_case())
def test_coalesced_iteration_matches_numpy(case):
    in_shapes, out_shape = case
    dims, strides = check(in_shapes, out_shape)
    # no unit dims remain unless the whole space is one element
    assert all(d > 1 for d in dims) or dims == [1]
    # coalescing is maximal: no two neighbouring dims could have been merged
    for j in range(len(dims) - 1):
        assert not all(s[j] == s[j + 1] * dims[j + 1] for s in strides)
    # the mask has bit i set exactly when input i moves along the innermost dim
    mask = expected_masks(list(in_shapes), out_shape)[0]
    for i, s in enumerate(strides):
        assert bool(mask >> i & 1) == (s[-1] != 0)


@settings(max_examples=150, deadline=None)
@given(broadcast_case(), st.data())
def test_symbolic_masks_match_concrete_masks(case, data):
    """Replacing some dims > 1 by symbols (consistently) does not change the expected mask."""
    in_shapes, out_shape = case
    names = {}
    for j, d in enumerate(out_shape):
        if d > 1 and data.draw(st.booleans()):
            names[j] = f"s{j}"
    rank = len(out_shape)

    def sym(shape):
        lead = rank - len(shape)
        return tuple(names.get(j + lead, d) if d > 1 else d for j, d in enumerate(shape))

    concrete = expected_masks(list(in_shapes), out_shape)
    symbolic = expected_masks([sym(s) for s in in_shapes], sym(out_shape))
    assert symbolic == concrete


@pytest.mark.parametrize("n_inputs", [1, 8, 16])
def test_many_inputs_mask_width(n_inputs):
    shapes = [(2, 3)] * n_inputs
    assert expected_masks(shapes, (2, 3)) == [(1 << n_inputs) - 1]
