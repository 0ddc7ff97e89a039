"""Bin assignment shared by every binned metric, so the edge convention is in one place.

Convention: bins are half-open on the left, ``(lo, hi]``, except the first,
which is closed, ``[0, hi]``. So a confidence of exactly 0 lands in the first
bin, exactly 1.0 in the last, and an edge value belongs to the lower bin.
"""

from __future__ import annotations

import functools

import numpy as np
from confcal._validation import plain

BINNINGS = ("equal_width", "equal_mass")


#: more bins than any reliability diagram resolves; every accumulator holds a few arrays of this size
MAX_BINS = 100_000


def check_n_bins(n_bins) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins: expected a positive integer, got {plain(n_bins)}")
    if n_bins > MAX_BINS:
        raise ValueError(f"n_bins: expected at most {MAX_BINS:,} bins, got {n_bins:,} (the usual choice is 10-20)")
    return int(n_bins)


def bin_edges(confidence: np.ndarray, n_bins: int, binning: str) -> np.ndarray:
    """Edges ``(n_bins + 1,)`` from 0 to 1.

    ``equal_mass`` puts the inner edges at the empirical quantiles of
    ``confidence``; tied confidences share a bin, so some bins can be empty
    (duplicate edges) and the effective number of bins can be below ``n_bins``.
    """
    n_bins = check_n_bins(n_bins)
    if binning == "equal_width":
        return np.linspace(0.0, 1.0, n_bins + 1)
    if binning == "equal_mass":
        inner = np.quantile(confidence, np.arange(1, n_bins) / n_bins, method="inverted_cdf") \
            if n_bins > 1 else np.empty(0)
        return np.concatenate([[0.0], np.asarray(inner, dtype=np.float64), [1.0]])
    raise ValueError(f"binning: expected one of {BINNINGS}, got {binning!r}")


def assign_bins(confidence: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index in ``[0, len(edges) - 2]`` for each confidence under the ``(lo, hi]`` rule.

    Equal-width edges (``linspace(0, 1, n_bins + 1)``) take the arithmetic path of
    :func:`equal_width_bins`; other edges a binary search. Both give the same index."""
    if is_equal_width(edges):
        return equal_width_bins(confidence, len(edges) - 1)
    idx = np.searchsorted(edges[1:-1], confidence, side="left")
    return idx.astype(np.intp)


_ARITHMETIC_MAX_BINS = 1 << 20  # c * n_bins stays within one bin of the truth far beyond this


@functools.lru_cache(maxsize=64)
def _linspace(n_bins: int) -> np.ndarray:
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    edges.flags.writeable = False  # shared by every caller
    return edges


@functools.lru_cache(maxsize=64)
def _bounds(n_bins: int):
    """Lower and upper edge of each equal-width bin; NaN where no move is allowed
    (nothing goes below the closed first bin, the last bin takes everything above)."""
    edges = _linspace(n_bins)
    lower, upper = edges[:-1].copy(), edges[1:].copy()
    lower[0] = upper[-1] = np.nan
    lower.flags.writeable = upper.flags.writeable = False
    return lower, upper


def equal_width_bins(confidence, n_bins: int) -> np.ndarray:
    """Bin index of each confidence on the edges ``linspace(0, 1, n_bins + 1)`` under the
    ``(lo, hi]`` rule, identical to the binary search of :func:`assign_bins`.

    ``floor(c * n_bins)`` is the bin up to one rounding of the product (and of the edge,
    which ``linspace`` rounds too), so it is off by at most one; one comparison with
    each edge of that bin moves it to the exact rule. NaN lands in the last bin, as in
    the binary search (which sorts NaN last).
    """
    c = np.asarray(confidence)
    f = np.multiply(c, float(n_bins), dtype=np.float64)
    np.fmin(f, n_bins - 1, out=f)  # fmin maps NaN to the last bin
    np.maximum(f, 0.0, out=f)
    idx = f.astype(np.intp)
    lower, upper = _bounds(n_bins)
    idx -= c <= lower[idx]
    idx += c > upper[idx]
    return idx


def is_equal_width(edges: np.ndarray) -> bool:
    """Whether ``edges`` are ``linspace(0, 1, n_bins + 1)`` (the arithmetic bin index applies)."""
    n_bins = len(edges) - 1
    return 1 <= n_bins <= _ARITHMETIC_MAX_BINS and np.array_equal(edges, _linspace(n_bins))


def bin_sums(confidence: np.ndarray, correct: np.ndarray, n_bins: int, binning: str):
    """Per-bin ``count``, ``sum of confidence``, ``sum of correct`` (float64), and the edges."""
    edges = bin_edges(confidence, n_bins, binning)
    idx = assign_bins(confidence, edges)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    conf_sum = np.bincount(idx, weights=confidence, minlength=n_bins)
    corr_sum = np.bincount(idx, weights=correct.astype(np.float64), minlength=n_bins)
    return count, conf_sum, corr_sum, edges


NORMS = ("l1", "l2", "max")


def binned_gap(count, conf_sum, corr_sum, norm: str = "l1") -> float:
    """Count-weighted gap between mean confidence and accuracy over non-empty bins:
    ``l1`` (ECE), ``l2`` (root of the weighted mean squared gap) or ``max`` (MCE)."""
    nz = count > 0
    gaps = np.abs(conf_sum[nz] - corr_sum[nz]) / count[nz]
    w = count[nz] / count.sum()
    if norm == "l1":
        return float(np.sum(w * gaps))
    if norm == "l2":
        return float(np.sqrt(np.sum(w * gaps**2)))
    if norm == "max":
        return float(gaps.max())
    raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
