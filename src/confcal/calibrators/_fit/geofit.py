"""L2-penalised logistic regression on a fixed basis, by Newton's method, with the penalty
chosen by cross-validated NLL: the fitting core of the geometry-dependent box maps.

Objective (weights ``w_i``, basis rows ``phi_i``, labels ``y_i`` in {0, 1})::

    J(c, beta) = sum_i w_i [log(1 + exp(z_i)) - y_i z_i] / sum_i w_i + (lam / 2) ||beta||^2,
    z_i = c + phi_i . beta

The intercept ``c`` is not penalised. ``J`` is strictly convex for ``lam > 0``, so Newton with
step halving converges to its unique minimum from zero.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, log_expit

__all__ = ["fit_penalised_logistic", "select_penalty", "penalised_nll", "REG_GRID", "stratified_folds"]

#: penalties tried by the cross-validation (one per decade; columns are standardised first)
REG_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def penalised_nll(theta, phi, y, w, lam) -> float:
    """``J`` above at ``theta = [c, beta]`` (the oracle tests minimise this with scipy)."""
    z = theta[0] + phi @ theta[1:]
    loss = -(y * log_expit(z) + (1 - y) * log_expit(-z))
    return float(np.dot(w, loss) / w.sum() + 0.5 * lam * np.dot(theta[1:], theta[1:]))


def fit_penalised_logistic(phi: np.ndarray, y: np.ndarray, w: np.ndarray | None, lam: float, *,
                           max_iter: int = 100, tol: float = 1e-10) -> np.ndarray:
    """Minimiser ``[c, beta]`` of ``J`` (float64 ``(1 + p,)``) for ``phi`` ``(n, p)``, ``y`` ``(n,)``."""
    n, p = phi.shape
    w = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    wn = w / w.sum()
    X = np.hstack([np.ones((n, 1)), phi])
    pen = np.full(p + 1, lam)
    pen[0] = 0.0
    theta = np.zeros(p + 1)
    rate = float(np.clip(np.dot(wn, y), 1e-6, 1 - 1e-6))
    theta[0] = np.log(rate / (1 - rate))  # start at the base rate: one step closer
    f = penalised_nll(theta, phi, y, w, lam)
    for _ in range(max_iter):
        z = X @ theta
        q = expit(z)
        g = X.T @ (wn * (q - y)) + pen * theta
        if np.max(np.abs(g)) < tol:
            break
        H = (X * (wn * q * (1 - q))[:, None]).T @ X + np.diag(pen)
        try:
            step = np.linalg.solve(H + 1e-12 * np.eye(p + 1), g)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(H, g, rcond=None)[0]
        t = 1.0
        while True:  # halve until J does not increase (J is convex: a descent direction)
            cand = theta - t * step
            fc = penalised_nll(cand, phi, y, w, lam)
            if fc <= f:
                break
            t *= 0.5
            if t < 1e-10:
                cand, fc = theta, f
                break
        done = f - fc <= 1e-15 * max(1.0, abs(f))
        theta, f = cand, fc
        if done:
            break
    return theta


def stratified_folds(y: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Fold id ``(n,)`` per row: each label's rows dealt in turn after a seeded shuffle, so every
    fold holds both labels whenever each label has ``n_folds`` rows."""
    rng = np.random.default_rng(seed)
    fold = np.empty(y.shape[0], dtype=np.int64)
    for lab in (0, 1):
        idx = np.flatnonzero(y == lab)
        idx = idx[rng.permutation(idx.size)]
        fold[idx] = np.arange(idx.size) % n_folds
    return fold


def select_penalty(phi, y, w, *, grid=REG_GRID, n_folds: int = 3, seed: int = 0) -> tuple[float, list]:
    """The penalty of ``grid`` with the lowest cross-validated NLL (weighted mean over the held-out
    rows of all folds; ties go to the stronger penalty), and ``[[lam, cv_nll], ...]``."""
    w = np.ones(y.shape[0]) if w is None else w
    fold = stratified_folds(y, n_folds, seed)
    scores = []
    for lam in grid:
        total = 0.0
        for k in range(n_folds):
            tr, te = fold != k, fold == k
            if not te.any() or not tr.any() or w[tr].sum() <= 0:
                continue
            theta = fit_penalised_logistic(phi[tr], y[tr], w[tr], lam)
            z = theta[0] + phi[te] @ theta[1:]
            total += float(np.dot(w[te], -(y[te] * log_expit(z) + (1 - y[te]) * log_expit(-z))))
        scores.append([float(lam), total / w.sum()])
    best = min(range(len(grid)), key=lambda i: (round(scores[i][1], 12), -grid[i]))
    return float(grid[best]), scores
