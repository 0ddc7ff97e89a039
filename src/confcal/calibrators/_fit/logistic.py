"""1-D logistic calibration maps ``sigmoid(slope * x + bias)`` by a sufficient-statistics Newton.

The solver behind every box-score fit: binary temperature scaling (``det-ts``:
slope ``1/T``, bias 0 or free; Guo et al. 2017 sec. 4.2 in its binary form) and
Platt scaling (``det-platt``: J. Platt, "Probabilistic Outputs for Support Vector
Machines and Comparisons to Regularized Likelihood Methods", 1999, with its
smoothed targets ``t+ = (N+ + 1) / (N+ + 2)``, ``t- = 1 / (N- + 2)``).

The objective of group ``g`` is the weighted Bernoulli NLL with targets ``t_i``::

    L_g(a, b) = sum_{i in g} w_i [softplus(u_i) - t_i u_i],   u_i = a x_i + b

(convex in ``(a, b)``). :func:`binary_batch_stats` returns, for one batch of rows and
the current parameters of every group, the per-group sums of ``L``, its gradient
and its Hessian; :func:`newton_fit` is the driver. Because a pass only needs those
sums, the same driver (same iterates, same stopping rule) runs in memory
(:func:`fit_logistic`), over row batches of a source (:func:`fit_logistic_batches`)
and on a Dask cluster (the same job, ``confcal.calibrators._fit.jobs.boxfit``): results agree to rounding.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
from scipy.special import expit

from confcal.calibrators._fit.tsfit import CalibrationWarning
from confcal.calibrators._fit.tsfit import _result as _ts_result

__all__ = ["LogisticFit", "fit_logistic", "fit_logistic_batches", "binary_batch_stats", "binary_counts",
           "newton_fit", "newton_steps", "platt_targets"]

#: a group stops when its mean gradient (free coordinates) is below this
GRAD_TOL = 1e-12


@dataclass(frozen=True)
class LogisticFit:
    """One group's fit: ``slope``, ``bias``, the mean NLL at the optimum (with the fit's
    targets), Newton iterations, and whether the slope ended on one of its bounds."""

    slope: float
    bias: float
    nll: float
    n_iter: int
    at_bound: bool


def _groups(group, n: int, n_groups: int):
    if group is None:
        return np.zeros(n, dtype=np.int64), 1
    g = np.asarray(group, dtype=np.int64)
    if g.shape != (n,):
        raise ValueError(f"group: expected shape ({n},), got {g.shape}")
    return g, int(n_groups)


def binary_counts(y, *, group=None, n_groups: int = 1, sample_weight=None) -> tuple[np.ndarray, np.ndarray]:
    """Per-group ``(total weight, weight of positives)``, each ``(n_groups,)`` float64 (row counts
    when ``sample_weight`` is None): the first pass of every fit (targets, start, fallbacks)."""
    y = np.asarray(y)
    g, n_groups = _groups(group, y.shape[0], n_groups)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    total = np.bincount(g, weights=w, minlength=n_groups).astype(np.float64)
    pos = np.bincount(g, weights=(y > 0.5) * (1.0 if w is None else w), minlength=n_groups).astype(np.float64)
    return total, pos


def platt_targets(total, pos, targets: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-group targets ``(t+, t-)``: ``(1, 0)`` for ``"hard"``, Platt's smoothed ones for ``"platt"``."""
    total = np.asarray(total, dtype=np.float64)
    pos = np.asarray(pos, dtype=np.float64)
    if targets == "hard":
        return np.ones_like(total), np.zeros_like(total)
    if targets == "platt":
        return (pos + 1.0) / (pos + 2.0), 1.0 / (total - pos + 2.0)
    raise ValueError(f"targets: expected 'hard' or 'platt', got {targets!r}")


