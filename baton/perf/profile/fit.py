"""Fitting the step-time model: least squares on relative error, coefficients kept non-negative.

Relative error, because step times span three orders of magnitude (a 30 ms decode, a 10 s prefill)
and an absolute fit would ignore the short steps that decide inter-token latency. Non-negative,
because every feature is work that can only add time; a negative coefficient would be the fit
trading one correlated feature against another and would extrapolate badly. The solver is
Lawson-Hanson NNLS on unit-scaled columns (numpy only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FitReport:
    n: int
    rms_rel_error: float
    median_abs_rel_error: float
    p90_abs_rel_error: float
    max_abs_rel_error: float
    by_kind: dict[str, float]  # median |relative error| per sample kind

    def to_json(self) -> dict:
        return {
            "n": self.n,
            "rms_rel_error": self.rms_rel_error,
            "median_abs_rel_error": self.median_abs_rel_error,
            "p90_abs_rel_error": self.p90_abs_rel_error,
            "max_abs_rel_error": self.max_abs_rel_error,
            "by_kind": dict(self.by_kind),
        }

    @classmethod
    def from_json(cls, d: dict) -> FitReport:
        return cls(
            int(d["n"]),
            float(d["rms_rel_error"]),
            float(d["median_abs_rel_error"]),
            float(d["p90_abs_rel_error"]),
            float(d["max_abs_rel_error"]),
            {str(k): float(v) for k, v in d.get("by_kind", {}).items()},
        )


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson & Hanson, 1974)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * max(1.0, np.abs(a).max()) * max(m, n)
    for _ in range(max_iter or 3 * n + 10):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def fit_step_model(
    rows: Sequence[dict[str, float]], seconds: Sequence[float], names: Sequence[str]
) -> dict[str, float]:
    """Coefficients (seconds per unit of each feature) minimising the relative squared error."""
    if len(rows) != len(seconds) or not rows:
        raise ValueError("fit_step_model needs one feature row per measured time, and at least one")
    y = np.asarray(seconds, dtype=float)
    if (y <= 0).any() or not np.isfinite(y).all():
        raise ValueError("measured step times must be positive and finite")
    x = np.array([[float(r[n]) for n in names] for r in rows])
    xw = x / y[:, None]  # relative error: divide each equation by its target
    scale = np.linalg.norm(xw, axis=0)
    used = scale > 0  # a feature the samples never exercise stays at 0
    # One sample (or identical ones) gave {'const': 0.03} and a "perfect" fit. A grid whose features
    # are partly collinear is fine (non-negative least squares picks a solution); one direction is not.
    if used.sum() >= 2 and np.linalg.matrix_rank(xw[:, used]) < 2:
        raise ValueError(
            f"{len(rows)} step sample(s) of a single batch shape cannot tell the {int(used.sum())} "
            "step features they exercise apart; profile a grid of batch shapes"
        )
    coef = np.zeros(len(names))
    if used.any():
        sol = nnls(xw[:, used] / scale[used], np.ones(len(y)))
        coef[used] = sol / scale[used]
    return {n: float(c) for n, c in zip(names, coef)}


def predict(coefficients: dict[str, float], features: dict[str, float]) -> float:
    return sum(c * features.get(n, 0.0) for n, c in coefficients.items())


def report(
    coefficients: dict[str, float], rows: Sequence[dict[str, float]], seconds: Sequence[float], kinds: Sequence[str]
) -> FitReport:
    rel = np.array([(predict(coefficients, r) - s) / s for r, s in zip(rows, seconds)])
    a = np.abs(rel)
    by_kind = {k: float(np.median(a[[i for i, x in enumerate(kinds) if x == k]])) for k in sorted(set(kinds))}
    return FitReport(
        n=len(rel),
        rms_rel_error=float(math.sqrt(float(np.mean(rel**2)))),
        median_abs_rel_error=float(np.median(a)),
        p90_abs_rel_error=float(np.quantile(a, 0.9)),
        max_abs_rel_error=float(a.max()),
        by_kind=by_kind,
    )
