"""The glue's description of one QDQ GlobalAveragePool op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import c_signature


@dataclass
class QGapKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    sums: str  # the generated function: sums(const int8 *x, int32_t *out, int64_t planes, int64_t hw)
    x_scale: float
    x_zero: int
    y_scale: float
    y_zero: int
    signed: bool

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_qgap_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_QGAP", self.in_types, self.out_types)
        return (f"extern void {self.sums}(const void *, int32_t *, int64_t, int64_t);\n{decls}"
                f"static const onnxopt_qgap_desc {prefix}_desc = {{{sig}, {self.sums}, {float(self.x_scale)!r}f, "
                f"{int(self.x_zero)}, {float(self.y_scale)!r}f, {int(self.y_zero)}, {int(self.signed)}}};\n")
