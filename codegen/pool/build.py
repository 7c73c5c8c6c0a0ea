"""One pool region (MaxPool, AveragePool, GlobalMaxPool or GlobalAveragePool with its epilogue) -> native object
and the glue's description."""

from __future__ import annotations

from onnxopt.dtypes import dtype
from onnxopt.fusion.region import Region

from ..compile import compile_object, new_module
from ..target import Target
from .desc import ELEMS, INLINE_WORK, MAX_TASKS, PoolKernelDesc
from .kernels import PoolSpec, define_pool_functions


def pool_spec(region: Region, target: Target) -> PoolSpec:
    p = region.pool
    a = p.attrs
    return PoolSpec(op=p.op, lanes=target.float32_lanes, epilogue=region.program, extra_kinds=tuple(p.extra_kinds),
                    kernel=tuple(a.get("kernel", (1, 1))), strides=tuple(a.get("strides", (1, 1))),
                    dilations=tuple(a.get("dilations", (1, 1))), dtype=p.dtype)


def build_pool(region: Region, target: Target) -> tuple[bytes, PoolKernelDesc, str]:
    """Returns (object code, glue description, LLVM IR text)."""
    p = region.pool
    spec = pool_spec(region, target)
    module = new_module(target, region.op_type)
    syms = define_pool_functions(module, region.op_type, spec, target.features)
    ir_text = str(module)
    obj = compile_object(ir_text, target)
    a = p.attrs
    enum = dtype(p.dtype).onnx  # the graph's element type (fusion/pool.py), as the custom op declares it
    desc = PoolKernelDesc(
        op_type=region.op_type, op=p.op,
        in_types=[enum] * len(region.inputs),
        out_types=[enum] * len(region.outputs),
        lanes=spec.lanes, elem=ELEMS[p.dtype], rows=syms.get("rows"), glob=syms.get("global"),
        kernel=spec.kernel, strides=spec.strides, dilations=spec.dilations,
        pads=tuple(a.get("pads", (0, 0, 0, 0))), auto_pad=int(a.get("auto_pad", 0)),
        ceil_mode=int(a.get("ceil_mode", 0)), count_include_pad=int(a.get("count_include_pad", 0)),
        rank=int(a["rank"]), extra_kinds=list(p.extra_kinds), extra_nstride=list(p.extra_nstride),
        blocked=int(a.get("blocked", 0)), exit_channels=int(a.get("exit_channels", 0)),
        max_tasks=p.max_tasks or MAX_TASKS, inline_work=p.inline_work or INLINE_WORK,
    )
    return obj, desc, ir_text
