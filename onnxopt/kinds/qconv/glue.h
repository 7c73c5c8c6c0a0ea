/* An int8 convolution with its epilogue (onnxopt/kinds/qconv): ConvInteger -> Cast -> float ops, or a QDQ unit
   DequantizeLinear -> Conv -> QuantizeLinear with its requantization. */
#ifndef ONNXOPT_QCONV_H
#define ONNXOPT_QCONV_H
/* Included after glue.h (codegen/glue/kinds.py). The limits QC_MAX_OUT, QC_MAX_EXTRA, QC_MAX_MR, QC_MAX_TAPS, the
   tile's record qc_tile (lower.py reads its slots), the tile type qconv_tile_fn and the descriptor
   onnxopt_qconv_desc are declared in desc.py (CONTRACT, codegen/glue/contract.py); the translation units hold their
   generated C before this header. */

#endif
