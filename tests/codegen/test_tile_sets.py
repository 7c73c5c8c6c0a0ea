"""Tile sets (codegen/compute/tile_sets.py): compute kernels whose tile functions would be the same share one
compiled set. The key must tell apart everything the code depends on (the epilogue and its constants, the register
tile, a depthwise kernel's width and stride) and nothing else (tensor names, shapes, channel counts), and a library
whose kernels share sets must link each set once and compute the right answers."""

from __future__ import annotations

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
from test_layout import MK, TARGET, Chain, check_answers, fused_nodes, needs_vectors  # noqa: E402


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
