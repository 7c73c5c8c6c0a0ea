"""A compute region (a convolution or matmul with its epilogue) -> the glue's description and the tile sets its
kernel calls; build.py compiles them. AFUSION and sibling kernels describe each of their parts with it."""

from __future__ import annotations

from onnxopt.dtypes import dtype
from onnxopt.fusion.layout import is_depthwise
from onnxopt.fusion.region import EwProgram, Region, Value

from ..glue.descs import CtKernelDesc
from ..instructions.tile_program import emulating
from ..microkernel.depthwise import depthwise_mi_for
from ..microkernel.registry import select
from ..target import Target
from .amx_tile import MAX_GROUPS as AMX_GROUPS, choose as amx_choose
from .tile import TileSpec
from .tile_sets import TileSetRequest


def describe_compute(region: Region, name: str, target: Target) -> tuple[CtKernelDesc, list[TileSetRequest]]:
    """The glue's description of one compute region's op (named `name`) and the tile set its tables point at."""
    c = region.compute
    kernel = select(target)
    tile = kernel.tile
    packed_b = int(c.attrs.packed_b)
    if packed_b:  # a constant B packed in panels for the target's mask-free tile (fusion/compute.py), or the
        # searched one's (apply_tile repacks them)
        tile = c.tile if getattr(c, "tile", None) is not None else kernel.packed_b_tile
        if tile.lanes != kernel.lanes:
            raise ValueError(f"register tile {tile} is for {tile.lanes} lanes, the target has {kernel.lanes}")
        if packed_b != tile.ni * tile.lanes:
            raise ValueError(f"B is packed in panels of {packed_b} columns, the target's tile has "
                             f"{tile.ni * tile.lanes}")
    elif getattr(c, "tile", None) is not None:  # chosen by the tile search (onnxopt/tune); weights packed for it
        if c.tile.lanes != tile.lanes:
            raise ValueError(f"register tile {c.tile} is for {c.tile.lanes} lanes, the target has {tile.lanes}")
        tile = c.tile
    # ConvTranspose packs its weights for the default tile.
    if c.attrs.packed_ni not in (None, tile.ni) or c.attrs.packed_mi not in (None, tile.mi):
        raise ValueError(f"the weights are packed for another register tile than {tile}")
    b_format = b_format_for(c.attrs.b_dtype, target, tile.lanes) if packed_b else "f32"
    if c.op == "conv" and c.attrs.b_dtype is not None:  # a blocked convolution in a 16-bit type (lower_blocked_conv)
        b_format = conv_b_format(c, target, tile.lanes)
    spec = TileSpec(tile, region.program, tuple(c.extra_kinds), packed_a=c.op != "matmul", packed_b=packed_b,
                    b_format=b_format)
    # A convolution whose output stays in the blocked layout has its own tile (vectors of output channels).
    channel_vectors = c.attrs.out_blocked or c.attrs.channel_vectors
    mi, ni = tile.mi, tile.ni
    wino = int(c.attrs.winograd or 0)
    sets = []
    if wino:
        # The per-position products are blocked tiles with an empty epilogue; the epilogue runs in the output
        # transform (codegen/compute/winograd.py, glue winograd_exec.c).
        req = TileSetRequest("blocked", TileSpec(tile, identity_program(c.dtype), (), packed_a=True))
        sets.append(TileSetRequest("winograd", spec, winograd=wino, wino_kernel=tuple(c.attrs.kernel)))
    elif channel_vectors and is_depthwise(c):  # one channel vector times its filters
        kw, sw, dw = c.attrs.kernel[1], c.attrs.strides[1], c.attrs.dilations[1]
        mi, ni = depthwise_mi_for(kernel, kw), 1
        req = TileSetRequest("depthwise", spec, (mi, kw, sw, dw))
    else:
        req = TileSetRequest("blocked" if channel_vectors else "nchw", spec)
    tiles = req.names()
    a = c.attrs
    enum = dtype(c.dtype).onnx  # the graph's element type (fusion/compute.py), as the custom op declares it
    desc = CtKernelDesc(
        op_type=name, kind=c.op,
        # a packed B in a lower precision is op input 1 in its stored element type (the glue reads its size from
        # it): bfloat16, or its bits as uint16 before opset 13 (fusion/compute.py bfloat16_weights)
        in_types=[enum if i != 1 or c.attrs.b_dtype is None else _stored_type(region, c)
                  for i in range(len(region.inputs))],
        out_types=[enum] * len(region.outputs),
        mi=mi, ni=ni, lanes=tile.lanes, tiles=tiles,
        extra_kinds=list(c.extra_kinds), extra_nstride=list(c.extra_nstride),
        trans_a=int(a.trans_a),
    )
    if packed_b:
        desc.packed_b, desc.oc = packed_b, int(a.n)
        desc.schedule = tuple(int(v) for v in a.schedule) if a.schedule else (0, 0, 0, 0)
    if c.op in ("conv", "conv_transpose"):
        desc.oc, desc.groups, desc.ic_g = a.oc, a.groups, a.ic_g
        desc.kernel, desc.strides, desc.dilations = a.kernel, a.strides, a.dilations
        desc.pads, desc.auto_pad = a.pads, a.auto_pad
        desc.in_blocked, desc.out_blocked = int(a.in_blocked), int(a.out_blocked)
        desc.channel_vectors = int(a.channel_vectors)
        desc.transposed = int(c.op == "conv_transpose")
        desc.output_padding = tuple(a.output_padding or (0, 0))
    if wino:
        desc.winograd = wino
        desc.wino_in, desc.wino_out = sets[0].names()[0]
    # AMX tiles too, where the target has AMX-BF16 (AMX-FP16 for float16 pairs)
    if packed_b and b_format in AMX_DTYPE and c.op == "matmul":
        ins, _ = amx_choose(target, tile.lanes, AMX_DTYPE[b_format])
        if ins is not None:
            amx = TileSetRequest("amx", spec, matrix=ins.name, emulated=emulating())
            rows = amx.names()  # the tiles' rows, [round], then those writing bfloat16 (amx_tile.has_out16)
            desc.amx_tiles, (desc.amx_round,), desc.amx_tiles16 = rows[:AMX_GROUPS], rows[AMX_GROUPS], \
                rows[AMX_GROUPS + 1:]
            desc.matrix_instruction, desc.amx_emulated = ins.name, amx.emulated
            sets.append(amx)
    # a bf16 convolution, or one with float16 pairs: AMX tiles too (the blocked set runs where they cannot)
    if req.kind == "blocked" and (b_format == "bf16_dot" or c.attrs.b_pairs) and not wino:
        ins, why = amx_choose(target, tile.lanes, "f16" if c.attrs.b_dtype == "float16" else "bf16")
        if ins is None and c.attrs.b_pairs:
            raise ValueError(f"a convolution's float16 weights are in pairs for AMX-FP16 tiles: {why}")
        if ins is not None:
            amx = TileSetRequest("amx_conv", spec, matrix=ins.name, emulated=emulating())
            desc.amx_tiles = amx.names()
            desc.matrix_instruction, desc.amx_emulated = ins.name, amx.emulated
            sets.append(amx)
    return desc, [req] + sets


