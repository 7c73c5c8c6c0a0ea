"""One hierarchy of errors. Each message says what went wrong and what to do about it.

The CLI turns an `OnnxoptError` into a one-line message and an exit code, never a traceback:
`UsageError` and `InputError` exit 2, `VerificationError` exits 1.
"""


class OnnxoptError(Exception):
    exit_code = 2


class UsageError(OnnxoptError):
    """The command line or the Python call is wrong (bad flag value, output path equal to the input...)."""


class InputError(OnnxoptError):
    """The model cannot be read or is not valid ONNX that onnxruntime can load."""


class ToolchainError(OnnxoptError):
    """The system linker or C compiler needed to build the kernel library is missing or failed."""


class VerificationError(OnnxoptError):
    """The optimized model does not match the original within the tolerances."""

    exit_code = 1
