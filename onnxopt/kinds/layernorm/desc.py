"""The glue's description of one layernorm op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from onnxopt.dtypes import from_onnx

from ..base import c_signature


@dataclass
class LayerNormKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    residual: bool
    sum_output: bool
    has_bias: bool
    rows: str  # the generated function (glue.h layernorm_rows_fn)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_layernorm_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_LAYERNORM", self.in_types, self.out_types)
        ct = from_onnx(self.in_types[0]).c  # the element's C type
        return (f"extern void {self.rows}(const {ct} *, const {ct} *, const {ct} *, const {ct} *, {ct} *, "
                f"{ct} *, int64_t, int64_t);\n{decls}"
                f"static const onnxopt_layernorm_desc {prefix}_desc = {{{sig}, {int(self.residual)}, "
                f"{int(self.sum_output)}, {int(self.has_bias)}, {self.rows}}};\n")
