"""Exact 1-D temperature fit: safeguarded Newton on t = log T (Guo et al. 2017, sec. 4.2).

The mean NLL of ``softmax(z / T)`` is convex in ``s = 1/T``, so its derivative
in ``t = log T`` changes sign once: Newton steps with a bisection bracket find
that root, or the search bound when the optimum lies beyond it.

Speed: every iteration is one streaming pass over the logits in row chunks
that fit in cache (exp, and two row dot products). Passes run in the input
dtype (float32 stays float32) until the step is below 1e-5; the last steps are
float64 so the answer is exact to rounding, not to float32's precision.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import numpy as np
from confcal._lazy import torch  # imported on first use: importing this module needs no torch

__all__ = ["fit_temperature", "TemperatureFit", "CalibrationWarning", "DEFAULT_T_BOUNDS", "check_labels_not_masked"]

DEFAULT_T_BOUNDS = (1e-2, 1e2)
_CHUNK_ELEMS = 1 << 18  # ~1 MB of float32 per chunk: stays in L2
_SMALL_ELEMS = 1 << 23  # up to this many logits the fit runs on one thread (see _one_thread)
_ACCEPT = 1e-7  # a float64 Newton step below this (in log T) ends the fit
_WARM_START_ROWS = 50_000  # above this, start from a fit on a strided subsample
_NEAR_BLOCK = 1 << 15  # rows per NearMetrics.add call
_NEAR_DMAX = 1e-6  # relative reach in 1/T of the metrics gathered in a float64 pass (NearMetrics)


class CalibrationWarning(UserWarning):
    """A fit ended on a search bound or on too little data (like scikit-learn's ConvergenceWarning)."""


@dataclass(frozen=True)
class TemperatureFit:
    temperature: float
    nll: float
    n_iter: int
    at_bound: bool


@contextlib.contextmanager
def _one_thread(active: bool):
    """Run torch ops on the calling thread only, restoring the setting afterwards.

    For calibration-sized inputs each pass is a few milliseconds; waking torch's
    thread pool for every op costs more than it saves, and on a busy machine
    (measured here with 2 cores and other jobs) it made a 5,000 x 100 fit 20x slower.
    """
    before = torch.get_num_threads()
    if not active or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Stats:
    """Row statistics of ``z`` needed for every pass, computed once."""

    def __init__(self, logits, labels, sample_weight):
        z = torch.as_tensor(np.asarray(logits)) if not torch.is_tensor(logits) else logits.detach().cpu()
        if z.dtype not in (torch.float32, torch.float64):
            z = z.float()
        self.z = z
        y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        n = z.shape[0]
        self.rows = max(1, _CHUNK_ELEMS // max(1, z.shape[1]))
        # One cache-friendly sweep for the row max (finite: rows are never all -inf)
        # and the row min (-inf marks a masked class).
        self.m = torch.empty(n, dtype=torch.float64)
        self.has_masked = False
        for i in range(0, n, self.rows):
            lo_, hi_ = torch.aminmax(z[i:i + self.rows], dim=1)
            self.m[i:i + self.rows] = hi_
            self.has_masked = self.has_masked or bool(torch.isneginf(lo_).any())
        self.zy_c = z.gather(1, y[:, None])[:, 0].double() - self.m
        if sample_weight is None:
            self.w = None
        else:
            w = torch.as_tensor(np.asarray(sample_weight, dtype=np.float64))
            self.w = w / w.sum()
        self.n = n

    def _mean(self, v):
        return float(v.mean()) if self.w is None else float((v * self.w).sum())

    def evaluate(self, s: float, exact: bool):
        """Mean NLL, d/ds and d2/ds2 at inverse temperature ``s`` (float64 results)."""
        n = self.n
        s0 = torch.empty(n, dtype=torch.float64)
        s1 = torch.empty(n, dtype=torch.float64)
        s2 = torch.empty(n, dtype=torch.float64)
        dtype = torch.float64 if exact else self.z.dtype
        for i in range(0, n, self.rows):
            zc = self.z[i:i + self.rows].to(dtype) - self.m[i:i + self.rows, None].to(dtype)
            e = _exp_(zc * s)
            if self.has_masked:
                zc = torch.where(torch.isinf(zc), torch.zeros((), dtype=dtype), zc)
            ez = e * zc
            s0[i:i + self.rows] = e.sum(1)
            s1[i:i + self.rows] = ez.sum(1)
            s2[i:i + self.rows] = _rowdot(ez, zc)
        mean_z = s1 / s0
        loss = self._mean(torch.log(s0) - s * self.zy_c)
        grad = self._mean(mean_z - self.zy_c)
        hess = self._mean(torch.clamp(s2 / s0 - mean_z**2, min=0.0))
        return loss, grad, hess


def check_labels_not_masked(logits, labels, sample_weight=None) -> None:
    """A label on a ``-inf`` logit has probability 0 under every map: the NLL
    is infinite, so refuse it (samples of weight 0 do not count).  ``logits``
    ``(n_samples, n_classes)`` numpy or torch, ``labels`` ``(n_samples,)``."""
    labels = np.asarray(labels)
    rows = np.arange(len(labels))
    true = logits[torch.as_tensor(rows), torch.as_tensor(labels)] if torch.is_tensor(logits) else logits[rows, labels]
    bad = np.isneginf(np.asarray(true.cpu() if torch.is_tensor(true) else true))
    if sample_weight is not None:
        bad &= np.asarray(sample_weight) > 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"labels: sample {i} has label {int(labels[i])}, whose logit is -inf (probability 0); "
                         f"{int(bad.sum())} such samples make the NLL infinite")


def fit_temperature(logits, labels, *, sample_weight=None, t_bounds=DEFAULT_T_BOUNDS,
                    tol: float = 1e-12, max_iter: int = 100, warn: bool = True) -> TemperatureFit:
    """Temperature ``T`` minimising the mean NLL of ``softmax(logits / T)``.

    Parameters
    ----------
    logits : float ``(n_samples, n_classes)``, validated (finite or ``-inf``)
    labels : int64 ``(n_samples,)``
    sample_weight : optional non-negative ``(n_samples,)``; the weighted mean NLL is minimised
    t_bounds : ``(T_min, T_max)``, the search range (default ``[1e-2, 1e2]``)
    tol : stop when the bracket on ``log T`` is narrower than this (the usual stop is a float64
        Newton step below 1e-7, whose error is then ~1e-14)

    Returns a :class:`TemperatureFit`. When the optimum lies on a bound
    (separable data: T -> 0; a model mostly wrong: T -> inf), that bound is
    returned and a :class:`CalibrationWarning` is issued (if ``warn``).
    """
    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    check_labels_not_masked(logits, labels, sample_weight)
    n_elems = (logits.numel() if torch.is_tensor(logits) else np.size(logits))
    with _one_thread(n_elems <= _SMALL_ELEMS):
        return _fit(logits, labels, sample_weight, t_min, t_max, tol, max_iter, warn)


def _fit(logits, labels, sample_weight, t_min, t_max, tol, max_iter, warn) -> TemperatureFit:
    t_bounds = (t_min, t_max)
    st = _Stats(logits, labels, sample_weight)
    exact = st.z.dtype == torch.float64

    def dt_stats(t, exact):
        s = math.exp(-t)
        loss, g_s, h_s = st.evaluate(s, exact)
        # chain rule for s = exp(-t)
        return loss, -s * g_s, s * s * h_s + s * g_s

    t = min(max(0.0, math.log(t_min)), math.log(t_max))
    if st.n > _WARM_START_ROWS and sample_weight is None:
        # A fit on every k-th row lands within ~1e-2 of the optimum, which saves
        # about half of the full passes; the full-data Newton below stays exact.
        stride = st.n // (_WARM_START_ROWS // 2)
        sub = fit_temperature(st.z[::stride], np.asarray(labels)[::stride], t_bounds=t_bounds, warn=False)
        t = math.log(sub.temperature)
    t, loss, n_iter, _ = _newton(dt_stats, t, t_min, t_max, tol, max_iter, exact)
    return _result(t, loss, n_iter, t_min, t_max, warn, stacklevel=5)


def _newton(dt_stats, t, t_min, t_max, tol, max_iter, exact, *, accept_evaluated: float = 0.0):
    """Safeguarded Newton on ``t = log T``; ``dt_stats(t, exact) -> (mean loss, d/dt, d2/dt2)``.

    Drives :func:`_newton_steps`; see there for the result."""
    steps = _newton_steps(t, t_min, t_max, tol, max_iter, exact, accept_evaluated=accept_evaluated)
    request = next(steps)
    while True:
        try:
            request = steps.send(dt_stats(*request))
        except StopIteration as stop:
            return stop.value


def _newton_steps(t, t_min, t_max, tol, max_iter, exact, *, accept_evaluated: float = 0.0):
    """The Newton iteration as a generator: yields ``(t, exact)`` and is sent back
    ``(mean loss, d/dt, d2/dt2)`` at that point, so that several fits (one per domain) can share
    each pass over the data.

    Returns ``(t, loss at the last evaluated point, n_iter, evaluated)`` where ``evaluated``
    says whether ``t`` is the last point ``dt_stats`` was called at. With
    ``accept_evaluated > 0``, a float64 Newton step below it ends the fit *at* the
    evaluated point (its distance to the optimum is about the step), so statistics
    gathered in that pass (metrics) belong to the returned temperature.
    """
    lo, hi = math.log(t_min), math.log(t_max)
    lo_known = hi_known = False  # sign of the derivative known at that end?
    t_lo_bound, t_hi_bound = lo, hi
    loss = float("nan")
    n_iter = 0
    evaluated = False
    streak, last_sign, prev_step = 0, 0, math.inf
    for n_iter in range(1, max_iter + 1):
        loss, g, h = yield t, exact
        evaluated = True
        if g == 0.0:
            if h == 0.0 and loss < 1e-300:
                t = t_lo_bound  # every probability saturated at 1: separable, optimum at T -> 0
                evaluated = False
            break
        if g < 0:
            lo, lo_known = t, True
            if t == t_hi_bound:
                break  # still descending at the upper bound
        else:
            hi, hi_known = t, True
            if t == t_lo_bound:
                break  # still descending at the lower bound
        sign = 1 if g > 0 else -1
        streak = streak + 1 if sign == last_sign else 1
        last_sign = sign
        step = -g / h if h > 0 else math.nan
        if exact and math.isfinite(step) and abs(step) < accept_evaluated:
            break  # t is within ~|step| of the optimum
        if math.isfinite(step) and abs(step) < (_ACCEPT if exact else 1e-5):
            if exact:
                if accept_evaluated:
                    t = min(max(t + step, lo), hi)
                    evaluated = False
                    continue  # one more pass lands within ~step**2, below accept_evaluated
                # Newton converges quadratically: after a float64 step this small the error
                # is ~step**2, far below tol, so no verifying pass is needed.
                t = min(max(t + step, lo), hi)
                evaluated = False
                break
            # close enough: finish in float64, with a fresh bracket (float32 signs may be off)
            exact = True
            t = min(max(t + step, lo), hi)
            lo, hi, lo_known, hi_known = t_lo_bound, t_hi_bound, False, False
            streak, last_sign, prev_step = 0, 0, math.inf
            evaluated = False
            continue
        t_new = t + step if math.isfinite(step) else math.nan
        slow = math.isfinite(step) and abs(step) > 0.5 * abs(prev_step)
        prev_step = step
        if streak >= 3 and slow and not (hi_known if g < 0 else lo_known):
            t_new = math.nan  # slow one-sided progress (optimum near a bound): probe the bound
        if not (lo < t_new < hi):
            # Newton left the bracket: try the unexplored bound first, then bisect.
            if g < 0 and not hi_known:
                t_new = hi
            elif g > 0 and not lo_known:
                t_new = lo
            else:
                t_new = 0.5 * (lo + hi)
        if hi - lo < tol:
            break
        t = t_new
        evaluated = False
    else:
        warnings.warn(f"temperature fit did not converge in {max_iter} iterations "
                      f"(T = {math.exp(t):.6g})", CalibrationWarning, stacklevel=5)
    return t, loss, n_iter, evaluated


def _result(t, loss, n_iter, t_min, t_max, warn, stacklevel=4) -> TemperatureFit:
    temperature = math.exp(t)
    at_bound = abs(t - math.log(t_min)) < 1e-9 or abs(t - math.log(t_max)) < 1e-9
    if at_bound:
        temperature = t_min if abs(t - math.log(t_min)) < 1e-9 else t_max
        if warn:
            if temperature == t_min:
                why = ("the calibration set is (nearly) perfectly separated, or the logits are on a "
                       "very small scale")
                fix = f"lower t_min (now {t_min:g}; CLI: --param t_min={t_min / 100:g})"
            else:
                why = ("either the model is mostly wrong or uninformative on the calibration set, or its "
                       "logits are on a large scale (a logit gap of thousands needs T in the thousands)")
                fix = f"raise t_max (now {t_max:g}; CLI: --param t_max={t_max * 100:g})"
            warnings.warn(f"temperature fit stopped at the search bound T = {temperature:g}: {why}; "
                          f"{fix} and refit, or check the data", CalibrationWarning, stacklevel=stacklevel)
    return TemperatureFit(temperature=temperature, nll=loss, n_iter=n_iter, at_bound=at_bound)


# ----------------------------------------------------------------------------- streaming
# The fit above holds the logits; the functions below stream them: each Newton iteration
# is one pass over a source in row batches, summing per-batch sufficient statistics.


@dataclass
class TSPassStats:
    """Sums over rows of one pass at ``t = log T``: weight, loss (NLL), d/dt and d2/dt2.

    ``before`` / ``after`` are optional ``(ScoresAccumulator, BinnedAccumulator)`` pairs
    with the summary metrics at ``T = 1`` and at ``T = exp(t)``. Stats of batches of one
    pass add up with :meth:`merge` (any order), so a pass can run on several workers.
    """

    t: float
    weight: float = 0.0
    loss: float = 0.0
    grad: float = 0.0
    hess: float = 0.0
    n_rows: int = 0
    unit_rows: bool = True  # every row so far lies in [0, 1] (probabilities given as logits?)
    before: tuple | None = None
    after: tuple | None = None
    near: "NearMetrics | None" = None  # the summary metrics near this t, resolved after the pass

    def merge(self, other: "TSPassStats") -> "TSPassStats":
        if other.t != self.t:
            raise ValueError(f"merge: statistics at different temperatures (t={self.t!r}, {other.t!r})")
        self.weight += other.weight
        self.loss += other.loss
        self.grad += other.grad
        self.hess += other.hess
        self.n_rows += other.n_rows
        self.unit_rows = self.unit_rows and other.unit_rows
        for key in ("before", "after"):
            mine, theirs = getattr(self, key), getattr(other, key)
            if theirs is not None:
                if mine is None:
                    setattr(self, key, theirs)
                else:
                    mine[0].merge(theirs[0])
                    mine[1].merge(theirs[1])
        if other.near is not None:
            self.near = other.near if self.near is None else self.near.merge(other.near)
        return self

    def means(self):
        """Weighted mean loss, d/dt and d2/dt2."""
        return self.loss / self.weight, self.grad / self.weight, self.hess / self.weight


def _exp_(x: torch.Tensor) -> torch.Tensor:
    """``exp`` in place on a contiguous CPU tensor, by numpy: its AVX-512 ``exp`` measured 2x
    torch's here (float64 82 vs 163 ms, float32 46 vs 91 ms per 1e8 elements, one thread)."""
    a = x.numpy()
    np.exp(a, out=a)
    return x


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products of two contiguous CPU ``(rows, k)`` tensors, by numpy's stacked
    ``matmul``: 21 ms against 42 for ``torch.linalg.vecdot`` per 1e8 float64 elements here."""
    return torch.from_numpy(np.matmul(a.numpy()[:, None, :], b.numpy()[:, :, None]).reshape(-1))


def _metric_pair(n_bins):
    from confcal.metrics import BinnedAccumulator, ScoresAccumulator

    return ScoresAccumulator(), BinnedAccumulator(n_bins)


def _add_metrics(pair, e, s0, zy, s, correct):
    """Summary metrics of ``softmax(z * s)`` from the pass's sums: the top probability is
    ``1 / s0`` (the row max is subtracted, so its term is 1), ``log p_y = s zy - log s0``,
    Brier ``= sum p^2 - 2 p_y + 1``."""
    from confcal.metrics.scores import NLL_EPS

    scores, bins = pair
    log_py = s * zy - torch.log(s0)
    nll = -torch.clamp(log_py, min=math.log(NLL_EPS))
    e64 = e.double()
    brier = _rowdot(e64, e64) / (s0 * s0) - 2.0 * torch.exp(log_py) + 1.0
    scores.update_sums(s0.shape[0], int(correct.sum()), float(nll.sum()), float(brier.sum()))
    bins.update_pairs((1.0 / s0).numpy(), correct.numpy())


class NearMetrics:
    """Summary metrics at ``s + delta`` for a small ``delta`` known only after the pass.

    A Newton pass at inverse temperature ``s`` already has each row's ``log s0`` and the
    mean and variance of the centred logits under ``softmax(s z)``, which are the first two
    derivatives of ``log s0`` in ``s``. Every per-row quantity of the summary (``log p_y``,
    the top probability ``1 / s0``, ``sum_k p_k^2``) is ``exp`` of a function of ``s`` with known
    first and second derivatives, so its sum at ``s + delta`` is ``S0 + delta S1 + delta^2 S2``
    up to ``O((delta a)^3)`` per row (``a`` the row's first derivative): below float64 rounding
    when ``|delta| * max|a| <= 1e-5``, which :meth:`resolve` checks. Rows that ``delta`` could
    move across an ECE bin edge or the NLL clip (``|delta| <= dmax``) are kept one by one and
    placed exactly. So the fit record's "after" metrics come from the last Newton pass itself,
    with no pass at the final temperature. Mergeable (any batch order, several workers).
    """

    _MAX_KEPT = 1 << 20  # rows kept one by one; beyond this resolve() asks for a real pass

    def __init__(self, s: float, n_bins: int, dmax: float):
        from confcal.metrics.scores import NLL_EPS

        self.s, self.n_bins, self.dmax = float(s), int(n_bins), float(dmax)
        self.log_eps = math.log(NLL_EPS)
        self.n = self.correct = self.n_clipped = 0
        self.nll = np.zeros(3)  # sums of the coefficients of 1, delta, delta^2 (unclipped rows)
        self.brier = np.zeros(3)
        self.count = np.zeros(self.n_bins)
        self.corr = np.zeros(self.n_bins)
        self.conf = np.zeros((3, self.n_bins))
        self.a_max = 0.0
        self.kept_bins: list = []  # (conf, d1, d2, correct) of rows near an inner bin edge
        self.kept_nll: list = []  # (log p_y, d1, d2) of rows near the clip
        self.n_kept = 0

    def add(self, log_s0, m1, var, zy, q0, q1, q2, correct):
        """One chunk's rows (float64 tensors ``(rows,)``): ``log s0``, ``m1`` and ``var`` (mean and
        variance of the centred logits), ``zy`` (label logit minus the row max), ``q0..q2``
        (``sum e^2``, ``sum e^2 zc``, ``sum e^2 zc^2``) and ``correct`` (bool)."""
        from confcal.metrics._binning import _bounds, equal_width_bins

        s, dmax = self.s, self.dmax
        log_s0, m1, var, zy = (t.numpy() for t in (log_s0, m1, var, zy))
        q0, q1, q2, correct = q0.numpy(), q1.numpy(), q2.numpy(), correct.numpy()
        self.n += log_s0.shape[0]
        self.correct += int(np.count_nonzero(correct))
        # log p_y(s + d) = log p_y + d a - d^2 var / 2
        log_py = s * zy - log_s0
        a = zy - m1
        # sum p^2 = q(2s) / s0^2: d/ds log = b, d2/ds2 log = c
        w1 = q1 / q0
        b = 2.0 * (w1 - m1)
        c = 4.0 * np.maximum(q2 / q0 - w1 * w1, 0.0) - 2.0 * var
        self.a_max = max(self.a_max, float(np.max(np.abs(a))), float(np.max(np.abs(b))),
                         float(np.max(np.abs(m1))))
        # NLL: rows whose clip state delta cannot change are sums; the others are kept
        reach = 2.0 * (dmax * np.abs(a) + dmax * dmax * var) + 1e-12
        above = log_py - self.log_eps
        free = above > reach
        clipped = above < -reach
        self.n_clipped += int(np.count_nonzero(clipped))
        self.nll += [-np.sum(log_py[free]), -np.sum(a[free]), 0.5 * np.sum(var[free])]
        near = ~(free | clipped)
        if near.any():
            self._keep(self.kept_nll, (log_py[near], a[near], var[near]))
        # Brier = sum p^2 - 2 p_y + 1, each factor exp(d f' + d^2 f'' / 2) ~ 1 + d f' + d^2 (f'^2 + f'') / 2
        p2 = q0 / np.exp(2.0 * log_s0)
        py = np.exp(log_py)
        self.brier += [np.sum(p2 - 2.0 * py + 1.0), np.sum(p2 * b - 2.0 * py * a),
                       0.5 * np.sum(p2 * (b * b + c) - 2.0 * py * (a * a - var))]
        # ECE: top probability 1 / s0, d log / ds = -m1, d2 = -var
        conf = np.exp(-log_s0)
        idx = equal_width_bins(conf, self.n_bins)
        lower, upper = _bounds(self.n_bins)
        reach_c = conf * (2.0 * (dmax * np.abs(m1) + dmax * dmax * var) + 1e-12)
        near = (conf - lower[idx] <= reach_c) | (upper[idx] - conf < reach_c)  # NaN edges: never near
        far = ~near
        i = idx[far]
        cf, m1f, vf = conf[far], m1[far], var[far]
        self.count += np.bincount(i, minlength=self.n_bins)
        self.corr += np.bincount(i, weights=correct[far], minlength=self.n_bins)
        self.conf[0] += np.bincount(i, weights=cf, minlength=self.n_bins)
        self.conf[1] -= np.bincount(i, weights=cf * m1f, minlength=self.n_bins)
        self.conf[2] += np.bincount(i, weights=0.5 * cf * (m1f * m1f - vf), minlength=self.n_bins)
        if near.any():
            self._keep(self.kept_bins, (conf[near], m1[near], var[near], correct[near]))

    def _keep(self, into, arrays):
        self.n_kept += arrays[0].shape[0]
        if self.n_kept <= self._MAX_KEPT:
            into.append(tuple(np.array(x) for x in arrays))

    def merge(self, other: "NearMetrics") -> "NearMetrics":
        if (other.s, other.n_bins, other.dmax) != (self.s, self.n_bins, self.dmax):
            raise ValueError("merge: near-metrics of different passes")
        for key in ("n", "correct", "n_clipped", "n_kept"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        for key in ("nll", "brier", "count", "corr", "conf"):
            getattr(self, key).__iadd__(getattr(other, key))
        self.a_max = max(self.a_max, other.a_max)
        self.kept_bins += other.kept_bins
        self.kept_nll += other.kept_nll
        return self

    def resolve(self, s_final: float):
        """``(ScoresAccumulator, BinnedAccumulator)`` at ``s_final``, or None when ``s_final`` is
        too far from this pass's ``s`` for the expansion (then a pass at ``s_final`` is needed)."""
        from confcal.metrics import BinnedAccumulator, ScoresAccumulator
        from confcal.metrics._binning import equal_width_bins

        d = s_final - self.s
        if not (abs(d) <= self.dmax and abs(d) * self.a_max <= 1e-5 and self.n_kept <= self._MAX_KEPT):
            return None  # (a NaN anywhere refuses too)
        powers = np.array([1.0, d, d * d])
        nll = float(powers @ self.nll) - self.n_clipped * self.log_eps
        for log_py, a, var in self.kept_nll:
            nll -= float(np.sum(np.maximum(log_py + d * a - 0.5 * d * d * var, self.log_eps)))
        scores = ScoresAccumulator().update_sums(self.n, self.correct, nll, float(powers @ self.brier))
        bins = BinnedAccumulator(self.n_bins)
        bins.count += self.count
        bins.corr_sum += self.corr
        bins.conf_sum += powers @ self.conf
        for conf, m1, var, correct in self.kept_bins:
            c = conf * np.exp(-d * m1 - 0.5 * d * d * var)
            i = equal_width_bins(c, self.n_bins)
            bins.count += np.bincount(i, minlength=self.n_bins)
            bins.conf_sum += np.bincount(i, weights=c, minlength=self.n_bins)
            bins.corr_sum += np.bincount(i, weights=correct, minlength=self.n_bins)
        return scores, bins


def ts_batch_stats(logits, labels, t: float, *, sample_weight=None, exact: bool = True, metrics: bool = False,
                   before: bool = False, n_bins: int = 15, first_row: int = 0,
                   check_unit: bool = True, near: float | None = None) -> TSPassStats:
    """Sufficient statistics of one batch for a Newton step on ``t = log T``.

    Parameters
    ----------
    logits : float ``(n_rows, n_classes)`` (numpy or torch; ``-inf`` marks a masked class)
    labels : int ``(n_rows,)``, validated
    t : log temperature of this pass
    sample_weight : optional ``(n_rows,)`` non-negative weights (the loss is a weighted sum)
    exact : compute in float64 (else in the logits' dtype, for the early passes)
    metrics, before : also gather the summary metrics at ``T = exp(t)`` / at ``T = 1``
    first_row : index of the batch's first row in the whole data (for messages)
    check_unit : record whether every row lies in [0, 1] (``unit_rows``; the probabilities
        check, needed on the first pass only)
    near : with ``exact``, also gather :class:`NearMetrics` (``out.near``): the summary metrics at
        any inverse temperature within ``near`` of ``exp(-t)``, resolved once the pass is summed

    Returns a :class:`TSPassStats` whose sums add up over batches: with ``s = exp(-t)``
    and ``nll_i = log sum_k exp(s z_ik) - s z_iy``, ``loss = sum_i w_i nll_i``,
    ``grad = sum_i w_i d nll_i / dt`` and ``hess = sum_i w_i d2 nll_i / dt2``.

    Raises ``ValueError`` when a label sits on a ``-inf`` logit (infinite NLL).

    Examples
    --------
    >>> import numpy as np
    >>> z = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]]); y = np.array([0, 1, 1])
    >>> a = ts_batch_stats(z[:1], y[:1], 0.0).merge(ts_batch_stats(z[1:], y[1:], 0.0))
    >>> bool(np.allclose(a.means(), ts_batch_stats(z, y, 0.0).means()))
    True
    """
    if torch.is_tensor(logits):
        z = logits.detach().cpu()
    else:
        with warnings.catch_warnings():  # read-only memory maps: this function never writes to them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            z = torch.as_tensor(np.asarray(logits))
    if z.dtype not in (torch.float32, torch.float64):
        z = z.float()
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    w = None if sample_weight is None else torch.as_tensor(np.asarray(sample_weight, dtype=np.float64))
    s = math.exp(-t)
    dtype = torch.float64 if exact else z.dtype
    out = TSPassStats(t=t, n_rows=int(z.shape[0]))
    if metrics:
        out.after = _metric_pair(n_bins)
    if before:
        out.before = _metric_pair(n_bins)
    near = near if exact else None
    if near is not None:
        out.near = NearMetrics(s, n_bins, near)
    loss = grad_s = hess_s = 0.0
    near_rows, n_near = [], 0
    rows = max(1, _CHUNK_ELEMS // max(1, z.shape[1]))
    zero = torch.zeros((), dtype=dtype)
    for i in range(0, z.shape[0], rows):
        raw = z[i:i + rows]
        hi_ = raw.amax(dim=1)  # amax is much faster than aminmax/max(dim) on CPU
        if check_unit and out.unit_rows:
            out.unit_rows = bool((hi_ <= 1).all()) and bool((raw.amin() >= 0))
        if raw.dtype == dtype:
            zc = raw - hi_[:, None]
        else:  # cast first: a mixed float32 - float64 subtraction runs several times slower
            zc = raw.to(dtype)
            zc -= hi_.to(dtype)[:, None]
        e = _exp_(zc * s)
        ez = e * zc
        s1 = ez.sum(1)
        if bool(torch.isnan(s1).any()):  # 0 * -inf of a masked class (or bad input, caught by the caller)
            zc0 = torch.where(torch.isneginf(zc), zero, zc)
            ez = e * zc0
            s1 = ez.sum(1)
        else:
            zc0 = zc
        s0, s1, s2 = e.sum(1).double(), s1.double(), _rowdot(ez, zc0).double()
        yi = y[i:i + rows]
        zy = raw.gather(1, yi[:, None])[:, 0].double() - hi_.double()
        wi = None if w is None else w[i:i + rows]
        if bool(torch.isneginf(zy).any()):
            # a +inf elsewhere in the row also makes zy -inf: that is bad logits, which the
            # caller names (NaN/+inf in row ...), not a label on a masked class
            bad = torch.isneginf(zy) & torch.isfinite(hi_)
            bad = bad if wi is None else bad & (wi > 0)
            if bool(bad.any()):
                r = int(torch.nonzero(bad)[0])
                raise ValueError(f"labels: sample {first_row + i + r} has label {int(yi[r])}, whose logit is -inf "
                                 "(probability 0), which makes the NLL infinite")
        mean_z = s1 / s0
        li, gi, hi = torch.log(s0) - s * zy, mean_z - zy, torch.clamp(s2 / s0 - mean_z**2, min=0.0)
        if wi is None:
            loss, grad_s, hess_s = loss + float(li.sum()), grad_s + float(gi.sum()), hess_s + float(hi.sum())
        else:
            loss += float((li * wi).sum())
            grad_s += float((gi * wi).sum())
            hess_s += float((hi * wi).sum())
        if metrics or before or near is not None:
            # first maximum wins ties, as numpy.argmax (which is also faster than torch's here)
            correct = torch.from_numpy(np.argmax(raw.numpy(), axis=1)) == yi
            if metrics:
                if exact:
                    _add_metrics(out.after, e, s0, zy, s, correct)
                else:
                    e64 = _exp_(zc.double() * s)
                    _add_metrics(out.after, e64, e64.sum(1), zy, s, correct)
            if before:
                e1 = _exp_(zc.to(torch.float64, copy=True))
                _add_metrics(out.before, e1, e1.sum(1), zy, 1.0, correct)
            if near is not None:
                near_rows.append((torch.log(s0), mean_z, hi, zy, _rowdot(e, e), _rowdot(e, ez), _rowdot(ez, ez),
                                  correct))
                n_near += s0.shape[0]
                if n_near >= _NEAR_BLOCK:  # numpy work per block of rows, not per cache-sized chunk
                    out.near.add(*(torch.cat(cols) for cols in zip(*near_rows)))
                    near_rows, n_near = [], 0
    if near_rows:
        out.near.add(*(torch.cat(cols) for cols in zip(*near_rows)))
    out.weight = float(z.shape[0]) if w is None else float(w.sum())
    out.loss, out.grad, out.hess = loss, -s * grad_s, s * s * hess_s + s * grad_s
    return out


@dataclass(frozen=True)
class StreamedTemperatureFit:
    """Result of :func:`fit_temperature_stream`: the fit, the data size and digest, and the summary
    metrics (accuracy, ECE with 15 equal-width bins, NLL, Brier) at ``T = 1`` and at the fitted ``T``."""

    fit: TemperatureFit
    n_samples: int
    n_classes: int
    data_sha256: str
    metrics_before: dict | None
    metrics_after: dict | None
    n_passes: int


def _summary(pair) -> dict:
    scores, bins = pair
    r = scores.result()
    return {"accuracy": r["accuracy"], "ece": bins.ece(), "nll": r["nll"], "brier": r["brier"]}


def fit_temperature_stream(logits, labels, *, sample_weight=None, t_bounds=DEFAULT_T_BOUNDS, tol: float = 1e-12,
                           max_iter: int = 100, warn: bool = True, input_kind: str = "logits",
                           metrics: bool = True, n_bins: int = 15, batch_rows: int | None = None,
                           batch_bytes: int | None = None, progress=False) -> StreamedTemperatureFit:
    """:func:`fit_temperature` over row batches of a source: bounded memory, same ``T``.

    Each Newton iteration is one pass summing :func:`ts_batch_stats` over the batches;
    inputs are validated batch by batch on the first pass (same messages as
    :func:`confcal._validation.check_logits` / ``check_labels``, rows named by their index
    in the whole data). With ``metrics=True`` the summary metrics before (``T = 1``) and
    after come from the float64 passes of the fit itself, not from extra passes.

    Parameters
    ----------
    logits, labels, sample_weight : sources, specs (``"val.parquet:logit_*"``) or arrays;
        aligned row by row (:func:`confcal.sources.open_source`)
    t_bounds, tol, max_iter, warn : as :func:`fit_temperature`
    input_kind : ``"logits"`` or ``"probs"`` (their log is used, per batch)
    batch_rows / batch_bytes : batch size (default ~64 MB of rows)
    progress : tqdm bars on stderr per pass (``None``: when stderr is a terminal)

    Returns a :class:`StreamedTemperatureFit`.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(500, 4)) * 3; y = rng.integers(0, 4, size=500)
    >>> res = fit_temperature_stream(z, y, batch_rows=64)
    >>> bool(abs(np.log(res.fit.temperature / fit_temperature(z, y).temperature)) < 1e-9)
    True
    >>> sorted(res.metrics_after)
    ['accuracy', 'brier', 'ece', 'nll']
    """
    from confcal._digest import DataDigest
    from confcal._progress import progress_bar
    from confcal._validation import check_labels, check_logits
    from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, check_aligned, iter_aligned, open_source

    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    xs = open_source(logits, name="logits")
    ys = open_source(labels, name="labels")
    ws = None if sample_weight is None else open_source(sample_weight, name="sample_weight")
    if xs.ndim != 2:
        check_logits(xs.read(0, 1) if xs.n_rows else xs.to_numpy())  # the usual shape message
        raise ValueError(f"logits: expected shape (n_samples, n_classes), got {xs.shape}")
    n, k = xs.shape
    if n == 0:
        raise ValueError(f"logits: expected at least 1 sample, got shape {xs.shape}")
    if k < 2:
        raise ValueError(f"logits: expected n_classes >= 2, got shape {xs.shape}")
    if ws is not None and (ws.dtype == bool or ws.dtype.kind not in "fiu"):
        raise TypeError(f"sample_weight: expected a float array of shape ({n},), got dtype {ws.dtype}")
    sources = {"logits": xs, "labels": ys, "sample_weight": ws}
    check_aligned(sources)  # before the warm start reads row blocks: the message counts whole sources
    rows = batch_rows or batch_rows_for([xs, ys], batch_bytes or DEFAULT_BATCH_BYTES)
    work_dtype = np.float64 if xs.dtype == np.float64 or input_kind == "probs" else np.float32
    state = {"pass": 0, "validated": False, "before": None, "after": None, "after_t": None, "near": None,
             "prev_exact_t": None}
    digest = DataDigest(2 if ws is None else 3)  # as Calibrator.fit: logits, labels[, weights]

    def batches():
        validate = not state["validated"]
        for first, b in iter_aligned(sources, rows):
            x = b["logits"]
            if input_kind == "probs" or x.dtype not in (np.float32, np.float64) or x.ndim != 2:
                x = check_logits(x, input_kind=input_kind, first_row=first, whole=False)
            # float logits: NaN, +inf and all -inf rows make the pass's sums non-finite, and
            # one_pass then names the first bad row (check_logits on that batch), at no extra cost
            y = check_labels(b["labels"], x.shape[0], k, first_row=first)
            w = b["sample_weight"]
            if validate and w is not None:
                w = np.asarray(w, dtype=np.float64)
                if w.ndim != 1:
                    raise ValueError(f"sample_weight: expected shape ({n},) (one weight per sample), got "
                                     f"{(n, *w.shape[1:])}")
                bad = ~np.isfinite(w) | (w < 0)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise ValueError(f"sample_weight: expected finite weights >= 0, got {w[i]!r} at index {first + i}")
            if validate:
                digest.update(0, x)
                digest.update(1, y)
                if w is not None:
                    digest.update(2, w)
            yield first, x, y, w

    def one_pass(t, exact, with_metrics, near=None):
        state["pass"] += 1
        want_before = (with_metrics or near is not None) and exact and state["before"] is None
        check_unit = not state["validated"]
        total = TSPassStats(t=t)
        with progress_bar(n, f"temperature pass {state['pass']}", progress) as bar:
            for first, x, y, w in batches():
                st = ts_batch_stats(x, y, t, sample_weight=w, exact=exact, metrics=with_metrics and exact,
                                    before=want_before, n_bins=n_bins, first_row=first, check_unit=check_unit,
                                    near=near)
                if not all(math.isfinite(v) for v in (st.loss, st.grad, st.hess)):
                    check_logits(x, first_row=first, whole=False)  # names the bad row, if any
                total.merge(st)
                bar.update(x.shape[0])
        if not state["validated"]:
            state["validated"] = True
            if not total.weight > 0:
                raise ValueError("sample_weight: every weight is 0; at least one sample must count")
            if total.unit_rows and input_kind == "logits":
                _refuse_probabilities(xs, rows)
        if want_before:
            state["before"] = total.before
        if total.after is not None:
            state["after"], state["after_t"] = total.after, t
        state["near"] = total.near
        return total

    def dt_stats(t, exact):
        # the first float64 pass after float32 ones (which ran until the step was below 1e-5) is
        # usually the last, as is a float64 pass close to the previous one (Newton converges
        # quadratically): such a pass also gathers the metrics before (T = 1) and near its T,
        # resolved at the final T
        prev, state["prev_exact_t"] = state["prev_exact_t"], t if exact else state["prev_exact_t"]
        likely_last = exact and (not exact_input or (prev is not None and abs(t - prev) < 1e-3))
        near = _NEAR_DMAX * math.exp(-t) if metrics and likely_last else None
        return one_pass(t, exact, False, near).means()

    exact = exact_input = work_dtype == np.float64
    t = min(max(0.0, math.log(t_min)), math.log(t_max))
    if n > _WARM_START_ROWS and sample_weight is None:
        # a fit on spread-out row blocks lands near the optimum and saves full passes
        per = _WARM_START_ROWS // 8
        starts = np.linspace(0, n - per, 8).astype(np.int64)
        sub_x = np.concatenate([check_logits(xs.read(a, a + per), input_kind=input_kind, first_row=int(a),
                                             whole=False) for a in starts])
        sub_y = np.concatenate([check_labels(ys.read(a, a + per), per, k, first_row=int(a)) for a in starts])
        sub = fit_temperature(sub_x, sub_y, t_bounds=(t_min, t_max), warn=False)
        t = math.log(sub.temperature)
    with _one_thread(n * k <= _SMALL_ELEMS):
        # the same iteration as fit_temperature, so the same T (no verifying pass at the end)
        t, loss, n_iter, evaluated = _newton(dt_stats, t, t_min, t_max, tol, max_iter, exact)
        fit = _result(t, loss, n_iter, t_min, t_max, warn, stacklevel=3)
        t_final = t if not fit.at_bound else math.log(fit.temperature)
        if metrics:
            near = state["near"]
            after = near.resolve(math.exp(-t_final)) if near is not None else None
            if after is None or state["before"] is None:  # T moved too far after the last float64 pass
                one_pass(t_final, True, True)
            else:
                state["after"], state["after_t"] = after, t_final
    return StreamedTemperatureFit(
        fit=fit, n_samples=int(n), n_classes=int(k), data_sha256=digest.hexdigest(),
        metrics_before=_summary(state["before"]) if metrics else None,
        metrics_after=_summary(state["after"]) if metrics else None, n_passes=state["pass"])


def _refuse_probabilities(xs, rows) -> None:
    """Every row is in [0, 1]; if every row also sums to 1 and some entry is strictly inside
    (0, 1), these are probabilities, not logits (the rule of ``check_logits``)."""
    inside = False
    for first in range(0, xs.n_rows, rows):
        x = xs.read(first, first + rows)
        tol = 1e-3 if x.dtype == np.float16 else 1e-4
        if not np.all(np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol):
            return
        inside = inside or not np.all((x == 0) | (x == 1))
    if inside:
        raise ValueError("logits: every row is in [0, 1] and sums to 1, so these look like "
                         "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                         "to use their log as logits")


# ----------------------------------------------------------------------------- grouped, streamed

@dataclass(frozen=True)
class StreamedGroupedFit:
    """Result of :func:`fit_grouped_temperature_stream`."""

    pooled: TemperatureFit
    groups: dict  # {domain id: TemperatureFit} for the domains with their own fit
    counts: dict  # {domain id: n calibration samples}, ids sorted
    fallback: dict  # {domain id: reason} for the domains that use the pooled fit
    n_samples: int
    n_classes: int
    data_sha256: str
    metrics_before: dict | None
    metrics_after: dict | None
    n_passes: int


def _plain_id(v):
    return v.item() if hasattr(v, "item") else v


def fit_grouped_temperature_stream(logits, labels, domains, *, t_bounds=DEFAULT_T_BOUNDS, min_samples: int = 1,
                                   tol: float = 1e-12, max_iter: int = 100, input_kind: str = "logits",
                                   metrics: bool = True, n_bins: int = 15, batch_rows: int | None = None,
                                   batch_bytes: int | None = None, progress=False) -> StreamedGroupedFit:
    """A pooled temperature and one per domain, every Newton iteration sharing the passes over a source.

    The multiclass analogue of :func:`ts_batch_stats` per group: each pass reads a batch once,
    sorts its rows by domain and sums each group's statistics at that group's current ``log T``
    (and the pooled ones at the pooled ``log T``); each group runs the Newton iteration of
    :func:`fit_temperature` (:func:`_newton_steps`), so the temperatures equal the in-memory
    per-domain fits. Domains with fewer than ``min_samples`` rows use the pooled fit. With
    ``metrics``, one more pass gathers the summary metrics at ``T = 1`` and with each row at its
    domain's temperature (the fit record of ``grouped-ts``).

    Parameters
    ----------
    logits, labels, domains : aligned sources, specs or arrays; ``domains`` holds str or int ids
    t_bounds, tol, max_iter : as :func:`fit_temperature` (every group)
    min_samples : domains with fewer rows fall back to the pooled temperature
    input_kind, n_bins, batch_rows, batch_bytes, progress : as :func:`fit_temperature_stream`

    Returns a :class:`StreamedGroupedFit`; raises ``ValueError`` on invalid inputs (rows named
    by their index in the whole data).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, size=600); d = rng.integers(0, 2, size=600)
    >>> z = (1 + 3 * d)[:, None] * (rng.normal(size=(600, 3)) + np.eye(3)[y])
    >>> res = fit_grouped_temperature_stream(z, y, d, batch_rows=50)
    >>> {k: round(f.temperature, 3) for k, f in res.groups.items()}, res.counts
    ({0: 1.09, 1: 3.981}, {0: 290, 1: 310})
    >>> bool(abs(res.groups[1].temperature / fit_temperature(z[d == 1], y[d == 1]).temperature - 1) < 1e-9)
    True
    """
    from confcal._digest import DataDigest
    from confcal._progress import progress_bar
    from confcal._validation import check_domains, check_labels, check_logits
    from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, check_aligned, iter_aligned, open_source

    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    xs, ys = open_source(logits, name="logits"), open_source(labels, name="labels")
    ds = open_source(domains, name="domains")
    if xs.ndim != 2 or xs.shape[0] == 0 or xs.shape[1] < 2:
        raise ValueError(f"logits: expected shape (n_samples, n_classes) with n_samples >= 1 and "
                         f"n_classes >= 2, got {xs.shape}")
    n, k = xs.shape
    sources = {"logits": xs, "labels": ys, "domains": ds}
    check_aligned(sources)  # before the warm start reads row blocks: the message counts whole sources
    rows = batch_rows or batch_rows_for(list(sources.values()), batch_bytes or DEFAULT_BATCH_BYTES)
    exact0 = xs.dtype == np.float64 or input_kind == "probs"
    state = {"pass": 0, "validated": False}
    digest = DataDigest(3)  # as Calibrator.fit: logits, labels, domains
    counts: dict = {}

    def batches(desc):
        validate = not state["validated"]
        unit = True
        state["pass"] += 1
        with progress_bar(n, f"{desc} {state['pass']}", progress) as bar:
            for first, b in iter_aligned(sources, rows):
                x = b["logits"]
                if validate or input_kind == "probs" or x.dtype not in (np.float32, np.float64):
                    x = check_logits(x, input_kind=input_kind, first_row=first, whole=False)
                    unit = unit and bool(np.min(x) >= 0) and bool(np.max(x) <= 1)
                y = check_labels(b["labels"], x.shape[0], k, first_row=first)
                d = check_domains(b["domains"], x.shape[0]) if validate else b["domains"]
                ids, codes = np.unique(d, return_inverse=True)
                ids = [_plain_id(v) for v in ids]
                order = np.argsort(codes, kind="stable")
                bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(ids)))])
                if validate:
                    digest.update(0, x)
                    digest.update(1, y)
                    digest.update(2, d)
                    for g, key in enumerate(ids):
                        counts[key] = counts.get(key, 0) + int(bounds[g + 1] - bounds[g])
                yield x, y, ids, order, bounds
                bar.update(x.shape[0])
        if validate:
            state["validated"] = True
            if unit and input_kind == "logits":
                _refuse_probabilities(xs, rows)

    def newton_pass(requests):
        """``{group: (t, exact)}`` -> ``{group: TSPassStats}`` (group None: the pooled fit)."""
        totals = {g: TSPassStats(t=t) for g, (t, _) in requests.items()}
        for x, y, ids, order, bounds in batches("grouped temperature pass"):
            if None in requests:
                t, exact = requests[None]
                totals[None].merge(ts_batch_stats(x, y, t, exact=exact, check_unit=False))
            xo, yo = None, None
            for g, key in enumerate(ids):
                if key not in requests and state["validated"]:
                    continue
                if xo is None:
                    xo, yo = x[order], y[order]
                lo, hi = bounds[g], bounds[g + 1]
                t, exact = requests.get(key, requests.get(None))  # a group first seen starts at the pooled t
                st = ts_batch_stats(xo[lo:hi], yo[lo:hi], t, exact=exact, check_unit=False)
                totals.setdefault(key, TSPassStats(t=t)).merge(st)
        return totals

    # every group and the pooled fit start from the same point (a fit on spread-out row blocks)
    t0 = min(max(0.0, math.log(t_min)), math.log(t_max))
    if n > _WARM_START_ROWS:
        per = _WARM_START_ROWS // 8
        starts = np.linspace(0, n - per, 8).astype(np.int64)
        sub_x = np.concatenate([check_logits(xs.read(a, a + per), input_kind=input_kind, first_row=int(a),
                                             whole=False) for a in starts])
        sub_y = np.concatenate([check_labels(ys.read(a, a + per), per, k, first_row=int(a)) for a in starts])
        t0 = math.log(fit_temperature(sub_x, sub_y, t_bounds=(t_min, t_max), warn=False).temperature)
    steps = {None: _newton_steps(t0, t_min, t_max, tol, max_iter, exact0)}
    pending = {None: next(steps[None])}
    done = {}
    small = set()
    with _one_thread(n * k <= _SMALL_ELEMS):
        while pending:
            stats = newton_pass(pending)
            if len(steps) == 1:  # the first pass found the groups: each starts where the pooled fit did
                small = {g for g, c in counts.items() if c < min_samples}
                for g in counts:
                    if g not in small:
                        steps[g] = _newton_steps(t0, t_min, t_max, tol, max_iter, exact0)
                        pending[g] = next(steps[g])
            moving = {}
            for g, request in pending.items():
                try:
                    moving[g] = steps[g].send(stats[g].means())
                except StopIteration as stop:
                    done[g] = stop.value
            pending = moving
    fits = {}
    for g, (t, loss, n_iter, _) in done.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            fits[g] = _result(t, loss, n_iter, t_min, t_max, True)
        for w in caught:
            prefix = "" if g is None else f"domain {g!r}: "
            warnings.warn(f"{prefix}{w.message}", CalibrationWarning, stacklevel=3)
    pooled = fits.pop(None)
    counts = {key: counts[key] for key in _sorted_ids(counts)}
    fits = {key: fits[key] for key in counts if key in fits}
    fallback = {g: f"fewer than min_samples={min_samples} calibration samples" for g in counts if g in small}
    before = after = None
    if metrics:
        before, after = _metric_pair(n_bins), _metric_pair(n_bins)
        for x, y, ids, order, bounds in batches("grouped temperature metrics pass"):
            xo, yo = x[order], y[order]
            for g, key in enumerate(ids):
                lo, hi = bounds[g], bounds[g + 1]
                t = math.log(fits.get(key, pooled).temperature)
                st = ts_batch_stats(xo[lo:hi], yo[lo:hi], t, metrics=True, before=True, n_bins=n_bins,
                                    check_unit=False)
                for mine, theirs in ((before, st.before), (after, st.after)):
                    mine[0].merge(theirs[0])
                    mine[1].merge(theirs[1])
    return StreamedGroupedFit(pooled=pooled, groups=fits, counts=counts, fallback=fallback, n_samples=int(n),
                              n_classes=int(k), data_sha256=digest.hexdigest(),
                              metrics_before=_summary(before) if metrics else None,
                              metrics_after=_summary(after) if metrics else None, n_passes=state["pass"])


def _sorted_ids(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # mixed types: a stable order all the same
        return sorted(keys, key=repr)
