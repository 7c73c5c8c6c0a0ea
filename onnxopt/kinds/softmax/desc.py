"""The glue's description of one softmax op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from onnxopt.dtypes import from_onnx

from ..base import c_signature


@dataclass
class SoftmaxKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    axis: int
    columns: bool  # the dims after `axis` are columns (lower.py define_columns), else they are part of a row
    rows: str  # the generated function: f(const float *x, float *y, int64_t count, int64_t n, int64_t inner)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_softmax_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_SOFTMAX", self.in_types, self.out_types)
        ct = from_onnx(self.in_types[0]).c  # the element's C type
        return (f"extern void {self.rows}(const {ct} *, {ct} *, int64_t, int64_t, int64_t);\n{decls}"
                f"static const onnxopt_softmax_desc {prefix}_desc = "
                f"{{{sig}, {self.axis}, {int(self.columns)}, {self.rows}}};\n")
