"""Depthwise convolutions inside blocked chains (codegen/microkernel/depthwise.py, compute_exec.c's
cb_run_depthwise_task): one channel vector per tile, each input vector loaded once per kernel row and shared by the
taps that read it, the input read in place whatever the padding (kernel rows outside the image left out, columns
outside it read as zeros by the border tiles' masked loads)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.compute.blocked_tile import define_depthwise_tile_functions
from onnxopt.codegen.compute.tile import TileSpec
from onnxopt.codegen.microkernel.depthwise import DEPTHWISE_MI_MAX, depthwise_mi, depthwise_mi_for
from onnxopt.codegen.microkernel.registry import select
from onnxopt.codegen.target import host_target, parse_target
from onnxopt.emit.sequence import expand_sequences

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import Chain, check_answers, fused_nodes, needs_vectors, optimize_blocked  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_microkernel import _identity_program, _instructions, _loops  # noqa: E402


@st.composite
def depthwise_convs(draw):
    """Kernel rows and columns apart (1x1 to 7x7, 3x5 ...), dilation, stride, pads up to the kernel's reach and an
    image at least one window large after padding; widths past two 14-pixel tiles, so that rows have border tiles
    on both sides and interior ones between."""
    kh, kw = draw(st.sampled_from([1, 2, 3, 5, 7])), draw(st.sampled_from([1, 3, 5, 7]))
    d, s = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    reach_h, reach_w = (kh - 1) * d + 1, (kw - 1) * d + 1
    pads = [draw(st.integers(0, min(3, r - 1))) for r in (reach_h, reach_w, reach_h, reach_w)]
    min_h = max(1, reach_h - pads[0] - pads[2])  # 13 for a 7-row kernel dilated by 2 without pads
    h = draw(st.integers(min_h, max(12, min_h)))
    w = draw(st.integers(max(1, reach_w - pads[1] - pads[3]), 40))
    return kh, kw, d, s, pads, h, w


@needs_vectors
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(1, 40), conv=depthwise_convs(), batch=st.sampled_from([1, 2]), act=st.sampled_from(
    ["Relu", "Sigmoid", None]))
def test_depthwise_in_a_blocked_chain_matches_onnxruntime(tmp_path_factory, c, conv, batch, act):
    """1x1 (writes blocked) -> depthwise (blocked in and out) -> 1x1 (ends the chain): channel counts that are not
    a multiple of the lanes, every border case of the padding, checked with and without the library."""
    kh, kw, d, s, pads, h, w = conv
    ch = Chain(3, h, w, batch=batch, seed=c + 11 * kh + kw)
    a = ch.conv("x", "a", c, k=1, p=0)
    b = ch.conv(a, "b", c, k=kh, kw=kw, s=s, d=d, pads=pads, group=c, act=act)
    ch.conv(b, "c", 7, k=1, p=0, act=None)
    model = ch.model(["c"])
    res = optimize_blocked(model, tmp_path_factory.mktemp("dw"))
    assert [r["layout"] for r in res.report["regions"]] == ["nchw->blocked", "blocked->blocked", "blocked->nchw"]
    check_answers(res, model, ch.feeds)


@needs_vectors
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(1, 40), conv=depthwise_convs(), batch=st.sampled_from([1, 3]))
def test_depthwise_ending_a_chain_matches_onnxruntime(tmp_path_factory, c, conv, batch):
    """A depthwise convolution whose output is the graph's: blocked input, NCHW output through the blocked buffer
    and the reorder at the end."""
    kh, kw, d, s, pads, h, w = conv
    ch = Chain(4, h, w, batch=batch, seed=c + kh)
    a = ch.conv("x", "a", c, k=1, p=0, act="Sigmoid")
    ch.conv(a, "b", c, k=kh, kw=kw, s=s, d=d, pads=pads, group=c, act="Relu")
    model = ch.model(["b"])
    res = optimize_blocked(model, tmp_path_factory.mktemp("dwx"))
    assert [r["layout"] for r in res.report["regions"]] == ["nchw->blocked", "blocked->nchw"]
    check_answers(res, model, ch.feeds)


@needs_vectors
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(2, 40), conv=depthwise_convs(), batch=st.sampled_from([1, 2]), blocked_out=st.booleans())
def test_depthwise_on_an_nchw_input_matches_onnxruntime(tmp_path_factory, c, conv, batch, blocked_out):
    """A depthwise convolution reading the graph's NCHW input (a producer that writes NCHW, as NASNet's Relu of a
    tensor a pool also reads was): it still runs on channel vectors, the input reordered inside the kernel, and
    writes blocked for a 1x1 after it or NCHW as the graph's output."""
    kh, kw, d, s, pads, h, w = conv
    ch = Chain(c, h, w, batch=batch, seed=c + 5 * kh)
    ch.conv("x", "b", c, k=kh, kw=kw, s=s, d=d, pads=pads, group=c, act="Relu")
    if blocked_out:
        ch.conv("b", "c", 5, k=1, p=0, act=None)
    # A blocked chain beside it, so that the blocked plan exists when the depthwise one is NCHW in and out.
    ch.conv(ch.conv("x", "e", 8, k=1, p=0), "f", 4, k=3)
    model = ch.model(["c" if blocked_out else "b", "f"])
    res = optimize_blocked(model, tmp_path_factory.mktemp("dwn"))
    dw = next(r for r in res.report["regions"] if r["nodes"][0] == "b_pre")
    assert dw.get("layout", "nchw->nchw") == ("nchw->blocked" if blocked_out else "nchw->nchw") and dw["tile"][1] == 1, dw
    check_answers(res, model, ch.feeds)