def binary_batch_stats(x, y, slope, bias, t_pos, t_neg, *, group=None, sample_weight=None):
    """Per-group sums of the NLL, its gradient and Hessian in ``(slope, bias)`` over one batch.

    Parameters
    ----------
    x : float ``(n,)`` feature (a logit or a raw score), y : 0/1 ``(n,)``
    slope, bias, t_pos, t_neg : float ``(n_groups,)`` current parameters and targets per group
    group : int ``(n,)`` in ``[0, n_groups)``, or None (one group)
    sample_weight : optional float ``(n,)`` >= 0

    Returns
    -------
    loss : ``(n_groups,)``, grad : ``(n_groups, 2)``, hess : ``(n_groups, 2, 2)`` (sums, not means)
    """
    x = np.asarray(x, dtype=np.float64)
    slope = np.asarray(slope, dtype=np.float64)
    n_groups = slope.shape[0]
    pos = np.asarray(y) > 0.5
    if group is None and n_groups == 1:  # one group: plain sums, no per-row gathers
        u = slope[0] * x + float(np.asarray(bias, dtype=np.float64)[0])
        t = np.where(pos, float(np.asarray(t_pos)[0]), float(np.asarray(t_neg)[0]))
        g = None
    else:
        g, _ = _groups(group, x.shape[0], n_groups)
        u = slope[g] * x + np.asarray(bias, dtype=np.float64)[g]
        t = np.where(pos, np.asarray(t_pos, dtype=np.float64)[g], np.asarray(t_neg, dtype=np.float64)[g])
    # one exp and one log1p per row serve both: e = exp(-|u|), softplus(u) = log1p(e) + max(u, 0),
    # sigmoid(u) = 1 / (1 + e) for u >= 0 and e / (1 + e) below (no overflow, no cancellation)
    e = np.exp(-np.abs(u))
    inv = 1.0 / (1.0 + e)
    p = np.where(u >= 0, inv, e * inv)
    r = p - t
    h = e * inv * inv  # p (1 - p)
    loss_i = np.log1p(e) + np.maximum(u, 0.0) - t * u
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64)
        r, h, loss_i = r * w, h * w, loss_i * w

    def s(v):
        return np.array([v.sum()]) if g is None else np.bincount(g, weights=v, minlength=n_groups)

    loss = s(loss_i)
    grad = np.stack([s(r * x), s(r)], axis=1)
    hx = h * x
    hxy = s(hx)
    hess = np.stack([np.stack([s(hx * x), hxy], axis=1), np.stack([hxy, s(h)], axis=1)], axis=1)
    return loss, grad, hess


def newton_fit(pass_fn: Callable, total, pos, *, slope_bounds=(0.0, math.inf), fit_bias: bool = True,
               targets: str = "hard", max_iter: int = 200, warn: bool = True, stacklevel: int = 3
               ) -> list[LogisticFit]:
    """:func:`newton_steps` driven by ``pass_fn(slope, bias, t_pos, t_neg) -> (loss, grad, hess)``."""
    steps = newton_steps(total, pos, slope_bounds=slope_bounds, fit_bias=fit_bias, targets=targets,
                         max_iter=max_iter, warn=warn, stacklevel=stacklevel + 1)
    request = next(steps)
    while True:
        try:
            request = steps.send(pass_fn(*request))
        except StopIteration as stop:
            return stop.value


