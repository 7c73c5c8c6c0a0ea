"""Fusion rule: a pool (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool) with the elementwise chain after it.

    MaxPool -> Relu                    AveragePool -> Add(residual) -> Clip
    GlobalAveragePool -> Mul(scale) -> Add(bias)

becomes one kernel (codegen/pool): the pooled vector runs through the chain in registers before it is stored. The
epilogue grows exactly as a compute op's does (fusion/compute.py): consumers that the elementwise rule admits, with
the pool's output shape, whose other inputs broadcast as POSITION (laid out like the output), CHANNEL (one value per
channel) or SCALAR; one-element constants are folded into the code.

Admitted: float32, NCHW. MaxPool and AveragePool over 2-D windows (any kernel, strides, dilations, pads, auto_pad,
ceil_mode, count_include_pad); MaxPool only when its Indices output is unused. Global pools over any spatial rank.
A windowed MaxPool of uint8 or int8 too (a quantized model's, graph/quantized_pools.py), with no epilogue.
The function fallback is the original nodes.
"""

from __future__ import annotations

import onnx

from .compute import ACC, MAX_EXTRAS, MAX_OUTPUTS, ComputeRule
from .elementwise import _attr
from .params import PoolParams
from .region import EwOp, EwProgram, Region, Value

POOL_OPS = {"MaxPool": "max", "AveragePool": "avg", "GlobalMaxPool": "gmax", "GlobalAveragePool": "gavg"}
AUTO_PAD = {"NOTSET": 0, "SAME_UPPER": 1, "SAME_LOWER": 2, "VALID": 3}
# A MaxPool of a quantized model's int8 tensor (graph/quantized_pools.py puts it there): the integer maximum, with no
# epilogue (what follows it is a quantized unit's).
INT8_TYPES = ("uint8", "int8")
# The windowed kernels unroll every tap of the window, and a strided one loads a row's whole span at once
# (codegen/pool/kernels.py): an exported AveragePool with a 1280 x 1280 window (a global pool in disguise) made
# millions of instructions and its build ran for many minutes. Past these, onnxruntime runs the pool.
MAX_WINDOW_TAPS = 256
MAX_ROW_SPAN = 512  # input columns one strip of 16 outputs reads: 15 * stride + (kernel - 1) * dilation + 1