@needs_vectors
@pytest.mark.parametrize("c", [3, 16, 20])
def test_nchw_input_reorder_puts_every_pixel_and_lane_in_place(tmp_path, c):
    """The reorder of an NCHW input to channel vectors (compute_exec.c's cb_reorder; 16 pixels at a time through a
    register transpose on AVX-512, then the scalar loop): 37x29 = 1073 pixels is one full run of 1024, then 49 of
    which 48 go through the transpose and 1 through the scalar loop; 3 and 20 channels leave padding lanes, which
    must read as zeros. A 1x1 depthwise convolution maps each input value to one output value, so any value put in
    the wrong pixel or lane shows in the answer."""
    ch = Chain(c, 37, 29, batch=2, seed=c)
    ch.conv("x", "b", c, k=1, p=0, group=c, act=None)
    ch.conv("b", "c", 5, k=1, p=0, act=None)
    ch.conv(ch.conv("x", "e", 8, k=1, p=0), "f", 4, k=3)  # a blocked chain beside it, as above
    model = ch.model(["c", "f"])
    res = optimize_blocked(model, tmp_path)
    dw = next(r for r in res.report["regions"] if r["nodes"][0] == "b")  # no activation: the Conv's own name
    assert dw["layout"] == "nchw->blocked"
    check_answers(res, model, ch.feeds, rtol=1e-6, atol=1e-6)


@needs_vectors
def test_mobilenet_block_stays_blocked_with_a_residual(tmp_path):
    """An inverted residual block (expand 1x1, depthwise 3x3, project 1x1 + residual add) twice, then a strided
    depthwise: every tensor between the fused convolutions stays blocked, the residual read blocked in the
    projection's epilogue."""
    ch = Chain(24, 15, 29, batch=2, seed=9)
    x = ch.conv("x", "stem", 24, k=3, s=1, p=1)
    for i in range(2):
        e = ch.conv(x, f"e{i}", 72, k=1, p=0)
        dw = ch.conv(e, f"dw{i}", 72, k=3, p=1, group=72)
        pr = ch.conv(dw, f"p{i}", 24, k=1, p=0, act=None)
        x = ch.add(pr, x, f"r{i}", relu=False)
    ch.conv(x, "down", 24, k=5, s=2, p=2, group=24)
    model = ch.model(["down"])
    res = optimize_blocked(model, tmp_path)
    layouts = [r["layout"] for r in res.report["regions"]]
    assert layouts == ["nchw->blocked"] + ["blocked->blocked"] * 6 + ["blocked->nchw"]
    # no reorder node anywhere
    assert len(expand_sequences(res.model).graph.node) == len(fused_nodes(res.model)) == 8
    tiles = {e["nodes"][0]: e["tile"] for e in res.report["regions"]}
    # the depthwise tiles in the report: as wide as the host's registers allow for a 3- and a 5-wide kernel
    mk = select(host_target())
    assert tiles["dw0_pre"] == [depthwise_mi_for(mk, 3), 1, 1]
    assert tiles["down_pre"] == [depthwise_mi_for(mk, 5), 1, 1]
    check_answers(res, model, ch.feeds)


