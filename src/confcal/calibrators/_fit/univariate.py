"""One-dimensional calibration maps: score -> P(positive), as pure fit/apply function pairs.

Each ``fit_*`` takes a score vector ``(n,)``, 0/1 targets ``(n,)`` and optional
non-negative sample weights, and returns JSON-ready parameters (plain floats
and lists); the matching ``apply_*`` evaluates the map on new scores. The
multiclass reductions (one-vs-rest, top-label) in :mod:`._reduce` and the box
score calibrators call these.

Binning convention (all binning maps): bin ``i`` is ``(edges[i-1], edges[i]]``,
with the first bin open to ``-inf`` and the last to ``+inf`` -- a score equal to
an edge falls in the lower bin, and scores outside the calibration range fall in
the first or last bin.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, gammaln, logsumexp

from confcal.calibrators._fit.constrained_logistic import fit_constrained_logistic

__all__ = ["equal_mass_edges", "edges_between", "bin_index", "fit_histogram", "apply_histogram", "fit_isotonic", "apply_isotonic",
           "fit_bbq", "apply_bbq", "bbq_bin_range", "bdeu_log_score", "random_halves",
           "fit_bin_means", "fit_platt", "apply_platt", "apply_step"]


def _weights(w, n):
    return np.ones(n) if w is None else np.asarray(w, dtype=np.float64)


# ------------------------------------------------------------------------- bins
def equal_mass_edges(scores, n_bins: int, sample_weight=None) -> np.ndarray:
    """Interior edges of ``n_bins`` equal-mass bins of ``scores``; duplicates merged.

    The cut ``i`` (``i = 1..n_bins-1``) falls after the smallest score whose
    cumulative (weighted) count reaches ``i / n_bins`` of the total (the
    inverted-CDF quantile ``q_i``). Equal cuts (ties) are kept once and cuts at
    the largest score are dropped, so that every bin holds at least one
    calibration score: ties at a quantile put the whole tie in one bin, and a
    constant predictor gets a single bin. The stored edge is not ``q_i`` itself
    but the midpoint between ``q_i`` and the next larger calibration score
    of positive weight (:func:`edges_between`), so no calibration score lies on an edge and a score
    an ulp away (another ``exp``, an exported head) stays in its bin; every
    calibration score is in the same bin as under the edge ``q_i``.

    Returns float64 ``(n_edges,)``, strictly increasing, ``n_edges <= n_bins - 1``.
    """
    s = np.asarray(scores, dtype=np.float64)
    w = _weights(sample_weight, s.size)
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    cw = np.cumsum(w[order])
    total = cw[-1]
    targets = np.arange(1, n_bins) * total / n_bins
    idx = np.minimum(np.searchsorted(cw, targets, side="left"), s.size - 1)
    return _cuts_between(s_sorted, idx, w[order])


def _cuts_between(s_sorted, idx, w_sorted) -> np.ndarray:
    """The edges for the quantile ranks ``idx`` of the sorted scores: distinct quantiles below the
    largest score, each moved to the midpoint before the next larger score of positive weight (a
    zero-weight row is a removed row: it must not move an edge)."""
    q = np.unique(s_sorted[idx])
    q = q[q < s_sorted[-1]]
    live = np.append(s_sorted[w_sorted > 0], np.inf)
    return edges_between(q, live[np.searchsorted(live[:-1], q, side="right")])


def edges_between(quantiles, above) -> np.ndarray:
    """Bin edges strictly between each calibration-score quantile and the next larger calibration score.

    ``quantiles`` ``(E,)`` strictly increasing scores, ``above`` ``(E,)`` the smallest calibration
    score greater than each (so ``quantiles[i] < above[i] <= quantiles[i + 1]``). Returns float64
    ``(E,)``: ``quantiles / 2 + above / 2`` (no overflow at the float64 limit), which lies strictly
    between the two unless they are adjacent floats (or infinite), where the quantile itself is
    kept. Every score ``<= quantiles[i]`` stays below edge ``i`` and every score ``>= above[i]``
    above it, so the bins' contents are those of the edges ``quantiles``.
    """
    q = np.asarray(quantiles, dtype=np.float64)
    a = np.asarray(above, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = 0.5 * q + 0.5 * a
    ok = np.isfinite(mid) & (mid > q) & (mid < a)
    return np.where(ok, mid, q)


def bin_index(edges, scores) -> np.ndarray:
    """Bin of each score under the ``(lo, hi]`` convention: the number of edges below it."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), np.asarray(scores, dtype=np.float64),
                           side="left")


def apply_step(edges, values, scores) -> np.ndarray:
    """Piecewise-constant map: ``values[bin_index(edges, scores)]``."""
    return np.asarray(values, dtype=np.float64)[bin_index(edges, scores)]


