"""onnxopt: an offline ONNX-to-ONNX optimizer whose fused regions run as native kernels inside ONNX Runtime.

    import onnxopt
    result = onnxopt.optimize("model.onnx", "fused.onnx")   # also writes fused.onnx.so
    result.report["regions"]                                 # what was fused, verified and measured
"""

__version__ = "0.1.0"


def __getattr__(name):
    if name == "optimize":  # the pipeline's own function (its signature and docstring), imported on first use
        from onnxopt.pipeline import optimize

        return optimize
    raise AttributeError(f"module 'onnxopt' has no attribute {name!r}")


__all__ = ["optimize", "__version__"]
