"""Detection calibration metrics on ``(confidence, correct)`` pairs, one pair per box.

A box's confidence is calibrated when, among boxes of confidence ``c``, a
fraction ``c`` are true positives (Kueppers et al., "Multivariate Confidence
Calibration for Object Detection", CVPR-W 2020, eq. 2: precision given
confidence). The detection ECE (D-ECE) here bins the confidence only (their
eq. 3 with no box-geometry dimensions): ``D-ECE = sum_b (n_b / n)
|precision(b) - mean confidence(b)|``. Bins follow the ``(lo, hi]`` rule of
:mod:`confcal.metrics._binning`.

Inputs: ``confidence`` float ``(n_boxes,)`` in [0, 1] (calibrated probabilities,
or raw scores clipped to [0, 1] first by the caller), ``correct`` ``(n_boxes,)``
of 0/1 (bool or int). Optional ``domains`` ``(n_boxes,)`` ids give one result
per domain plus the pooled one under the key ``"(all)"``.
"""

from __future__ import annotations

import numpy as np

from confcal._validation import as_numpy, check_domains
from confcal.metrics._binning import bin_sums, binned_gap, check_n_bins

__all__ = ["check_pairs", "detection_ece", "binary_nll", "binary_brier", "detection_reliability",
           "precision_above_threshold", "per_domain", "ALL"]

#: key of the pooled result in per-domain dicts
ALL = "(all)"


def check_pairs(confidence, correct, *, name: str = "confidence"):
    """Validate ``(confidence, correct)``; return float64 ``(n,)`` and bool ``(n,)``.

    Raises ``ValueError`` for wrong shapes, NaN, confidences outside [0, 1]
    (clip raw detector scores first) or ``correct`` values other than 0/1.
    """
    c = as_numpy(confidence, name)
    y = as_numpy(correct, "correct")
    if c.ndim != 1:
        raise ValueError(f"{name}: expected shape (n_boxes,), got {c.shape}")
    if y.shape != c.shape:
        raise ValueError(f"correct: expected shape {c.shape} (one per box), got {y.shape}")
    if c.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one box, got 0")
    if not (np.issubdtype(c.dtype, np.floating) or np.issubdtype(c.dtype, np.integer)) or c.dtype == bool:
        raise TypeError(f"{name}: expected floats, got dtype {c.dtype}")
    c = c.astype(np.float64)
    bad = ~np.isfinite(c) | (c < 0) | (c > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected values in [0, 1], got {c[i]!r} at index {i} "
                         f"(range seen [{np.nanmin(c):g}, {np.nanmax(c):g}]); clip raw scores or calibrate first")
    if y.dtype != bool:
        if not np.all((y == 0) | (y == 1)):
            i = int(np.flatnonzero((y != 0) & (y != 1))[0])
            raise ValueError(f"correct: expected 0/1 values, got {y[i]!r} at index {i}")
        y = y.astype(bool)
    return c, y


def detection_ece(confidence, correct, n_bins: int = 15, binning: str = "equal_width", norm: str = "l1",
                  *, return_n_bins: bool = False):
    """D-ECE: count-weighted mean of ``|fraction of true positives - mean confidence|`` per bin.

    Parameters
    ----------
    confidence : float ``(n_boxes,)`` in [0, 1]
    correct : 0/1 ``(n_boxes,)``, 1 = true positive
    n_bins : number of bins (default 15)
    binning : ``"equal_width"`` or ``"equal_mass"`` (edges at confidence quantiles;
        tied confidences share a bin, so a constant confidence is one bin)
    norm : ``"l1"`` (D-ECE), ``"l2"`` or ``"max"`` (D-MCE)

    Returns a float in [0, 1] (with ``return_n_bins``: also the number of non-empty bins).
    Source: Kueppers et al. 2020, eq. 3 restricted to the confidence dimension.
    """
    c, y = check_pairs(confidence, correct)
    count, conf_sum, corr_sum, _ = bin_sums(c, y, check_n_bins(n_bins), binning)
    value = binned_gap(count, conf_sum, corr_sum, norm)
    return (value, int(np.count_nonzero(count))) if return_n_bins else value


def binary_nll(confidence, correct) -> float:
    """Mean Bernoulli negative log-likelihood (nats) of ``correct`` under ``confidence``.

    Probabilities are clipped to ``[eps, 1 - eps]`` with ``eps = 1e-12`` (as
    :func:`confcal.metrics.nll`), so a confident mistake is large but finite.
    """
    c, y = check_pairs(confidence, correct)
    p = np.clip(np.where(y, c, 1.0 - c), 1e-12, 1.0)
    return float(-np.mean(np.log(p))) + 0.0


def binary_brier(confidence, correct) -> float:
    """Mean squared difference ``(confidence - correct)^2`` (binary Brier score, in [0, 1])."""
    c, y = check_pairs(confidence, correct)
    return float(np.mean((c - y) ** 2))


def per_domain(domains, n: int) -> dict:
    """``{domain id: index array}`` in sorted id order, plus ``ALL`` for every box."""
    out = {ALL: np.arange(n)}
    if domains is None:
        return out
    d = check_domains(domains, n)
    for key in np.unique(d):
        out[key.item() if hasattr(key, "item") else key] = np.flatnonzero(d == key)
    return out


def detection_reliability(confidence, correct, n_bins: int = 10, binning: str = "equal_width",
                          domains=None) -> dict:
    """Reliability tables, one per domain (plus the pooled one under ``"(all)"``).

    Returns ``{domain: table}``; each table is a dict of ``(n_bins,)`` arrays:
    ``bin_lo``, ``bin_hi``, ``count`` (int64), ``mean_confidence`` and
    ``precision`` (fraction of true positives; NaN for empty bins). With
    ``binning="equal_mass"`` the edges are the quantiles of that domain's confidences.
    """
    c, y = check_pairs(confidence, correct)
    n_bins = check_n_bins(n_bins)
    out = {}
    for key, idx in per_domain(domains, c.shape[0]).items():
        count, conf_sum, corr_sum, edges = bin_sums(c[idx], y[idx], n_bins, binning)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[key] = {
                "bin_lo": edges[:-1].copy(), "bin_hi": edges[1:].copy(), "count": count.astype(np.int64),
                "mean_confidence": np.where(count > 0, conf_sum / count, np.nan),
                "precision": np.where(count > 0, corr_sum / count, np.nan),
            }
    return out


def precision_above_threshold(confidence, correct, threshold: float = 0.7, domains=None) -> dict:
    """Precision among boxes with ``confidence >= threshold``, per domain.

    This is the "same threshold, same meaning across sensors" check: after
    calibration, the precision of the boxes kept at a threshold should be at
    least the threshold in every domain, and the mean confidence of the kept
    boxes should match their precision.

    Returns ``{domain: {"n_boxes", "n_above", "precision", "mean_confidence"}}``;
    ``precision`` and ``mean_confidence`` are NaN when no box reaches the threshold.
    """
    c, y = check_pairs(confidence, correct)
    t = float(threshold)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"threshold: expected a value in [0, 1], got {threshold!r}")
    out = {}
    for key, idx in per_domain(domains, c.shape[0]).items():
        keep = idx[c[idx] >= t]
        out[key] = {
            "n_boxes": int(idx.size),
            "n_above": int(keep.size),
            "precision": float(y[keep].mean()) if keep.size else float("nan"),
            "mean_confidence": float(c[keep].mean()) if keep.size else float("nan"),
        }
    return out
