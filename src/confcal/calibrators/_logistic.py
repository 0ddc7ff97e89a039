"""Exact 2-parameter logistic regression ``sigmoid(slope * x + bias)`` by projected Newton.

The solver behind binary temperature scaling with an offset (``det-ts`` with
``bias=True``: slope ``1/T``) and Platt scaling (``det-platt``; J. Platt,
"Probabilistic Outputs for Support Vector Machines and Comparisons to
Regularized Likelihood Methods", 1999, with its smoothed targets).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from confcal.calibrators._tsfit import CalibrationWarning

__all__ = ["LogisticFit", "fit_logistic"]


@dataclass(frozen=True)
class LogisticFit:
    slope: float
    bias: float
    nll: float
    n_iter: int
    at_bound: bool


def _logistic_stats(x, t, w, b, sw=None):
    u = w * x + b
    mean = np.mean if sw is None else (lambda v: float(np.dot(v, sw)))  # sw sums to 1
    loss = float(mean(t * np.logaddexp(0.0, -u) + (1.0 - t) * np.logaddexp(0.0, u)))
    p = expit(u)
    r = p - t
    h = p * (1.0 - p)
    g = np.array([mean(r * x), mean(r)])
    hm = np.array([[mean(h * x * x), mean(h * x)], [mean(h * x), mean(h)]])
    return loss, g, hm


def fit_logistic(x, y, *, slope_bounds=(0.0, math.inf), fit_bias: bool = True, targets: str = "hard",
                 tol: float = 1e-10, max_iter: int = 200, sample_weight=None) -> LogisticFit:
    """Minimise the mean Bernoulli NLL of ``sigmoid(slope * x + bias)`` exactly.

    Projected Newton on ``(slope, bias)`` (the NLL is convex) with a backtracking
    line search; ``slope`` is kept in ``slope_bounds`` (a bound is active when the
    gradient pushes past it, and then only ``bias`` moves).

    Parameters
    ----------
    x : float ``(n,)`` feature (a logit or a raw score)
    y : 0/1 ``(n,)``
    slope_bounds : ``(lo, hi)``, ``0 <= lo < hi <= inf``
    fit_bias : if false, ``bias = 0``
    targets : ``"hard"`` (``t = y``) or ``"platt"`` (``t+ = (N+ + 1)/(N+ + 2)``,
        ``t- = 1/(N- + 2)``, Platt 1999), which keeps the optimum finite on separable data
    sample_weight : optional ``(n,)`` >= 0; the weighted mean NLL is minimised (and ``N+``,
        ``N-`` are weight sums), so an integer weight is the same as repeating the box

    Returns a :class:`LogisticFit`; ``at_bound`` is true when the slope ended on a bound.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    lo, hi = (float(v) for v in slope_bounds)
    if not (0.0 <= lo < hi):
        raise ValueError(f"slope_bounds: expected 0 <= lo < hi, got {slope_bounds!r}")
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if sw is not None:
        sw = sw / sw.sum()
    if targets == "hard":
        t = y
    elif targets == "platt":
        n_all = float(y.size) if sample_weight is None else float(np.sum(sample_weight))
        n_pos = float(y.sum()) if sample_weight is None else float(np.dot(y, sample_weight))
        n_neg = n_all - n_pos
        t = np.where(y > 0.5, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    else:
        raise ValueError(f"targets: expected 'hard' or 'platt', got {targets!r}")
    tbar = float(np.clip(t.mean() if sw is None else np.dot(t, sw), 1e-12, 1 - 1e-12))
    w = min(max(1.0, lo), hi)
    b = math.log(tbar / (1.0 - tbar)) if fit_bias else 0.0
    loss, g, hm = _logistic_stats(x, t, w, b, sw)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        free_w = not ((w <= lo and g[0] > 0) or (w >= hi and g[0] < 0))
        free = [free_w, fit_bias]
        idx = [k for k in range(2) if free[k]]
        if not idx:
            break
        gf = g[idx]
        hf = hm[np.ix_(idx, idx)]
        hf = hf + np.eye(len(idx)) * (1e-12 * (np.trace(hf) + 1e-300))
        try:
            step_f = -np.linalg.solve(hf, gf)
        except np.linalg.LinAlgError:
            step_f = -gf
        step = np.zeros(2)
        step[idx] = step_f
        if float(np.max(np.abs(gf))) < tol:
            break
        alpha = 1.0
        improved = False
        for _ in range(60):
            w_new = min(max(w + alpha * step[0], lo), hi)
            b_new = b + alpha * step[1]
            loss_new, g_new, hm_new = _logistic_stats(x, t, w_new, b_new, sw)
            if loss_new <= loss + 1e-4 * alpha * float(g @ (np.array([w_new - w, b_new - b]) / alpha)) \
                    or loss_new < loss:
                improved = True
                break
            alpha *= 0.5
        if not improved:
            break  # at the optimum to rounding
        moved = max(abs(w_new - w), abs(b_new - b))
        w, b, loss, g, hm = w_new, b_new, loss_new, g_new, hm_new
        if moved < tol * (1.0 + abs(w) + abs(b)):
            break
    else:
        warnings.warn(f"logistic fit did not converge in {max_iter} iterations (slope {w:.6g}, bias {b:.6g}); "
                      "the data may be separable: use targets='platt'", CalibrationWarning, stacklevel=3)
    at_bound = (w <= lo and g[0] >= 0) or (w >= hi and g[0] <= 0)
    return LogisticFit(slope=float(w), bias=float(b), nll=loss, n_iter=n_iter, at_bound=bool(at_bound))
