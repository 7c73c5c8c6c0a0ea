import os
import sys

# tests/ holds shared helpers (kernel_harness); make them importable from every test folder.
sys.path.insert(0, os.path.dirname(__file__))
# A private machine-model cache per test session keeps runs independent of the developer's cache.
os.environ.setdefault("ONNXOPT_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "onnxopt"))


def _private_cache_dir():
    """ONNXOPT_CACHE_DIR becomes a temporary directory per test session (per xdist worker): the measured-cost cache
    (costs.sqlite) starts empty and never touches the developer's. The machine model is carried over from the
    directory above (and new measurements back to it), so it is not measured again every session."""
    import atexit
    import glob
    import shutil
    import tempfile

    keep = os.environ["ONNXOPT_CACHE_DIR"]
    tmp = tempfile.mkdtemp(prefix="onnxopt-test-cache-")
    for f in glob.glob(os.path.join(keep, "machine-*.json")):
        shutil.copy(f, tmp)

    def done():
        try:
            os.makedirs(keep, exist_ok=True)
            for f in glob.glob(os.path.join(tmp, "machine-*.json")):
                if not os.path.exists(os.path.join(keep, os.path.basename(f))):
                    shutil.copy(f, keep)
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)

    atexit.register(done)
    os.environ["ONNXOPT_CACHE_DIR"] = tmp


_private_cache_dir()
# Under xdist the workers already keep every core busy: build kernels in the worker itself rather than forking more
# (codegen/parallel.py; its own tests ask for workers explicitly).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("ONNXOPT_BUILD_WORKERS", "1")
