"""Cases onnxruntime passes but onnxopt breaks today: onnxopt bugs, marked xfail(strict=True, raises=...) so the
suite stays green, a different failure in these cases still fails, and a fix shows up as XPASS(strict) -- then
delete the case's line here.

id -> (exception type the case fails with, precise reason)
"""

from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail

from onnxopt.errors import OnnxoptError

_IR3_INITIALIZER = (
    "onnxopt bug: IR version 3 model (opset 9): constant folding turns Constant nodes into initializers, but the "
    "fused model keeps ir_version=3 without listing them as graph inputs, so optimize() raises "
    "OnnxoptError('internal error: the fused model fails the ONNX checker (1 in initializer but not in graph input)')"
)

_UNKNOWN_INPUT_SHAPE = (
    "onnxopt bug: fusion/elementwise.py _make_region -> expected_masks crashes with TypeError('NoneType' object is "
    "not iterable) when a region's boundary input has no inferred shape (shape_of() is None; e.g. Add+Cast region, "
    "inputs AttnBias (4, 6) and MaskTri unknown, in test_attention_4d_causal_expanded); admits() only checks the "
    "output shape. Should reject the region instead of raising out of optimize()"
)

_SEQUENCE_OUTPUT = (
    "onnxopt bug: pipeline._infer runs onnxruntime's SymbolicShapeInference, which rewrites the sequence-typed graph "
    "output y (seq(tensor(float))) as tensor(float) without a shape (and adds it to value_info); optimize() then "
    "raises OnnxoptError('internal error: the fused model fails the ONNX checker (Field 'shape' of 'type' is "
    "required but missing.)')"
)

_IF_CONDITION_FOLDED = (
    "onnxopt bug: constant folding turns the If conditions (Equal(Size(size), 4)) into initializers; onnxruntime's "
    "If constant folding (ORT_ENABLE_BASIC and up) then inlines the branch and its Range node fails shape "
    "inference, so the fused model does not load: Fail('[ShapeInferenceError] Input to 'Range' op should be "
    "scalars'). Loads with ORT_DISABLE_ALL only; optimize(verify=False) writes it without noticing"
)

_WRONG_SYMBOLIC_SHAPES = (
    "onnxopt bug: pipeline._infer's SymbolicShapeInference(auto_merge=True) infers XToRotate/XNoRotate/XRotated as "
    "[2,3,4,4] (real: [2,3,4,8], [2,3,4,0], [2,3,4,8]); these wrong shapes are written into the fused model's "
    "value_info and onnxruntime fails at run time: Fail('Reshape ... Input shape:{2,3,4,4,2}, requested "
    "shape:{2,3,4,4}'). The same model with its value_info removed passes"
)

KNOWN_FAILURES: dict[str, tuple[type[BaseException], str]] = {
    "test_operator_repeat": (OnnxoptError, _IR3_INITIALIZER),
    "test_operator_repeat_dim_overflow": (OnnxoptError, _IR3_INITIALIZER),
    "test_PixelShuffle": (OnnxoptError, _IR3_INITIALIZER),
    "test_identity_sequence": (OnnxoptError, _SEQUENCE_OUTPUT),
    "test_affine_grid_2d_expanded": (OrtFail, _IF_CONDITION_FOLDED),
    "test_affine_grid_2d_align_corners_expanded": (OrtFail, _IF_CONDITION_FOLDED),
    "test_rotary_embedding_interleaved_expanded": (OrtFail, _WRONG_SYMBOLIC_SHAPES),
    "test_rotary_embedding_no_position_ids_interleaved_expanded": (OrtFail, _WRONG_SYMBOLIC_SHAPES),
    **{name: (TypeError, _UNKNOWN_INPUT_SHAPE) for name in [
        "test_attention_24_fullymasked_qk_matmul_output_mode3_zero_expanded",
        "test_attention_3d_causal_expanded",
        "test_attention_3d_diff_heads_sizes_causal_expanded",
        "test_attention_3d_gqa_causal_expanded",
        "test_attention_3d_local_window_expanded",
        "test_attention_4d_attn_mask_3d_causal_expanded",
        "test_attention_4d_attn_mask_4d_causal_expanded",
        "test_attention_4d_causal_expanded",
        "test_attention_4d_causal_nonpad_attn_mask_composition_expanded",
        "test_attention_4d_causal_with_past_and_present_expanded",
        "test_attention_4d_diff_heads_mask4d_padded_kv_expanded",
        "test_attention_4d_diff_heads_sizes_causal_expanded",
        "test_attention_4d_gqa_causal_expanded",
        "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal_expanded",
        "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal_expanded",
        "test_attention_bidirectional_window_expanded",
        "test_attention_causal_boolmask_nan_robustness_expanded",
        "test_attention_local_window_expanded",
        "test_attention_local_window_ext_cache_rank2_mask_expanded",
        "test_attention_local_window_ext_cache_rank3_head_mask_expanded",
        "test_attention_local_window_ext_cache_rank4_batch_mask_expanded",
        "test_attention_local_window_gqa_rank4_mask_expanded",
        "test_attention_local_window_rank1_boolean_mask_expanded",
        "test_attention_local_window_with_past_expanded",
    ]},
}
