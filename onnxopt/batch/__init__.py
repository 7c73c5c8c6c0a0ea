"""`onnxopt batch`: optimize a whole model zoo, one child process per model, resumably.

    from onnxopt.batch import run_batch
    result = run_batch(["zoo/", "@more.txt"], "out/", jobs=1, timeout=1800, threads=1, tune_budget=0)
    result.exit_code, result.records, result.report     # also in out/report.json and out/report.html

Modules: sources (which models, where their outputs go), worker (one model: optimize and bench children under
limits), state (batch-state.json, for reruns), runner (the driver: local threads or Ray tasks), report and
report_html (report.json, the summary table, the self-contained HTML page), options (what is passed through).
"""

from .runner import BatchResult, run_batch

__all__ = ["BatchResult", "run_batch"]
