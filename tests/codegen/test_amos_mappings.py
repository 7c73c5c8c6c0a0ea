"""AMOS's mapping enumeration and validation (codegen/instructions/mapping.py) on the thesis's operators: the counts
of its Table 5.3 for Tensor Core (WMMA m16n16k16), its example mappings, and VNNI read as a GEMV."""

from __future__ import annotations

import pytest

from onnxopt.codegen.instructions import by_name
from onnxopt.codegen.instructions.expr import Computation, Loop, access, cast, mul
from onnxopt.codegen.instructions.mapping import mappings, match_points, valid

WMMA = by_name("wmma_f16")


def _op(name, parallel, reduce, out, a, b):
    """out[..] += f32(A[a..]) * f32(W[b..]) with f16 sources, as the thesis's benchmarks are written (strides and
    dilations 2: any value above 1 behaves the same)."""
    loops = tuple(Loop(n, 8) for n in parallel.split()) + tuple(Loop(n, 3, reduce=True) for n in reduce.split())
    return Computation(name, loops, access("O", "f32", *out.split()),
                       mul("f32", cast("f32", access("A", "f16", *a.split())), cast("f32", access("W", "f16", *b.split()))))


OPERATORS = {
    "GMV": (_op("GMV", "i j", "k", "i j", "i k", "k j"), 1),  # j of extent 1: D[i] = C[i, 0]
    "GMM": (_op("GMM", "i j", "k", "i j", "i k", "k j"), 1),
    "C1D": (_op("C1D", "b k l", "rc rl", "b k l", "b rc 2*l+2*rl", "k rc rl"), 6),
    "C2D": (_op("C2D", "n k p q", "rc rr rs", "n k p q", "n rc 2*p+rr 2*q+rs", "k rc rr rs"), 35),
    "C3D": (_op("C3D", "n k d p q", "rc rd rr rs", "n k d p q", "n rc 2*d+rd 2*p+rr 2*q+rs", "k rc rd rr rs"), 180),
    "T2D": (_op("T2D", "b c h w", "rc rw rh", "b c h w", "b rc h+2*rh w+2*rw", "rc c 2-rh 2-rw"), 7),
    "GRP": (_op("GRP", "n ko ki p q", "rc rr rs", "n ko ki p q", "n ko rc 2*p+rr 2*q+rs", "ko ki rc rr rs"), 35),
    "DIL": (_op("DIL", "n k p q", "rc rr rs", "n k p q", "n rc 2*p+2*rr 2*q+2*rs", "k rc rr rs"), 35),
    "DEP": (_op("DEP", "n ko ki p q", "rr rs", "n ko ki p q", "n ko 2*p+rr 2*q+rs", "ko ki rr rs"), 11),
    "CAP": (_op("CAP", "b k h w s", "rc rw rh", "b k h w s", "b rc 2*h+2*rh 2*w+2*rw", "k rc rh rw s"), 105),
    "BCV": (_op("BCV", "n k p q", "rc rr rs", "n k p q", "n rc 2*p+rr 2*q+rs", "n k rc rr rs"), 11),
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_table_5_3_counts(name):
    op, count = OPERATORS[name]
    found = mappings(op, WMMA)
    assert len(found) == count
    assert all(valid(op, WMMA, m) for m in found)  # every mapping passes Algorithm 4 too


def test_c2d_match_points_and_a_table_5_4_mapping():
    op, _ = OPERATORS["C2D"]
    points = {tuple(lp for _, lp in p) for p in match_points(op, WMMA)}
    # k always on j; n with any reduction loop; p and q not with the window loop that shares their dim
    assert points == {("n", "k", "rc"), ("n", "k", "rr"), ("n", "k", "rs"), ("p", "k", "rc"), ("p", "k", "rs"),
                      ("q", "k", "rc"), ("q", "k", "rr")}
    # Table 5.4's C0: {n, q} on i and {c, r, s} on k, the union of (n, c), (n, s) and (q, r)
    groups = {(m.of("i"), m.of("k")) for m in mappings(op, WMMA)}
    assert (frozenset({"n", "q"}), frozenset({"rc", "rr", "rs"})) in groups


def test_rejections():
    op, _ = OPERATORS["T2D"]
    assert not any("rh" in p or "rw" in p for pt in match_points(op, WMMA) for p in dict(pt).values())  # 2 - rh
    grp, _ = OPERATORS["GRP"]
    assert all("ko" not in m.mapped for m in mappings(grp, WMMA))  # the group indexes both sources
    c2d, _ = OPERATORS["C2D"]
    from onnxopt.codegen.instructions.mapping import AmosMapping
    # the thesis's invalid example: n and k both on the first parallel loop
    wrong = AmosMapping((("i", frozenset({"n", "k"})), ("j", frozenset()), ("k", frozenset({"rc"}))))
    assert not valid(c2d, WMMA, wrong)
    # Algorithm 4 alone cannot see that p and rr share a dim: it passes what the matcher refuses
    shared = AmosMapping((("i", frozenset({"p"})), ("j", frozenset({"k"})), ("k", frozenset({"rr"}))))
    assert valid(c2d, WMMA, shared) and shared not in mappings(c2d, WMMA)


def test_int8_1x1_conv_on_vnni_as_a_gemv():
    """The checklist's int8 1x1 convolution: VNNI as AMOS reads it, d[i] += a[j] * b[i, j] (i < 16, j < 4), maps
    the input channels onto j and the output channels onto i."""
    vnni = Computation("vnni_gemv", (Loop("i", 16), Loop("j", 4, reduce=True)), access("d", "s32", "i"),
                       mul("s32", cast("s32", access("a", "u8", "j")), cast("s32", access("b", "s8", "i", "j"))))
    conv = Computation("conv1x1", (Loop("p", 196), Loop("k", 64), Loop("c", 32, reduce=True)), access("O", "s32", "k", "p"),
                       mul("s32", cast("s32", access("A", "u8", "c", "p")), cast("s32", access("W", "s8", "k", "c"))))
    found = mappings(conv, vnni)
    assert [(m.of("i"), m.of("j")) for m in found] == [(frozenset({"k"}), frozenset({"c"}))]
    s8 = Computation("conv1x1", conv.loops, conv.output,
                     mul("s32", cast("s32", access("A", "s8", "c", "p")), cast("s32", access("W", "s8", "k", "c"))))
    assert mappings(s8, vnni) == []  # s8 activations: not VNNI's u8 x s8
