#ifndef ONNXOPT_COMPUTE_H
#define ONNXOPT_COMPUTE_H
#include "glue.h"

/* A convolution or matmul with its fused epilogue (compute_exec.c runs it). */
typedef void (*tile_fn)(const int64_t *tile);
typedef struct {
  onnxopt_sig sig;
  int mi, ni, lanes;            /* the micro-kernel's register tile */
  const tile_fn *tiles;         /* [mi - 1][nv - 1] */
  int n_extra;                  /* epilogue inputs after the accumulator: op inputs 2.. */
  const int *extra_kind;        /* POSITION, CHANNEL, COLUMN, SCALAR (tile.py) */
  const int64_t *extra_nstride; /* elements between batch items, 0 when shared by the batch */
  /* Conv: weights packed [groups][ceil(oc_g / mi)][ic_g * kh * kw][mi] (op input 1). */
  int64_t oc, groups, kh, kw, sh, sw, dh, dw, pads[4]; /* pads: top, left, bottom, right */
  int auto_pad;                 /* 0 explicit/VALID, 1 SAME_UPPER, 2 SAME_LOWER */
  int64_t ic_g;
  /* MatMul/Gemm: A row-major, or transposed (Gemm transA). packed_b > 0: B is constant and packed in panels
     [ceil(N / packed_b)][K][packed_b], zero-padded, N in `oc` (op input 1 is the packed tensor). */
  int trans_a;
  int packed_b;
  /* Conv layouts: the input, and the outputs with their per-pixel epilogue inputs, in the blocked layout
     [N][C / lanes][H][W][lanes] (compute_exec.c, ct_conv_blocked). A blocked output has weights packed
     [ceil(oc / (ni * lanes))][ic_g * kh * kw][ni * lanes]. */
  int in_blocked, out_blocked;
  int channel_vectors; /* the blocked kernel (vectors of output channels) even though the outputs are NCHW */
  /* ConvTranspose (always on the blocked kernel): op input 0 is [N, IC, H, W] (ic_g = IC), weights packed
     [ceil(oc / (ni * lanes))][sh][sw][ceil(kh / sh)][ceil(kw / sw)][IC][ni * lanes], or with few output
     channels (channel_vectors 0) [sh][sw][ceil(oc / mi)][ceil(kh / sh)][ceil(kw / sw)][IC][mi] (compute_exec.c). */
  int transposed;
  int64_t out_pad[2]; /* output_padding: rows, columns */
  /* Winograd F(m x m, 3 x 3) (winograd_exec.c), m > 0: `tiles` are the per-position products (empty epilogue),
     weights packed [ceil(oc / (ni * lanes))][(m + 2)^2][ic][ni * lanes]; the transforms (codegen/compute/winograd.py)
     run the epilogue. */
  int wino_m;
  tile_fn wino_in, wino_out;
} onnxopt_ct_desc;

#endif