def _bin_sums(idx, n_bins, w, v):
    return np.bincount(idx, weights=w, minlength=n_bins), np.bincount(idx, weights=w * v, minlength=n_bins)


def _bin_means(count, total, fallback):
    # a bin can only be weightless when zero sample weights sit on an edge: it gets the overall mean
    out = np.full(count.shape, fallback)
    np.divide(total, count, out=out, where=count > 0)
    return out


# -------------------------------------------------------------------- histogram
def fit_histogram(scores, targets, *, n_bins: int, sample_weight=None, fitted: bool = False):
    """Histogram binning (Zadrozny & Elkan, ICML 2001): equal-mass bins, each bin's value is the
    (weighted) fraction of positives in it. Every bin is non-empty by construction of
    :func:`equal_mass_edges`.

    Without weights the edges come from one sort of the score values (no argsort: with unit weights
    the cumulative count at a rank is the rank, whatever the order of tied scores), the counts from
    the sorted scores (the edges lie strictly between two calibration scores) and the positives from
    one ``bincount`` in row order: the same sums as :func:`bin_index` and ``_bin_sums``, so the
    values are equal to the weighted path's with unit weights, not just close.

    ``fitted=True`` returns ``(params, map of each calibration score)``, the latter equal to
    :func:`apply_histogram` of ``params`` on ``scores`` (each score's bin is known from the fit)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if sample_weight is not None:
        w = _weights(sample_weight, s.size)
        edges = equal_mass_edges(s, n_bins, w)
        idx = bin_index(edges, s)
        count, pos = _bin_sums(idx, edges.size + 1, w, y)
        values = _bin_means(count, pos, float(np.sum(w * y) / np.sum(w)))
        params = {"edges": edges.tolist(), "values": values.tolist()}
        return (params, values[idx]) if fitted else params
    n = s.size
    s_sorted = np.sort(s)  # values only: numpy's SIMD sort, 2-4x faster here than an argsort
    # the ranks of equal_mass_edges with unit weights: its cumulative weights are 1, 2, ..., n
    ranks = np.minimum(np.searchsorted(np.arange(1.0, n + 1.0), np.arange(1, n_bins) * float(n) / n_bins,
                                       side="left"), n - 1)
    q = np.unique(s_sorted[ranks])
    q = q[q < s_sorted[-1]]
    edges = edges_between(q, s_sorted[np.searchsorted(s_sorted, q, side="right")])
    idx = bin_index(edges, s)  # a search in <= n_bins - 1 edges per score
    count = np.diff(np.concatenate([[0], np.searchsorted(s_sorted, edges, side="right"), [n]])).astype(np.float64)
    pos = np.bincount(idx, weights=y, minlength=edges.size + 1)  # as _bin_sums with unit weights
    values = pos / count
    params = {"edges": edges.tolist(), "values": values.tolist()}
    return (params, values[idx]) if fitted else params


def apply_histogram(params: dict, scores) -> np.ndarray:
    return apply_step(params["edges"], params["values"], scores)


# --------------------------------------------------------------------- isotonic
def fit_isotonic(scores, targets, *, sample_weight=None) -> dict:
    """Isotonic regression (Zadrozny & Elkan, KDD 2002), the map of scikit-learn's ``IsotonicRegression``
    (``increasing=True``, ``y_min=0``, ``y_max=1``, ``out_of_bounds="clip"``) without its per-call
    validation (a third of a one-vs-rest fit's time on 100 classes).

    The same steps: rows of zero weight dropped; scores sorted; a run of scores within float64's
    ``resolution`` (1e-15) of the run's first score merged into one point at that score with the
    weighted mean target and the summed weight; the pool-adjacent-violators fit of those points
    (``scipy.optimize.isotonic_regression``, which scikit-learn calls too); values clipped to
    ``[0, 1]``; interior points whose value equals both neighbours' dropped. Stored as the
    thresholds; :func:`apply_isotonic` interpolates linearly between them and clips outside
    ``[min score, max score]`` to the end values, as scikit-learn's ``predict`` does.
    """
    from scipy.optimize import isotonic_regression

    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
        keep = w > 0
        s, y, w = s[keep], y[keep], w[keep]
        order = np.lexsort((y, s))
        w = w[order]
    else:
        w = None
        # unit weights: the order within tied scores only changes the order of a run's sum of targets
        order = np.argsort(s)
    s, y = s[order], y[order]
    xs, ys, ws = _merge_close(s, y, w)
    fit = np.clip(np.asarray(isotonic_regression(ys, weights=ws, increasing=True).x, dtype=np.float64), 0.0, 1.0)
    keep = np.ones(fit.size, dtype=bool)
    keep[1:-1] = (fit[1:-1] != fit[:-2]) | (fit[1:-1] != fit[2:])
    return {"x": xs[keep].tolist(), "y": fit[keep].tolist()}


_RESOLUTION = float(np.finfo(np.float64).resolution)  # 1e-15: ties closer than this are one point


def _merge_close(s, y, w):
    """Sorted scores ``s`` whose runs lie within :data:`_RESOLUTION` of the run's first score, merged:
    ``(first score of each run, weighted mean target, summed weight)`` (``w`` None: unit weights).

    A step of at least the resolution always starts a run; steps below it start one only where
    the run begun before has already spread that far, which is checked one point at a time
    (only inside stretches of such small steps, rare for probabilities)."""
    n = s.size
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.greater_equal(s[1:] - s[:-1], _RESOLUTION, out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    wide = s[ends - 1] - s[starts] >= _RESOLUTION
    for a, b in zip(starts[wide], ends[wide]):
        anchor = a  # a run that spreads past the resolution: split it by the sequential rule
        for j in range(a + 1, b):
            if s[j] - s[anchor] >= _RESOLUTION:
                new[j] = True
                anchor = j
    starts = np.flatnonzero(new)
    if starts.size == n:
        return s, y, (np.ones(n) if w is None else w)
    if w is None:
        ws = np.diff(np.append(starts, n)).astype(np.float64)
        ys = np.add.reduceat(y, starts) / ws
    else:
        ws = np.add.reduceat(w, starts)
        ys = np.add.reduceat(w * y, starts) / ws
    return s[starts], ys, ws


def apply_isotonic(params: dict, scores) -> np.ndarray:
    x = np.asarray(params["x"], dtype=np.float64)
    y = np.asarray(params["y"], dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if x.size == 1:
        return np.full(s.shape, y[0])
    return np.interp(np.clip(s, x[0], x[-1]), x, y)


# -------------------------------------------------------------------------- BBQ
def bbq_bin_range(n_samples: int, spread: float = 10.0) -> range:
    """Bin counts BBQ averages over: ``floor(N^(1/3) / C) .. ceil(C N^(1/3))`` with ``C = spread``
    (Naeini et al., AAAI 2015, sec. "Bayesian Binning into Quantiles"), at least one bin."""
    root = n_samples ** (1.0 / 3.0)  # 1000 ** (1/3) = 9.999999999999998: the 1e-9 keeps exact cubes exact
    lo = max(1, int(math.floor(root / spread + 1e-9)))
    hi = max(lo, int(math.ceil(spread * root - 1e-9)))
    return range(lo, hi + 1)


def bdeu_log_score(edges, scores, targets, *, prior_strength: float = 2.0, sample_weight=None,
                   lo: float = 0.0, hi: float = 1.0):
    """log of the BDeu marginal likelihood of one binning (Naeini et al. 2015, the BBQ score):

    ``prod_b Gamma(N'/B) / Gamma(N_b + N'/B) * Gamma(m_b + a_b) / Gamma(a_b) * Gamma(n_b + b_b) / Gamma(b_b)``

    with ``B`` bins, ``N'`` = ``prior_strength``, ``N_b`` scores in bin ``b`` of which ``m_b``
    positive and ``n_b`` negative, ``a_b = N'/B * p_b``, ``b_b = N'/B * (1 - p_b)``, and ``p_b``
    the midpoint of the bin's interval (``lo`` and ``hi`` close the outer bins).
    Returns ``(log_score, bin values)``; a bin's value is the posterior mean
    ``(m_b + a_b) / (N_b + a_b + b_b)``.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    w = _weights(sample_weight, s.size)
    edges = np.asarray(edges, dtype=np.float64)
    count, pos = _bin_sums(bin_index(edges, s), edges.size + 1, w, y)
    return _bdeu(edges, count, pos, prior_strength, lo, hi)


def _bdeu(edges, count, pos, prior_strength, lo, hi):
    nb = edges.size + 1
    neg = count - pos
    bounds = np.concatenate([[lo], np.clip(edges, lo, hi), [hi]])
    mid = np.clip(0.5 * (bounds[:-1] + bounds[1:]), 1e-6, 1 - 1e-6)  # a prior mean strictly inside (0, 1)
    alpha = prior_strength / nb * mid
    beta = prior_strength / nb * (1.0 - mid)
    log_score = float(np.sum(gammaln(prior_strength / nb) - gammaln(count + prior_strength / nb)
                             + gammaln(pos + alpha) - gammaln(alpha) + gammaln(neg + beta) - gammaln(beta)))
    return log_score, (pos + alpha) / (count + alpha + beta)


def fit_bbq(scores, targets, *, spread: float = 10.0, prior_strength: float = 2.0, sample_weight=None) -> dict:
    """Bayesian binning into quantiles (Naeini, Cooper & Hauskrecht, AAAI 2015).

    One equal-mass binning per bin count in :func:`bbq_bin_range` (binnings that coincide after
    merging tied edges are counted once), each scored by :func:`bdeu_log_score` under a uniform
    prior over binnings; the calibrated value is the score-weighted average of the binnings'
    posterior-mean bin values. The average of step functions is itself a step function on
    the union of all edges, which is what is stored (plus each binning's bin count and weight).
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    w = _weights(sample_weight, s.size)
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    cw = np.cumsum(w[order])
    cpos = np.cumsum(w[order] * y[order])
    total, total_pos = cw[-1], cpos[-1]
    models, seen = [], set()
    # N is the (weighted) count, so an integer weight acts as a repeated score
    for b in bbq_bin_range(int(round(total)) if sample_weight is not None else s.size, spread):
        # the edges of equal_mass_edges(s, b, w), from the one sort
        idx = np.minimum(np.searchsorted(cw, np.arange(1, b) * total / b, side="left"), s.size - 1)
        edges = _cuts_between(s_sorted, idx, w[order])
        key = edges.tobytes()
        if key in seen:
            continue
        seen.add(key)
        # per-bin weighted counts from cumulative sums: scores <= edge fall in bins up to that edge
        upto = np.searchsorted(s_sorted, edges, side="right")
        cum_n = np.concatenate([[0.0], cw[upto - 1], [total]])
        cum_m = np.concatenate([[0.0], cpos[upto - 1], [total_pos]])
        count, pos = np.diff(cum_n), np.diff(cum_m)
        log_score, values = _bdeu(edges, count, pos, prior_strength, 0.0, 1.0)
        models.append((b, edges, values, log_score))
    log_scores = np.array([m[3] for m in models])
    weights = np.exp(log_scores - logsumexp(log_scores))
    union = np.unique(np.concatenate([m[1] for m in models]))
    # one representative per interval of the union: its right end, and +inf for the last
    reps = np.concatenate([union, [np.inf]])
    values = np.zeros(reps.size)
    for (_, edges, vals, _), wt in zip(models, weights):
        values += wt * vals[bin_index(edges, reps)]
    return {"edges": union.tolist(), "values": np.clip(values, 0.0, 1.0).tolist(),
            "n_bins": [int(m[0]) for m in models], "model_weights": weights.tolist()}


def apply_bbq(params: dict, scores) -> np.ndarray:
    return apply_step(params["edges"], params["values"], scores)


# ---------------------------------------------------------------- scaling-binning
def random_halves(n_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scaling-binning's split of the calibration set: ``numpy.random.default_rng(seed)`` permutes
    ``range(n_samples)``; the first ``n // 2`` indices fit the scaling map, the rest the bins."""
    from confcal._validation import MIN_SPLIT_ROWS, min_rows_message

    if n_samples < MIN_SPLIT_ROWS:
        raise ValueError(min_rows_message("scaling-binning", n_samples, "two halves"))
    perm = np.random.default_rng(seed).permutation(n_samples)
    return perm[: n_samples // 2], perm[n_samples // 2:]


def fit_bin_means(values, *, n_bins: int, sample_weight=None) -> dict:
    """Scaling-binning's steps 2-3 (Kumar, Liang & Ma, NeurIPS 2019, sec. 4): equal-mass bins of the
    scaling map's outputs ``values`` (:func:`equal_mass_edges`), each bin's value the (weighted) mean
    of the outputs in it -- not of the labels, which is what makes the binned map's calibration
    error measurable."""
    g = np.asarray(values, dtype=np.float64)
    w = _weights(sample_weight, g.size)
    edges = equal_mass_edges(g, n_bins, w)
    idx = bin_index(edges, g)
    count, total = _bin_sums(idx, edges.size + 1, w, g)
    fallback = float(np.sum(w * g) / np.sum(w))
    return {"edges": edges.tolist(), "values": np.clip(_bin_means(count, total, fallback), 0.0, 1.0).tolist()}


def fit_platt(logit_scores, targets, *, sample_weight=None, smoothed: bool = False) -> dict:
    """Platt scaling ``sigmoid(a s + b)`` of a logit score (Platt 1999) by exact maximum likelihood;
    ``smoothed`` uses Platt's targets (:func:`confcal.calibrators._fit.constrained_logistic.platt_targets`)."""
    from confcal.calibrators._fit.constrained_logistic import platt_targets

    y = np.asarray(targets, dtype=np.float64)
    t = platt_targets(y, sample_weight) if smoothed else y
    res = fit_constrained_logistic(logit_scores, t, sample_weight=sample_weight)
    return {"a": res.coef[0], "b": res.intercept}


def apply_platt(params: dict, logit_scores) -> np.ndarray:
    return expit(params["a"] * np.asarray(logit_scores, dtype=np.float64) + params["b"])
