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
    rows: str  # the generated function: rows(const float *x, float *y, int64_t rows, int64_t n)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_softmax_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_SOFTMAX", self.in_types, self.out_types)
        ct = from_onnx(self.in_types[0]).c  # the element's C type
        return (f"extern void {self.rows}(const {ct} *, {ct} *, int64_t, int64_t);\n{decls}"
                f"static const onnxopt_softmax_desc {prefix}_desc = {{{sig}, {self.axis}, {self.rows}}};\n")
