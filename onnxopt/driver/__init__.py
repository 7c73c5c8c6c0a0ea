"""The driver's stages (mixed into onnxopt/pipeline.py's _Optimizer) and its policy (policy.py)."""
