"""Pool kernels (codegen/pool, glue/pool_exec.c) against onnxruntime: MaxPool exactly, averages within rounding.

Each test fuses several models with PoolRule and links their kernels into one library (linking dominates the cost),
then runs every model with the library next to onnxruntime running the original nodes. Models with symbolic batch
and spatial dims run at several sizes through one fused node: the kernels take every size at run time.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnxopt.codegen.compile import compile_assembly, new_module
from onnxopt.codegen.pool.build import pool_spec
from onnxopt.codegen.pool.kernels import define_pool_functions
from onnxopt.codegen.target import parse_target
from pool_harness import (
    assert_pool_close,
    fuse_models,
    pool_model,
    reference,
    run_fused,
)

from onnxopt.fusion.pool import PoolRule


def _feeds(rng, shape, **others):
    f = {"x": (rng.standard_normal(shape) * 2).astype(np.float32)}
    f.update({k: (rng.standard_normal(s) * 2).astype(np.float32) for k, s in others.items()})
    return f


# ---- the shapes of typical networks ----
TYPICAL = [
    ("MaxPool", (1, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet stem
    ("AveragePool", (1, 64, 56, 56), dict(kernel_shape=[2, 2], strides=[2, 2])),  # DenseNet transition
    ("GlobalAveragePool", (1, 2048, 7, 7), {}),  # ResNet-50 head
    ("GlobalAveragePool", (1, 960, 7, 7), {}),  # MobileNetV3 head
    ("MaxPool", (1, 256, 20, 20), dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])),  # YOLO SPPF
    ("MaxPool", (1, 3, 150, 150), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # few planes: bands
    ("AveragePool", (2, 3, 99, 77), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                                         count_include_pad=0)),  # Inception branch pool
]


def test_typical_shapes(tmp_path):
    models = [pool_model(op, shape, **attrs) for op, shape, attrs in TYPICAL]
    fused, lib = fuse_models(models, tmp_path)
    rng = np.random.default_rng(0)
    for (op, shape, _), m, (f, regions) in zip(TYPICAL, models, fused):
        feeds = _feeds(rng, shape)
        for threads in (1, 2):
            got = run_fused(f, lib, feeds, threads, [regions[0].op_type] if threads == 2 else (), tmp_path)
            assert_pool_close(reference(m, feeds), got, exact=op == "MaxPool", msg=f"{op} {shape} {threads}t")


# ---- windows drawn by hypothesis, at batch 1 and 3, spatial sizes drawn too ----
def _out(n, k, s, d, pb, pe, ceil, auto):
    """onnxruntime's output size (see pool_exec.c); None where it rejects the shape."""
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        need = (-(-n // s) - 1) * s + k - n
        pb = int(need / 2) if auto == "SAME_UPPER" else int((need + 1) / 2)
        pe = need - pb
    elif auto == "VALID":
        pb = pe = 0
    num = n + pb + pe - d * (k - 1) - 1
    if ceil:
        o = -(-num // s) + 1 if num >= 0 else int(num / s) + 1
        if (o - 1) * s >= n + pb:
            o -= 1
    else:
        o = int(num / s) + 1
    return o


@st.composite
def window(draw):
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    attrs = dict(kernel_shape=[kh, kw], strides=[draw(st.integers(1, 3)), draw(st.integers(1, 3))])
    dil = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    if dil != [1, 1]:
        attrs["dilations"] = dil
    auto = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]  # onnxruntime wants pads below the kernel
    if auto == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto
    attrs["ceil_mode"] = draw(st.integers(0, 1))
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    sizes = []
    for _ in range(2):  # (H, W) at batch 1, then at batch 3
        h, w = draw(st.integers(1, 41)), draw(st.integers(1, 41))
        oh = _out(h, kh, attrs["strides"][0], dil[0], pads[0], pads[2], attrs["ceil_mode"], auto)
        ow = _out(w, kw, attrs["strides"][1], dil[1], pads[1], pads[3], attrs["ceil_mode"], auto)
        assume(oh >= 1 and ow >= 1)
        sizes.append((h, w))
    return op, attrs, sizes


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(window(), min_size=6, max_size=6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_random_windows(tmp_path_factory, windows, channels, seed):
    tmp = tmp_path_factory.mktemp("pool")
    models = [pool_model(op, ["N", channels, "H", "W"], **attrs) for op, attrs, _ in windows]
    fused, lib = fuse_models(models, tmp)
    rng = np.random.default_rng(seed)
    for (op, attrs, sizes), m, (f, _) in zip(windows, models, fused):
        for n, (h, w) in zip((1, 3), sizes):
            feeds = _feeds(rng, (n, channels, h, w))
            try:
                want = reference(m, feeds)
            except Exception as e:  # noqa: BLE001 - SAME pads that come out negative: onnxruntime refuses them
                assert "non-negative" in str(e), e
                continue
            assert_pool_close(want, run_fused(f, lib, feeds), exact=op == "MaxPool",
                              msg=f"{op} {attrs} {(n, channels, h, w)}")


def test_global_pools_any_rank(tmp_path):
    cases = [("GlobalAveragePool", ["N", 37, "H", "W"], [(1, 37, 7, 7), (3, 37, 5, 9)]),
             ("GlobalMaxPool", ["N", 20, "H", "W"], [(1, 20, 1, 1), (3, 20, 17, 3)]),
             ("GlobalAveragePool", ["N", 16, "L"], [(3, 16, 100), (1, 16, 3)]),
             ("GlobalMaxPool", ["N", 5, 2, "H", "W"], [(3, 5, 2, 6, 7)])]
    models = [pool_model(op, shape) for op, shape, _ in cases]
    fused, lib = fuse_models(models, tmp_path)
    rng = np.random.default_rng(1)
    for (op, _, shapes), m, (f, _) in zip(cases, models, fused):
        for shape in shapes:
            feeds = _feeds(rng, shape)
            assert_pool_close(reference(m, feeds), run_fused(f, lib, feeds), exact=op == "GlobalMaxPool",
                              msg=f"{op} {shape}")


# ---- MaxPool on int8 and uint8 tensors (a quantized model's: graph/quantized_pools.py) ----
def _ints(rng, shape, elem):
    lo, hi, t = (0, 256, np.uint8) if elem == onnx.TensorProto.UINT8 else (-128, 128, np.int8)
    return {"x": rng.integers(lo, hi, shape).astype(t)}


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(window(), min_size=6, max_size=6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_int8_max_pools_random_windows(tmp_path_factory, windows, channels, seed):
    """The integer maximum over any window, pads and ceil mode, uint8 and int8: equal to onnxruntime's own integer
    MaxPool, and the padding is the type's least value (all-negative int8 windows at the edges)."""
    tmp = tmp_path_factory.mktemp("qpool")
    windows = [(op, {k: v for k, v in attrs.items() if k != "count_include_pad"}, sizes)
               for op, attrs, sizes in windows]
    elems = [onnx.TensorProto.UINT8 if i % 2 else onnx.TensorProto.INT8 for i in range(len(windows))]
    models = [pool_model("MaxPool", ["N", channels, "H", "W"], elem=e, **attrs)
              for (_, attrs, _), e in zip(windows, elems)]
    fused, lib = fuse_models(models, tmp)
    rng = np.random.default_rng(seed)
    for (_, attrs, sizes), m, e, (f, regions) in zip(windows, models, elems, fused):
        assert regions[0].params.dtype == ("uint8" if e == onnx.TensorProto.UINT8 else "int8")
        for n, (h, w) in zip((1, 3), sizes):
            feeds = _ints(rng, (n, channels, h, w), e)
            try:
                want = reference(m, feeds)
            except Exception as ex:  # noqa: BLE001 - SAME pads that come out negative: onnxruntime refuses them
                assert "non-negative" in str(ex), ex
                continue
            got = run_fused(f, lib, feeds)
            assert got[0].dtype == want[0].dtype
            assert_pool_close(want, got, exact=True, msg=f"MaxPool {e} {attrs} {(n, channels, h, w)}")


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3", "x86-64"])
def test_int8_max_pools_typical(tmp_path, target):
    """The shapes of the quantized corpus (SqueezeNet's 3x3 / 2 with ceil mode, YOLOv8n's SPPF 5x5, PP-OCR cls's
    2x2 / 2), on each target's vector width, one and two threads, the kernel seen in onnxruntime's profile."""
    t = parse_target(target)
    cases = [(onnx.TensorProto.UINT8, (1, 64, 111, 111), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
             (onnx.TensorProto.UINT8, (1, 64, 10, 10), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
             (onnx.TensorProto.INT8, (2, 200, 3, 12), dict(kernel_shape=[2, 2], strides=[2, 2])),
             (onnx.TensorProto.INT8, (1, 3, 150, 150), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]))]
    models = [pool_model("MaxPool", shape, elem=e, **attrs) for e, shape, attrs in cases]
    fused, lib = fuse_models(models, tmp_path, t if target != "x86-64-v4" else None)
    rng = np.random.default_rng(4)
    for (e, shape, _), m, (f, regions) in zip(cases, models, fused):
        feeds = _ints(rng, shape, e)
        for threads in (1, 2):
            got = run_fused(f, lib, feeds, threads, [regions[0].op_type] if threads == 2 else (), tmp_path)
            assert_pool_close(reference(m, feeds), got, exact=True, msg=f"{shape} {target} {threads}t")
        # without the library: the function body, onnxruntime's integer MaxPool
        fallback = ort.InferenceSession(f.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert_pool_close(reference(m, feeds), fallback, exact=True, msg=f"{shape} (function body)")


def test_int8_pools_other_than_max_are_refused():
    rejected: list = []
    m = onnx.shape_inference.infer_shapes(pool_model("MaxPool", (1, 4, 8, 8), elem=onnx.TensorProto.UINT8,
                                                     kernel_shape=[2, 2]))
    assert len(PoolRule(m).find_regions(set(), rejected)) == 1
    g = pool_model("GlobalMaxPool", (1, 4, 8, 8), elem=onnx.TensorProto.UINT8)
    assert PoolRule(onnx.shape_inference.infer_shapes(g)).find_regions(set(), rejected) == []
    assert "only MaxPool runs on int8" in rejected[-1]["reason"]


# ---- fused epilogues ----
def test_epilogues(tmp_path):
    rng = np.random.default_rng(2)
    mp = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cases = [
        # (model, feeds shapes, exact, ops)
        (pool_model("MaxPool", (3, 8, 33, 35), [("Relu", [], {})], **mp), {}, True, "MaxPool -> Relu"),
        (pool_model("AveragePool", (3, 8, 20, 20), [("Clip", ["lo", "hi"], {})], inits=[("lo", 0.0), ("hi", 0.5)],
                    kernel_shape=[2, 2], strides=[2, 2]), {}, False, "AveragePool -> Clip"),
        # a residual of the pooled shape (per batch item), then Relu
        (pool_model("MaxPool", (3, 8, 33, 35), [("Add", ["res"], {}), ("Relu", [], {})], inputs=[("res", (3, 8, 17, 18))],
                    **mp), {"res": (3, 8, 17, 18)}, True, "MaxPool -> Add -> Relu"),
        # shared by the batch ([1, C, OH, OW]), per channel ([C, 1, 1]) and scalar
        (pool_model("AveragePool", (3, 4, 16, 16), [("Add", ["pos"], {}), ("Mul", ["ch"], {}), ("Add", ["s"], {})],
                    inits=[("pos", rng.standard_normal((1, 4, 8, 8))), ("ch", rng.standard_normal((4, 1, 1))),
                           ("s", [0.5])], kernel_shape=[2, 2], strides=[2, 2]), {}, False,
         "AveragePool -> Add -> Mul -> Add"),
        # the pool's own input as the residual: the fused node reads x twice
        (pool_model("MaxPool", (2, 6, 13, 12), [("Add", ["x"], {})], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), {},
         True, "MaxPool -> Add"),
        (pool_model("GlobalAveragePool", (3, 40, 7, 7), [("Mul", ["ch"], {}), ("HardSwish", [], {})],
                    inits=[("ch", rng.standard_normal((1, 40, 1, 1)))]), {}, False,
         "GlobalAveragePool -> Mul -> HardSwish"),
        (pool_model("GlobalMaxPool", (2, 24, 5, 5), [("Add", ["res"], {}), ("Sigmoid", [], {})],
                    inputs=[("res", (2, 24, 1, 1))]), {"res": (2, 24, 1, 1)}, False, "GlobalMaxPool -> Add -> Sigmoid"),
    ]
    fused, lib = fuse_models([c[0] for c in cases], tmp_path)
    for (m, others, exact, ops), (f, regions) in zip(cases, fused):
        assert [r.describe() for r in regions] == [ops]
        assert sum(n.domain == "onnxopt" for n in f.graph.node) == 1 and len(f.graph.node) == 1
        shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
        feeds = _feeds(rng, shape, **others)
        got = run_fused(f, lib, feeds, 2, [regions[0].op_type], tmp_path)
        assert_pool_close(reference(m, feeds), got, exact=exact, msg=ops)
        # Without the library, onnxruntime runs the function body: the original nodes. Exact only for maxima: how
        # onnxruntime rounds an average inlined from a function depends on its version and the host's ISA.
        fallback = ort.InferenceSession(f.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert_pool_close(reference(m, feeds), fallback, exact=exact, msg=ops + " (function body)")


# ---- narrower targets: AVX2 (8 lanes) and baseline x86-64 (4 lanes) ----
@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64"])
def test_other_targets(tmp_path, target):
    t = parse_target(target)
    cases = [("MaxPool", (3, 5, 23, 19), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
             ("AveragePool", (2, 3, 17, 21), dict(kernel_shape=[3, 2], strides=[3, 1], dilations=[1, 2],
                                                  pads=[2, 1, 0, 1], count_include_pad=1)),
             ("MaxPool", (1, 4, 20, 20), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
             ("GlobalAveragePool", (3, 21, 7, 7), {})]
    models = [pool_model(op, shape, [("Relu", [], {})], **attrs) for op, shape, attrs in cases]
    fused, lib = fuse_models(models, tmp_path, t)
    rng = np.random.default_rng(3)
    for (op, shape, _), m, (f, _) in zip(cases, models, fused):
        feeds = _feeds(rng, shape)
        assert_pool_close(reference(m, feeds), run_fused(f, lib, feeds), exact=op == "MaxPool", msg=f"{op} {target}")


# ---- the vectors are the target's full width ----
@pytest.mark.parametrize("target,lanes,reg", [("x86-64-v4", 16, "zmm"), ("x86-64-v3", 8, "ymm")])
def test_inner_loop_full_vector_width(target, lanes, reg):
    t = parse_target(target)
    cases = [(pool_model("MaxPool", (1, 8, 30, 30), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
              "rows", "vmaxps"),
             (pool_model("AveragePool", (1, 8, 30, 30), kernel_shape=[3, 3], strides=[1, 1]), "rows", "vaddps"),
             (pool_model("GlobalAveragePool", (1, 40, 7, 7)), "global", "vaddps")]
    for m, fn, op in cases:
        (r,) = PoolRule(onnx.shape_inference.infer_shapes(m)).find_regions(set())
        r.compute_op_type(target)
        module = new_module(t, r.op_type)
        syms = define_pool_functions(module, r.op_type, pool_spec(r, t), t.features)
        ir_text = str(module)
        # Every load of the input is a whole vector of the target's width; a window pool's last columns may use a
        # strip of half the width (when they fit in one), which is one strip of the three the function holds.
        sites = re.findall(r"call <(\d+) x float> @\"?llvm\.masked\.load", ir_text) + \
            re.findall(r"load <(\d+) x float>", ir_text)
        full = sum(w == str(lanes) for w in sites)
        assert full and full + sum(w == str(lanes // 2) for w in sites) == len(sites), sites
        assert full >= (2 if fn == "rows" else 1) * (len(sites) - full), sites
        asm = compile_assembly(ir_text, t)
        body = asm[asm.index(f"{syms[fn]}:"):]
        body = body[:body.index(".Lfunc_end")]
        # The maxima or sums of the taps of full strips are on whole registers (narrower ones are the half-width
        # strip's, or where LLVM proves that only a few lanes of a window's last vector matter).
        taps = re.findall(rf"\b{op}\b[^\n]*", body)
        assert sum(f"%{reg}" in x for x in taps) >= 4, taps
        assert reg == "zmm" or "zmm" not in body
