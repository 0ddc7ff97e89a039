"""Geometry-aware detection calibration error: D-ECE binned over confidence x box geometry.

Küppers et al., "Multivariate Confidence Calibration for Object Detection", CVPR-W 2020,
eq. 3: the D-ECE over a joint grid of the confidence and the box features (e.g. ``cx, cy, w, h``),
``D-ECE = sum_cells (n_cell / n) |precision(cell) - mean confidence(cell)|``. A detector that is
calibrated on average but over-confident at the image border and under-confident in the centre
has a small confidence-only D-ECE and a large geometry D-ECE.

Binning: the confidence in ``n_bins`` equal-width bins on [0, 1] (the ``(lo, hi]`` rule of
:mod:`confcal.metrics._binning`); each feature in ``n_feature_bins`` equal-width bins over its range
(``feature_ranges``, or the data's min and max), ``(lo, hi]`` with the first bin closed and values
outside the range in the outer bins.
"""

from __future__ import annotations

import numpy as np

from confcal._validation import check_features
from confcal.metrics._binning import assign_bins, bin_edges, check_n_bins
from confcal.metrics.detection import check_pairs

__all__ = ["geometry_ece", "geometry_gap_map", "feature_bin_edges", "geometry_cells", "geometry_ece_of_cells"]


def feature_bin_edges(features, n_feature_bins: int, feature_ranges=None) -> list[np.ndarray]:
    """Equal-width edges ``(n_feature_bins + 1,)`` per column of ``features`` ``(n, d)``, over
    ``feature_ranges`` ``[(lo, hi), ...]`` or the columns' min and max."""
    k = check_n_bins(n_feature_bins)
    d = features.shape[1]
    if feature_ranges is None:
        feature_ranges = [(float(features[:, j].min()), float(features[:, j].max())) for j in range(d)]
    if len(feature_ranges) != d:
        raise ValueError(f"feature_ranges: expected {d} (lo, hi) pairs, one per feature, got {len(feature_ranges)}")
    out = []
    for j, (lo, hi) in enumerate(feature_ranges):
        if not (np.isfinite(lo) and np.isfinite(hi) and hi >= lo):
            raise ValueError(f"feature_ranges: expected finite lo <= hi for feature {j}, got ({lo}, {hi})")
        out.append(np.linspace(lo, hi if hi > lo else lo + 1.0, k + 1))
    return out


def _cells(confidence, correct, features, n_bins, n_feature_bins, feature_ranges):
    c, y = check_pairs(confidence, correct)
    f = check_features(features, c.shape[0])
    edges = feature_bin_edges(f, n_feature_bins, feature_ranges)
    return (*geometry_cells(c, y, f, edges, n_bins), edges)


def geometry_cells(confidence, correct, features, edges, n_bins: int):
    """``(count, confidence sum, true-positive sum)`` per cell of the confidence x feature grid, each of
    shape ``(n_bins, len(edges[0]) - 1, ...)``; ``edges`` from :func:`feature_bin_edges`. Sums over row
    blocks add up to the sums over all rows (the streamed ``evaluate`` merges them)."""
    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct)
    f = np.asarray(features, dtype=np.float64).reshape(c.shape[0], -1)
    n_bins = check_n_bins(n_bins)
    idx = [assign_bins(c, bin_edges(c, n_bins, "equal_width"))]
    idx += [np.searchsorted(e[1:-1], f[:, j], side="left") for j, e in enumerate(edges)]
    shape = (n_bins,) + tuple(len(e) - 1 for e in edges)
    cell = np.ravel_multi_index(tuple(idx), shape)
    size = int(np.prod(shape))
    count = np.bincount(cell, minlength=size).reshape(shape)
    conf = np.bincount(cell, weights=c, minlength=size).reshape(shape)
    hits = np.bincount(cell, weights=y.astype(np.float64), minlength=size).reshape(shape)
    return count, conf, hits


def geometry_ece_of_cells(count, conf, hits) -> float:
    """The geometry D-ECE of cell sums (:func:`geometry_cells`): ``sum |hits - conf| / n``."""
    return float(np.abs(hits - conf).sum() / count.sum())


def geometry_ece(confidence, correct, features, n_bins: int = 5, n_feature_bins: int = 5, *,
                 feature_ranges=None) -> float:
    """Multivariate D-ECE over confidence x box features (Küppers et al. 2020, eq. 3).

    Parameters
    ----------
    confidence : float ``(n_boxes,)`` in [0, 1]
    correct : 0/1 or bool ``(n_boxes,)``
    features : float ``(n_boxes, d)``, the box geometry (e.g. ``cx, cy`` or ``range``), finite
    n_bins : confidence bins; n_feature_bins : bins per feature (the grid has
        ``n_bins * n_feature_bins ** d`` cells, so keep ``d`` small)
    feature_ranges : optional ``[(lo, hi)] * d``; default the data's range (give the same ranges to
        compare two calibrators on one set, or use the image's [0, 1])

    Returns
    -------
    float in [0, 1]; with ``d = 0`` columns it is :func:`~confcal.metrics.detection.detection_ece`.

    Raises
    ------
    ValueError
        Invalid pairs, features of the wrong shape or non-finite, bad bin counts or ranges.

    Examples
    --------
    Calibrated on average (two boxes of 0.5, one right) but not per half of the image:

    >>> round(geometry_ece([0.5, 0.5], [1, 0], [[0.1], [0.9]], n_bins=2, n_feature_bins=2), 6)
    0.5
    """
    count, conf, hits, _ = _cells(confidence, correct, features, n_bins, n_feature_bins, feature_ranges)
    return geometry_ece_of_cells(count, conf, hits)


def geometry_gap_map(confidence, correct, features, n_bins: int = 5, n_feature_bins: int = 5, *,
                     feature_ranges=None) -> dict:
    """Per feature cell, marginalised over confidence: ``count`` ``(k,)*d``, ``gap`` = mean confidence
    minus precision (NaN for empty cells; > 0: over-confident there), ``d_ece`` per cell (its
    confidence-binned D-ECE), and ``edges`` (the feature bin edges). For the report's heat map over
    position (``d = 2``: ``cx, cy``) and its gap-against-range curve (``d = 1``)."""
    count, conf, hits, edges = _cells(confidence, correct, features, n_bins, n_feature_bins, feature_ranges)
    n = count.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.where(n > 0, (conf.sum(axis=0) - hits.sum(axis=0)) / np.where(n > 0, n, 1), np.nan)
        dece = np.where(n > 0, np.abs(hits - conf).sum(axis=0) / np.where(n > 0, n, 1), np.nan)
    return {"count": n, "gap": gap, "d_ece": dece, "edges": edges}
