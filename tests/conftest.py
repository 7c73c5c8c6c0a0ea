import os
import sys

# tests/ holds shared helpers (kernel_harness); make them importable from every test folder.
sys.path.insert(0, os.path.dirname(__file__))
# A private machine-model cache per test session keeps runs independent of the developer's cache.
os.environ.setdefault("ONNXOPT_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "onnxopt"))