class PoolRule:
    kind_names = {"max": "MaxPool", "avg": "AveragePool", "gmax": "GlobalMaxPool", "gavg": "GlobalAveragePool"}

    def __init__(self, model: onnx.ModelProto):
        # The compute rule's helpers classify epilogue inputs; the micro-kernel tile size does not matter here.
        self.cr = ComputeRule(model, 1)
        self.ew = self.cr.ew
        self.index = self.ew.index

    def admits(self, node) -> str | None:
        if node.domain not in ("", "ai.onnx") or node.op_type not in POOL_OPS:
            return "not a pool"
        op = POOL_OPS[node.op_type]
        dt = self.ew.dtype_of(node.input[0]) if node.input else None
        if dt in INT8_TYPES and op != "max":
            return f"a {dt} {node.op_type}: only MaxPool runs on int8 tensors"
        if dt != "float32" and dt not in INT8_TYPES:
            return "not float32, uint8 or int8"
        if len(node.output) > 1 and node.output[1] and (self.index.consumers.get(node.output[1])
                                                         or node.output[1] in self.index.graph_outputs):
            return "MaxPool's Indices output is used"
        ti = self.ew.info.get(node.input[0])
        rank = ti.rank if ti is not None and ti.rank is not None else 0
        if op in ("gmax", "gavg"):
            if rank < 3:
                return "input rank unknown or below 3"
            return None
        if rank != 4:
            return "not a 2-D pool over [N, C, H, W]"
        if len(_attr(node, "kernel_shape", [])) != 2:
            return "kernel_shape is not 2-D"
        auto = _attr(node, "auto_pad", b"NOTSET")
        if (auto.decode() if isinstance(auto, bytes) else auto) not in AUTO_PAD:
            return "unknown auto_pad"
        kh, kw = (int(k) for k in _attr(node, "kernel_shape"))
        strides = list(_attr(node, "strides", None) or [1, 1])
        dilations = list(_attr(node, "dilations", None) or [1, 1])
        if len(strides) != 2 or len(dilations) != 2:
            return "strides or dilations are not 2-D"
        sw, dw = int(strides[1]), int(dilations[1])
        if kh * kw > MAX_WINDOW_TAPS or 15 * sw + (kw - 1) * dw + 1 > MAX_ROW_SPAN:
            return f"a {kh}x{kw} window with stride {sw}: too large for an unrolled kernel"
        return None

    def find_regions(self, claimed: set[int], rejected: list[dict] | None = None,
                     int8_only: bool = False) -> list[Region]:
        """The pool regions among the unclaimed nodes; `int8_only`: the MaxPools of int8 tensors only (a quantized
        model's units, which the plans without float pools take too)."""
        regions = []
        for i, node in enumerate(self.index.nodes):
            if i in claimed or node.op_type not in POOL_OPS or node.domain not in ("", "ai.onnx"):
                continue
            if int8_only and (not node.input or self.ew.dtype_of(node.input[0]) not in INT8_TYPES):
                continue
            why = self.admits(node)
            if why is not None:
                if rejected is not None:
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": f"{node.op_type}: {why}"})
                continue
            try:
                region, group = self._region_from(i, claimed)
            except _Reject as e:
                if rejected is not None:
                    rejected.append({"nodes": [node.name or node.output[0]], "reason": str(e)})
                continue
            claimed.update(group)
            regions.append(region)
        return regions

    def _region_from(self, i: int, claimed: set[int]):
        idx = self.index
        node = idx.nodes[i]
        out_shape = self.ew.shape_of(node.output[0])
        members = [i]
        values = {node.output[0]}
        extras: list[str] = []
        kinds: list[int] = []
        if out_shape is not None and self.ew.dtype_of(node.input[0]) == "float32":  # else no epilogue
            self.cr.grow_epilogue(i, claimed, members, values, extras, kinds, out_shape, "conv", MAX_EXTRAS)
        group = set(members)
        members = sorted(members)
        outputs = [o for m in members for o in idx.nodes[m].output[:1] if idx.is_used_outside(o, group)]
        if not outputs:
            raise _Reject("no output is used")
        if len(outputs) > MAX_OUTPUTS:
            raise _Reject(f"more than {MAX_OUTPUTS} outputs")
        return self._build(node, members, extras, kinds, outputs, out_shape), group

    def _build(self, node, members, extras, kinds, outputs, out_shape) -> Region:
        idx = self.index
        op = POOL_OPS[node.op_type]
        params = PoolParams(op, dtype=self.ew.dtype_of(node.input[0]))  # admits(): float32, or int8 for MaxPool
        dt = params.dtype
        xs = self.ew.info[node.input[0]].shape
        params.attrs["rank"] = len(xs)
        if op in ("max", "avg"):
            auto = _attr(node, "auto_pad", b"NOTSET")
            auto = auto.decode() if isinstance(auto, bytes) else auto
            params.attrs.update(
                kernel=tuple(int(k) for k in _attr(node, "kernel_shape")),
                strides=tuple(int(s) for s in (_attr(node, "strides", None) or [1, 1])),
                dilations=tuple(int(d) for d in (_attr(node, "dilations", None) or [1, 1])),
                pads=tuple(int(p) for p in (_attr(node, "pads", None) or [0, 0, 0, 0])) if auto == "NOTSET"
                else (0, 0, 0, 0),
                auto_pad=AUTO_PAD[auto], ceil_mode=int(_attr(node, "ceil_mode", 0)))
            if op == "avg":
                params.attrs["count_include_pad"] = int(_attr(node, "count_include_pad", 0))
        consts: dict = {}
        ops = [EwOp("Identity", (ACC,), node.output[0], dt)]
        for m in members[1:]:
            ops.append(self.ew._to_op(idx.nodes[m], consts))
        params.extra_kinds = list(kinds)
        params.extra_nstride = [self.cr._nstride(x, k, out_shape, "conv") for x, k in zip(extras, kinds)]
        prog = EwProgram(inputs=[Value(ACC, dt)] + [Value(x, dt) for x in extras], consts=consts,
                         ops=ops, outputs=[Value(o, dt) for o in outputs])
        if out_shape is not None:
            shape = list(out_shape)
        else:  # symbolic sizes that shape inference could not follow through the window: the rank is enough
            ti = self.ew.info.get(node.output[0])
            dims = ti.shape if ti is not None and ti.shape is not None else [None] * len(xs)
            shape = [d if isinstance(d, (int, str)) and not str(d).startswith("unk__") else None for d in dims]
        region = Region(self.kind_names[op], [idx.nodes[m] for m in members], [node.input[0]] + extras, outputs,
                        prog, shape)
        region.params = params
        return region


    def blocked_region(self, node, rewritten: list, lanes: int, exit_channels: int = 0) -> Region | None:
        """A pool that a blocked chain runs through, as a kernel of ours on the blocked tensors (pool_exec.c's
        blocked path: each lane a channel); `rewritten` is the node's passthrough form, which becomes the fallback.
        A global pool may also end the chain (`exit_channels` = C, `rewritten` its exit form): it reads the blocked
        tensor and writes NCHW [N, C, 1, 1] for the classifier after it. None when the pool is not one our kernel
        computes (then the passthrough stays)."""
        if node.op_type not in POOL_OPS or self.admits(node) is not None or \
                self.ew.dtype_of(node.input[0]) != "float32":
            return None
        glob = node.op_type.startswith("Global")
        if exit_channels and not glob:
            return None
        out_shape = self.ew.shape_of(node.output[0])
        if out_shape is None or (glob and len(out_shape) != 4):  # the blocked form is 2-D: [N, C / L, H, W, L]
            return None
        region = self._build(node, [self.index.nodes.index(node)], [], [], [node.output[0]], out_shape)
        region.pool.attrs["blocked"] = int(lanes)
        if exit_channels:
            region.pool.attrs["exit_channels"] = int(exit_channels)
        region.pool.body = list(rewritten)
        return region


class _Reject(Exception):
    pass