def test_depthwise_tile_width_fits_the_register_file():
    assert depthwise_mi(32, 3) == DEPTHWISE_MI_MAX
    assert depthwise_mi(16, 3, mask_registers=1) == 11  # AVX2: 11 accumulators + 3 filters + 1 input + 1 mask
    assert depthwise_mi(16, 7, mask_registers=1) == 7
    assert depthwise_mi(8, 7) == 1


def _depthwise_loop(level, mi, kw, sw, dw, bounded):
    target = parse_target(level)
    spec = TileSpec(select(target).tile, _identity_program(), (), packed_a=True)
    module = new_module(target, "dw")
    define_depthwise_tile_functions(module, "dw", spec, target.features, mi, kw, sw, dw)
    asm = compile_assembly(str(module), target)
    name = f"dw_d{mi}" + ("b" if bounded else "")
    body = asm.split(f"\n{name}:", 1)[1]
    body = re.split(r"\n[A-Za-z_][\w.$]*:", body, 1)[0]
    loops = [lp for lp in _loops(body.splitlines()) if any(i.startswith("vfmadd") for i in lp)]
    # The kernel-row loop, and around it the loop over the rows of one call (blocked_tile.py, ROWS).
    assert len(loops) == 2, body
    inner, outer = sorted(loops, key=len)
    assert len(outer) > len(inner)
    return inner


@pytest.mark.parametrize("level,mi,kw,sw,dw", [("x86-64-v4", 14, 3, 1, 1), ("x86-64-v4", 14, 5, 1, 1),
                                               ("x86-64-v4", 10, 3, 2, 1), ("x86-64-v4", 12, 3, 1, 2),
                                               ("x86-64-v3", 11, 3, 1, 1)])
@pytest.mark.parametrize("bounded", [False, True])
def test_kernel_row_loads_each_input_vector_once(level, mi, kw, sw, dw, bounded):
    """Per kernel row: mi * kw FMAs, kw filter loads and one load per input position the row's taps read, and no
    vector register stored to the stack in the loop. (AVX2's border tiles keep their per-position masks, which are
    loop-invariant, on the stack and reload them: ymm masks do not fit beside the accumulators.)"""
    loop = _depthwise_loop(level, mi, kw, sw, dw, bounded)
    vector_width = "zmm" if level == "x86-64-v4" else "ymm"
    fmas = [i for i in loop if i.startswith("vfmadd")]
    assert len(fmas) == mi * kw and all(vector_width in i for i in fmas)
    positions = len({i * sw + c * dw for i in range(mi) for c in range(kw)})
    operands = [i.split(None, 1)[1].split(", ") for i in loop
                if i.startswith(("vmovups", "vmovaps", "vmaskmovps", "vfmadd"))]
    data_loads = [ops for ops in operands if any("(" in o and "%rsp" not in o for o in ops[:-1])]
    assert len(data_loads) == positions + kw
    stack_stores = [i for i in loop if i.startswith("v") and i.split(", ")[-1].endswith("(%rsp)")]
    assert not stack_stores
    if level == "x86-64-v4" or not bounded:
        assert not [i for i in loop if i.startswith("v") and "(%rsp)" in i and vector_width in i]


def test_depthwise_on_avx2_blocks_of_8(tmp_path):
    """The AVX2 target (NCHW8c, 11-pixel depthwise tiles, masks in vector registers) on this machine, when it has
    AVX2: channels not a multiple of 8, a 5x5 with a stride, both border variants."""
    import onnxopt
    from onnxopt.codegen.target import missing_cpu_flags

    missing = missing_cpu_flags(parse_target("x86-64-v3").required_cpu_flags)
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)} for x86-64-v3")
    ch = Chain(5, 13, 31, batch=2, seed=4)
    a = ch.conv("x", "a", 21, k=1, p=0)
    b = ch.conv(a, "b", 21, k=3, p=1, group=21)
    c = ch.conv(b, "c", 21, k=5, s=2, pads=[2, 1, 2, 2], group=21, act="Sigmoid")
    ch.conv(c, "d", 6, k=1, p=0, act=None)
    model = ch.model(["d"])
    res = onnxopt.optimize(model, str(tmp_path / "fused.onnx"), plan="compute-blocked", measure=False,
                           target="x86-64-v3")
    assert res.report["target"]["name"] == "x86-64-v3"
    assert any(list(t.dims) == [3, 25, 8] for t in res.model.graph.initializer)  # 5x5 filters in vectors of 8
    assert [r["layout"] for r in res.report["regions"]] == ["nchw->blocked"] + ["blocked->blocked"] * 2 + [
        "blocked->nchw"]
    check_answers(res, model, ch.feeds)
