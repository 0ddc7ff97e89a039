"""Validation of (score, label) pairs and their counts below every grid threshold, in one pass.

No sort: each score is placed in its grid cell (``searchsorted`` into the grid, O(n log G)) and the
cells are counted (``bincount``); cumulative sums give ``#{S < lambda_j}`` and the positives among
them for all ``G`` thresholds at once.
"""

from __future__ import annotations

import numpy as np

#: fixed default grid for scores in [0, 1]: 0.001 steps plus log-spaced points near 0 and 1, where
#: calibrated confidences of accurate models pile up (fixed before any label is seen, as LTT asks)
_UNIT_GRID = np.unique(np.concatenate([np.linspace(0.0, 1.0, 1001), 1.0 - np.logspace(-8, -3, 51),
                                       np.logspace(-8, -3, 51)]))


def check_scores_labels(scores, labels, *, name: str = "scores") -> tuple[np.ndarray, np.ndarray]:
    """``scores`` as finite float64 ``(n,)`` and ``labels`` as bool ``(n,)`` (1 = positive: a true
    positive box, a correct top label, a present label); one-line ``ValueError`` otherwise."""
    s = check_scores(scores, name=name)
    y = np.asarray(labels)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != s.shape:
        raise ValueError(f"labels: expected shape {s.shape} (one 0/1 label per score), got {y.shape}")
    if y.dtype.kind == "b":
        return s, y
    if y.dtype.kind not in "iuf":
        raise ValueError(f"labels: expected 0/1 labels, got dtype {y.dtype}")
    ok = (y == 0) | (y == 1)
    if not ok.all():
        raise ValueError(f"labels: expected 0/1 labels (1 = positive), got {y[~ok][0]} at row {int(np.argmin(ok))}")
    return s, y.astype(bool)


def check_scores(scores, *, name: str = "scores") -> np.ndarray:
    """``scores`` as finite float64 ``(n,)``, ``n >= 1``; one-line ``ValueError`` otherwise."""
    s = np.asarray(scores)
    if s.ndim == 2 and s.shape[1] == 1:
        s = s[:, 0]
    if s.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array (n_samples,) of scores, got shape {s.shape}")
    if s.dtype.kind not in "fiub":
        raise ValueError(f"{name}: expected numeric scores, got dtype {s.dtype}")
    s = s.astype(np.float64, copy=False)
    if s.size == 0:
        raise ValueError(f"{name}: expected at least one score, got an empty array")
    bad = ~np.isfinite(s)
    if bad.any():
        raise ValueError(f"{name}: expected finite scores, got {s[bad][0]} at row {int(np.argmax(bad))}")
    return s


def default_grid(scores: np.ndarray) -> np.ndarray:
    """The candidate thresholds: :data:`_UNIT_GRID` for scores in [0, 1]; otherwise 1,001 quantiles of
    the scores (a grid that depends on the scores but not on the labels)."""
    if scores.min() >= 0.0 and scores.max() <= 1.0:
        return _UNIT_GRID.copy()
    return np.unique(np.quantile(scores, np.linspace(0.0, 1.0, 1001)))


def check_grid(grid) -> np.ndarray:
    """A user grid as a sorted, unique, finite float64 array."""
    g = np.asarray(grid, dtype=np.float64).ravel()
    if g.size == 0 or not np.all(np.isfinite(g)):
        raise ValueError(f"grid: expected a non-empty array of finite thresholds, got {g.size} values"
                         f"{'' if g.size == 0 else ' with a non-finite one'}")
    return np.unique(g)


def below_counts(scores: np.ndarray, labels: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(n_below, pos_below)``: ``#{S < grid[j]}`` and the positives among them, int64 ``(G,)``."""
    cell = np.searchsorted(grid, scores, side="right")  # grid[cell-1] <= s < grid[cell]
    g = grid.size
    all_in = np.bincount(cell, minlength=g + 1)
    pos_in = np.bincount(cell[labels], minlength=g + 1)
    return np.cumsum(all_in)[:g].astype(np.int64), np.cumsum(pos_in)[:g].astype(np.int64)
