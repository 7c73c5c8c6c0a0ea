"""The glue's description of one qconv op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import c_signature


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

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_qconv_desc, glue.h)."""
        p = self.params
        decls, sig = c_signature(prefix, self.op_type, "KIND_QCONV", self.in_types, self.out_types)
        half = self.half_tiles or []
        externs = "".join(f"extern void {t}(const int64_t *);\n" for t in self.tiles + half)
        geometry = [p.cin, p.cout, *p.kernel, *p.strides, *p.pads, *p.dilations, p.k4, p.group]
        kinds = ", ".join(str(k) for k in p.extra_kinds) or "0"
        return (f"{externs}{decls}static const onnxopt_qconv_desc {prefix}_desc = {{{sig}, "
                f"{', '.join(str(v) for v in geometry)}, {p.mode}, {int(p.has_asum)}, {int(p.has_fix)}, "
                f"{int(p.act_signed != self.packed_signed)}, {int(self.packed_signed)}, {int(p.implicit)}, "
                f"{int(p.depthwise)}, {int(p.int_bias)}, {int(p.in_blocked)}, {int(p.out_blocked)}, {int(p.lut)}, "
                f"{len(p.extra_kinds)}, {{{kinds}}}, {self.mr}, {p.tasks}, {{{', '.join(self.tiles)}}}, "
                f"{self.half_cols}, {{{', '.join(half) or '0'}}}}};\n")
