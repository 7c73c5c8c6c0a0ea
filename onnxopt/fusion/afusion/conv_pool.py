"""AFUSION conv -> pool: a convolution region (with its epilogue) and the MaxPool or AveragePool that reads its
output, in one kernel.

The stems of ResNet (7x7 /2 conv -> 3x3 /2 MaxPool) and SqueezeNet, and UNet's encoder (conv -> 2x2 MaxPool) write a
full-size activation only for a pool to read it once and keep a quarter. Fused, the conv computes by bands the rows
that a band of pool output rows needs into a scratch band, and the pool reads them there (codegen/glue/afusion_exec.c,
af_pool_compute); the conv's output never goes to memory. Bands overlap by the pool window's halo rows, which both
neighbours compute.

In the blocked plan the pool is a passthrough region: onnxruntime's pool on blocked tensors (fusion/
blocked_passthrough.py). The fused region's inputs are the convolution's, its output the pool's (blocked); its
function fallback is the convolution's fallback and the passthrough node, so the model is correct without the
library.

What the kernel supports (`pool_reason` says why not):
- the convolution as for every AFUSION first part (conv_part_reason): 2-D, one group or depthwise, constant weights;
- the pool is a 2-D MaxPool (any kernel, strides, dilations, pads, ceil_mode) or AveragePool (no dilation; with or
  without count_include_pad), with explicit pads (auto_pad NOTSET or VALID), its Indices output unused;
- the convolution's output is read by nothing but the pool, and its epilogue has no per-pixel input.
"""

from __future__ import annotations

from ..compute import ComputeParams
from ..params import ComputeAttrs, RelayoutParams
from ..elementwise import _attr
from ..region import EwProgram, Region
from .siso import (
    DEFAULT_SCRATCH_BYTES,
    balanced_rows,
    channel_vector_parts,
    conv_part_reason,
    kept_inside_reason,
)

POOL_OPS = {"MaxPool": "max", "AveragePool": "avg"}


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def is_pool_region(r: Region) -> bool:
    """A 2-D MaxPool or AveragePool on blocked tensors: a passthrough region, or our blocked pool kernel's region
    (fusion/pool.py `blocked_region`), with no epilogue."""
    if len(r.nodes) != 1 or r.nodes[0].op_type not in POOL_OPS:
        return False
    if r.relayout is not None:
        return isinstance(r.params, RelayoutParams) and not r.params.exit
    return r.pool is not None and bool(r.pool.attrs.get("blocked")) and not r.pool.extra_kinds


def blocked_form(pool: Region) -> list:
    """The pool's nodes rewritten for the 5-D form (the fused region's fallback)."""
    return list(pool.relayout) if pool.relayout is not None else list(pool.pool.body)


def pool_params(node) -> dict | str:
    """The pool's parameters as the kernel takes them, or why it cannot."""
    k = list(_attr(node, "kernel_shape", []))
    if len(k) != 2:
        return "the pool is not 2-D"
    auto_pad = _text(_attr(node, "auto_pad", "NOTSET"))
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the pool's auto_pad is {auto_pad} (explicit pads only)"
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return "MaxPool's Indices output is used"
    pads = [0, 0, 0, 0] if auto_pad == "VALID" else list(_attr(node, "pads", [0, 0, 0, 0]))
    strides = list(_attr(node, "strides", [1, 1]))
    dilations = list(_attr(node, "dilations", [1, 1]))
    if node.op_type == "AveragePool" and dilations != [1, 1]:
        return "a dilated AveragePool"
    # ONNX pads are [top, left, bottom, right] for 2-D (begins, then ends): the glue's order too.
    return {"op": POOL_OPS[node.op_type], "kernel": k, "strides": strides, "dilations": dilations, "pads": pads,
            "ceil_mode": int(_attr(node, "ceil_mode", 0)), "count_include_pad": int(_attr(node, "count_include_pad", 0))}


