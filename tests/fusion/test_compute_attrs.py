"""ComputeAttrs, the typed attributes of a compute region (fusion/params.py): the op types of the regions every rule
makes are the ones the attribute dict gave before it (a kernel library built before keeps its op types), and an
unknown attribute is an error."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxopt.codegen.microkernel.register_tile import RegisterTile
from onnxopt.fusion.afusion.chain import fuse_chain
from onnxopt.fusion.afusion.conv_pool import fuse_conv_pool
from onnxopt.fusion.afusion.miso import fuse_miso
from onnxopt.fusion.afusion.siso import fuse_siso
from onnxopt.fusion.compute import ComputeRule, apply_tile
from onnxopt.fusion.layout import assign_blocked_layouts
from onnxopt.fusion.params import ComputeAttrs, ComputeParams, RelayoutParams
from onnxopt.fusion.region import Region
from onnxopt.fusion.siblings import fuse_siblings
from onnxopt.fusion.winograd import sizes, to_winograd
from onnxopt.tune.band_search import with_band_rows

from onnx_builders import make_model  # noqa: E402

F32 = TensorProto.FLOAT
vi = helper.make_tensor_value_info
n = helper.make_node
KEY = "attrs-test-target"  # the target text of the op types: any fixed one
MI, LANES, NI, PANEL = 6, 8, 3, 16  # fixed, so that the op types do not depend on the machine


def _w(name, shape, seed):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _rule(nodes, inputs, inits, **kw) -> ComputeRule:
    m = make_model(nodes, inputs, [vi(nodes[-1].output[0], F32, None)], inits)
    return ComputeRule(onnx.shape_inference.infer_shapes(m), MI, **kw)


def _regions(nodes, inputs, inits, **kw):
    rule = _rule(nodes, inputs, inits, **kw)
    regions = rule.find_regions(set(), [])
    return rule, {r.nodes[0].name: r for r in regions}


def _conv(x, out, w, b=None, **attrs):
    return n("Conv", [x, w] + ([b] if b else []), [out], name=out, **attrs)


def _blocked_chain():
    """conv a (8 -> 32, 3x3) -> depthwise d -> conv b (1x1, 24) -> conv c (3x3, 16), Relu after each, on blocked
    tensors between them (the layout pass at LANES lanes)."""
    nodes, inits = [], []
    for name, x, oc, ic, k, group in (("a", "x", 32, 8, 3, 1), ("d", "a", 32, 1, 3, 32), ("b", "d", 24, 32, 1, 1),
                                      ("c", "b", 16, 24, 3, 1)):
        inits += [_w(f"{name}_w", [oc, ic, k, k], len(inits)), _w(f"{name}_b", [oc], len(inits) + 1)]
        nodes += [_conv(x, f"{name}_pre", f"{name}_w", f"{name}_b", pads=[k // 2] * 4, group=group),
                  n("Relu", [f"{name}_pre"], [name], name=f"{name}_act")]
    rule = _rule(nodes, [vi("x", F32, [1, 8, 10, 10])], inits)
    regions = rule.find_regions(set(), [])
    assign_blocked_layouts(regions, rule.index, rule.ew.shape_of, LANES, NI, rule.ew.opset)
    return rule, {r.outputs[0]: r for r in regions}


def _miso():
    """t and c2 convolutions of x; c2's epilogue adds t (a MISO pair)."""
    inits = [_w("w1", [16, 8, 1, 1], 0), _w("w2", [16, 8, 1, 1], 1)]
    nodes = [_conv("x", "c2", "w2", pads=[0] * 4), _conv("x", "t", "w1", pads=[0] * 4),
             n("Add", ["c2", "t"], ["s"], name="add"), n("Relu", ["s"], ["y"], name="relu")]
    rule = _rule(nodes, [vi("x", F32, [1, 8, 6, 6])], inits)
    regions = rule.find_regions(set(), [])
    assign_blocked_layouts(regions, rule.index, rule.ew.shape_of, LANES, NI, rule.ew.opset)
    return rule, {r.nodes[0].name: r for r in regions}


