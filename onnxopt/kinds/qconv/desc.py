"""The glue's description of one qconv op type (exec.c runs it), and its C initializer; the kind's contract with its
C (codegen/glue/contract.py): the limits, the tile's record `qc_tile` (lower.py reads its slots, exec.c fills it)
and the descriptor `onnxopt_qconv_desc`, whose C codegen/glue/kinds.py writes before glue.h."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxopt.codegen.glue.contract import ONNXOPT_SIG, ArgBlock, Contract, Field, FnType, Limit, Struct

from ..base import c_signature

QC_MAX_OUT = Limit("QC_MAX_OUT", 4)
QC_MAX_EXTRA = Limit("QC_MAX_EXTRA", 8)
QC_MAX_MR = Limit("QC_MAX_MR", 8)
QC_MAX_TAPS = Limit("QC_MAX_TAPS", 64, "the implicit form's kernel windows (find.py)")
QC_MAX_AMX = Limit("QC_MAX_AMX", 4)
QC_MAX_WIDE = Limit("QC_MAX_WIDE", 8)
QCONV_TILE_FN = FnType("qconv_tile_fn", "void", "const int64_t *tile", "a tile (lower.py): a qc_tile")

QC_TILE = ArgBlock("qc_tile", [
    Field("w", "const int8_t *", comment="the packed weights: [cout][k4]"),
    Field("panel", "const uint8_t *", comment="the packed activations of 16 output pixels: [k4 / 4][16][4]; "
                                              "implicit: the panel's first pixel's window position per tap, "
                                              "const uint8_t *[taps]"),
    Field("k4q", "int64_t", comment="k4 / 4"),
    Field("azp", "int64_t", comment="the packed activations' zero point"),
    Field("m0", "int64_t", comment="the first output channel"),
    Field("vsum", "const int32_t *", comment="per channel: the sum of its weights less their zero point"),
    Field("dvec", "const int32_t *", comment="per channel: what each activation adds besides its weight "
                                             "(has_asum), or NULL"),
    Field("asum", "const int32_t *", comment="the panel's per-pixel sums of activations, or NULL"),
    Field("ncols", "int64_t", comment="valid pixels in the panel"),
    Field("out_off", "int64_t", comment="the element of (image, channel 0, the panel's first pixel) in the output"),
    Field("ohw", "int64_t", comment="elements between channels of the output (blocked: bytes between groups of 4)"),
    Field("fix_offsets", "const int32_t *", comment="per channel [cout + 1]"),
    Field("fix_entries", "const int32_t *", comment="(a group's first k, its 4 s8 residuals)"),
    Field("chan_base", "int64_t", comment="image * cout: a CHANNEL input's index is (chan_base + channel) % its "
                                          "count"),
    Field("bias", "const int32_t *", comment="QUANT, or FLOAT with int_bias: the int32 bias per channel"),
    Field("scale", "const float *", comment="QUANT: x_scale * w_scale / y_scale per channel"),
    Field("taps", "int64_t", comment="implicit: kh * kw"),
    Field("plane4", "int64_t", comment="implicit: bytes between channel groups of the input"),
    Field("cin4q", "int64_t", comment="implicit: cin4 / 4"),
    Field("out", "void *", QC_MAX_OUT),
    Field("extra", "const float *", QC_MAX_EXTRA),
    Field("extra_count", "int64_t", QC_MAX_EXTRA),
    Field("dw_in", "const uint8_t *", comment="depthwise: the channel's input plane padded with the zero point"),
    Field("dw_w", "const int32_t *", comment="depthwise: the weights [cout][taps] less their zero point"),
    Field("dw_wp", "int64_t", comment="depthwise: the padded plane's row length"),
    Field("dw_y0", "int64_t", comment="depthwise: the output rows [y0, y1)"),
    Field("dw_y1", "int64_t"),
    Field("dw_ow", "int64_t", comment="depthwise: the output's width"),
    Field("lut", "const uint8_t *", comment="QUANT with a tail (lookup.py): [cout][256] output bytes, 4 bytes of "
                                            "slack"),
    Field("bias_rest", "const float *", comment="QUANT with bias_rest: per channel, the part of a float bias below "
                                                "the sums' step, in output steps, added after the scale"),
], prefix="QC_SLOT_", comment="a qconv tile's record (lower.py)")

QC_DESC = Struct("onnxopt_qconv_desc", [
    Field("sig", ONNXOPT_SIG),
    *(Field(n, "int64_t") for n in ("cin", "cout", "kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", "dh", "dw", "k4")),
    Field("group", "int64_t", comment="channels in independent groups; k4 is a group's reduction (k = tap with one "
                                      "input channel)"),
    Field("mode", "int", comment="0 FLOAT, 1 QUANT"),
    Field("has_asum", "int"),
    Field("has_fix", "int"),
    Field("flip", "int", comment="the activations' top bit is flipped while packing (their zero point's too): s8 "
                                 "ones for a u8 x s8 instruction, u8 ones for sdot (a - 128)"),
    Field("packed_signed", "int", comment="the packed activations are s8 (sdot): sums and the zero point read them "
                                          "signed"),
    Field("implicit", "int", comment="stride 1: the tile reads the input laid out [c / 4][h + pads][w + pads][4] "
                                     "itself, no im2col"),
    Field("depthwise", "int", comment="one input channel per output channel: tiles[0] runs a channel's rows on its "
                                      "padded plane"),
    Field("int_bias", "int", comment="FLOAT: an int32 bias per channel input, added before the Cast"),
    Field("in_blocked", "int", comment="the input, the output as [n][c / 4][h][w][4], channels past c zero "
                                       "(layout.py)"),
    Field("out_blocked", "int"),
    Field("lut", "int", comment="QUANT: the requantized values go through a table a channel (lookup.py)"),
    Field("bias_rest", "int", comment="QUANT: a float per channel input after the scales, added after the scale"),
    Field("n_extra", "int"),
    Field("extra_kind", "int", QC_MAX_EXTRA, "0 POSITION, 1 CHANNEL, 3 SCALAR", partial=True),
    Field("mr", "int"),
    Field("tasks", "int", comment="most tasks a call is split into"),
    Field("tiles", QCONV_TILE_FN, QC_MAX_MR, "tiles[mi - 1]: mi output channels", partial=True),
    Field("half_cols", "int64_t", comment="a panel of at most this many pixels runs on half_tiles (0: none)"),
    Field("half_tiles", QCONV_TILE_FN, QC_MAX_MR, "tiles of one vector of pixels: the last, short panel of a row "
                                                  "or plane", partial=True),
    Field("amx_groups", "int", comment="the most groups of 16 channels an AMX tile takes (0: no AMX tiles)"),
    Field("amx_tiles", QCONV_TILE_FN, QC_MAX_AMX, "amx_tiles[g - 1]: 16 g channels on AMX, run only where the CPU "
                                                   "and the OS allow it (glue/matrix_engine.c)", partial=True),
    Field("wide_panels", "int", comment="panels a wide tile takes side by side (0: no wide tiles)"),
    Field("wide_rows", "int", comment="channels of the largest wide tile"),
    Field("wide", QCONV_TILE_FN, QC_MAX_WIDE, "wide[mi - 1]: mi channels x wide_panels panels of one image's "
                                              "consecutive pixels (lower.py wide_shape)", partial=True),
], comment="an int8 convolution with its epilogue (exec.c)")

CONTRACT = Contract("onnxopt/kinds/qconv/desc.py", [QC_MAX_OUT, QC_MAX_EXTRA, QC_MAX_MR, QC_MAX_TAPS, QC_MAX_AMX,
                                                   QC_MAX_WIDE, QCONV_TILE_FN, QC_TILE, QC_DESC])


@dataclass
class QConvKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    params: object  # QConvParams
    mr: int  # output channels of the largest tile; tiles[mi - 1] takes mi
    tiles: list[str]
    instruction: str  # what the K loop runs on (the report's)
    packed_signed: bool = False  # the instruction takes s8 activations (sdot): they are packed as s8
    half_cols: int = 0  # a panel of at most this many pixels runs on half_tiles (one vector of lanes)
    half_tiles: list[str] | None = None
    amx_tiles: list[str] = field(default_factory=list)  # amx_tiles[g - 1]: 16 g channels on AMX (amx.py)
    matrix_instruction: str = ""  # what the AMX tiles run on ("" for none)
    amx_emulated: bool = False  # the tiles were built as plain code (tile_program.emulating: tests)
    wide_tiles: list[str] = field(default_factory=list)  # wide_tiles[mi - 1]: mi channels x wide_panels panels
    wide_panels: int = 0

    @property
    def uses_amx(self) -> bool:
        return bool(self.amx_tiles)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_qconv_desc: QC_DESC above, by member name)."""
        p = self.params
        decls, sig = c_signature(prefix, self.op_type, "KIND_QCONV", self.in_types, self.out_types)
        half = self.half_tiles or []
        externs = "".join(f"extern void {t}(const int64_t *);\n" for t in self.tiles + half + self.amx_tiles +
                          self.wide_tiles)
        geometry = dict(zip(("cin", "cout", "kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", "dh", "dw", "k4", "group"),
                            (p.cin, p.cout, *p.kernel, *p.strides, *p.pads, *p.dilations, p.k4, p.group), strict=True))
        return f"{externs}{decls}static const onnxopt_qconv_desc {prefix}_desc = " + QC_DESC.initializer({
            "sig": sig, **geometry, "mode": p.mode, "has_asum": p.has_asum, "has_fix": p.has_fix,
            "flip": p.act_signed != self.packed_signed, "packed_signed": self.packed_signed, "implicit": p.implicit,
            "depthwise": p.depthwise, "int_bias": p.int_bias, "in_blocked": p.in_blocked,
            "out_blocked": p.out_blocked, "lut": p.lut, "bias_rest": p.bias_rest, "n_extra": len(p.extra_kinds),
            "extra_kind": list(p.extra_kinds), "mr": self.mr, "tasks": p.tasks, "tiles": list(self.tiles),
            "half_cols": self.half_cols, "half_tiles": list(half), "amx_groups": len(self.amx_tiles),
            "amx_tiles": list(self.amx_tiles), "wide_panels": self.wide_panels, "wide_rows": len(self.wide_tiles),
            "wide": list(self.wide_tiles)}) + ";\n"