def newton_steps(total, pos, *, slope_bounds=(0.0, math.inf), fit_bias: bool = True, targets: str = "hard",
                 max_iter: int = 200, warn: bool = True, stacklevel: int = 3):
    """Projected Newton with a backtracking line search, every group in lockstep, as a generator:
    it yields ``(slope, bias, t_pos, t_neg)`` (one pass over the data each) and is sent back the
    summed ``(loss, grad, hess)`` there, so any engine can run the passes.

    ``pass_fn(slope, bias, t_pos, t_neg)`` returns the summed ``(loss, grad, hess)`` of all
    groups (:func:`binary_batch_stats` over every row); each call is one pass over the data.
    ``total`` / ``pos`` are the per-group weights from :func:`binary_counts`. The slope stays
    in ``slope_bounds`` (``-inf <= lo < hi <= inf``; a bound is active when the gradient pushes
    past it, and then only the bias moves). A group stops when its mean gradient in the free
    coordinates is below ``GRAD_TOL`` (when Newton would still walk on towards a finite slope
    bound, as on separable data, the bound is tried once first), when an accepted step moves
    less than ``1e-13`` relative, or when 60 halvings find no decrease (the optimum to rounding).

    Returns one :class:`LogisticFit` per group (mean NLL with the fit's targets).
    """
    lo, hi = (float(v) for v in slope_bounds)
    if not lo < hi:
        raise ValueError(f"slope_bounds: expected lo < hi, got {slope_bounds!r}")
    total = np.asarray(total, dtype=np.float64)
    pos = np.asarray(pos, dtype=np.float64)
    n_groups = total.shape[0]
    t_pos, t_neg = platt_targets(total, pos, targets)
    tbar = np.clip((pos * t_pos + (total - pos) * t_neg) / np.maximum(total, 1e-300), 1e-12, 1 - 1e-12)
    w = np.full(n_groups, min(max(1.0, lo), hi))
    b = np.log(tbar / (1.0 - tbar)) if fit_bias else np.zeros(n_groups)
    loss, grad, hess = yield w, b, t_pos, t_neg
    active = np.ones(n_groups, dtype=bool)
    n_iter = np.zeros(n_groups, dtype=np.int64)
    alpha = np.ones(n_groups)
    step = np.zeros((n_groups, 2))
    searching = np.zeros(n_groups, dtype=bool)  # a step is proposed, its trial point evaluated next
    cap = np.zeros(n_groups, dtype=bool)
    probed = np.zeros(n_groups, dtype=bool)

    def free_of(k):
        return [not ((w[k] <= lo and grad[k, 0] > 0) or (w[k] >= hi and grad[k, 0] < 0)), fit_bias]

    while active.any():
        for k in np.flatnonzero(active & ~searching):  # propose a Newton step where none is pending
            idx = [j for j, f in enumerate(free_of(k)) if f]
            if not idx:
                active[k] = False
                continue
            gf = grad[k, idx] / total[k]
            hf = hess[k][np.ix_(idx, idx)] / total[k]
            hf = hf + np.eye(len(idx)) * (1e-12 * (np.trace(hf) + 1e-300))
            try:
                sf = -np.linalg.solve(hf, gf)
            except np.linalg.LinAlgError:
                sf = -gf
            step[k] = 0.0
            step[k, idx] = sf
            if float(np.max(np.abs(gf))) < GRAD_TOL:
                # flat but Newton still walks towards a slope bound (separable data: the loss only
                # tends to its infimum there): try the bound itself once, else stop
                bound = hi if step[k, 0] > 0 else lo
                if probed[k] or not math.isfinite(bound) or abs(step[k, 0]) < 1e-6 * (1.0 + abs(w[k])):
                    active[k] = False
                    continue
                probed[k] = True
                step[k] = (bound - w[k], 0.0)
            if n_iter[k] >= max_iter:
                active[k] = False
                cap[k] = True
                continue
            n_iter[k] += 1
            alpha[k] = 1.0
            searching[k] = True
        if not active.any():
            break
        w_try = np.where(searching, np.clip(w + alpha * step[:, 0], lo, hi), w)
        b_try = np.where(searching, b + alpha * step[:, 1], b)
        loss_t, grad_t, hess_t = yield w_try, b_try, t_pos, t_neg
        for k in np.flatnonzero(searching):
            mask = np.array([step[k, 0] != 0.0 or w_try[k] != w[k], fit_bias], dtype=float)
            moved = np.array([w_try[k] - w[k], b_try[k] - b[k]])
            # near the optimum the loss sums stop resolving the decrease (rounding): there the
            # step is kept when it shrinks the gradient, which Newton does quadratically
            flat = abs(loss_t[k] - loss[k]) <= 1e-12 * abs(loss[k])
            if loss_t[k] <= loss[k] + 1e-4 * float(grad[k] @ moved) or loss_t[k] < loss[k] \
                    or (flat and np.max(np.abs(grad_t[k] * mask)) < np.max(np.abs(grad[k] * mask))):
                searching[k] = False
                w[k], b[k], loss[k], grad[k], hess[k] = w_try[k], b_try[k], loss_t[k], grad_t[k], hess_t[k]
                scale = 1.0 + abs(w[k]) + abs(b[k])
                if float(np.max(np.abs(moved))) < 1e-13 * scale:
                    active[k] = False
            else:
                alpha[k] *= 0.5
                if alpha[k] < 2.0 ** -60:  # no decrease along the Newton direction: optimal to rounding
                    searching[k] = False
                    active[k] = False
    if warn and cap.any():
        ks = np.flatnonzero(cap).tolist()
        warnings.warn(f"logistic fit did not converge in {max_iter} iterations (group(s) {ks}; slope "
                      f"{w[ks[0]]:.6g}, bias {b[ks[0]]:.6g}); the data may be separable: use targets='platt'",
                      CalibrationWarning, stacklevel=stacklevel)
    out = []
    for k in range(n_groups):
        at_bound = bool((w[k] <= lo and grad[k, 0] >= 0) or (w[k] >= hi and grad[k, 0] <= 0))
        out.append(LogisticFit(slope=float(w[k]), bias=float(b[k]), nll=float(loss[k] / total[k]),
                               n_iter=int(n_iter[k]), at_bound=at_bound))
    return out


