"""onnxopt: an offline ONNX-to-ONNX optimizer whose fused regions run as native kernels inside ONNX Runtime.

    import onnxopt
    result = onnxopt.optimize("model.onnx", "fused.onnx")   # also writes fused.onnx.so
    result.report["regions"]                                 # what was fused, verified and measured
"""

__version__ = "0.1.0"


def optimize(model, output=None, **options):
    """Optimize a model (path or onnx.ModelProto); see `onnxopt.pipeline.optimize` for the options."""
    from onnxopt.pipeline import optimize as _optimize

    return _optimize(model, output, **options)


__all__ = ["optimize", "__version__"]
