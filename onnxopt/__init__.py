"""onnxopt: an offline ONNX-to-ONNX optimizer whose fused regions run as native kernels inside ONNX Runtime."""

__version__ = "0.1.0"