def _siblings():
    """Two convolutions of x (siblings)."""
    inits = [_w("w1", [16, 8, 3, 3], 0), _w("w2", [8, 8, 1, 1], 1)]
    nodes = [_conv("x", "p", "w1", pads=[1] * 4), _conv("x", "q", "w2", pads=[0] * 4),
             n("Concat", ["p", "q"], ["y"], name="join", axis=1)]
    rule = _rule(nodes, [vi("x", F32, [1, 8, 7, 7])], inits)
    return rule, {r.nodes[0].name: r for r in rule.find_regions(set(), [])}


def regions() -> dict:
    """A region per way the rules make or change compute parameters, by name."""
    out = {}
    x = [vi("x", F32, [1, 4, 9, 9])]
    _, rs = _regions([_conv("x", "c", "w", "b", pads=[1] * 4), n("Relu", ["c"], ["y"], name="relu")], x,
                     [_w("w", [8, 4, 3, 3], 0), _w("b", [8], 1)])
    out["conv_relu"] = rs["c"]
    out["conv_tile"] = apply_tile(replace(rs["c"]), RegisterTile(mi=4, ni=2, mii=1, lanes=8))
    _, rs = _regions([_conv("x", "y", "w", group=2, strides=[2, 2], pads=[0, 1, 0, 1])], x, [_w("w", [6, 2, 3, 3], 2)])
    out["grouped_conv"] = rs["y"]
    _, rs = _regions([_conv("x", "y", "w", group=4, dilations=[2, 2], auto_pad="SAME_UPPER")], x,
                     [_w("w", [4, 1, 3, 3], 3)])
    out["depthwise_conv"] = rs["y"]
    a = [vi("a", F32, [2, 16])]
    _, rs = _regions([n("Gemm", ["a", "b", "c"], ["y"], name="y", transB=1, alpha=0.5, beta=2.0)], a,
                     [_w("b", [20, 16], 4), _w("c", [20], 5)])
    out["gemm"] = rs["y"]
    _, rs = _regions([n("Gemm", ["a", "b", "c"], ["y"], name="y", beta=2.0)], a, [_w("b", [16, 20], 4), _w("c", [20], 5)],
                     panel=PANEL)
    out["gemm_packed_b"] = rs["y"]
    _, rs = _regions([n("Gemm", ["a", "b"], ["y"], name="y", transA=1)], [vi("a", F32, [16, 2])], [_w("b", [16, 20], 6)])
    out["gemm_trans_a"] = rs["y"]
    for panel in (0, PANEL):
        _, rs = _regions([n("MatMul", ["a", "b"], ["m"], name="y"), n("Relu", ["m"], ["y"], name="relu")], a,
                         [_w("b", [16, 20], 7)], panel=panel)
        out[f"matmul_panel{panel}"] = rs["y"]
    for oc in (4, 24):  # pixel vectors (oc <= 2 x lanes), channel vectors
        _, rs = _regions([n("ConvTranspose", ["x", "w", "b"], ["y"], name="y", strides=[2, 2], pads=[1, 1, 1, 1],
                            output_padding=[1, 1])], x, [_w("w", [4, oc, 3, 3], 8), _w("b", [oc], 9)],
                         blocked=(LANES, NI))
        out[f"conv_transpose_oc{oc}"] = rs["y"]
    _, rs = _blocked_chain()
    for name in "adbc":
        out[f"blocked_{name}"] = rs[name]
    out["winograd"] = to_winograd(rs["a"], sizes((3, 3))[0], LANES, NI)
    pool = n("MaxPool", ["a"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    out["afusion_conv_pool"] = fuse_conv_pool(rs["a"], Region("relayout", [pool], ["a"], ["p"], None, [1, 32, 5, 5],
                                                              params=RelayoutParams([pool])), LANES, NI, 17, 2)
    out["afusion_siso"] = fuse_siso(rs["b"], rs["c"], LANES, NI, 17, 3)
    out["afusion_siso_band5"] = with_band_rows(out["afusion_siso"], 5)
    out["afusion_chain"] = fuse_chain(rs["d"], rs["b"], rs["c"], LANES, NI, 17, 2)
    _, rs = _miso()
    out["afusion_miso"] = fuse_miso(rs["t"], rs["c2"], LANES, NI, 17, 2)
    _, rs = _siblings()
    out["siblings"] = fuse_siblings([rs["p"], rs["q"]], LANES, NI, 17)
    for r in out.values():
        r.compute_op_type(KEY)
    return out


EXPECTED = {  # what the code gave with the attribute dict (git 8cbb722)
    'conv_relu': 'Conv_a089da169d9b45a7',
    'conv_tile': 'Conv_79cf2f160efc97d2',
    'grouped_conv': 'Conv_2f223af1c7c56dc4',
    'depthwise_conv': 'Conv_fd5965f2bbc127e1',
    'gemm': 'MatMul_c61d9ad85afcc54f',
    'gemm_packed_b': 'MatMul_4353a025d3b25b36',
    'gemm_trans_a': 'MatMul_5bb16e365a684678',
    'matmul_panel0': 'MatMul_7dde349e90f3afdc',
    'matmul_panel16': 'MatMul_e071f0fd53ff53ab',
    'conv_transpose_oc4': 'ConvTranspose_b2d4ec70fcf63895',
    'conv_transpose_oc24': 'ConvTranspose_ab2927352397f77d',  # since 16 channels went to pixel vectors (a8a8a47)
    'blocked_a': 'Conv_3949a51f633e6441',
    'blocked_d': 'Conv_c2beab738710c60d',
    'blocked_b': 'Conv_de61e056f4611c53',
    'blocked_c': 'Conv_755265efced465ce',
    'winograd': 'Conv_165b6ea42b64ec4b',
    'afusion_conv_pool': 'afusion_f0d78b7ef09e7704',
    'afusion_siso': 'afusion_54c5fda448282225',
    'afusion_siso_band5': 'afusion_78d11810faa6ef27',
    'afusion_chain': 'afusion_48198ca7aaa5fb59',
    'afusion_miso': 'afusion_94bbb1ebc9d0b162',
    'siblings': 'siblings_0754f57d11f7b42d',
}


def test_op_types_are_the_ones_the_attribute_dict_gave():
    assert {name: r.op_type for name, r in regions().items()} == EXPECTED


def test_an_unknown_attribute_is_an_error():
    with pytest.raises(TypeError):
        ComputeAttrs(kernal=(3, 3))
    with pytest.raises(TypeError):
        ComputeParams("conv", attrs=ComputeAttrs(oc=8, band_row=2))
    with pytest.raises(AttributeError):  # slots: no attribute is made by assigning it
        ComputeAttrs().kernal = (3, 3)


def test_a_field_set_to_its_default_is_set():
    """What the dict's keys were: a rule that sets in_blocked = 0 gives another op type than one that leaves it out
    (ConvTranspose's and the layout pass's regions set it; a plain convolution's do not)."""
    absent = ComputeAttrs(oc=8)
    assert absent.in_blocked == 0 and absent.miso_extra == -1 and absent.kernel is None
    assert list(absent.items()) == [("oc", 8)]
    zero = ComputeAttrs(oc=8, in_blocked=0)
    assert list(zero.items()) == [("oc", 8), ("in_blocked", 0)]
    assert list(replace(absent, band_rows=3).items()) == [("oc", 8), ("band_rows", 3)]  # a copy keeps what is absent
    absent.out_blocked = 0
    assert list(absent.items()) == [("oc", 8), ("out_blocked", 0)]
    text = ComputeParams("conv", attrs=zero).op_type_text("t")
    assert text == '|["conv", [], [], {"in_blocked": "0", "oc": "8"}]'
