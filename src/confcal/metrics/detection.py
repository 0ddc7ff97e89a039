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
from confcal._validation import plain

__all__ = ["check_pairs", "detection_ece", "binary_nll", "binary_brier", "detection_reliability",
           "precision_above_threshold", "per_domain", "ALL"]

#: key of the pooled result in per-domain dicts
ALL = "(all)"


def check_pairs(confidence, correct, *, name: str = "confidence"):
    """Validate ``(confidence, correct)`` box pairs.

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]`` (clip raw detector scores first).
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.
    name : str, default="confidence"
        Name of the first argument in error messages.

    Returns
    -------
    confidence : ndarray of float64, shape (n_boxes,)
    correct : ndarray of bool, shape (n_boxes,)

    Raises
    ------
    ValueError
        Wrong shapes, no boxes, NaN, confidences outside ``[0, 1]`` or
        ``correct`` values other than 0/1.
    TypeError
        Non-numeric confidences.

    Examples
    --------
    >>> from confcal.metrics.detection import check_pairs
    >>> c, y = check_pairs([0.9, 0.2], [1, 0])
    >>> c.dtype, y.tolist()
    (dtype('float64'), [True, False])
    >>> check_pairs([1.2], [1])
    Traceback (most recent call last):
    ...
    ValueError: confidence: expected values in [0, 1], got 1.2 at index 0 ...
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
        raise ValueError(f"{name}: expected values in [0, 1], got {float(c[i])!r} at index {i} "
                         f"(range seen [{np.nanmin(c):g}, {np.nanmax(c):g}]); clip raw scores or calibrate first")
    if y.dtype != bool:
        if not np.all((y == 0) | (y == 1)):
            i = int(np.flatnonzero((y != 0) & (y != 1))[0])
            raise ValueError(f"correct: expected 0/1 values, got {plain(y[i])} at index {i}")
        y = y.astype(bool)
    return c, y


def detection_ece(confidence, correct, n_bins: int = 15, binning: str = "equal_width", norm: str = "l1",
                  *, return_n_bins: bool = False):
    """Detection ECE (D-ECE): count-weighted mean of ``|precision(b) - mean confidence(b)|`` per bin.

    Source: Kueppers et al., "Multivariate Confidence Calibration for Object
    Detection", CVPR-W 2020, eq. 3 restricted to the confidence dimension.

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]``.
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.
    n_bins : int, default=15
        Number of bins.
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        Edges at ``k / n_bins`` or at confidence quantiles (tied confidences
        share a bin, so a constant confidence is one bin).
    norm : {"l1", "l2", "max"}, default="l1"
        D-ECE, root mean squared gap, or D-MCE.
    return_n_bins : bool, default=False
        Also return the number of non-empty bins.

    Returns
    -------
    d_ece : float
        In ``[0, 1]``.
    n_bins_used : int
        Only with ``return_n_bins=True``.

    Raises
    ------
    ValueError
        Invalid pairs (see :func:`check_pairs`), unknown ``binning`` or
        ``norm``, ``n_bins < 1``.

    Examples
    --------
    Five bins: the two 0.9 boxes (one true) have gap 0.4 each, 0.55 (true)
    0.45 and 0.3 (false) 0.3, so ``(0.8 + 0.45 + 0.3) / 4 = 0.3875``:

    >>> import numpy as np
    >>> confidence = np.array([0.9, 0.9, 0.55, 0.3])
    >>> correct = np.array([1, 0, 1, 0])
    >>> from confcal.metrics.detection import detection_ece
    >>> round(detection_ece(confidence, correct, n_bins=5), 6)
    0.3875
    >>> round(detection_ece(confidence, correct, n_bins=5, norm="max"), 6)
    0.45
    """
    c, y = check_pairs(confidence, correct)
    count, conf_sum, corr_sum, _ = bin_sums(c, y, check_n_bins(n_bins), binning)
    value = binned_gap(count, conf_sum, corr_sum, norm)
    return (value, int(np.count_nonzero(count))) if return_n_bins else value


def binary_nll(confidence, correct) -> float:
    """Mean Bernoulli negative log-likelihood (nats) of ``correct`` under ``confidence``.

    Source: the NLL of Guo et al., ICML 2017, sec. 2, for one binary event
    per box.

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]``.
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.

    Returns
    -------
    float
        ``>= 0``, in nats.  The probability of the outcome is clipped below
        at ``1e-12`` (as :func:`confcal.metrics.nll`), so a confident mistake
        is large but finite.

    Raises
    ------
    ValueError
        Invalid pairs (see :func:`check_pairs`).

    Examples
    --------
    The probabilities of the outcomes are 0.9, 0.1, 0.55 and 0.7:

    >>> import numpy as np
    >>> confidence = np.array([0.9, 0.9, 0.55, 0.3])
    >>> correct = np.array([1, 0, 1, 0])
    >>> from confcal.metrics.detection import binary_nll
    >>> round(binary_nll(confidence, correct), 6)
    0.840614
    """
    c, y = check_pairs(confidence, correct)
    p = np.clip(np.where(y, c, 1.0 - c), 1e-12, 1.0)
    return float(-np.mean(np.log(p))) + 0.0


def binary_brier(confidence, correct) -> float:
    """Binary Brier score: mean ``(confidence - correct)^2``, in ``[0, 1]``.

    Source: Brier, Monthly Weather Review 1950, eq. 1, for one binary event
    per box.

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]``.
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Invalid pairs (see :func:`check_pairs`).

    Examples
    --------
    ``(0.1^2 + 0.9^2 + 0.45^2 + 0.3^2) / 4 = 1.1125 / 4``:

    >>> import numpy as np
    >>> confidence = np.array([0.9, 0.9, 0.55, 0.3])
    >>> correct = np.array([1, 0, 1, 0])
    >>> from confcal.metrics.detection import binary_brier
    >>> round(binary_brier(confidence, correct), 6)
    0.278125
    """
    c, y = check_pairs(confidence, correct)
    return float(np.mean((c - y) ** 2))


def per_domain(domains, n: int) -> dict:
    """Row indices per domain, plus every row under :data:`ALL`.

    Parameters
    ----------
    domains : array-like of shape (n,) or None
        Domain ids (ints or strings); ``None``: only the pooled entry.
    n : int
        Number of rows.

    Returns
    -------
    dict
        ``{ALL: arange(n), domain id: index array, ...}``, ids in sorted order.

    Raises
    ------
    ValueError
        ``domains`` of the wrong length (see
        :func:`confcal._validation.check_domains`).

    Examples
    --------
    >>> from confcal.metrics.detection import per_domain
    >>> {k: v.tolist() for k, v in per_domain(["b", "a", "b"], 3).items()}
    {'(all)': [0, 1, 2], 'a': [1], 'b': [0, 2]}
    """
    out = {ALL: np.arange(n)}
    if domains is None:
        return out
    d = check_domains(domains, n)
    for key in np.unique(d):
        out[key.item() if hasattr(key, "item") else key] = np.flatnonzero(d == key)
    return out


def detection_reliability(confidence, correct, n_bins: int = 10, binning: str = "equal_width",
                          domains=None) -> dict:
    """Reliability tables of box confidence, one per domain (plus the pooled one under ``"(all)"``).

    Source: the precision-given-confidence diagram of Kueppers et al.,
    CVPR-W 2020, eq. 2.

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]``.
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.
    n_bins : int, default=10
        Number of bins (always that many rows).
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        With ``"equal_mass"`` the edges are the quantiles of that domain's
        confidences.
    domains : array-like of shape (n_boxes,) or None, default=None
        Domain ids; ``None``: only the pooled table.

    Returns
    -------
    dict
        ``{domain: table}``; each table is a dict of ``(n_bins,)`` arrays
        ``bin_lo``, ``bin_hi``, ``count`` (int64), ``mean_confidence`` and
        ``precision`` (fraction of true positives; NaN for empty bins).

    Raises
    ------
    ValueError
        Invalid pairs or domains, ``n_bins < 1``, unknown ``binning``.

    Examples
    --------
    >>> import numpy as np
    >>> confidence = np.array([0.9, 0.9, 0.55, 0.3])
    >>> correct = np.array([1, 0, 1, 0])
    >>> from confcal.metrics.detection import detection_reliability
    >>> tables = detection_reliability(confidence, correct, n_bins=5, domains=["a", "a", "b", "b"])
    >>> list(tables), tables["(all)"]["count"].tolist()
    (['(all)', 'a', 'b'], [0, 1, 1, 0, 2])
    >>> tables["a"]["precision"].tolist()
    [nan, nan, nan, nan, 0.5]
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
    boxes should match their precision (Kueppers et al., CVPR-W 2020, eq. 2
    at one confidence level).

    Parameters
    ----------
    confidence : array-like of float, shape (n_boxes,)
        Box confidences in ``[0, 1]``.
    correct : array-like of bool or 0/1, shape (n_boxes,)
        1 = true positive.
    threshold : float, default=0.7
        Keep boxes with ``confidence >= threshold``; in ``[0, 1]``.
    domains : array-like of shape (n_boxes,) or None, default=None
        Domain ids; ``None``: only the pooled entry.

    Returns
    -------
    dict
        ``{domain: {"n_boxes", "n_above", "precision", "mean_confidence"}}``;
        ``precision`` and ``mean_confidence`` are NaN when no box reaches the
        threshold.

    Raises
    ------
    ValueError
        Invalid pairs or domains, ``threshold`` outside ``[0, 1]``.

    Examples
    --------
    Three boxes reach 0.5; two of them are true positives:

    >>> import numpy as np
    >>> confidence = np.array([0.9, 0.9, 0.55, 0.3])
    >>> correct = np.array([1, 0, 1, 0])
    >>> from confcal.metrics.detection import precision_above_threshold
    >>> res = precision_above_threshold(confidence, correct, threshold=0.5)["(all)"]
    >>> res["n_above"], round(res["precision"], 4), round(res["mean_confidence"], 4)
    (3, 0.6667, 0.7833)
    """
    c, y = check_pairs(confidence, correct)
    t = float(threshold)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"threshold: expected a value in [0, 1], got {plain(threshold)}")
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
