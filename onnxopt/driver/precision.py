"""`--precision fp32|bf16|fp16|auto`: which fused GEMMs and convolutions keep their constant weights in a 16-bit type,
how they are checked against the float32 original, and what the precision cost (issue 46, items 5 and 8).

What is lowered:
- the compute kind's MatMul and Gemm regions whose B is a constant matrix packed for the kernel (fusion/compute.py
  `lower_packed_b`). Their weights are converted offline (bfloat16: round to nearest even; float16: only when every
  weight is within 65504) and the sums stay float32, as do the epilogues (bias, activations, residual adds).
  float16 on a target without AMX-FP16 is storage only (fusion/compute.py `store_weights_f16`: the float32 kernel
  on weights rounded to float16, written once as float16 with a Cast outside the op that onnxruntime folds into
  float32 at session load): widening them inside the kernel's loop cost FMA throughput, and MiniLM's GEMMs so
  widened ran 0.87-0.99x of onnxruntime's.
  bfloat16 runs on AMX tiles (tdpbf16ps, codegen/compute/amx_tile.py) where the target has AMX-BF16 and the CPU and
  the OS allow them at run time (K then stored padded to whole tile steps of 32: bf16_k_step), and on vdpbf16ps
  where the target has avx512_bf16 (the rows AMX does not take, and targets without it), with A rounded to bfloat16
  in the kernel; elsewhere
  the bfloat16 weights are widened in registers and multiplied with float32 FMAs (half the weight bytes, the float32
  FMA rate). float16 runs on AMX tiles (tdpfp16ps) where the target has AMX-FP16 (Granite Rapids: weights in pairs,
  K padded to 32, A rounded to float16 as bfloat16's is), and on that widening (vcvtph2ps) for the rows the tiles
  do not take.
- convolutions. fp16: on AMX tiles (tdpfp16ps) where the target has AMX-FP16, as bf16's below (float16 pairs,
  the input copied as float16); every other convolution (any kernel, depthwise and grouped ones too) keeps its
  float32 kernel and stores its weights as float16 (fusion/compute.py `store_weights_f16`: rounded at build
  time, written once as float16 with a Cast outside the op that onnxruntime folds into float32 at session load),
  so the file's weights halve at the float32 speed (widening float16 inside the kernels' loops cost FMA
  throughput: YOLOv8n 0.78x of float32 on a Sapphire Rapids). bf16: one-group convolutions on the blocked kernel
  (fusion/layout.py `lower_blocked_conv`): weights in
  pairs of adjacent input channels, the input read from a bfloat16 copy the glue makes per call (zero-padded; an
  NCHW input of 16 channels or more is gathered by that copy). On AMX tiles where the target has AMX-BF16
  (codegen/compute/amx_conv_tile.py: the copy in blocks of 32 channels, the weights' channels padded to 32), else on
  vdpbf16ps (blocked by 16). A target without avx512_bf16 keeps them float32: widening would save no time in a
  compute-bound convolution. On an AMX target (whose cores run vdpbf16ps at half the FMA rate), an NCHW kernel's
  convolution is given the blocked kernel (NCHW in and out) to reach the tiles, and the convolutions the tiles do not
  speed up keep float32 (`amx_conv_refusal`).
- recurrent cells (LSTM, GRU) under bf16, on every target: their packed W and R stored as bfloat16 and widened
  exactly in the kernel (kinds/recurrent/precision.py): a batch-1 step streams R once a step, so half the bytes is
  what speeds it up; h, c, the gates and the sums stay float32. fp16 keeps them float32.
- attention chains, on an AMX-BF16 target only (fp16: AMX-FP16; onnxopt/kinds/attention/amx.py): Q, K^T, V and the
  softmax's weights rounded to bfloat16 (float16) for the two products on AMX tiles, the softmax and the sums
  float32; the float32 kernel runs where the tiles cannot (vdpbf16ps at half the FMA rate would gain nothing there).
Before opset 13 (Cast has no bfloat16) the weights are stored as their bits in UINT16 and the function bodies decode
them exactly (fusion/compute.py `bfloat16_weights`). Everything else stays float32: under bf16 depthwise, grouped
and Winograd convolutions and the NCHW kernel's (without AMX-BF16); AFUSION and sibling groups, elementwise,
softmax and LayerNorm regions, and any region the lowering refuses (the report says which and why).
onnxopt lowers nothing unless asked: fp32 is the default and builds exactly what it built before the option.

The check: a lowered kernel, and the whole model with one, is compared with the float32 original at the bfloat16
tolerance (LOW_PRECISION_TOLERANCE: 2% of the value plus 1% of the output's largest magnitude) instead of float32's,
and the report says what the precision cost per output (`precision_cost`). Under bf16 the whole model is held to
1.25x OpenVINO's own bf16 error on the same inputs instead, where OpenVINO reads the model
(driver/openvino_reference.py).

`auto` takes bf16 per GEMM or convolution region only while the whole model stays within `--accuracy-budget`. The
budget's metric is the precision cost's `max_rel_error`: over every float output, the largest |lowered - float32|
divided by the output's largest |float32| (a scaled error: an element-wise relative error is unbounded where an
output crosses zero). Before building, the regions' bfloat16 arithmetic is simulated in onnxruntime on the check
inputs (B rounded to bfloat16, and A too where the kernel runs vdpbf16ps or AMX, as a convolution always does: a
Cast to bfloat16 and back, or before opset 13, which has no bfloat16, Veltkamp's split; _round_to): all of them
at once first; past the budget, regions are taken from the least to the most costly (each GEMM's or convolution's
own bf16 error on its real operands), as many as keep the
simulated model within the budget; the others stay float32 and the report says why. The written model's own cost
is then measured and reported as bf16's is, and must be within the budget, or nothing is written; its whole-model
check accepts each output within the budget's fraction of its largest magnitude (low_precision_tolerance), since a
model that amplifies bf16's rounding (PP-OCRv4 rec's softmax: 8% at a budget of 0.1) may be past the fixed bf16
tolerance and still within what the user allowed.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxopt.errors import UsageError
from onnxopt.fusion.compute import FLOAT16_MAX, bfloat16_values, lower_packed_b, store_weights_f16
from onnxopt.fusion.layout import (blocked_conv_refusal, channel_vectors_apply, lower_blocked_conv,
                                   with_channel_vectors)
from onnxopt.kinds.attention import amx as attention_amx
from onnxopt.kinds.recurrent import precision as recurrent_precision
from onnxopt.verify import LOW_PRECISION_TOLERANCE, Tolerance

PRECISIONS = ("fp32", "bf16", "fp16", "auto")
DEFAULT_ACCURACY_BUDGET = 0.01
B_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "auto": "bfloat16"}
PRECISION_OF = {"bfloat16": "bf16", "float16": "fp16"}
# fp16's regions are chosen as auto's are, within the share of each output's largest magnitude that the whole-model
# check's fixed low-precision tolerance allows (LOW_PRECISION_TOLERANCE's atol: 1%)
FP16_BUDGET = 0.01



def low_precision_tolerance(tol: Tolerance, budget: float | None = None) -> Tolerance:
    """`tol` (the user's or the default whole-model tolerance) at least as loose as LOW_PRECISION_TOLERANCE for
    float32 outputs; with `auto`'s accuracy `budget` (max |lowered - float32| / max |float32| per output), at least
    that fraction of each output's largest magnitude: what the budget allows, the check accepts."""
    out = Tolerance(dict(tol.rtol), dict(tol.atol), dict(tol.stol))
    if budget is not None:
        out.stol["float32"] = max(out.stol.get("float32", 0.0), budget)
    for table, low in ((out.rtol, LOW_PRECISION_TOLERANCE.rtol), (out.atol, LOW_PRECISION_TOLERANCE.atol),
                       (out.stol, LOW_PRECISION_TOLERANCE.stol)):
        table["float32"] = max(table.get("float32", 0.0), low["float32"])
    return out


def parse_precision(value, named) -> str:
    if not isinstance(value, str) or value not in PRECISIONS:
        raise UsageError(f"{named('precision', value)}: give one of {', '.join(PRECISIONS)}")
    return value


def parse_budget(value, named) -> float:
    try:
        x = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        x = float("nan")
    if not math.isfinite(x) or x <= 0 or x >= 1:
        raise UsageError(f"{named('accuracy_budget', value)}: give the largest error allowed as a fraction of each "
                         "output's largest magnitude, more than 0 and less than 1 (such as 0.01)")
    return x


def kernel_path(precision: str, target) -> str:
    """How the target runs the lowered GEMMs, in words (the report, and the CLI's line for bf16)."""
    if precision in ("bf16", "auto"):
        if bf16_k_step(target) > 2:
            return ("bf16 GEMMs, blocked convolutions and attention's two products on AMX tiles (tdpbf16ps) where "
                    "the CPU and the OS allow them, else vdpbf16ps (avx512_bf16; attention: float32); float32 sums")
        if target.has("avx512bf16"):
            return "bf16 on vdpbf16ps (avx512_bf16), float32 sums"
        return (f"bf16 emulated: target {target.name} has no bf16 instruction (avx512_bf16 or AMX), so the weights "
                "are stored in bf16 and widened to float32 in registers for float32 FMAs (half the weight bytes, the "
                "float32 FMA rate)")
    if precision == "fp16":
        if fp16_k_step(target) > 1:
            return ("fp16 GEMMs and blocked convolutions on AMX tiles (tdpfp16ps) where the CPU and the OS allow them, "
                    "else the GEMMs widen their fp16 pairs by vcvtph2ps and the convolutions unpack theirs to float32; "
                    "other convolutions: fp16 storage widened at load; float32 sums")
        return (f"fp16 storage: target {target.name} has no float16 instruction, so the GEMMs and convolutions keep "
                "their float32 kernels and their weights are written in fp16, widened to float32 when a session "
                "loads the model (half the file's weights at the float32 speed)")
    return "fp32"


def bf16_k_step(target) -> int:
    """K rows a bfloat16 B panel is padded to: whole AMX steps where the target has AMX-BF16 (the tiles then read
    no weights past a panel, codegen/compute/amx_tile.py), else pairs."""
    from onnxopt.codegen.compute.amx_tile import K_CHUNK, choose

    return K_CHUNK if choose(target, target.float32_lanes)[0] is not None else 2


def fp16_k_step(target) -> int:
    """K rows a float16 B panel is padded to: whole AMX steps, in pairs, where the target has AMX-FP16 tiles; else
    1 (stored as the float32 form is, for widening in registers)."""
    from onnxopt.codegen.compute.amx_tile import K_CHUNK, choose

    return K_CHUNK if choose(target, target.float32_lanes, "f16")[0] is not None else 1


def k_step(precision: str, target) -> int:
    return fp16_k_step(target) if B_DTYPE[precision] == "float16" else bf16_k_step(target)


def conv_refusal(precision: str, target) -> str | None:
    """Why the target's convolutions stay float32 at `precision`, or None when its blocked ones can take it."""
    if precision == "fp16":  # float16 storage needs nothing of the target (onnxruntime widens it at load)
        return None
    if precision not in ("bf16", "auto"):
        return f"conv: float32 ({precision} covers the GEMMs only)"
    if not target.has("avx512bf16"):
        return (f"conv: float32 (bf16 convolutions run on vdpbf16ps only, and target {target.name} has no "
                "avx512_bf16: widening the weights would save no time where the convolution is compute-bound)")
    if target.has("amx-bf16") and bf16_k_step(target) == 2:
        return (f"conv: float32 (target {target.name} has AMX-BF16 but no 16-lane tiles to finish its rows: its cores "
                "run vdpbf16ps at half the float32 FMA rate, 220 against 427 GFLOP/s measured on a Sapphire Rapids)")
    return None


# On AMX tiles a convolution gains where each input value meets enough outputs: its bfloat16 copy (read as float32,
# written and read again as bfloat16) costs about 8 bytes an input value, and the float32 kernel's arithmetic on it,
# 2 x OC x taps FLOPs at 427 GFLOP/s, outweighs that at 30 GB/s from OC x taps = 57. Fewer than 32 input channels pad
# a tile row (32 channels) by half or more. Measured on PP-OCRv4 det's 1x1 convolutions (Sapphire Rapids, 2 threads,
# the region against its float32 kernel): 16 -> 32 at 160x160 0.62x, 32 -> 48 0.65x, 12 -> 96 0.85x, 24 -> 96 at one
# pixel 0.77x; 96 -> 96 at 40x40 1.42x, 192 -> 192 at 20x20 2.0-2.8x, 384 -> 360 at 10x10 3.0x. A kernel with
# several taps reads each copied value once a tap: four 3x3 convolutions of 16 channels at 80x80, whole, ran 1.37x
# faster on the tiles (422-443 against 583-599 us), with a stride-2 one at 160x160 1.1-1.3x; of 8 channels, even.
AMX_CONV_MIN_CHANNELS = 32  # a 1x1 convolution's
AMX_CONV_MIN_CHANNELS_TAPS = 16  # one with several taps
AMX_CONV_MIN_OUTPUTS = 64  # OC x taps


def amx_conv_refusal(region) -> str | None:
    """Why a convolution keeps float32 on an AMX target though its kernel could take bf16, or None."""
    a = region.compute.attrs
    least = AMX_CONV_MIN_CHANNELS if a.kernel[0] * a.kernel[1] == 1 else AMX_CONV_MIN_CHANNELS_TAPS
    if a.ic_g < least:
        return (f"conv: float32 (on AMX tiles its {a.ic_g} input channels would pad to a tile row of 32, and its "
                "bfloat16 input copy cost more than the tiles save)")
    if a.oc * a.kernel[0] * a.kernel[1] < AMX_CONV_MIN_OUTPUTS:
        return (f"conv: float32 (each input value meets {a.oc * a.kernel[0] * a.kernel[1]} outputs, fewer than "
                f"{AMX_CONV_MIN_OUTPUTS}: on AMX tiles its bfloat16 input copy costs more than the tiles save)")
    return None


def lower_regions(regions, precision: str, opset: int, target) -> tuple[list, list[dict]]:
    """Lower every region that can take `precision` (in place); returns (the lowered regions, the float32 ones
    that are GEMM or convolution regions, each with why)."""
    from onnxopt.codegen.microkernel.registry import select

    lowered, kept = [], []
    conv_why = conv_refusal(precision, target)
    f16 = B_DTYPE[precision] == "float16"
    amx = (fp16_k_step(target) if f16 else bf16_k_step(target)) > 2  # the convolution tiles' instruction
    for r in regions:
        if r.compute is None:
            why = "-"
            if r.params.family == "attention":  # its two products on AMX tiles, where the target has them
                why = attention_amx.lower(r, target, "bf16" if B_DTYPE[precision] == "bfloat16" else "f16")
            elif r.params.family == "recurrent":  # its packed W and R stored as bfloat16, on every target
                why = recurrent_precision.lower(r, B_DTYPE[precision], opset)
            if why != "-":
                (kept.append({"nodes": r.node_names, "ops": r.describe(), "precision": "fp32", "reason": why})
                 if why else lowered.append(r))
            continue
        if r.compute.op == "conv":  # on AMX tiles where the target has them: channels padded to blocks of 32
            tiles_why = amx_conv_refusal(r) if amx else "no tiles"
            if conv_why is None and tiles_why is None and channel_vectors_apply(r, target.float32_lanes) \
                    and not r.compute.attrs.winograd:
                # an NCHW kernel's convolution: the blocked kernel (NCHW in and out) reaches the tiles
                with_channel_vectors(r, target.float32_lanes, select(target).tile.ni, opset)
            if conv_why is not None:
                why = conv_why
            elif f16:  # float16 pairs for the tiles, else float16 storage for the float32 kernel
                pairs = tiles_why is None and blocked_conv_refusal(r, opset) is None
                why = lower_blocked_conv(r, opset, fp16_k_step(target), "float16") if pairs \
                    else store_weights_f16(r)
            else:
                why = (tiles_why if amx else None) or lower_blocked_conv(r, opset, bf16_k_step(target))
        elif f16 and fp16_k_step(target) == 1 and r.compute.op == "matmul" and r.compute.attrs.packed_b:
            why = store_weights_f16(r)  # no float16 instruction: the float32 kernel, float16 in the file
        else:
            why = lower_packed_b(r, B_DTYPE[precision], opset, k_step(precision, target))
        if why is None:
            lowered.append(r)
        else:
            kept.append({"nodes": r.node_names, "ops": r.describe(), "precision": "fp32", "reason": why})
    return lowered, kept


def lowered_dtype(region) -> str | None:
    """The 16-bit type a lowered region computes in or stores its weights in ("bfloat16", "float16"), None for
    float32."""
    if region.compute is not None:
        return region.compute.attrs.b_dtype or region.compute.attrs.stored_dtype
    # an attention chain's products, a recurrent cell's weights
    low = getattr(region.params, "products", None) or getattr(region.params, "weights", "float32")
    return None if low == "float32" else low


def is_lowered(region) -> bool:
    return lowered_dtype(region) is not None


def precision_cost(names, want, got) -> list[dict]:
    """What the lower precision cost on each float output, against the float32 original: max_rel_error (the largest
    |got - want| over the output's largest |want|: the budget's metric), mean_rel_error (mean |got - want| over mean
    |want|), cosine similarity, and for a classifier's logits (rank 2, [1, C]) whether the top-1 class agrees."""
    out = []
    for name, a, b in zip(names, want, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or a.shape != b.shape or a.size == 0:
            continue
        a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        finite = np.isfinite(a64) & np.isfinite(b64)
        a64, b64 = a64[finite], b64[finite]
        err = np.abs(a64 - b64)
        scale = float(np.max(np.abs(a64))) if a64.size else 0.0
        mean_scale = float(np.mean(np.abs(a64))) if a64.size else 0.0
        norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
        entry = {"output": name,
                 "max_rel_error": float(err.max()) / scale if scale > 0 else float(err.max(initial=0.0)),
                 "mean_rel_error": float(err.mean()) / mean_scale if mean_scale > 0 else 0.0,
                 "cosine": float(np.dot(a64, b64) / norm) if norm > 0 else 1.0}
        if a.ndim == 2 and a.shape[0] == 1 and a.shape[1] > 1:
            entry["top1_agrees"] = bool(np.argmax(a) == np.argmax(b))
        out.append(entry)
    return out


def worst_error(cost: list[dict]) -> float:
    return max((c["max_rel_error"] for c in cost), default=0.0)


# ---- auto: which regions take bf16 within the budget ----

def _values(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to `dtype` ("bfloat16" or "float16") and widened back."""
    x = np.asarray(x, np.float32)
    return bfloat16_values(x) if dtype == "bfloat16" else x.astype(np.float16).astype(np.float32)


def _simulated(model: onnx.ModelProto, regions, round_a: bool, dtype: str = "bfloat16") -> onnx.ModelProto:
    """`model` with each region's GEMM computing in `dtype` as its kernel would: B rounded to it (a new
    initializer), and A too when `round_a` (_round_to); sums stay float32. A bfloat16 convolution always reads a
    rounded input; a float16-stored one's float32 kernel never does."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
    inits = {t.name: t for t in m.graph.initializer}
    heads = {r.nodes[0].output[0]: r for r in regions if not _is_attention(r) and not _is_recurrent(r)}
    # a recurrent cell's W and R are stored as bfloat16: both rounded (h, c and the sums stay float32)
    cells = {r.nodes[0].output[0] or r.nodes[0].name for r in regions if _is_recurrent(r)}
    # an attention chain's two products read bf16 operands (Q and K, then the weights and V): both rounded
    products = {n.output[0] for r in regions if _is_attention(r) for n in r.nodes if n.op_type == "MatMul"}
    new_nodes = []
    for n in m.graph.node:
        if n.output and n.output[0] in products:
            for i in range(2):
                new_nodes += _round_to(n.input[i], f"{n.output[0]}__bf16_{i}", opset, dtype)
                n.input[i] = f"{n.output[0]}__bf16_{i}"
        elif n.output and (n.output[0] or n.name) in cells:
            for i in (1, 2):
                w = numpy_helper.to_array(inits[n.input[i]]).astype(np.float32)
                wname = f"{n.output[0] or n.name}__bf16_{i}"
                m.graph.initializer.append(numpy_helper.from_array(_values(w, dtype), wname))
                n.input[i] = wname
        elif n.output and n.output[0] in heads and n.op_type in LOWERED_OPS and n.input[1] in inits:
            b = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
            bname = f"{n.output[0]}__bf16_b"
            m.graph.initializer.append(numpy_helper.from_array(_values(b, dtype), bname))
            a = n.input[0]
            if round_a or (n.op_type == "Conv" and dtype == "bfloat16"):
                new_nodes += _round_to(a, f"{bname}_a", opset, dtype)
                a = f"{bname}_a"
            n.input[0], n.input[1] = a, bname
        new_nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(new_nodes)
    return m


LOWERED_OPS = ("MatMul", "Gemm", "Conv")


def _is_attention(region) -> bool:
    return region.compute is None and region.params.family == "attention"


def _is_recurrent(region) -> bool:
    return region.compute is None and region.params.family == "recurrent"


VELTKAMP_BF16 = float(2 ** 16 + 1)  # float32's 24-bit significand split at 16 bits: the high 8 are bfloat16's


def _round_to(x: str, out: str, opset: int, dtype: str = "bfloat16") -> list:
    """Nodes giving `out` = float32 `x` rounded to bfloat16 (round to nearest even). From opset 13 a Cast to
    bfloat16 and back. Before (Paddle's opset-11 exports), Cast has no bfloat16, and Veltkamp's split does it in
    float32 arithmetic: c = x * (2^16 + 1), out = c - (c - x) is x rounded to 8 significant bits, ties to even
    (equal to the Cast on 2 M values spanning 2^-29 to 2^29 and 1,000 exact ties; it overflows past 5e33).
    float16: a Cast to float16 and back at any opset."""
    if dtype == "float16":
        return [helper.make_node("Cast", [x], [f"{out}16"], to=onnx.TensorProto.FLOAT16),
                helper.make_node("Cast", [f"{out}16"], [out], to=onnx.TensorProto.FLOAT)]
    if opset >= 13:
        return [helper.make_node("Cast", [x], [f"{out}16"], to=onnx.TensorProto.BFLOAT16),
                helper.make_node("Cast", [f"{out}16"], [out], to=onnx.TensorProto.FLOAT)]
    split = helper.make_node("Constant", [], [f"{out}_split"],
                             value=numpy_helper.from_array(np.array(VELTKAMP_BF16, np.float32), f"{out}_split"))
    return [split, helper.make_node("Mul", [x, f"{out}_split"], [f"{out}_c"]),
            helper.make_node("Sub", [f"{out}_c", x], [f"{out}_d"]),
            helper.make_node("Sub", [f"{out}_c", f"{out}_d"], [out])]


def _gemm_of(model: onnx.ModelProto, region):
    """The region's head MatMul, Gemm or Conv node and its constant B: a GEMM's as [K, N] float32 (transB and alpha
    applied), a convolution's weights as they are; None when B is not an initializer (what _simulated can round)."""
    n = region.nodes[0]
    if n.op_type not in LOWERED_OPS:
        return None
    init = next((t for t in model.graph.initializer if t.name == n.input[1]), None)
    if init is None:
        return None
    b = numpy_helper.to_array(init).astype(np.float32)
    if n.op_type == "Conv":
        return n, b
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    if attrs.get("transB", 0):
        b = b.T
    return n, b * np.float32(attrs.get("alpha", 1.0))


def _conv_own_error(model: onnx.ModelProto, node, a: np.ndarray, dtype: str = "bfloat16") -> float:
    """A convolution's own error in `dtype` on its real input `a`: the node alone in onnxruntime, float32 against
    its weights rounded to it, and its input too under bfloat16 (float32 sums), as max |diff| / max |float32|."""
    import onnxruntime as ort

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    m = onnx.ModelProto()
    m.ir_version = min(model.ir_version, 8)
    m.opset_import.add(domain="", version=opset)
    single = onnx.NodeProto()
    single.CopyFrom(node)
    del single.output[1:]
    m.graph.node.append(single)
    m.graph.input.append(helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, a.shape))
    m.graph.output.append(onnx.ValueInfoProto(name=node.output[0]))
    m.graph.initializer.extend(numpy_helper.from_array(np.asarray(inits[x], np.float32), x)
                               for x in node.input[1:] if x)
    exact = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {node.input[0]: a})[0].astype(np.float64)
    del m.graph.initializer[:]
    m.graph.initializer.extend(numpy_helper.from_array(_values(inits[x], dtype)
                                                       if i == 1 else np.asarray(inits[x], np.float32), x)
                               for i, x in enumerate(node.input) if i > 0 and x)
    low = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {node.input[0]: _values(a, dtype) if dtype == "bfloat16" else a})[0].astype(np.float64)
    scale = float(np.max(np.abs(exact))) if exact.size else 0.0
    return float(np.max(np.abs(exact - low))) / scale if scale > 0 else 0.0


