"""One compute region (a convolution or matmul with its epilogue) -> native object and the glue's description."""

from __future__ import annotations

from onnxopt.fusion.layout import is_depthwise
from onnxopt.fusion.region import Region

from ..compile import compile_object, new_module
from ..elementwise.types import ONNX_ENUM
from ..glue.library import CtKernelDesc
from ..microkernel.depthwise import depthwise_mi_for
from ..microkernel.registry import select
from ..target import Target
from .blocked_tile import define_blocked_tile_functions, define_depthwise_tile_functions
from .tile import TileSpec, define_tile_functions


def build_compute(region: Region, target: Target) -> tuple[bytes, CtKernelDesc, str]:
    """Returns (object code, glue description, LLVM IR text)."""
    if region.compute.op == "afusion":  # two convolutions in one kernel (codegen/compute/afusion.py)
        from .afusion import build_afusion

        return build_afusion(region, target)
    if region.compute.op == "siblings":  # convolutions of one input in one kernel (codegen/compute/siblings.py)
        from .siblings import build_siblings

        return build_siblings(region, target)
    module = new_module(target, region.op_type)
    desc = define_compute(module, region, region.op_type, target)
    ir_text = str(module)
    return compile_object(ir_text, target), desc, ir_text


def define_compute(module, region: Region, name: str, target: Target) -> CtKernelDesc:
    """Define the tile functions of one compute region in `module`, their symbols prefixed by `name`; returns the
    glue's description of the op (named `name`)."""
    c = region.compute
    kernel = select(target)
    tile = kernel.tile
    if getattr(c, "tile", None) is not None:  # chosen by the tile search (onnxopt/tune); weights packed for it
        if c.tile.lanes != tile.lanes:
            raise ValueError(f"register tile {c.tile} is for {c.tile.lanes} lanes, the target has {tile.lanes}")
        tile = c.tile
    # ConvTranspose packs its weights for the default tile.
    if c.attrs.get("packed_ni", tile.ni) != tile.ni or c.attrs.get("packed_mi", tile.mi) != tile.mi:
        raise ValueError(f"the weights are packed for another register tile than {tile}")
    spec = TileSpec(tile, region.program, tuple(c.extra_kinds), packed_a=c.op != "matmul")
    # A convolution whose output stays in the blocked layout has its own tile (vectors of output channels).
    channel_vectors = c.attrs.get("out_blocked") or c.attrs.get("channel_vectors")
    mi, ni = tile.mi, tile.ni
    if channel_vectors and is_depthwise(c):  # one channel vector times its filters
        kw, sw, dw = c.attrs["kernel"][1], c.attrs["strides"][1], c.attrs["dilations"][1]
        mi, ni = depthwise_mi_for(kernel, kw), 1
        tiles = define_depthwise_tile_functions(module, name, spec, target.features, mi, kw, sw, dw)
    else:
        define = define_blocked_tile_functions if channel_vectors else define_tile_functions
        tiles = define(module, name, spec, target.features)
    a = c.attrs
    desc = CtKernelDesc(
        op_type=name, kind=c.op,
        in_types=[ONNX_ENUM["float32"]] * len(region.inputs),
        out_types=[ONNX_ENUM["float32"]] * len(region.outputs),
        mi=mi, ni=ni, lanes=tile.lanes, tiles=tiles,
        extra_kinds=list(c.extra_kinds), extra_nstride=list(c.extra_nstride),
        trans_a=int(a.get("trans_a", 0)),
    )
    if c.op in ("conv", "conv_transpose"):
        desc.oc, desc.groups, desc.ic_g = a["oc"], a["groups"], a["ic_g"]
        desc.kernel, desc.strides, desc.dilations = a["kernel"], a["strides"], a["dilations"]
        desc.pads, desc.auto_pad = a["pads"], a["auto_pad"]
        desc.in_blocked, desc.out_blocked = int(a.get("in_blocked", 0)), int(a.get("out_blocked", 0))
        desc.channel_vectors = int(a.get("channel_vectors", 0))
        desc.transposed = int(c.op == "conv_transpose")
        desc.output_padding = tuple(a.get("output_padding", (0, 0)))
    return desc
