"""Which elementwise ONNX ops the generated kernels implement, and for which dtypes.

Codegen implements exactly this table (tests/codegen check every entry lowers and matches onnxruntime). Integer
division and modulo are left out on purpose: a zero divisor traps, and a trapping kernel would take the serving
process down where onnxruntime reports an error.
"""

FLOATS = {"float32", "float64"}
F32 = {"float32"}
SIGNED = {"int8", "int16", "int32", "int64"}
UNSIGNED = {"uint8", "uint16", "uint32", "uint64"}
INTS = SIGNED | UNSIGNED
NUMERIC = FLOATS | INTS
BOOL = {"bool"}
ALL = NUMERIC | BOOL

# op type -> dtypes of its (first) data input that we support.
SUPPORTED = {
    "Add": NUMERIC, "Sub": NUMERIC, "Mul": NUMERIC, "Div": FLOATS,
    "Neg": FLOATS | SIGNED, "Abs": NUMERIC, "Sign": FLOATS | SIGNED,
    "Relu": FLOATS | SIGNED, "LeakyRelu": FLOATS, "Elu": F32, "Selu": F32, "Celu": F32,
    "ThresholdedRelu": FLOATS, "HardSigmoid": FLOATS, "HardSwish": FLOATS,
    "Sigmoid": F32, "Tanh": F32, "Erf": F32, "Exp": F32, "Log": F32, "Softplus": F32, "Softsign": FLOATS,
    "Mish": F32, "Gelu": F32,
    "Sqrt": FLOATS, "Reciprocal": FLOATS, "Pow": FLOATS, "Floor": FLOATS, "Ceil": FLOATS, "Round": FLOATS,
    "Clip": NUMERIC, "Min": NUMERIC, "Max": NUMERIC, "Identity": ALL,
    "Where": ALL, "Cast": ALL,
    "Equal": ALL, "Less": NUMERIC, "Greater": NUMERIC, "LessOrEqual": NUMERIC, "GreaterOrEqual": NUMERIC,
    "Not": BOOL, "And": BOOL, "Or": BOOL, "Xor": BOOL,
    # Per-tensor quantization steps of a QDQ model (scalar constant scale and zero point): DequantizeLinear's int8
    # input to float32 and QuantizeLinear's float32 to int8, computed as the spec and onnxruntime's quantizer do
    # (x / scale, rounded half to even, plus the zero point, saturated; NaN to the type's least value).
    "DequantizeLinear": {"uint8", "int8"}, "QuantizeLinear": F32,
}
QUANTIZERS = frozenset({"DequantizeLinear", "QuantizeLinear"})

# Ops whose cost is more than a few instructions per element (they count as "math" in the cost estimate).
TRANSCENDENTAL = {"Sigmoid", "Tanh", "Erf", "Exp", "Log", "Softplus", "Mish", "Gelu", "Elu", "Selu", "Celu"}