def _stored_type(region: Region, c) -> int:
    """The ONNX element type op input 1 (lower-precision weights) is stored in."""
    init = next((t for t in c.initializers if t.name == region.inputs[1]), None)
    return init.data_type if init is not None else dtype(c.attrs.b_dtype).onnx


# The AMX tiles' operand type for a packed-B format that has them (amx_tile.py).
AMX_DTYPE = {"bf16_dot": "bf16", "f16_pairs": "f16"}


def b_format_for(b_dtype: str | None, target: Target, lanes: int) -> str:
    """The packed-B tile's format (microkernel/outer_product.py, B_FORMATS) for weights stored as `b_dtype`:
    bfloat16 on vdpbf16ps where the target has avx512_bf16 (16 lanes), else widened to float32 in registers;
    float16 in pairs where the target has AMX-FP16 tiles (16 lanes), widened in registers for the rows they do not
    take."""
    if b_dtype in (None, "float32"):
        return "f32"
    if b_dtype == "bfloat16":
        return "bf16_dot" if target.has("avx512bf16") and lanes == 16 else "bf16"
    if b_dtype == "float16":  # elsewhere float16 is only stored, for the float32 tile (store_weights_f16)
        if amx_choose(target, lanes, "f16")[0] is None:
            raise ValueError(f"float16 weights in a kernel need AMX-FP16 tiles, which target {target.name} lacks")
        return "f16_pairs"
    raise ValueError(f"no packed-B kernel for weights stored as {b_dtype}")


def conv_b_format(c, target: Target, lanes: int) -> str:
    """The blocked convolution's tile format for its 16-bit weights: bfloat16 pairs on vdpbf16ps ("bf16_dot"), or
    the float32 tiles for float16 pairs (AMX-FP16's), which the glue unpacks into float32 where the tiles cannot
    run."""
    if c.attrs.b_dtype == "float16" and c.attrs.b_pairs and lanes == 16:
        return "f32"
    if c.attrs.b_dtype == "bfloat16" and target.has("avx512bf16") and lanes == 16:
        return "bf16_dot"
    raise ValueError(f"a convolution with {c.attrs.b_dtype} weights runs only on vdpbf16ps (bfloat16: avx512_bf16, 16 "
                     "lanes) or AMX-FP16 tiles (float16 pairs)")


def identity_program(elem: str = "float32") -> EwProgram:
    """The epilogue that stores the accumulator (of element type `elem`) as it is."""
    acc = Value("acc", elem)
    return EwProgram(inputs=[acc], consts={}, ops=[], outputs=[acc])
