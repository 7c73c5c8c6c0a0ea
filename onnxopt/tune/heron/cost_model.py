"""The learned cost model: XGBoost regression on the measured points, as Heron's code trains it (depth 7, eta 0.3,
label ln(1 / seconds) scaled by its maximum, failed points left out), on features that carry across shapes (the
space's `features`: ratios, footprints, the tile's intensity), not raw variable values.

Each feature names the variables it reads, so the model's importance of a variable (the summed split counts of the
features reading it, Heron's get_score('weight')) ranks CGA's key variables."""

from __future__ import annotations

import math

import numpy as np


class CostModel:
    def __init__(self, feature_deps: list[tuple[str, ...]], rounds: int = 60, seed: int = 0):
        self.deps = feature_deps  # per feature, the variables it reads
        self.rounds = rounds
        self.seed = seed
        self.booster = None
        self.scale = 1.0

    def fit(self, X: list[list[float]], seconds: list[float]) -> None:
        import xgboost as xgb

        y = np.array([math.log(1.0 / s) for s in seconds], np.float64)
        # ln(1/s) scaled by its maximum, shifted to be positive (Heron: divided by the max)
        self.offset = float(y.min()) - 1.0
        self.scale = float(y.max() - self.offset) or 1.0
        label = (y - self.offset) / self.scale
        d = xgb.DMatrix(np.asarray(X, np.float32), label=label)
        params = {"max_depth": 7, "eta": 0.3, "gamma": 1e-5, "min_child_weight": 1, "lambda": 1,
                  "objective": "reg:squarederror", "nthread": 1, "seed": self.seed, "verbosity": 0}
        self.booster = xgb.train(params, d, num_boost_round=self.rounds)

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def predict(self, X: list[list[float]]) -> np.ndarray:
        """Predicted fitness (higher is faster); zeros before training."""
        if self.booster is None:
            return np.zeros(len(X))
        import xgboost as xgb

        return self.booster.predict(xgb.DMatrix(np.asarray(X, np.float32)))

    def seconds(self, X: list[list[float]]) -> np.ndarray:
        """Predicted seconds (the label's inverse)."""
        return np.exp(-(self.predict(X) * self.scale + self.offset))

    def importance(self) -> dict[str, float]:
        """Variable -> importance: the split counts of the features that read it."""
        if self.booster is None:
            return {}
        score = self.booster.get_score(importance_type="weight")
        out: dict[str, float] = {}
        for f, deps in enumerate(self.deps):
            w = score.get(f"f{f}", 0.0)
            for v in deps:
                out[v] = out.get(v, 0.0) + w
        return out


def r2(predicted, measured) -> float:
    """The coefficient of determination of `predicted` against `measured` (the models' fit, reported before they
    choose)."""
    p, m = np.asarray(predicted, np.float64), np.asarray(measured, np.float64)
    ss = float(np.sum((m - m.mean()) ** 2))
    return 1.0 - float(np.sum((m - p) ** 2)) / ss if ss > 0 else 0.0
