"""AMOS's performance model choosing the int8 convolution's form (kinds/qconv/forms.py): both forms are mappings
AMOS's mapper enumerates and validates, both are exact wherever the model may send a convolution, the machine model
it reads decides which the kernel is built in, and the written model runs its kernel in a fresh process."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from int8_models import conv_attrs, conv_int, qdq_conv_model, qdq_unit_operands, requantized
from kind_harness import fuse_kind

from onnxopt.codegen.instructions import available
from onnxopt.codegen.instructions.mapping import mappings, valid
from onnxopt.codegen.target import host_target
from onnxopt.hardware.machine_model import Machine, MemoryLevel
from onnxopt.kinds.qconv import KIND, forms
from onnxopt.kinds.qconv.find import forced_form, implicit_refusal
from onnxopt.timing import make_session

needs_dot = pytest.mark.skipif(not available(host_target(), ("u8", "s8")),
                               reason="this CPU has no u8 x s8 dot-product instruction (AVX2 or VNNI)")


def test_each_form_is_one_of_the_mappings_amos_enumerates():
    """The stride-1 3x3 convolution onto the instruction as the tile issues it: 11 valid mappings, both forms
    among them; a mapping the kernel does not implement (pixels of a column, p alone) is among them too, and one
    that puts the output channels on the lanes is not (they index the broadcast weights)."""
    s = forms.ConvShape(cin=32, cout=64, oh=28, ow=28, kh=3, kw=3)
    op, ins = forms.conv_computation(s), forms.instruction_as_issued()
    found = [{il: set(g) for il, g in m.groups} for m in mappings(op, ins)]
    assert len(found) == 11 and all(valid(op, ins, m) for m in mappings(op, ins))
    assert all(forms.MAPPINGS[f] in found for f in forms.FORMS)
    assert {"i": {"p"}, "j": {"c"}} in found
    assert not any("k" in m["i"] for m in found)
    assert forms.candidates(s) == forms.FORMS


def _machine(latency_s: float, l1_gbs: float = 220.0) -> Machine:
    """A 2-core AVX-512 machine model with an int8 peak of one panel instruction a cycle at 3.6 GHz, this
    instruction latency and L1 bandwidth (a core's)."""
    g = 1e9
    peak_1 = 3.6 * g * 128
    return Machine("perturbed", 2, ["avx512f", "avx512_vnni"], {"float32": 230 * g, "int8": 2 * peak_1}, [
        MemoryLevel("L1", 64 << 10, 2 * l1_gbs * g, bandwidth_1core=l1_gbs * g),
        MemoryLevel("L2", 2 << 20, 220 * g), MemoryLevel("L3", 32 << 20, 180 * g),
        MemoryLevel("DRAM", None, 40 * g)], vector_bits=512,
        details={"peak_flops_1core": {"int8": peak_1}, "kernels": {"int8": {"latency_s": latency_s}}})


def test_the_model_weighs_idle_lanes_latency_and_the_transform():
    """Rows of 32 pixels and a short instruction latency: the implicit form (no im2col) is faster. Rows of 33 idle
    15 of 48 lanes: packed. An instruction latency that the implicit tile's 4 chains cannot hide (16 cycles):
    packed, whose wide tiles keep 24 in flight."""
    fast, slow = forms.rates(_machine(1.1e-9)), forms.rates(_machine(16 / 3.6e9))
    row16 = forms.ConvShape(cin=64, cout=64, oh=32, ow=32, kh=3, kw=3)
    assert forms.choose(row16, fast) == "implicit"
    assert forms.choose(forms.ConvShape(cin=64, cout=64, oh=33, ow=33, kh=3, kw=3), fast) == "packed"
    assert forms.choose(row16, slow) == "packed"
    t = {f: forms.predict_seconds(row16, f, slow) for f in forms.FORMS}
    assert t["implicit"] > 2 * t["packed"]  # latency-bound: 4 chains of a 16-cycle instruction
    with pytest.raises(ValueError):
        forms.predict_seconds(row16, "transposed", fast)
    # on a target with matrix tiles the packed form's whole groups of 16 channels run there (kinds/qconv/amx.py)
    tiles = dataclasses.replace(fast, matrix_ins=forms.MATRIX_OVER_VECTOR * fast.peak_ins)
    assert forms.choose(row16, tiles) == "packed"
    assert forms.rates(_machine(1.1e-9), matrix=True).matrix_ins == pytest.approx(16 * 3.6e9)


@needs_dot
def test_the_machine_model_decides_the_built_kernel(tmp_path, monkeypatch):
    """The model reads the machine model from its cache file, as the optimizer does: written with a short
    instruction latency the convolution is built in the implicit form, with a long one in the packed form; the
    report says which and what the model predicted."""
    from onnxopt.hardware import measure

    monkeypatch.setenv("ONNXOPT_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(3)
    wt, sw, bias, sx, sy = qdq_unit_operands(rng, 64, 64, 3)
    attrs = conv_attrs(3, 3, 1, 1, 1, 32, 32)
    model = qdq_conv_model(wt, sw, bias, sx, np.uint8(3), sy, np.uint8(128), attrs, (1, 64, 32, 32), False)
    built = {}
    for name, latency in (("short", 1.1e-9), ("long", 16 / 3.6e9)):
        measure._write_cache(measure.cache_path(), _machine(latency))
        _, _, region, _ = fuse_kind(KIND, model, tmp_path, name=f"{name}.so")
        built[name] = region
    assert built["short"].params.implicit and not built["long"].params.implicit
    assert built["short"].op_type != built["long"].op_type
    note = KIND.report(built["short"], None, None)["form"]
    assert note.startswith("implicit (AMOS's model: implicit") and "packed" in note


@needs_dot
@settings(max_examples=10, deadline=None)
@given(cin=st.integers(2, 40), cout=st.integers(1, 70), r=st.integers(1, 4), pad=st.integers(0, 2),
       n=st.integers(1, 2), h=st.integers(1, 12), w=st.integers(1, 40), seed=st.integers(0, 2**16),
       relu=st.booleans())
def test_both_forms_requantize_exactly_on_drawn_shapes(tmp_path_factory, cin, cout, r, pad, n, h, w, seed, relu):
    """Whichever form the model picks for a stride-1 QDQ unit, the kernel gives QLinearConv's exact answer: each
    form forced in turn, and the model's own choice, bit for bit the exact requantized integers."""
    attrs = conv_attrs(r, r, 1, pad, 1, h, w)
    if attrs is None:
        return
    rng = np.random.default_rng(seed)
    wt, sw, bias, sx, sy = qdq_unit_operands(rng, cin, cout, r)
    zx, zy = np.uint8(rng.integers(0, 256)), np.uint8(rng.integers(0, 256))
    model = qdq_conv_model(wt, sw, bias, sx, zx, sy, zy, attrs, (n, cin, h, w), relu)
    x = rng.integers(0, 256, (n, cin, h, w)).astype(np.uint8)
    want = requantized(conv_int(x, wt, int(zx), 0, [1, 1], attrs["pads"], [1, 1]), bias, sx, sw, sy, zy, relu)
    folder = tmp_path_factory.mktemp("forms")
    oh, ow = h + 2 * pad - r + 1, w + 2 * pad - r + 1
    both = implicit_refusal(((r, r), (1, 1), None, None, 1), False, [n, cout, oh, ow], cin) is None
    for form in (forms.FORMS if both else ("packed",)) + (None,):
        with forced_form(form):
            fused, lib, region, _ = fuse_kind(KIND, model, folder, name=f"{form}.so")
        if form is not None:
            assert region.params.implicit == (form == "implicit")
        got = make_session(fused, 2, library=lib).run(None, {"xq": x})[0]
        np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=str(form))


@needs_dot
@pytest.mark.parametrize("form", forms.FORMS)
def test_a_written_model_in_each_form_runs_its_kernel_in_a_fresh_process(tmp_path, form):
    """The optimizer's output in each form, loaded through the public loader in a new process as a user does: the
    kernel's calls counted there, the answer onnxruntime's, and the function bodies alone give it too."""
    from fresh_process import assert_written_model_runs

    from onnxopt import optimize

    rng = np.random.default_rng(5)
    wt, sw, bias, sx, sy = qdq_unit_operands(rng, 24, 20, 3)
    model = qdq_conv_model(wt, sw, bias, sx, np.uint8(9), sy, np.uint8(120), conv_attrs(3, 3, 1, 1, 1, 14, 16),
                           (1, 24, 14, 16), True)
    src = tmp_path / "conv.onnx"
    onnx.save(model, src)
    with forced_form(form):
        res = optimize(model, output=str(tmp_path / "fused.onnx"), measure=False, threads=2)
    entry = next(r for r in res.report["regions"] if r["op_type"].startswith("qconv_"))
    assert entry["form"] == f"{form} (forced)"
    op_type = next(nd.op_type for nd in res.model.graph.node if nd.op_type.startswith("qconv_"))
    feeds = {"xq": rng.integers(0, 256, (1, 24, 14, 16)).astype(np.uint8)}
    # onnxruntime's QDQ convolution may sit a step off the exact requantization at a rare element
    assert_written_model_runs(src, tmp_path / "fused.onnx", feeds, op_type, tmp_path, rtol=0, atol=1)


def test_rates_come_from_the_machine_model_at_the_targets_width():
    m = _machine(2e-9)
    r16, r8 = forms.rates(m), forms.rates(m, lanes=8)
    assert r16.lanes == 16 and r8.lanes == 8 and r16.latency_s == 2e-9
    assert r16.peak_ins == pytest.approx(3.6e9) and r8.l1_loads == pytest.approx(2 * r16.l1_loads)
    s = forms.ConvShape(cin=64, cout=64, oh=8, ow=64, kh=3, kw=3)
    # on 8 lanes a panel is two vectors: more loads a panel instruction, and no wide tiles
    assert forms.predict_seconds(s, "packed", r8) > forms.predict_seconds(s, "packed", r16)
    assert dataclasses.replace(r16, cores=1).cores == 1
