/* An int8 convolution with its epilogue (onnxopt/kinds/qconv): ConvInteger -> Cast -> float ops, or a QDQ unit
   DequantizeLinear -> Conv -> QuantizeLinear with its requantization. */
#ifndef ONNXOPT_QCONV_H
#define ONNXOPT_QCONV_H
/* Included after glue.h (codegen/glue/kinds.py). */

#define QC_MAX_OUT 4
#define QC_MAX_EXTRA 8
#define QC_MAX_MR 8
#define QC_MAX_TAPS 64 /* the implicit form's kernel windows (find.py) */

typedef struct { /* mirrors the slots of lower.py */
  const int8_t *w;       /* the packed weights: [cout][k4] */
  const uint8_t *panel;  /* the packed activations of 16 output pixels: [k4 / 4][16][4]; implicit: the panel's
                            first pixel's window position per tap, const uint8_t *[taps] */
  int64_t k4q, azp, m0;  /* k4 / 4, the packed activations' zero point, the first output channel */
  const int32_t *vsum;   /* per channel: the sum of its weights less their zero point */
  const int32_t *dvec;   /* per channel: what each activation adds besides its weight (has_asum), or NULL */
  const int32_t *asum;   /* the panel's per-pixel sums of activations, or NULL */
  int64_t ncols;         /* valid pixels in the panel */
  int64_t out_off;       /* the element of (image, channel 0, the panel's first pixel) in the output */
  int64_t ohw;           /* elements between channels of the output (blocked: bytes between groups of 4) */
  const int32_t *fix_offsets, *fix_entries; /* per channel [cout + 1]; (a group's first k, its 4 s8 residuals) */
  int64_t chan_base;     /* image * cout: a CHANNEL input's index is (chan_base + channel) % its count */
  const int32_t *bias;   /* QUANT, or FLOAT with int_bias: the int32 bias per channel */
  const float *scale;    /* QUANT: x_scale * w_scale / y_scale per channel */
  int64_t taps, plane4, cin4q; /* implicit: kh * kw, bytes between channel groups of the input, cin4 / 4 */
  void *out[QC_MAX_OUT];
  const float *extra[QC_MAX_EXTRA];
  int64_t extra_count[QC_MAX_EXTRA];
  /* depthwise: the channel's input plane padded with the zero point, the weights [cout][taps] less their zero point,
     the padded plane's row length, the output rows [y0, y1), the output's width */
  const uint8_t *dw_in;
  const int32_t *dw_w;
  int64_t dw_wp, dw_y0, dw_y1, dw_ow;
  const uint8_t *lut; /* QUANT with a tail (lookup.py): [cout][256] output bytes, 4 bytes of slack */
} qc_tile;

typedef void (*qconv_tile_fn)(const int64_t *tile);
typedef struct {
  onnxopt_sig sig;
  int64_t cin, cout, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, k4;
  int64_t group; /* channels in independent groups; k4 is a group's reduction (k = tap with one input channel) */
  int mode; /* 0 FLOAT, 1 QUANT */
  int has_asum, has_fix;
  int flip;          /* the activations' top bit is flipped while packing (their zero point's too): s8 ones for a
                        u8 x s8 instruction, u8 ones for sdot (a - 128) */
  int packed_signed; /* the packed activations are s8 (sdot): sums and the zero point read them signed */
  int implicit;   /* stride 1: the tile reads the input laid out [c / 4][h + pads][w + pads][4] itself, no im2col */
  int depthwise;  /* one input channel per output channel: tiles[0] runs a channel's rows on its padded plane */
  int int_bias;   /* FLOAT: an int32 bias per channel input, added before the Cast */
  int in_blocked, out_blocked; /* the input, the output as [n][c / 4][h][w][4], channels past c zero (layout.py) */
  int lut;                     /* QUANT: the requantized values go through a table a channel (lookup.py) */
  int n_extra;
  int extra_kind[QC_MAX_EXTRA]; /* 0 POSITION, 1 CHANNEL, 3 SCALAR */
  int mr;
  int tasks; /* most tasks a call is split into */
  qconv_tile_fn tiles[QC_MAX_MR]; /* tiles[mi - 1]: mi output channels */
  int64_t half_cols;                   /* a panel of at most this many pixels runs on half_tiles (0: none) */
  qconv_tile_fn half_tiles[QC_MAX_MR]; /* tiles of one vector of pixels: the last, short panel of a row or plane */
} onnxopt_qconv_desc;

#endif
