/* An LSTM or a GRU as one kernel: the input projection of all steps, then the steps (onnxopt/kinds/recurrent). */
#ifndef ONNXOPT_RECURRENT_H
#define ONNXOPT_RECURRENT_H
/* Included after glue.h (codegen/glue/kinds.py). */

#define RECURRENT_BLOCK 16 /* hidden units a packed block holds (params.py BLOCK) */
#define RECURRENT_SLOTS 64 /* floats of gx and of the bias a block: 4 slots of RECURRENT_BLOCK (find.py SLOTS) */

/* lower.py: gx[row * gx_stride + block * 64 + slot * 16 + unit] = bias + x[row] . W, for the blocks b0 .. b1 */
typedef void (*recurrent_proj_fn)(const float *x, const void *wp, const float *bp, float *gx, int64_t rows,
                                  int64_t in_size, int64_t gx_stride, int64_t b0, int64_t b1);
/* lower.py: one step of one direction for the blocks b0 .. b1: c updated in place, h_next written */
typedef void (*recurrent_step_fn)(const void *rp, const float *gx, int64_t gx_stride, const float *h_prev,
                                  float *h_next, float *c, int64_t rows, int64_t hp, int64_t hidden, int64_t b0,
                                  int64_t b1);
typedef struct {
  onnxopt_sig sig;
  int gates;        /* 4: an LSTM (i, o, f, c); 3: a GRU (z, r, h) */
  int weight_bytes; /* of the packed W and R: 4 (float32) or 2 (bfloat16, kinds/recurrent/precision.py) */
  int directions; /* 1 or 2 (forward, then reverse) */
  int reverse;    /* a single direction that runs from the last step */
  int hidden, input_size;
  int has_h0, has_c0;            /* inputs 4 and 5 (or 4 alone) are initial_h and an LSTM's initial_c */
  int out_y, out_yh, out_yc;     /* which of Y, Y_h, Y_c the op writes, in that order */
  int serpentine;                /* odd steps run the blocks from the last (exec.c) */
  recurrent_proj_fn proj;
  recurrent_step_fn step;
} onnxopt_recurrent_desc;

#endif
