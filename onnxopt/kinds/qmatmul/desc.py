"""The glue's description of one qmatmul op type (exec.c runs it), and its C initializer; the kind's contract with
its C (codegen/glue/contract.py): the limits, the tile's record `qm_tile` (lower.py reads its slots, exec.c fills it)
and the descriptor `onnxopt_qmatmul_desc`, whose C codegen/glue/kinds.py writes before glue.h."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxopt.codegen.glue.contract import ONNXOPT_SIG, ArgBlock, Contract, Field, FnType, Limit, Struct

from ..base import c_signature
from .params import PANEL

QM_MAX_OUT = Limit("QM_MAX_OUT", 4)
QM_MAX_EXTRA = Limit("QM_MAX_EXTRA", 8)
QM_MAX_MR = Limit("QM_MAX_MR", 8)
QM_MAX_AMX = Limit("QM_MAX_AMX", 4)
QM_MAX_WIDE = Limit("QM_MAX_WIDE", 8)
QMATMUL_TILE_FN = FnType("qmatmul_tile_fn", "void", "const int64_t *tile", "a tile (lower.py): a qm_tile")

QM_TILE = ArgBlock("qm_tile", [
    Field("a", "const uint8_t *"),
    Field("a_rs", "int64_t", comment="bytes between rows of A"),
    Field("b", "const int8_t *", comment="the panel: [K / 4][panel][4]"),
    Field("colsum", "const int32_t *", comment="the panel's column sums of B"),
    Field("k4", "int64_t"),
    Field("azp", "int64_t"),
    Field("m0", "int64_t"),
    Field("ldc", "int64_t"),
    Field("n0", "int64_t"),
    Field("ncols", "int64_t"),
    Field("fix", "const int32_t *", comment="the panel's corrections: (k, column, residual) triples (find.py)"),
    Field("nfix", "int64_t", comment="their count (a wide tile: of all its panels)"),
    Field("out", "float *", QM_MAX_OUT),
    Field("extra", "const float *", QM_MAX_EXTRA),
    Field("extra_rows", "int64_t", QM_MAX_EXTRA, "rows of a POSITION or CHANNEL input: row r reads its row "
                                                 "r % extra_rows"),
    Field("qscale", "const float *", comment="QUANT: the panel's a_scale * b_scale / y_scale per column"),
    Field("qbias", "const int32_t *", comment="QUANT with a bias: the panel's int32 bias per column"),
    Field("asum", "const int32_t *", comment="has_asum: per row of A, the sum of its a - za (rows from 0)"),
    Field("dvec", "const int32_t *", comment="has_asum: the panel's 128 - zw per column"),
    Field("fix_offsets", "const int32_t *", comment="a wide tile's: its first panel's entry in the offsets of "
                                                    "the corrections (where each of its panels' triples begin)"),
], prefix="QM_SLOT_", comment="a qmatmul tile's record (lower.py)")

QM_DESC = Struct("onnxopt_qmatmul_desc", [
    Field("sig", ONNXOPT_SIG),
    Field("k", "int64_t"),
    Field("n", "int64_t"),
    Field("panel", "int64_t"),
    Field("has_azp", "int"),
    Field("mode", "int", comment="0 FLOAT, 1 QUANT (the scale per column is the input after the corrections)"),
    Field("has_bias", "int", comment="QUANT: an int32 bias per column is the input after the scales"),
    Field("has_fix", "int", comment="inputs after the column sums: fix offsets [panels + 1], fix entries [count][3], "
                                    "and two tables of the function fallback's that the kernel does not read"),
    Field("has_asum", "int", comment="QUANT: inputs after the bias: 128 - zw per column (whole panels), and the "
                                     "function fallback's zero point, which the kernel does not read"),
    Field("n_extra", "int"),
    Field("extra_kind", "int", QM_MAX_EXTRA, "0 POSITION, 1 CHANNEL, 2 COLUMN, 3 SCALAR", partial=True),
    Field("mr", "int"),
    Field("tasks", "int", comment="most tasks a call is split into"),
    Field("tiles", QMATMUL_TILE_FN, QM_MAX_MR, "tiles[mi - 1]: mi rows", partial=True),
    Field("amx_groups", "int", comment="the most groups of 16 rows an AMX tile takes (0: no AMX tiles)"),
    Field("amx_tiles", QMATMUL_TILE_FN, QM_MAX_AMX, "amx_tiles[g - 1]: 16 g rows on AMX, run only where the CPU "
                                                     "and the OS allow it (glue/matrix_engine.c)", partial=True),
    Field("wide_panels", "int", comment="panels a wide tile takes side by side (0: no wide tiles)"),
    Field("wide_rows", "int", comment="rows of the largest wide tile"),
    Field("wide", QMATMUL_TILE_FN, QM_MAX_WIDE, "wide[mi - 1]: mi rows x wide_panels panels (lower.py "
                                                 "wide_shape)", partial=True),
], comment="an int8 GEMM with its float epilogue (exec.c)")

CONTRACT = Contract("onnxopt/kinds/qmatmul/desc.py", [QM_MAX_OUT, QM_MAX_EXTRA, QM_MAX_MR, QM_MAX_AMX, QM_MAX_WIDE,
                                                     QMATMUL_TILE_FN, QM_TILE, QM_DESC])


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
    has_asum: bool = False  # QUANT: u8 weights stored as B - 128, with the row term (params.py)
    amx_tiles: list[str] = field(default_factory=list)  # amx_tiles[g - 1]: 16 g rows on AMX (amx.py)
    matrix_instruction: str = ""  # what the AMX tiles run on ("" for none)
    amx_emulated: bool = False  # the tiles were built as plain code (tile_program.emulating: tests)
    wide_tiles: list[str] = field(default_factory=list)  # wide_tiles[mi - 1]: mi rows x wide_panels panels
    wide_panels: int = 0

    @property
    def uses_amx(self) -> bool:
        return bool(self.amx_tiles)

    def c_source(self, prefix: str) -> str:
        """Declarations and the descriptor `<prefix>_desc` (onnxopt_qmatmul_desc: QM_DESC above, by member name)."""
        decls, sig = c_signature(prefix, self.op_type, "KIND_QMATMUL", self.in_types, self.out_types)
        externs = "".join(f"extern void {t}(const int64_t *);\n" for t in self.tiles + self.amx_tiles +
                          self.wide_tiles)
        return f"{externs}{decls}static const onnxopt_qmatmul_desc {prefix}_desc = " + QM_DESC.initializer({
            "sig": sig, "k": self.k, "n": self.n, "panel": PANEL, "has_azp": self.has_azp, "mode": self.mode,
            "has_bias": self.has_bias, "has_asum": self.has_asum, "has_fix": self.has_fix,
            "n_extra": len(self.extra_kinds),
            "extra_kind": list(self.extra_kinds), "mr": self.mr, "tasks": self.tasks,
            "tiles": list(self.tiles), "amx_groups": len(self.amx_tiles), "amx_tiles": list(self.amx_tiles),
            "wide_panels": self.wide_panels, "wide_rows": len(self.wide_tiles), "wide": list(self.wide_tiles)}) + ";\n"
