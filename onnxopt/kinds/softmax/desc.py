"""The glue's description of one softmax op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SoftmaxKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    axis: int
    rows: str  # the generated function: rows(const float *x, float *y, int64_t rows, int64_t n)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_softmax_desc, glue.h)."""
        ins = ", ".join(str(t) for t in self.in_types)
        outs = ", ".join(str(t) for t in self.out_types)
        return (f"extern void {self.rows}(const float *, float *, int64_t, int64_t);\n"
                f"static const int {prefix}_in_types[] = {{{ins}}};\n"
                f"static const int {prefix}_out_types[] = {{{outs}}};\n"
                f'static const onnxopt_softmax_desc {prefix}_desc = {{{{"{self.op_type}", KIND_SOFTMAX, '
                f"{len(self.in_types)}, {len(self.out_types)}, {prefix}_in_types, {prefix}_out_types}}, "
                f"{self.axis}, {self.rows}}};\n")
