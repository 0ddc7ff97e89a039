"""Exact small logistic regressions with sign constraints (Platt, beta, scaling-binning's scaling step).

Minimises the weighted mean Bernoulli NLL of ``sigmoid(X @ w + b)`` over ``w``
(``d <= 3`` features) and ``b``, with ``w[j] >= 0`` for the coordinates in
``nonneg``. The problem is convex, so its constrained optimum is the
unconstrained optimum of the sub-problem in which the active coordinates are
fixed at 0: every subset of ``nonneg`` is solved by damped Newton (closed-form
Hessian, backtracking line search) and the best *feasible* sub-optimum is the
answer (any feasible sub-optimum is a feasible point, so none can beat the true
optimum, and the true optimum is one of them). With ``d <= 3`` that is at most
8 tiny Newton solves.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from confcal.calibrators._fit.tsfit import CalibrationWarning

__all__ = ["LogisticResult", "fit_constrained_logistic", "platt_targets"]


@dataclass(frozen=True)
class LogisticResult:
    coef: tuple[float, ...]
    intercept: float
    nll: float
    converged: bool


def platt_targets(y: np.ndarray, sample_weight: np.ndarray | None = None) -> np.ndarray:
    """Platt's smoothed targets ``(N+ + 1) / (N+ + 2)`` for positives and ``1 / (N- + 2)`` for negatives
    (Platt 1999, sec. 2.2; the rule scikit-learn's ``CalibratedClassifierCV(method="sigmoid")`` uses).
    ``N+``/``N-`` are weighted counts when ``sample_weight`` is given."""
    y = np.asarray(y, dtype=np.float64)
    w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    n_pos = float(np.sum(w * y))
    n_neg = float(np.sum(w * (1.0 - y)))
    return np.where(y > 0.5, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))


def _loss_grad_hess(z, t, w, wsum):
    # z: (n, m) design with the intercept column last; t: targets in [0, 1]
    def f(theta):
        u = z @ theta
        loss = float(np.sum(w * (t * np.logaddexp(0.0, -u) + (1.0 - t) * np.logaddexp(0.0, u)))) / wsum
        p = expit(u)
        g = z.T @ (w * (p - t)) / wsum
        h = (z * (w * p * (1.0 - p))[:, None]).T @ z / wsum
        return loss, g, h
    return f


def _newton(z, t, w, wsum, tol, max_iter):
    f = _loss_grad_hess(z, t, w, wsum)
    m = z.shape[1]
    theta = np.zeros(m)
    tbar = float(np.clip(np.sum(w * t) / wsum, 1e-12, 1 - 1e-12))
    theta[-1] = math.log(tbar / (1.0 - tbar))  # start at the base rate
    loss, g, h = f(theta)
    for _ in range(max_iter):
        if float(np.max(np.abs(g))) < tol:
            return theta, loss, True
        reg = 1e-12 * (np.trace(h) + 1e-300)
        try:
            step = -np.linalg.solve(h + reg * np.eye(m), g)
        except np.linalg.LinAlgError:
            step = -g
        alpha, improved = 1.0, False
        for _ in range(60):
            cand = theta + alpha * step
            loss_c, g_c, h_c = f(cand)
            if loss_c <= loss + 1e-4 * alpha * float(g @ step):
                improved = True
                break
            alpha *= 0.5
        if not improved:  # no descent left: at the optimum to rounding
            return theta, loss, True
        moved = float(np.max(np.abs(cand - theta)))
        theta, loss, g, h = cand, loss_c, g_c, h_c
        if moved < 1e-13 * (1.0 + float(np.max(np.abs(theta)))):
            return theta, loss, True
    return theta, loss, float(np.max(np.abs(g))) < 1e-6


def fit_constrained_logistic(x, targets, *, nonneg=(), sample_weight=None, tol: float = 1e-11,
                             max_iter: int = 100) -> LogisticResult:
    """Minimise ``mean_i w_i BCE(t_i, sigmoid(x_i @ coef + intercept))`` with ``coef[j] >= 0`` for j in ``nonneg``.

    Parameters
    ----------
    x : float ``(n_samples, n_features)`` with ``n_features <= 3``, finite
    targets : float ``(n_samples,)`` in ``[0, 1]`` (0/1 labels or :func:`platt_targets`)
    nonneg : indices of coefficients constrained to be ``>= 0``
    sample_weight : optional non-negative ``(n_samples,)``

    Returns
    -------
    LogisticResult
        ``coef``, ``intercept``, the weighted mean NLL and whether Newton converged. On
        separable data with hard targets the optimum is at infinity: the fit stops after
        ``max_iter`` steps and a :class:`CalibrationWarning` says so.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    t = np.asarray(targets, dtype=np.float64)
    n, d = x.shape
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    wsum = float(w.sum())
    if wsum <= 0:
        raise ValueError("sample_weight: expected a positive total weight")
    best = None
    nonneg = tuple(sorted(set(int(j) for j in nonneg)))
    for k in range(len(nonneg) + 1):
        for fixed in itertools.combinations(nonneg, k):
            free = [j for j in range(d) if j not in fixed]
            z = np.column_stack([x[:, free], np.ones(n)])
            theta, loss, conv = _newton(z, t, w, wsum, tol, max_iter)
            coef = np.zeros(d)
            coef[free] = theta[:-1]
            if any(coef[j] < 0 for j in nonneg):
                continue  # infeasible sub-optimum
            if best is None or loss < best[2] - 1e-15:
                best = (coef, float(theta[-1]), loss, conv)
    coef, intercept, loss, conv = best  # the all-fixed subset is always feasible
    if not conv:
        warnings.warn(f"logistic fit did not converge in {max_iter} Newton steps (coef {coef.tolist()}); "
                      "the classes may be separable on this calibration set", CalibrationWarning, stacklevel=3)
    return LogisticResult(tuple(float(c) for c in coef), intercept, loss, bool(conv))
