"""The glue's description of one qmatmul op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import c_signature
from .params import PANEL


@dataclass
class QMatMulKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    k: int
    n: int
    has_azp: bool
    has_fix: bool
    extra_kinds: list[int]
    mr: int  # rows of the largest tile; tiles[mi - 1] takes mi rows
    tiles: list[str]
    instruction: str  # what the K loop runs on (the report's)
    tasks: int = 16  # most tasks a call is split into
    mode: int = 0  # 0 FLOAT, 1 QUANT
    has_bias: bool = False  # QUANT: an int32 bias per column

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_qmatmul_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_QMATMUL", self.in_types, self.out_types)
        externs = "".join(f"extern void {t}(const int64_t *);\n" for t in self.tiles)
        kinds = ", ".join(str(k) for k in self.extra_kinds) or "0"
        tiles = ", ".join(self.tiles)
        return (f"{externs}{decls}static const onnxopt_qmatmul_desc {prefix}_desc = {{{sig}, {self.k}, {self.n}, "
                f"{PANEL}, {int(self.has_azp)}, {self.mode}, {int(self.has_bias)}, {int(self.has_fix)}, "
                f"{len(self.extra_kinds)}, {{{kinds}}}, "
                f"{self.mr}, {self.tasks}, {{{tiles}}}}};\n")
