"""Quick optimize options for the batch tests."""

import pytest


@pytest.fixture
def quick(tmp_path):
    """Pass-through options that make optimize quick and deterministic (--min-speedup 0: every correct kernel is
    kept, untimed as a whole), with a cost cache of the test's own."""
    return ["--threads", "1", "--tune-budget", "0", "--search-budget", "5", "--min-speedup", "0",
            "--cost-cache", str(tmp_path / "costs.sqlite")]


@pytest.fixture
def quick_kwargs(tmp_path):
    """The same for run_batch()."""
    return {"threads": 1, "tune_budget": 0, "search_budget": 5, "min_speedup": 0,
            "cost_cache": str(tmp_path / "costs.sqlite"), "quiet": True}
