"""Histogram binning of many score columns at once: equal-mass (``"quantile"``) and equal-width
(``"uniform"``) bins, the maps of :func:`confcal.calibrators._fit.univariate.fit_histogram`.

A one-vs-rest fit on ``K`` classes bins ``K`` columns of the same ``n`` rows. Here they are binned
together: one in-place sort of the transposed ``(K, n)`` scores gives every column's equal-mass quantiles and
bin counts, one comparison pass per edge every score's bin (and the counts of equal-width bins),
and one ``bincount`` over the ``n`` labelled entries (a row is a positive of its own class's map
only) every bin's positives. The result is
equal to the per-column fit, not just close: edges and values are the same arithmetic on the same
numbers (no ``exp`` or ``log``). Columns that the shortcut does not cover (a tie at a quantile rank,
sample weights) go through the per-column code.

Binning convention (as every binning map here): bin ``i`` is ``(edges[i-1], edges[i]]``, the
outer bins open to ``-inf`` / ``+inf``.
"""

from __future__ import annotations

import numpy as np

from confcal.calibrators._fit.univariate import bin_index, edges_between, fit_histogram

__all__ = ["STRATEGIES", "MAX_UNIFORM_BINS", "check_uniform_bins", "uniform_edges", "uniform_bin_values", "fit_uniform_histogram", "fit_histograms", "quantile_ranks"]

#: bin strategies: equal-mass (Zadrozny & Elkan 2001) and equal-width on [0, 1] (Naeini et al. 2015;
#: Guo et al. 2017), scikit-learn's names (``KBinsDiscretizer``, ``calibration_curve``)
STRATEGIES = ("quantile", "uniform")

#: the most equal-width bins a fit makes. A bin of width 1e-4 is finer than a calibration set fills (one score
#: per bin on average takes 10,000 rows per class, a usable bin fraction hundreds), and every bin is stored:
#: 100,000 bins on 10 classes made a 39 MB manifest that took 17 s to load. Equal-mass bins need no cap (tied
#: edges merge: at most n_samples - 1 edges whatever n_bins). Manifests above it, written before, still load.
MAX_UNIFORM_BINS = 10_000


def check_uniform_bins(n_bins: int, strategy: str) -> None:
    """``ValueError`` naming ``n_bins`` when ``strategy="uniform"`` asks for more than :data:`MAX_UNIFORM_BINS`."""
    if strategy == "uniform" and n_bins > MAX_UNIFORM_BINS:
        raise ValueError(f"n_bins: expected at most {MAX_UNIFORM_BINS} equal-width bins with strategy='uniform' "
                         f"(narrower bins stay empty on any calibration set, and every bin is stored in the "
                         f"manifest), got {n_bins}; use fewer bins, or strategy='quantile'")


def uniform_edges(n_bins: int) -> np.ndarray:
    """The ``n_bins - 1`` interior edges ``i / n_bins`` (``i = 1 .. n_bins - 1``) of equal-width bins on
    ``[0, 1]``, float64 ``(n_bins - 1,)``, each the correctly rounded quotient."""
    return np.arange(1, n_bins, dtype=np.float64) / n_bins


def uniform_bin_values(count, pos, n_bins: int) -> np.ndarray:
    """``pos / count`` per bin; an empty (weightless) bin gets its midpoint ``(i + 1/2) / n_bins``: no
    calibration score fell in it, so there is no evidence to move the score's value (the outer bins'
    midpoints are those of ``[0, 1/n_bins]`` and ``[1 - 1/n_bins, 1]``)."""
    mid = np.broadcast_to((np.arange(n_bins, dtype=np.float64) + 0.5) / n_bins, count.shape).copy()
    np.divide(pos, count, out=mid, where=count > 0)
    return mid


