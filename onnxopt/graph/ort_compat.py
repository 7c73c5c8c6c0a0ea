"""What the installed onnxruntime can load: the newest IR version and default-domain opset.

onnx's default IR version can be newer than ORT reads, so the output must be clamped. ORT does not expose these
numbers, so we ask it: build a one-node model at a given version and see whether a session opens. Probed once per
process (a few milliseconds).
"""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto, helper


def _loads(ir_version: int, opset: int) -> bool:
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return True
    except Exception:  # noqa: BLE001 - any refusal means "not supported"
        return False


@functools.lru_cache(maxsize=None)
def max_ir_version() -> int:
    for v in range(onnx.IR_VERSION, 2, -1):
        if _loads(v, 13):
            return v
    return 7


@functools.lru_cache(maxsize=None)
def max_opset() -> int:
    ir = max_ir_version()
    for v in range(onnx.defs.onnx_opset_version(), 6, -1):
        if _loads(ir, v):
            return v
    return 13