def ceil_mode_reason(params: dict, in_h: int, in_w: int) -> str | None:
    """With ceil_mode, onnx's shape inference counts a last window that starts in the end padding and onnxruntime
    drops it: the two sizes differ, and the blocked chain's reshapes are built from onnx's. Refused."""
    if not params["ceil_mode"]:
        return None
    for size, k, s, d, p0, p1 in zip((in_h, in_w), params["kernel"], params["strides"], params["dilations"],
                                     params["pads"][:2], params["pads"][2:]):
        out = -(-(size + p0 + p1 - (k - 1) * d - 1) // s) + 1
        if (out - 1) * s >= size + p0:
            return "ceil_mode's last window starts in the padding (onnx and onnxruntime disagree on the size)"
    return None


def pool_reason(first: Region, pool: Region, lanes: int, consumers: dict[str, list] | None = None,
                graph_outputs: set[str] = frozenset()) -> str | None:
    """None when convolution region `first` and pool region `pool` can run as one AFUSION kernel, else why not."""
    if lanes < 8:
        return "AFUSION runs on the channel-vector kernel, which needs 8 or more lanes"
    why = conv_part_reason(first, "first")
    if why:
        return why
    if not is_pool_region(pool):
        return "the second region is not a MaxPool or AveragePool on blocked tensors"
    params = pool_params(pool.nodes[0])
    if isinstance(params, str):
        return params
    if len(first.outputs) != 1:
        return "the first convolution's region has more than one output"
    t = first.outputs[0]
    if pool.inputs[0] != t:
        return "the pool does not read the convolution's output"
    if not first.compute.attrs.out_blocked:
        return "the convolution's output is not blocked"
    return kept_inside_reason(first, consumers, graph_outputs)


def pool_band_bytes(first: Region, params: dict, lanes: int, band_rows: int, out_w1: int) -> int:
    """Bytes of the scratch band for `band_rows` pool output rows: the conv rows they need, all channels."""
    rows = (band_rows - 1) * params["strides"][0] + (params["kernel"][0] - 1) * params["dilations"][0] + 1
    return -(-first.compute.attrs.oc // lanes) * rows * out_w1 * lanes * 4


def pool_band_rows(first: Region, params: dict, lanes: int, out_h2: int, out_w1: int, batch: int, threads: int,
                   scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> int:
    """The tallest band of pool output rows whose conv rows fit `scratch_bytes`, balanced over the threads."""
    rows = 1
    while rows < out_h2 and pool_band_bytes(first, params, lanes, rows + 1, out_w1) <= scratch_bytes:
        rows += 1
    return balanced_rows(rows, out_h2, batch, threads)


def fuse_conv_pool(first: Region, pool: Region, lanes: int, ni: int, opset: int, band_rows: int) -> Region:
    """The AFUSION region of convolution `first` and the pool reading its output (check `pool_reason` first)."""
    (p1,) = channel_vector_parts([first], lanes, ni, opset)
    params = pool_params(pool.nodes[0])
    taken = {o for n in p1.compute.body for o in n.output}
    if any(o in taken for n in blocked_form(pool) for o in n.output):  # cannot happen: the pool's outputs are its own
        raise ValueError("the pool's fallback nodes would reassign a tensor of the convolution's")
    compute = ComputeParams(
        op="afusion",
        attrs=ComputeAttrs(band_rows=int(band_rows), in_blocked=int(p1.compute.attrs.in_blocked),
                           out_blocked=1, block=lanes, pool=params),
        initializers=list(p1.compute.initializers),
        body=list(p1.compute.body) + blocked_form(pool),
        orig_consts=list(p1.compute.orig_consts),
        parts=[p1],
    )
    fused = Region(label="afusion", nodes=list(p1.nodes) + list(pool.nodes), inputs=list(p1.inputs),
                   outputs=list(pool.outputs), program=EwProgram(inputs=[], consts={}, ops=[], outputs=[]),
                   shape=list(pool.shape), params=compute)
    if first.op_type_key:
        fused.compute_op_type(first.op_type_key)
    return fused
