/* An int8 GEMM with its float epilogue (onnxopt/kinds/qmatmul): MatMulInteger -> Cast -> Mul -> Add ... */
#ifndef ONNXOPT_QMATMUL_H
#define ONNXOPT_QMATMUL_H
/* Included after glue.h (codegen/glue/kinds.py). The limits QM_MAX_OUT, QM_MAX_EXTRA, QM_MAX_MR, the tile's record
   qm_tile (lower.py reads its slots), the tile type qmatmul_tile_fn and the descriptor onnxopt_qmatmul_desc are
   declared in desc.py (CONTRACT, codegen/glue/contract.py); the translation units hold their generated C before this
   header. */

#endif
