"""The glue's description of one attention op type (exec.c runs it), and its C initializer."""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from onnxopt.dtypes import from_onnx

from ..base import c_signature

MASK_KINDS = {"none": 0, "add": 1, "select": 2, "fill": 3}


def kernel_function(module, name: str):
    """(a kernel function with glue.h's attention_fn signature, a builder at its entry): the float32 kernel
    (lower.py) and the 16-bit one (amx.py) both have it (lower.py's docstring names the arguments)."""
    i64, ptr = ir.IntType(64), ir.PointerType()
    args = [ptr, i64, ptr, i64, ptr, i64, ptr, i64, ptr, i64, i64, i64, i64, i64, ptr, i64]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)
    for i in (0, 2, 4, 6, 8, 14):  # q, kp, vp, mask, out, s
        fn.args[i].add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


@dataclass
class AttentionKernelDesc:
    op_type: str
    in_types: list[int]
    out_types: list[int]
    k_transposed: bool
    mask_kind: str
    block: int  # the kernel's column block: score rows are padded to it, K^T and V packed in panels of it
    rows_block: int  # query rows of the micro-kernel: a task's rows are a multiple of it
    min_tasks: int  # the schedule (schedule.py): fewer rows a task rather than fewer tasks than this
    fn: str  # the generated function (glue.h attention_fn)
    rank: int = 0  # of q, k, v and the output, where perms are given
    perms: tuple = ((), (), (), ())  # AttentionParams.perms
    amx_fn: str = ""  # the bf16 kernel on AMX tiles (amx.py), run where the CPU and the OS allow them; "" for none
    matrix_instruction: str = ""  # what its tiles run on (the report's)
    amx_emulated: bool = False  # the tiles were built as plain code (tile_program.emulating: tests)
    amx_f16: bool = False  # its tiles take float16 (tdpfp16ps, AMX-FP16), else bfloat16
    amx_min_keys: int = 0  # the fewest keys it runs for (amx.py MIN_KEYS); fewer run the float32 kernel
    middle_softmax: bool = True  # a softmax between the products (else a plain chain's none or Relu)
    key_floats: int = 0  # the float32 kernel's K^T, V and scores a block of keys may take (capacity.py); 0: whole rows

    @property
    def uses_amx(self) -> bool:
        return bool(self.amx_fn)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_attention_desc, glue.h)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_ATTENTION", self.in_types, self.out_types)
        perms = ", ".join("{" + ", ".join(str(x) for x in (p or range(self.rank)) or [0]) + "}" for p in self.perms)
        elem = from_onnx(self.in_types[0])
        ct, acc = elem.c, elem.accumulator.c  # q, K^T and V panels, the output; the scores' scratch
        externs = "".join(f"extern void {fn}(const {ct} *, int64_t, const {ct} *, int64_t, const {ct} *, int64_t, "
                          f"const void *, int64_t, {ct} *, int64_t, int64_t, int64_t, int64_t, int64_t, {acc} *, "
                          "int64_t);\n" for fn in (self.fn, self.amx_fn) if fn)
        return (f"{externs}{decls}static const onnxopt_attention_desc {prefix}_desc = {{{sig}, "
                f"{int(self.k_transposed)}, {MASK_KINDS[self.mask_kind]}, {self.block}, {self.rows_block}, "
                f"{self.min_tasks}, {self.fn}, {int(any(self.perms))}, {{{perms}}}, {self.amx_fn or 'NULL'}, "
                f"{int(self.amx_f16)}, {self.amx_min_keys}, {int(self.middle_softmax)}, {self.key_floats}}};\n")