def fit_logistic(x, y, *, slope_bounds=(0.0, math.inf), fit_bias: bool = True, targets: str = "hard",
                 max_iter: int = 200, sample_weight=None) -> LogisticFit:
    """Minimise the (weighted) mean Bernoulli NLL of ``sigmoid(slope * x + bias)`` exactly.

    Parameters
    ----------
    x : float ``(n,)`` feature (a logit or a raw score)
    y : 0/1 ``(n,)``
    slope_bounds : ``(lo, hi)``, ``-inf <= lo < hi <= inf``
    fit_bias : if false, ``bias = 0``
    targets : ``"hard"`` (``t = y``) or ``"platt"`` (``t+ = (N+ + 1)/(N+ + 2)``,
        ``t- = 1/(N- + 2)``, Platt 1999), which keeps the optimum finite on separable data
    sample_weight : optional ``(n,)`` >= 0; ``N+``, ``N-`` are then weight sums, so an integer
        weight is the same as repeating the row

    Returns
    -------
    LogisticFit
        ``at_bound`` is true when the slope ended on a bound.

    Examples
    --------
    Three rows at ``x = 2``, two positives: ``sigmoid(2 a) = 2/3`` without a bias:

    >>> fit = fit_logistic([2.0, 2.0, 2.0], [1, 1, 0], fit_bias=False)
    >>> round(fit.slope, 6), round(float(np.log(2)) / 2, 6)
    (0.346574, 0.346574)
    """
    return fit_logistic_batches(lambda: [(x, y, sample_weight)], slope_bounds=slope_bounds, fit_bias=fit_bias,
                                targets=targets, max_iter=max_iter, stacklevel=4)


def fit_logistic_batches(batches: Callable[[], Iterable], *, slope_bounds=(0.0, math.inf), fit_bias: bool = True,
                         targets: str = "hard", max_iter: int = 200, stacklevel: int = 3) -> LogisticFit:
    """:func:`fit_logistic` where ``batches()`` yields ``(x, y, sample_weight or None)`` row batches
    (called once per pass): the parameters do not depend on how the rows are batched (to rounding).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=100); y = (rng.random(100) < 1 / (1 + np.exp(-2 * x))).astype(int)
    >>> one = fit_logistic(x, y)
    >>> many = fit_logistic_batches(lambda: ((x[i:i + 7], y[i:i + 7], None) for i in range(0, 100, 7)))
    >>> bool(abs(one.slope - many.slope) < 1e-9 and abs(one.bias - many.bias) < 1e-9)
    True
    """
    total, pos = np.zeros(1), np.zeros(1)
    for x, y, w in batches():
        t, p = binary_counts(y, sample_weight=w)
        total += t
        pos += p
    if not total[0] > 0:
        raise ValueError("sample_weight: every weight is 0; at least one sample must count")

    def pass_fn(slope, bias, t_pos, t_neg):
        loss, grad, hess = np.zeros(1), np.zeros((1, 2)), np.zeros((1, 2, 2))
        for x, y, w in batches():
            lb, gb, hb = binary_batch_stats(x, y, slope, bias, t_pos, t_neg, sample_weight=w)
            loss += lb
            grad += gb
            hess += hb
        return loss, grad, hess

    return newton_fit(pass_fn, total, pos, slope_bounds=slope_bounds, fit_bias=fit_bias, targets=targets,
                      max_iter=max_iter, stacklevel=stacklevel + 1)[0]


def binary_ts_params(res: LogisticFit, t_min: float, t_max: float, *, warn: bool = True,
                     stacklevel: int = 6) -> dict:
    """det-ts parameters ``{temperature, bias, nll, at_bound}`` from a logistic fit with slope ``1/T``
    (warns, as ``ts`` does, when ``T`` ends on a bound of ``[t_min, t_max]``)."""
    fit = _ts_result(-math.log(res.slope), res.nll, res.n_iter, t_min, t_max, warn, stacklevel=stacklevel)
    return {"temperature": fit.temperature, "bias": res.bias, "nll": res.nll, "at_bound": fit.at_bound}


def platt_params(res: LogisticFit, increasing: bool, *, warn: bool = True, stacklevel: int = 5) -> dict:
    """det-platt parameters ``{a, b, nll, at_bound}`` from a logistic fit (warns on a flat map)."""
    at_bound = bool(increasing and res.at_bound)
    if warn and at_bound and res.slope == 0.0:
        warnings.warn("Platt slope a = 0: the scores carry no increasing signal on this set, so every box "
                      f"gets the base rate {expit(res.bias):.4g}", CalibrationWarning, stacklevel=stacklevel)
    return {"a": res.slope, "b": res.bias, "nll": res.nll, "at_bound": at_bound}