def choose_auto(model, regions, budget: float, round_a: bool, run, dtype: str = "bfloat16") \
        -> tuple[list, list[dict], dict]:
    """The regions to take `dtype` (bf16 in `auto`; fp16 too, whose fixed tolerance is its budget): (chosen,
    refused with why, the simulation's record). `run(model, names)` gives those outputs of a model on the check
    inputs.

    All regions at once first (one session). Past the budget, each GEMM's own bf16 error is measured on its real
    operands (its A from one float32 run of the model, in numpy), and the longest run of the least costly ones whose
    simulated model stays within the budget is found by bisection (the error grows with the regions taken, near
    enough monotonically): about log2(regions) sessions, not one per region."""
    names = [o.name for o in model.graph.output]
    # an attention chain's or a recurrent cell's own error comes from simulating it whole (below)
    gemms = {id(r): (None, None) if _is_attention(r) or _is_recurrent(r) else _gemm_of(model, r) for r in regions}
    refused = [{"nodes": r.node_names, "ops": r.describe(), "precision": "fp32",
                "reason": "its B is not an initializer, which the accuracy simulation needs"}
               for r in regions if gemms[id(r)] is None]
    if dtype == "float16":  # past float16's range: the lowering keeps them float32 (and says so), never simulated
        big = {id(r) for r in regions if gemms[id(r)] and gemms[id(r)][1] is not None
               and float(np.max(np.abs(gemms[id(r)][1]), initial=0.0)) > FLOAT16_MAX}
        refused += [{"nodes": r.node_names, "ops": r.describe(), "precision": "fp32",
                     "reason": "float32 (a weight is past float16's 65504)"} for r in regions if id(r) in big]
        regions = [r for r in regions if id(r) not in big]
    regions = [r for r in regions if gemms[id(r)] is not None]

    def cost(taken) -> float:
        return worst_error(precision_cost(names, want, run(_simulated(model, taken, round_a, dtype), names)))

    a_names = list(dict.fromkeys(gemms[id(r)][0].input[0] if gemms[id(r)][0] else r.outputs[0] for r in regions))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend([onnx.ValueInfoProto(name=a) for a in a_names if a not in known])
    outs = run(probe, names + a_names)
    want, a_values = outs[:len(names)], dict(zip(a_names, outs[len(names):]))
    every = cost(regions)
    if every <= budget:  # the common case: every region within the budget together
        return list(regions), refused, {"simulated_max_rel_error": every, "regions_simulated": len(regions),
                                        "sessions": 2}
    own = []
    for r in regions:
        node, b = gemms[id(r)]
        if node is None:  # an attention chain or a recurrent cell: its output with only its own rounding
            exact = np.asarray(a_values[r.outputs[0]], np.float64)
            low = np.asarray(run(_simulated(probe, [r], round_a, dtype), [r.outputs[0]])[0], np.float64)
            scale = float(np.max(np.abs(exact))) if exact.size else 0.0
            own.append((float(np.max(np.abs(exact - low))) / scale if scale > 0 else 0.0, r))
            continue
        a = np.asarray(a_values[node.input[0]], np.float32)
        if node.op_type == "Conv":
            own.append((_conv_own_error(model, node, a, dtype), r))
            continue
        if node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute):
            a = a.T
        a = a.reshape(-1, b.shape[0])
        exact = a.astype(np.float64) @ b.astype(np.float64)
        low = (_values(a, dtype) if round_a else a).astype(np.float64) @ _values(b, dtype).astype(np.float64)
        scale = float(np.max(np.abs(exact))) if exact.size else 0.0
        own.append((float(np.max(np.abs(exact - low))) / scale if scale > 0 else 0.0, r))
    own.sort(key=lambda e: e[0])
    lo, hi, best_err, sessions = 0, len(own), 0.0, 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        err = cost([r for _, r in own[:mid]])
        sessions += 1
        if err <= budget:
            lo, best_err = mid, err
        else:
            hi = mid - 1
    refused += [{"nodes": r.node_names, "ops": r.describe(), "precision": "fp32",
                 "reason": f"{PRECISION_OF[dtype]} here (its own error {e:.3g}, more than the {lo} taken) would "
                           f"take the model past the accuracy budget {budget:g}"} for e, r in own[lo:]]
    return [r for _, r in own[:lo]], refused, {"simulated_max_rel_error": best_err,
                                               "regions_simulated": len(own), "sessions": sessions}
