"""Tile sets (codegen/compute/tile_sets.py): compute kernels whose tile functions would be the same share one
compiled set. The key must tell apart everything the code depends on (the epilogue and its constants, the register
tile, a depthwise kernel's width and stride) and nothing else (tensor names, shapes, channel counts), and a library
whose kernels share sets must link each set once and compute the right answers."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxopt
from onnx import helper, numpy_helper

from onnxopt.codegen.compute.build import build_compute, compute_tile_sets
from onnxopt.codegen.compute.tile_sets import TileSetRequest, compile_tile_set, tile_set_object
from onnxopt.fusion.compute import ComputeRule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fusion"))
from test_layout import MK, TARGET, Chain, check_answers, fused_nodes, needs_vectors, reference  # noqa: E402


def _regions(model):
    model = onnx.shape_inference.infer_shapes(model)
    regions = ComputeRule(model, MK.tile.mi).find_regions(set(), [])
    for r in regions:
        r.compute_op_type("test")
    return {r.outputs[0]: r for r in regions}


def _key(region) -> str:
    (req,) = compute_tile_sets(region, TARGET)
    return req.key


def test_same_epilogue_different_shapes_share_a_set():
    ch = Chain(8, 12, 12)
    a = ch.conv("x", "a", 32)             # 3x3, 8 -> 32 at 12x12
    b = ch.conv(a, "b", 16, k=1, p=0)     # 1x1, 32 -> 16
    c = ch.conv(b, "c", 24, k=3, s=2)     # 3x3 /2, 16 -> 24 at 6x6
    regions = _regions(ch.model([c]))
    assert _key(regions["a"]) == _key(regions["b"]) == _key(regions["c"])
    # The kernels' tables name the same symbols, and their objects are the same bytes.
    objs = [build_compute(regions[n], TARGET)[0] for n in ("a", "b", "c")]
    assert objs[0] == objs[1] == objs[2] and len(objs[0]) == 1


def test_the_key_tells_apart_what_the_code_depends_on():
    ch = Chain(8, 12, 12)
    a = ch.conv("x", "a", 16)                       # bias + Relu
    b = ch.conv(a, "b", 16, act=None)               # bias only
    c = ch.conv(b, "c", 16, act="Sigmoid")          # bias + Sigmoid
    regions = _regions(ch.model([c]))
    keys = {_key(regions[n]) for n in ("a", "b", "c")}
    assert len(keys) == 3
    # Constants are part of the code: LeakyRelu with another alpha is another set.
    (req,) = compute_tile_sets(regions["a"], TARGET)
    prog = req.spec.epilogue
    leaky = [replace(op, op="LeakyRelu", attrs=(("alpha", 0.1),)) if op.op == "Relu" else op for op in prog.ops]
    leakier = [replace(op, attrs=(("alpha", 0.2),)) if op.op == "LeakyRelu" else op for op in leaky]
    k1 = TileSetRequest(req.kind, replace(req.spec, epilogue=replace(prog, ops=leaky))).key
    k2 = TileSetRequest(req.kind, replace(req.spec, epilogue=replace(prog, ops=leakier))).key
    assert k1 != k2 and req.key not in (k1, k2)
    # The register tile, the layout kind and a depthwise kernel's geometry too.
    tile = req.spec.tile
    other_tile = replace(req.spec, tile=replace(tile, mi=tile.mi - 1))
    assert TileSetRequest(req.kind, other_tile).key != req.key
    assert TileSetRequest("blocked", req.spec).key != TileSetRequest("nchw", req.spec).key
    dw3 = TileSetRequest("depthwise", req.spec, (4, 3, 1, 1)).key
    assert dw3 != TileSetRequest("depthwise", req.spec, (4, 5, 1, 1)).key
    assert dw3 != TileSetRequest("depthwise", req.spec, (4, 3, 2, 1)).key


def test_tensor_names_do_not_change_the_key():
    ch = Chain(8, 12, 12)
    ch.conv("x", "first_name", 16)
    other = Chain(8, 12, 12)
    other.conv("x", "another_name_entirely", 16)
    r1 = _regions(ch.model(["first_name"]))["first_name"]
    r2 = _regions(other.model(["another_name_entirely"]))["another_name_entirely"]
    assert _key(r1) == _key(r2)


def test_names_match_the_defined_functions():
    ch = Chain(8, 12, 12)
    ch.conv("x", "a", 16)
    (req,) = compute_tile_sets(_regions(ch.model(["a"]))["a"], TARGET)
    for kind, extra in (("nchw", ()), ("blocked", ()), ("depthwise", (3, 3, 1, 1))):
        r = TileSetRequest(kind, req.spec, extra)
        _, ir_text = compile_tile_set(r, TARGET)
        for row in r.names():
            for name in row:
                assert f'@"{name}"(' in ir_text or f"@{name}(" in ir_text
    assert tile_set_object(req, TARGET) is tile_set_object(req, TARGET)  # compiled once in this process


@needs_vectors
def test_a_network_whose_kernels_share_sets_links_and_is_right(tmp_path):
    """Six convolutions of four shapes with one epilogue, in NCHW kernels and in the blocked chain: every kernel of
    a plan uses one set, linked once, and the answers match onnxruntime (and the function fallback)."""
    ch = Chain(8, 16, 16, batch=2)
    a = ch.conv("x", "a", 32)
    b = ch.conv(a, "b", 16, k=1, p=0)
    c = ch.conv(b, "c", 32, k=3, s=2)
    d = ch.conv(c, "d", 24, k=1, p=0)
    e = ch.conv(d, "e", 24, k=5, p=2)
    f = ch.conv(e, "f", 8, k=1, p=0)
    model = ch.model([f])
    for plan in ("compute", "compute-blocked"):
        result = onnxopt.optimize(model, str(tmp_path / f"{plan}.onnx"), plan=plan, measure=False)
        assert len(fused_nodes(result.model)) == 6
        check_answers(result, model, ch.feeds)


def test_a_library_links_a_shared_set_once(tmp_path):
    """Two kernels of one set in a library built by hand: the set's object is passed twice and linked once (twice
    would be a duplicate symbol, and the link would fail)."""
    from onnxopt.codegen.glue.library import link_library

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 10, 10])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((12, 16, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Conv", ["hr", "w2"], ["g"]), helper.make_node("Relu", ["g"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w1, w2]),
                              opset_imports=[helper.make_opsetid("", 17)])
    regions = list(_regions(model).values())
    built = [build_compute(r, TARGET) for r in regions]
    assert built[0][0] == built[1][0]
    lib = str(tmp_path / "shared.so")
    link_library([b[1] for b in built], [b[0] for b in built], TARGET, lib)  # would fail on a duplicate symbol


def test_tile_sets_compile_to_the_same_code_without_llvms_vectorizers():
    """Tile sets are compiled with LLVM's loop and SLP vectorizers off (their IR is vectors already, and the
    vectorizers cost a third of a depthwise set's compile time): the assembly must be what the full O3 pipeline
    gives, for a blocked set with a vector-math epilogue and a depthwise set."""
    from onnxopt.codegen.compile import new_module, optimize, target_machine
    from onnxopt.codegen.compute.blocked_tile import (
        define_blocked_tile_functions,
        define_depthwise_tile_functions,
    )
    from onnxopt.codegen.compute.tile import TileSpec

    from onnxopt.fusion.compute import ACC
    from onnxopt.fusion.region import EwOp, EwProgram, Value

    prog = EwProgram(inputs=[Value(ACC, "float32")], consts={}, ops=[EwOp("Sigmoid", (ACC,), "y", "float32")],
                     outputs=[Value("y", "float32")])
    spec = TileSpec(MK.tile, prog, (), packed_a=True)
    for define in (lambda m: define_blocked_tile_functions(m, "b", spec, TARGET.features),
                   lambda m: define_depthwise_tile_functions(m, "d", spec, TARGET.features, 14, 3, 2, 1)):
        module = new_module(TARGET, "same")
        define(module)
        ir_text = str(module)
        full, lean = (target_machine(TARGET).emit_assembly(optimize(ir_text, TARGET, v)) for v in (True, False))
        assert lean == full


def _affine_chain(scales, shifts):
    """Convolutions 8 -> 16 -> 16 ..., each followed by PP-LCNet's learned scale and shift (one-element initializers
    of learned values), then Clip(0, 6) with its bounds as initializers written by hand."""
    ch = Chain(8, 12, 12)
    x = "x"
    for i, (scale, shift) in enumerate(zip(scales, shifts)):
        c = ch.conv(x, f"c{i}", 16, act=None)
        ch.inits += [numpy_helper.from_array(np.array([scale], np.float32), f"scale{i}"),
                     numpy_helper.from_array(np.array(shift, np.float32), f"shift{i}"),
                     numpy_helper.from_array(np.array(0.0, np.float32), f"lo{i}"),
                     numpy_helper.from_array(np.array(6.0, np.float32), f"hi{i}")]
        ch.nodes += [helper.make_node("Mul", [c, f"scale{i}"], [f"m{i}"]),
                     helper.make_node("Add", [f"m{i}", f"shift{i}"], [f"a{i}"]),
                     helper.make_node("Clip", [f"a{i}", f"lo{i}", f"hi{i}"], [f"y{i}"])]
        ch.c[f"y{i}"] = 16
        x = f"y{i}"
    return ch, x


def test_layers_that_differ_only_in_learned_scalars_share_a_set():
    """The learned scale and shift are SCALAR inputs read at run time, so the layers share their code; the Clip
    bounds (written by hand) stay constants in it, and another bound is another set."""
    from onnxopt.fusion.compute import SCALAR

    ch, last = _affine_chain([1.2167922, -0.6180339, 0.3183099], [-0.0052005, 0.5116695, 2.7182817])
    regions = _regions(ch.model([last]))
    firsts = [regions[f"y{i}"] for i in range(3)]
    for i, r in enumerate(firsts):
        assert f"scale{i}" in r.inputs and f"shift{i}" in r.inputs
        assert r.compute.extra_kinds[-2:] == [SCALAR, SCALAR]
        assert set(r.program.consts) == {f"lo{i}", f"hi{i}"}
    assert len({_key(r) for r in firsts}) == 1
    other, last2 = _affine_chain([1.2167922], [-0.0052005])
    other.inits = [numpy_helper.from_array(np.array(4.0, np.float32), "hi0") if t.name == "hi0" else t
                   for t in other.inits]
    assert _key(_regions(other.model([last2]))["y0"]) != _key(firsts[0])


@needs_vectors
def test_the_shared_set_reads_each_layers_scalars_in_a_fresh_process(tmp_path):
    """Written and loaded as a user does: one compiled set serves the three layers, each with its own scale and shift,
    and the answers match onnxruntime's on the original model."""
    from fresh_process import kernel_ran, run_written

    ch, last = _affine_chain([1.2167922, -0.6180339, 0.3183099], [-0.0052005, 0.5116695, 2.7182817])
    model = ch.model([last])
    out = tmp_path / "affine.onnx"
    result = onnxopt.optimize(model, str(out), plan="compute-blocked", measure=False)
    written = onnx.load(str(out))
    fused = fused_nodes(written)
    assert len(fused) == 3
    got, loader = run_written(out, ch.feeds["x"], tmp_path)
    want = reference(model, ch.feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    assert all(kernel_ran(written, nd.op_type, loader["calls"]) >= 1 for nd in fused), loader
    check_answers(result, model, ch.feeds)  # with the library and with the function bodies alone
    assert len({r["op_type"] for r in result.report["regions"]}) == 3
    # one set's tile functions in the library (their symbols are named by the set's digest)
    sets = set(re.findall(rb"oxt_[a-z]+_([0-9a-f]{24})_", (tmp_path / "affine.onnx.so").read_bytes()))
    assert len(sets) == 1, sets
