import pytest


@pytest.fixture(autouse=True)
def every_legal_group(monkeypatch):
    """The kernels are under test here, not the search's choice (G1 and G2 are compute-bound, where the roofline
    predicts no gain): fuse every legal AFUSION group. A test of the search's choice removes the variable."""
    monkeypatch.setenv("ONNXOPT_AFUSION_PAIRS", "all")
