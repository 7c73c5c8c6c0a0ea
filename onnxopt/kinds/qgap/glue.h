/* A QDQ GlobalAveragePool unit in int8 (onnxopt/kinds/qgap). */
#ifndef ONNXOPT_QGAP_H
#define ONNXOPT_QGAP_H
/* Included after glue.h (codegen/glue/kinds.py). */

typedef void (*qgap_sums_fn)(const void *x, int32_t *out, int64_t planes, int64_t hw);
typedef struct {
  onnxopt_sig sig;
  qgap_sums_fn sums; /* lower.py: each plane's exact int32 sum */
  float x_scale;     /* the DequantizeLinear's step */
  int x_zero;
  float y_scale; /* the QuantizeLinear's */
  int y_zero;
  int is_signed; /* int8 (else uint8), in and out */
} onnxopt_qgap_desc;

#endif
