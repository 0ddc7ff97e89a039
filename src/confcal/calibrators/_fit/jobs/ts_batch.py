"""Sufficient statistics of one batch for a temperature Newton pass (:func:`ts_batch_stats`), their
mergeable sums (:class:`TSPassStats`) and the fit record's metrics near the final ``T``
(:class:`NearMetrics`): what every streamed temperature fit sums over its batches, on any engine.
numpy only (no torch): float32 rows are computed in float32 on the early passes, every sum over
rows is accumulated in float64."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from confcal.calibrators._fit.tsfit import _CHUNK_ELEMS, _NEAR_BLOCK, _as_float_array, _rowdot, _rowmax, _rowsum

__all__ = ["TSPassStats", "NearMetrics", "ts_batch_stats"]


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


def _metric_pair(n_bins):
    from confcal.metrics import BinnedAccumulator, ScoresAccumulator

    return ScoresAccumulator(), BinnedAccumulator(n_bins)


def _add_metrics(pair, s0, q, zy, s, correct):
    """Summary metrics of ``softmax(z * s)`` from per-row sums of a pass (float64 ``(rows,)``): ``s0 =
    sum_k e_k`` and ``q = sum_k e_k^2`` with ``e = exp(s (z - max z))``. The top probability is ``1 / s0``
    (the row max is subtracted, so its term is 1), ``log p_y = s zy - log s0``, Brier ``= q / s0^2 - 2 p_y + 1``.
    Called once per block of rows (:data:`_NEAR_BLOCK`), not per cache-sized chunk: the per-row
    arithmetic and the binning pay numpy's per-call cost once per 32K rows."""
    from confcal.metrics.scores import NLL_EPS

    scores, bins = pair
    log_py = s * zy - np.log(s0)
    nll = -np.maximum(log_py, math.log(NLL_EPS))
    brier = q / (s0 * s0) - 2.0 * np.exp(log_py) + 1.0
    scores.update_sums(s0.shape[0], int(np.count_nonzero(correct)), float(nll.sum()), float(brier.sum()))
    bins.update_pairs(1.0 / s0, correct)


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
        """One chunk's rows (float64 arrays ``(rows,)``): ``log s0``, ``m1`` and ``var`` (mean and
        variance of the centred logits), ``zy`` (label logit minus the row max), ``q0..q2``
        (``sum e^2``, ``sum e^2 zc``, ``sum e^2 zc^2``) and ``correct`` (bool)."""
        from confcal.metrics._binning import _bounds, equal_width_bins

        s, dmax = self.s, self.dmax
        self.n += log_s0.shape[0]
        self.correct += int(np.count_nonzero(correct))
        # (the usual block has no row near the clip or a bin edge: sums and bincounts over the whole
        # block then, without boolean gathers; dot products instead of sums of product temporaries)
        # log p_y(s + d) = log p_y + d a - d^2 var / 2
        log_py = s * zy - log_s0
        a = zy - m1
        # sum p^2 = q(2s) / s0^2: d/ds log = b, d2/ds2 log = c
        w1 = q1 / q0
        b = 2.0 * (w1 - m1)
        c = 4.0 * np.maximum(q2 / q0 - w1 * w1, 0.0) - 2.0 * var
        abs_a, abs_m1 = np.abs(a), np.abs(m1)
        self.a_max = max(self.a_max, float(abs_a.max()), float(b.max()), float(-b.min()), float(abs_m1.max()))
        # NLL: rows whose clip state delta cannot change are sums; the others are kept
        reach = 2.0 * (dmax * abs_a + dmax * dmax * var) + 1e-12
        above = log_py - self.log_eps
        free = above > reach
        if free.all():
            self.nll += [-log_py.sum(), -a.sum(), 0.5 * var.sum()]
        else:
            clipped = above < -reach
            self.n_clipped += int(np.count_nonzero(clipped))
            self.nll += [-np.sum(log_py[free]), -np.sum(a[free]), 0.5 * np.sum(var[free])]
            near = ~(free | clipped)
            if near.any():
                self._keep(self.kept_nll, (log_py[near], a[near], var[near]))
        # Brier = sum p^2 - 2 p_y + 1, each factor exp(d f' + d^2 f'' / 2) ~ 1 + d f' + d^2 (f'^2 + f'') / 2
        p2 = q0 / np.exp(2.0 * log_s0)
        py = np.exp(log_py)
        n = log_s0.shape[0]
        self.brier += [p2.sum() - 2.0 * py.sum() + n, p2 @ b - 2.0 * (py @ a),
                       0.5 * (p2 @ (b * b + c)) - py @ (a * a - var)]
        # ECE: top probability 1 / s0, d log / ds = -m1, d2 = -var
        conf = np.exp(-log_s0)
        idx = equal_width_bins(conf, self.n_bins)
        lower, upper = _bounds(self.n_bins)
        reach_c = conf * (2.0 * (dmax * abs_m1 + dmax * dmax * var) + 1e-12)
        near = (conf - lower[idx] <= reach_c) | (upper[idx] - conf < reach_c)  # NaN edges: never near
        if near.any():
            self._keep(self.kept_bins, (conf[near], m1[near], var[near], correct[near]))
            far = ~near
            idx, conf, m1, var, correct = idx[far], conf[far], m1[far], var[far], correct[far]
        cm = conf * m1
        self.count += np.bincount(idx, minlength=self.n_bins)
        self.corr += np.bincount(idx, weights=correct, minlength=self.n_bins)
        self.conf[0] += np.bincount(idx, weights=conf, minlength=self.n_bins)
        self.conf[1] -= np.bincount(idx, weights=cm, minlength=self.n_bins)
        self.conf[2] += np.bincount(idx, weights=0.5 * (cm * m1 - conf * var), minlength=self.n_bins)

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
    logits : float ``(n_rows, n_classes)`` (numpy, or a CPU torch tensor; ``-inf`` marks a masked class)
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
    z = _as_float_array(logits)
    y = np.asarray(labels).astype(np.int64, copy=False)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    s = math.exp(-t)
    dtype = np.dtype(np.float64) if exact else z.dtype
    out = TSPassStats(t=t, n_rows=int(z.shape[0]))
    if metrics:
        out.after = _metric_pair(n_bins)
    if before:
        out.before = _metric_pair(n_bins)
    near = near if exact else None
    if near is not None:
        out.near = NearMetrics(s, n_bins, near)
    acc = [0.0, 0.0, 0.0]  # loss, d/ds, d2/ds2
    # per-row terms of the metrics, gathered chunk by chunk and reduced per block of rows
    blocks = _MetricBlocks(out, s)
    rows = max(1, _CHUNK_ELEMS // max(1, z.shape[1]))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # masked classes; bad rows: named
        for i in range(0, z.shape[0], rows):  # by the caller from the non-finite sums
            _chunk_stats(z[i:i + rows], y[i:i + rows], None if w is None else w[i:i + rows], i, s, dtype, out, acc,
                         blocks, check_unit=check_unit, metrics=metrics, before=before, first_row=first_row)
        blocks.flush()
    out.weight = float(z.shape[0]) if w is None else float(w.sum())
    loss, grad_s, hess_s = acc
    out.loss, out.grad, out.hess = loss, -s * grad_s, s * s * hess_s + s * grad_s
    return out


class _MetricBlocks:
    """The per-row terms of one pass's metrics (before, after, near), collected chunk by chunk and
    handed to the accumulators once per :data:`_NEAR_BLOCK` rows."""

    def __init__(self, out: TSPassStats, s: float):
        self.out, self.s = out, s
        self.rows: dict = {"before": [], "after": [], "near": []}
        self.n = 0

    def add(self, n: int, **terms) -> None:
        for key, cols in terms.items():
            self.rows[key].append(cols)
        self.n += n
        if self.n >= _NEAR_BLOCK:
            self.flush()

    def flush(self) -> None:
        out, rows = self.out, self.rows
        for key in ("before", "after", "near"):
            if rows[key]:
                cols = tuple(np.concatenate(c) for c in zip(*rows[key]))
                if key == "near":
                    out.near.add(*cols)
                else:
                    _add_metrics(getattr(out, key), *cols[:3], 1.0 if key == "before" else self.s, cols[3])
                rows[key].clear()
        self.n = 0


def _chunk_stats(raw, yi, wi, i, s, dtype, out, acc, blocks, *, check_unit, metrics, before, first_row):
    """One cache-sized chunk of :func:`ts_batch_stats`: adds to ``acc`` (loss, d/ds, d2/ds2) and
    hands the per-row terms of the requested metrics to ``blocks`` (:class:`_MetricBlocks`)."""
    hi_ = _rowmax(raw)
    if check_unit and out.unit_rows:
        out.unit_rows = bool((hi_ <= 1).all()) and bool(raw.min() >= 0)
    zc = np.subtract(raw, hi_[:, None], dtype=dtype)  # float64 passes: cast, then subtract
    e = zc * s
    np.exp(e, out=e)
    ez = e * zc
    s1 = _rowsum(ez)
    if np.isnan(s1).any():  # 0 * -inf of a masked class (or bad input, caught by the caller)
        zc0 = np.where(np.isneginf(zc), dtype.type(0), zc)
        ez = e * zc0
        s1 = _rowsum(ez)
    else:
        zc0 = zc
    s0 = _rowsum(e).astype(np.float64, copy=False)
    s1 = s1.astype(np.float64, copy=False)
    s2 = _rowdot(ez, zc0).astype(np.float64, copy=False)
    zy = raw[np.arange(raw.shape[0]), yi].astype(np.float64) - hi_  # (take_along_axis: twice the time)
    if zy.min() == -np.inf:  # (a reduction: much cheaper than isneginf)
        # a +inf elsewhere in the row also makes zy -inf: that is bad logits, which the
        # caller names (NaN/+inf in row ...), not a label on a masked class
        bad = np.isneginf(zy) & np.isfinite(hi_)
        bad = bad if wi is None else bad & (wi > 0)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(f"labels: sample {first_row + i + r} has label {int(yi[r])}, whose logit is -inf "
                             "(probability 0), which makes the NLL infinite")
    mean_z = s1 / s0
    li, gi, hi = np.log(s0) - s * zy, mean_z - zy, np.maximum(s2 / s0 - mean_z * mean_z, 0.0)
    if wi is None:
        acc[0] += float(li.sum())
        acc[1] += float(gi.sum())
        acc[2] += float(hi.sum())
    else:
        acc[0] += float(li @ wi)
        acc[1] += float(gi @ wi)
        acc[2] += float(hi @ wi)
    if not (metrics or before or out.near is not None):
        return
    correct = _top_is_label(raw, hi_, yi, zy, s0)
    terms = {}
    if metrics:
        if dtype == np.float64:
            terms["after"] = (s0, _rowdot_metric(e, e), zy, correct)
        else:
            e64 = zc.astype(np.float64) * s
            np.exp(e64, out=e64)
            terms["after"] = (_rowsum(e64), _rowdot_metric(e64, e64), zy, correct)
    if before:
        if s == 1.0 and dtype == np.float64:  # this pass is at T = 1: its terms are the metrics before
            e1, s01 = e, s0
        else:
            e1 = np.exp(zc if zc.dtype == np.float64 else zc.astype(np.float64))
            s01 = _rowsum(e1)
        terms["before"] = (s01, _rowdot_metric(e1, e1), zy, correct)
    if out.near is not None:
        terms["near"] = (np.log(s0), mean_z, hi, zy, _rowdot_metric(e, e), _rowdot_metric(e, ez),
                         _rowdot_metric(ez, ez), correct)
    blocks.add(raw.shape[0], **terms)


def _rowdot_metric(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of two ``(rows, k)`` float64 arrays for the fit record's metrics: one
    read of each, no ``a * b`` temporary (half the time of :func:`_rowdot` on a chunk of 2**18
    float64, which does not stay in L2). The search's own sums keep :func:`_rowdot`, as
    :func:`~confcal.calibrators._fit.tsfit.fit_temperature` computes them."""
    return np.einsum("ij,ij->i", a, b)


def _top_is_label(raw, hi_, yi, zy, s0=None) -> np.ndarray:
    """``argmax(raw, axis=1) == yi`` (the first maximum wins ties) from the row max ``hi_`` and
    ``zy = raw[y] - hi_``, without numpy's row-wise argmax (slow at small ``k``, as its max).

    ``s0``: the pass's ``sum_k exp(s (raw_k - hi_))`` per row, if known. A tie at the maximum puts two
    terms of exactly 1 in it (``exp(0)``, and a sum of non-negative floats never rounds below a
    partial sum), so a row with ``s0 < 2`` has no tie and only the other rows of a correct label are
    searched (on real outputs ~1% of the rows)."""
    correct = zy == 0.0
    if s0 is not None:
        idx = np.flatnonzero(correct & (s0 >= 2.0))
        if 4 * idx.size <= raw.shape[0]:
            if idx.size:
                sub = raw[idx]
                tied = np.count_nonzero(sub == hi_[idx, None], axis=1) > 1
                if tied.any():
                    t = idx[tied]
                    correct[t] = np.argmax(raw[t], axis=1) == yi[t]
            return correct
    at_max = raw == hi_[:, None]
    # every row without NaN has a maximum, so as many as rows means one per row: no ties (the usual case)
    if np.count_nonzero(at_max) == raw.shape[0] and not np.isnan(hi_).any():
        return correct
    ties = _rowsum(at_max.astype(raw.dtype)) > 1
    idx = np.flatnonzero(correct & ties)
    if idx.size:
        correct[idx] = np.argmax(raw[idx], axis=1) == yi[idx]
    return correct


def _summary(pair) -> dict:
    scores, bins = pair
    r = scores.result()
    return {"accuracy": r["accuracy"], "ece": bins.ece(), "nll": r["nll"], "brier": r["brier"]}