def fit_uniform_histogram(scores, targets, *, n_bins: int, sample_weight=None, fitted: bool = False):
    """Histogram binning with ``n_bins`` equal-width bins on ``[0, 1]`` (:func:`uniform_edges`): a bin's
    value is the (weighted) fraction of positives in it, an empty bin's its midpoint.

    ``scores`` ``(n,)``, ``targets`` ``(n,)`` 0/1, ``sample_weight`` ``(n,)`` >= 0 or None. Returns
    ``{"edges", "values"}`` (lists of ``n_bins - 1`` and ``n_bins`` floats); ``fitted=True`` returns
    ``(params, map of each calibration score)``.

    Source: the equal-width bins of Naeini, Cooper & Hauskrecht, AAAI 2015 (and of Guo et al.,
    ICML 2017, sec. 3, for the reliability diagram) in the histogram binning of Zadrozny & Elkan,
    ICML 2001.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    edges = uniform_edges(n_bins)
    idx = bin_index(edges, s)
    if sample_weight is None:
        count = np.bincount(idx, minlength=n_bins).astype(np.float64)
        pos = np.bincount(idx, weights=y, minlength=n_bins)
    else:
        w = np.asarray(sample_weight, dtype=np.float64)
        count = np.bincount(idx, weights=w, minlength=n_bins)
        pos = np.bincount(idx, weights=w * y, minlength=n_bins)
    values = uniform_bin_values(count, pos, n_bins)
    params = {"edges": edges.tolist(), "values": values.tolist()}
    return (params, values[idx]) if fitted else params


def quantile_ranks(n: int, n_bins: int) -> np.ndarray:
    """0-based ranks of the unweighted equal-mass quantiles of ``n`` scores: for ``i = 1..n_bins-1`` the
    first rank whose cumulative count ``1..n`` reaches ``i n / n_bins`` (the inverted CDF), as
    :func:`confcal.calibrators._fit.univariate.fit_histogram` computes them, capped at ``n - 1``."""
    return np.minimum(np.searchsorted(np.arange(1.0, n + 1.0), np.arange(1, n_bins) * float(n) / n_bins,
                                      side="left"), n - 1)


def _map_of_row(labels, classes) -> np.ndarray:
    """For each row, the column whose map counts it as a positive (its class's), or -1."""
    lookup = np.full(int(max(np.max(labels), np.max(classes))) + 1, -1, dtype=np.intp)
    lookup[np.asarray(classes)] = np.arange(len(classes))
    return lookup[labels]


def fit_histograms(scores, labels, classes, *, n_bins: int, strategy: str = "quantile", sample_weight=None):
    """Histogram binning of every column of ``scores`` ``(n, C)`` against ``labels == classes[c]``.

    Parameters
    ----------
    scores : float64 array ``(n_samples, C)``
        One column per map (for one-vs-rest, the probabilities of the classes mapped).
    labels : int array ``(n_samples,)``
        Classes of the rows; row ``i`` is a positive of map ``c`` when ``labels[i] == classes[c]``.
    classes : sequence of int ``(C,)``, distinct
    n_bins : int >= 1
    strategy : ``"quantile"`` or ``"uniform"``
    sample_weight : float ``(n_samples,)`` >= 0 or None

    Returns
    -------
    maps : list of ``{"edges", "values"}``, one per column, each equal to
        ``fit_histogram(scores[:, c], labels == classes[c], n_bins=n_bins)`` (``"quantile"``) or
        :func:`fit_uniform_histogram` (``"uniform"``)
    fitted : float64 ``(n_samples, C)``, each map at its column's calibration scores
    """
    s = np.asarray(scores, dtype=np.float64)
    n, n_maps = s.shape
    y = np.asarray(labels)
    if sample_weight is not None or n_maps == 0:
        return _per_column(s, y, classes, n_bins, strategy, sample_weight)
    owner = _map_of_row(y, classes)
    # few columns: bin the transposed (C, n) copy, whose inner loops run over the n rows (over 10
    # columns numpy's per-row loops cost 2-3x); many: bin the (n, C) scores themselves (no more
    # fresh (n, C) arrays: each costs page faults, ~1 ms on 5,000 x 100 here)
    work = np.array(s.T, order="C", copy=True) if n_maps <= _BY_ROWS_MAX else s
    if strategy == "uniform":
        edges = uniform_edges(n_bins)
        idx, cnt = _bins(work, np.broadcast_to(edges, (n_maps, edges.size)), counts=True)
        return _finish(idx, [edges] * n_maps, owner, n_bins, lambda cnt, pos: uniform_bin_values(cnt, pos, n_bins),
                       cnt)
    if work is s:
        srt = np.array(s.T, order="C", copy=True)  # a copy (never a view of s), sorted in place: numpy's SIMD sort
    else:
        srt = work.copy()
    srt.sort(axis=1)
    ranks = np.unique(quantile_ranks(n, n_bins))
    ranks = ranks[ranks < n - 1]  # a quantile at the largest score is no edge
    q = srt[:, ranks]
    above = srt[:, ranks + 1]
    del srt
    # no tie at any rank: the quantiles are distinct and below the maximum, the next larger score is the
    # next in order, and bin i holds the scores at positions ranks[i-1] + 1 .. ranks[i] of every column
    clean = np.all(q < above, axis=1)
    if not clean.all():
        return _mixed(s, y, classes, n_bins, clean)
    edges = edges_between(q, above)
    count = np.diff(np.concatenate([[0], ranks + 1, [n]])).astype(np.float64)
    return _finish(_bins(work, edges), list(edges), owner, ranks.size + 1, lambda cnt, pos: pos / count)


#: up to this many columns the bins are found in a transposed (C, n) copy of the scores
_BY_ROWS_MAX = 32

#: up to this many edges a score's bin is counted by comparisons (one vectorised pass per edge, no
#: branches); beyond, found by a binary search, whose branches mispredict on equal-mass bins
_COMPARE_EDGES = 48


def _bins(s, edges, counts: bool = False):
    """:func:`confcal.calibrators._fit.univariate.bin_index` of every column's scores in its row of
    ``edges`` ``(C, E)``: the number of edges below each score, in the layout of ``s`` (``(n, C)``, or
    ``(C, n)`` when ``C <= _BY_ROWS_MAX``); with ``counts``, also each column's bin counts
    ``(C, E + 1)`` (float64)."""
    n_maps = edges.shape[0]
    by_rows = n_maps <= _BY_ROWS_MAX  # s is (C, n)
    n = s.shape[1] if by_rows else s.shape[0]
    n_out = edges.shape[1] + 1
    col = (lambda a, c: a[c]) if by_rows else (lambda a, c: a[:, c])
    if edges.shape[1] > _COMPARE_EDGES:
        idx = np.empty(s.shape, dtype=np.intp)
        for c in range(n_maps):
            col(idx, c)[...] = np.searchsorted(edges[c], col(s, c), side="left")
        if not counts:
            return idx
        return idx, np.stack([np.bincount(col(idx, c), minlength=n_out) for c in range(n_maps)]).astype(np.float64)
    idx = np.zeros(s.shape, dtype=np.int8)
    above = np.empty((n_maps, n_out + 1), dtype=np.int64)  # scores above edge i-1: n, ..., 0
    above[:, 0], above[:, -1] = n, 0
    for i in range(edges.shape[1]):
        cmp = s > (edges[:, i:i + 1] if by_rows else edges[:, i])
        idx += cmp
        if counts:
            above[:, i + 1] = np.count_nonzero(cmp, axis=1 if by_rows else 0)
    # bin b is (e[b-1], e[b]]: its count is the scores above e[b-1] less those above e[b]
    return (idx, (above[:, :-1] - above[:, 1:]).astype(np.float64)) if counts else idx


def _finish(idx, edges, owner, n_out, values_of, cnt=None):
    """Maps and fitted values ``(n, C)`` from every entry's bin ``idx`` (layout of :func:`_bins`) and the
    bin counts ``cnt`` (None where ``values_of`` knows them): the positives from one ``bincount`` over
    the ``n`` rows' own entries only."""
    n_maps = len(edges)
    by_rows = n_maps <= _BY_ROWS_MAX
    rows = np.flatnonzero(owner >= 0)
    m = owner[rows]
    own = idx[m, rows] if by_rows else idx[rows, m]
    pos = np.bincount(own.astype(np.intp) + m * n_out, minlength=n_maps * n_out)
    values = values_of(cnt, pos.astype(np.float64).reshape(n_maps, n_out))
    maps = [{"edges": e.tolist(), "values": v.tolist()} for e, v in zip(edges, values)]
    if by_rows:
        return maps, np.take_along_axis(values, idx, axis=1).T
    return maps, np.take_along_axis(np.ascontiguousarray(values.T), idx, axis=0)


def _per_column(s, y, classes, n_bins, strategy, sample_weight):
    fit = fit_uniform_histogram if strategy == "uniform" else fit_histogram
    fits = [fit(s[:, c], (y == k).astype(np.float64), n_bins=n_bins, sample_weight=sample_weight, fitted=True)
            for c, k in enumerate(classes)]
    fitted = np.empty(s.shape, dtype=np.float64)
    for c, f in enumerate(fits):
        fitted[:, c] = f[1]
    return [f[0] for f in fits], fitted


def _mixed(s, y, classes, n_bins, clean):
    """Columns with a tie at a quantile rank through :func:`fit_histogram`, the others through the shortcut."""
    maps: list = [None] * s.shape[1]
    fitted = np.empty(s.shape, dtype=np.float64)
    classes = np.asarray(classes)
    tied = np.flatnonzero(~clean)
    sub_maps, sub_fit = _per_column(s[:, tied], y, classes[tied], n_bins, "quantile", None)
    for j, (c, m) in enumerate(zip(tied, sub_maps)):
        maps[c], fitted[:, c] = m, sub_fit[:, j]
    ok = np.flatnonzero(clean)
    if ok.size:
        sub_maps, sub_fit = fit_histograms(s[:, ok], y, classes[ok], n_bins=n_bins)
        for j, (c, m) in enumerate(zip(ok, sub_maps)):
            maps[c], fitted[:, c] = m, sub_fit[:, j]
    return maps, fitted
