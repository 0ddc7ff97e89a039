"""The beta map's numerics (Kull, Silva Filho & Flach, AISTATS 2017, eq. 4): features, the exact
constrained fit, the multinomial variant and the map itself, shared by ``beta`` and ``det-beta``."""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from confcal.calibrators._fit.constrained_logistic import fit_constrained_logistic
from confcal._validation import plain

__all__ = ["beta_features", "beta_feature_pair", "fit_beta", "fit_beta_batch", "fit_beta_multinomial", "apply_beta",
           "apply_beta_columns", "check_beta_params", "multinomial_logits", "beta_nll"]


def beta_feature_pair(log_odds) -> tuple[np.ndarray, np.ndarray]:
    """``(ln p, -ln(1 - p))`` from ``log(p / (1 - p))`` of any shape, without cancellation.

    With ``l = log(1 + exp(-|x|))``: ``ln p = min(x, 0) - l`` and ``-ln(1 - p) = max(x, 0) + l`` (two
    ``logaddexp``'s in one ``exp`` and one ``log`` pass). ``log(1 + e)`` rather than ``log1p(e)``
    (``e <= 1``): numpy's ``log`` is vectorised, ``log1p`` is not, and the rounded ``1 + e`` costs
    below 2.3e-16 absolute."""
    lo = np.asarray(log_odds, dtype=np.float64)
    ell = np.abs(lo)
    np.negative(ell, out=ell)
    np.exp(ell, out=ell)
    ell += 1.0
    np.log(ell, out=ell)
    return np.minimum(lo, 0.0) - ell, np.maximum(lo, 0.0) + ell


def beta_features(log_odds) -> np.ndarray:
    """``[ln p, -ln(1 - p)]`` ``(n, 2)`` from ``log(p / (1 - p))`` ``(n,)``, without cancellation."""
    return np.column_stack(beta_feature_pair(log_odds))


def fit_beta(log_odds, targets, *, sample_weight=None) -> dict:
    """Maximum-likelihood ``(a, b, c)`` of the beta map with ``a, b >= 0`` (see the module docstring)."""
    res = fit_constrained_logistic(beta_features(log_odds), targets, nonneg=(0, 1), sample_weight=sample_weight)
    return {"a": res.coef[0], "b": res.coef[1], "c": res.intercept}


def fit_beta_batch(log_odds, targets, *, sample_weight=None) -> list[dict]:
    """:func:`fit_beta` for the ``K`` columns of ``log_odds`` / ``targets`` ``(n, K)`` at once.

    The same exact constrained maximum likelihood: every active set of ``a, b >= 0`` (none, ``a = 0``,
    ``b = 0``, both) is a batch of ``K`` logistic fits (:func:`confcal.calibrators._fit.jobs.platt_batch.fit_logistic_batch`,
    batched Newton with closed-form gradients and Hessians), and per class the lowest loss among the
    feasible sets is kept, in :func:`fit_constrained_logistic`'s order and tie rule (a class whose free fit
    is feasible stops there: that is its constrained optimum, the problem being convex). A class whose
    Newton did not converge warns as there.
    """
    import warnings

    from confcal.calibrators._fit.jobs.platt_batch import fit_logistic_batch
    from confcal.calibrators._fit.tsfit import CalibrationWarning

    lo = np.asarray(log_odds, dtype=np.float64).T                    # (K, n)
    t = np.asarray(targets, dtype=np.float64).T
    k = lo.shape[0]
    feats = np.stack(beta_feature_pair(lo), axis=2)  # (K, n, 2)
    best_loss = np.full(k, np.inf)
    best = np.zeros((k, 3))
    best_conv = np.zeros(k, dtype=bool)
    todo = np.arange(k)
    for fixed in ((), (0,), (1,), (0, 1)):
        free = [j for j in (0, 1) if j not in fixed]
        # second start: the identity map (a = b = 1, c = 0: u = the input log-odds) on the free features
        init = (np.ones((todo.size, len(free))), np.zeros(todo.size))
        coef, icpt, loss, conv = fit_logistic_batch(feats[todo][:, :, free], t[todo], sample_weight=sample_weight,
                                                    init=init)
        full = np.zeros((todo.size, 2))
        full[:, free] = coef
        ok = np.all(full >= 0, axis=1) & (loss < best_loss[todo] - 1e-15)
        sel = todo[ok]
        best[sel, :2], best[sel, 2], best_loss[sel], best_conv[sel] = full[ok], icpt[ok], loss[ok], conv[ok]
        if not fixed:
            # a feasible unconstrained optimum of this convex problem is the constrained one: only the
            # classes whose free fit broke a sign constraint need the smaller active sets
            todo = todo[~ok]
            if todo.size == 0:
                break
    for j in np.flatnonzero(~best_conv):
        warnings.warn(f"logistic fit did not converge in 100 Newton steps (coef {best[j, :2].tolist()}); "
                      "the classes may be separable on this calibration set", CalibrationWarning, stacklevel=3)
    return [{"a": float(a), "b": float(b), "c": float(c)} for a, b, c in best]


