/* An int8 GEMM with its float epilogue (onnxopt/kinds/qmatmul): MatMulInteger -> Cast -> Mul -> Add ... */
#ifndef ONNXOPT_QMATMUL_H
#define ONNXOPT_QMATMUL_H
/* Included after glue.h (codegen/glue/kinds.py). */

#define QM_MAX_OUT 4
#define QM_MAX_EXTRA 8
#define QM_MAX_MR 8

typedef struct { /* mirrors the slots of lower.py */
  const uint8_t *a;
  int64_t a_rs;          /* bytes between rows of A */
  const int8_t *b;       /* the panel: [K / 4][panel][4] */
  const int32_t *colsum; /* the panel's column sums of B */
  int64_t k4, azp, m0, ldc, n0, ncols;
  const int32_t *fix; /* the panel's corrections: (k, column, residual) triples (find.py) */
  int64_t nfix;
  float *out[QM_MAX_OUT];
  const float *extra[QM_MAX_EXTRA];
  int64_t extra_rows[QM_MAX_EXTRA]; /* rows of a POSITION or CHANNEL input: row r reads its row r % extra_rows */
  const float *qscale; /* QUANT: the panel's a_scale * b_scale / y_scale per column */
  const int32_t *qbias; /* QUANT with a bias: the panel's int32 bias per column */
} qm_tile;

typedef void (*qmatmul_tile_fn)(const int64_t *tile);
typedef struct {
  onnxopt_sig sig;
  int64_t k, n, panel;
  int has_azp;
  int mode;    /* 0 FLOAT, 1 QUANT (the scale per column is the input after the corrections) */
  int has_bias; /* QUANT: an int32 bias per column is the input after the scales */
  int has_fix; /* inputs after the column sums: fix offsets [panels + 1], fix entries [count][3], and two tables of
                  the function fallback's that the kernel does not read */
  int n_extra;
  int extra_kind[QM_MAX_EXTRA]; /* 0 POSITION, 1 CHANNEL, 2 COLUMN, 3 SCALAR */
  int mr;
  int tasks; /* most tasks a call is split into */
  qmatmul_tile_fn tiles[QM_MAX_MR]; /* tiles[mi - 1]: mi rows */
} onnxopt_qmatmul_desc;

#endif
