"""Cases onnxruntime passes but onnxopt breaks today: onnxopt bugs, marked xfail(strict=True) so the suite stays
green and turns red (XPASS(strict)) the moment one is fixed -- then delete its line here.

id -> (exception type the case fails with, precise reason)
"""

from onnxopt.errors import OnnxoptError

_IR3_INITIALIZER = (
    "onnxopt bug: IR version 3 model (opset 9) whose Constant nodes are folded into initializers; the fused "
    "model keeps ir_version=3 without listing the new initializers as graph inputs, so optimize() raises "
    "OnnxoptError('internal error: the fused model fails the ONNX checker (1 in initializer but not in graph "
    "input)')"
)

KNOWN_FAILURES: dict[str, tuple[type[BaseException], str]] = {
    "test_operator_repeat": (OnnxoptError, _IR3_INITIALIZER),
    "test_operator_repeat_dim_overflow": (OnnxoptError, _IR3_INITIALIZER),
    "test_PixelShuffle": (OnnxoptError, _IR3_INITIALIZER),
}