def multinomial_logits(theta: np.ndarray, f1: np.ndarray, f2: np.ndarray) -> np.ndarray:
    k = f1.shape[1]
    return f1 * theta[:k] + f2 * theta[k:2 * k] + theta[2 * k:]


def multinomial_beta_objective(theta: np.ndarray, f1: np.ndarray, f2: np.ndarray, y: np.ndarray, r: np.ndarray):
    """Weighted mean NLL of ``softmax(a * f1 + b * f2 + c)`` and its gradient, ``theta = [a, b, c]``
    ``(3K,)``, features ``f1 = ln p``, ``f2 = -ln(1 - p)`` ``(n, K)``, row weights ``r`` summing to 1."""
    u = multinomial_logits(theta, f1, f2)
    rows = np.arange(len(y))
    u_y = u[rows, y]
    m = u.max(axis=1, keepdims=True)
    np.subtract(u, m, out=u)
    np.exp(u, out=u)
    tot = u.sum(axis=1)
    f = float(r @ (np.log(tot) + m[:, 0] - u_y))
    g = u  # G = r (P - Y), in place
    g *= (r / tot)[:, None]
    g[rows, y] -= r
    return f, np.concatenate([np.einsum("ij,ij->j", g, f1), np.einsum("ij,ij->j", g, f2), g.sum(axis=0)])


def fit_beta_multinomial(log_odds, labels, *, sample_weight=None, tol: float = 1e-9,
                         max_iter: int = 1000) -> list[dict]:
    """Maximum-likelihood ``K`` beta maps ``(a_k, b_k, c_k)``, ``a, b >= 0``, as logits of one softmax.

    ``log_odds`` ``(n, K)`` of ``p = softmax(logits)``, ``labels`` ``(n,)``. The objective
    (:func:`multinomial_beta_objective`) is convex in the ``3K`` parameters (a softmax NLL of
    logits linear in them), so L-BFGS-B under the bounds from the identity map (``a = 1, b = 0,
    c = 0``: ``softmax(ln p) = p``) reaches its global optimum; it stops at a projected gradient
    of ``tol``. The intercepts are shifted to sum to 0 (the NLL does not see a common shift).
    Warns (:class:`CalibrationWarning`) when the iteration limit is reached."""
    import warnings

    from scipy.optimize import minimize

    from confcal.calibrators._fit.tsfit import CalibrationWarning

    feats = beta_features(np.asarray(log_odds, dtype=np.float64).ravel()).reshape(*np.shape(log_odds), 2)
    f1, f2 = np.ascontiguousarray(feats[..., 0]), np.ascontiguousarray(feats[..., 1])
    n, k = f1.shape
    y = np.asarray(labels, dtype=np.int64)
    r = np.full(n, 1.0 / n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    r = r / r.sum()
    x0 = np.concatenate([np.ones(k), np.zeros(2 * k)])
    bounds = [(0.0, None)] * (2 * k) + [(None, None)] * k
    res = minimize(multinomial_beta_objective, x0, args=(f1, f2, y, r), jac=True, method="L-BFGS-B",
                   bounds=bounds, options={"maxiter": int(max_iter), "gtol": tol, "ftol": 1e-15, "maxcor": 20})
    if res.status == 1:
        warnings.warn(f"multinomial beta fit stopped at its iteration limit ({max_iter}); the classes may be "
                      "separable on this calibration set", CalibrationWarning, stacklevel=3)
    a, b, c = res.x[:k], res.x[k:2 * k], res.x[2 * k:]
    c = c - c.mean()
    return [{"a": float(ai), "b": float(bi), "c": float(ci)} for ai, bi, ci in zip(a, b, c)]


def apply_beta(params: dict, log_odds) -> np.ndarray:
    f = beta_features(log_odds)
    return expit(params["a"] * f[:, 0] + params["b"] * f[:, 1] + params["c"])


def apply_beta_columns(maps: list[dict], log_odds) -> np.ndarray:
    """:func:`apply_beta` of map ``k`` on column ``k`` of ``log_odds`` ``(n, K)``, all columns in one pass."""
    a, b, c = (np.array([m[key] for m in maps], dtype=np.float64) for key in "abc")
    f1, f2 = beta_feature_pair(log_odds)
    f1 *= a
    f2 *= b
    f1 += f2
    f1 += c
    return expit(f1, out=f1)


def check_beta_params(params) -> dict:
    if not isinstance(params, dict):
        raise TypeError(f"expected a dict {{a, b, c}}, got {type(params).__name__}")
    out = {}
    for key in ("a", "b", "c"):
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"{key}: expected a finite number, got {plain(v)}")
        if key in ("a", "b") and v < 0:
            raise ValueError(f"{key}: expected >= 0 (monotone beta map), got {plain(v)}")
        out[key] = float(v)
    return out



def beta_nll(params, x, y, sample_weight=None):
    f = beta_features(x)
    u = params["a"] * f[:, 0] + params["b"] * f[:, 1] + params["c"]
    return np.average(y * np.logaddexp(0.0, -u) + (1 - y) * np.logaddexp(0.0, u), weights=sample_weight)
