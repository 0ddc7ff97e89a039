"""Binned calibration errors: ECE, MCE, class-wise ECE and the reliability table.

All inputs are probabilities ``(n_samples, n_classes)`` (or 1-D positive-class
probabilities of a binary problem, read as the columns ``[1 - p, p]``) and
integer labels ``(n_samples,)``. Computation is in float64 and O(n) per call
apart from the quantiles of equal-mass binning. Bin edges follow the ``(lo, hi]``
convention of :mod:`confcal.metrics._binning`.
"""

from __future__ import annotations

import numpy as np

from confcal._validation import check_labels, check_probs
from confcal.metrics._binning import bin_sums, binned_gap, check_n_bins

__all__ = ["ece", "mce", "classwise_ece", "reliability_table", "ECEAccumulator"]

def _confidence_correct(probs, labels):
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    pred = np.argmax(p, axis=1)  # ties: lowest index wins, as in accuracy()
    conf = p[np.arange(p.shape[0]), pred]
    return conf, (pred == y)


def ece(probs, labels, n_bins: int = 15, binning: str = "equal_width", norm: str = "l1",
        *, return_n_bins: bool = False):
    """Top-label expected calibration error.

    ``ECE = sum_b (n_b / n) |acc(b) - conf(b)|`` over bins of the top-label
    confidence (Guo et al. 2017, eq. 5; Atarashi et al. arXiv 2506.10572, eq. 4).
    Bins are weighted by their count; empty bins contribute nothing.

    Parameters
    ----------
    probs : array ``(n_samples, n_classes)`` or ``(n_samples,)`` (binary, positive class)
    labels : int array ``(n_samples,)`` in ``[0, n_classes)``
    n_bins : int, number of bins (default 15)
    binning : ``"equal_width"`` (edges ``k / n_bins``) or ``"equal_mass"`` (edges at
        confidence quantiles; tied confidences share a bin, so fewer effective bins
        can result — a constant predictor gets one bin, never a spurious 0)
    norm : ``"l1"`` (ECE), ``"l2"`` (root of the count-weighted mean squared gap) or
        ``"max"`` (MCE)
    return_n_bins : also return the effective number of (non-empty) bins

    Returns
    -------
    float in [0, 1], or ``(float, int)`` with ``return_n_bins=True``.

    Raises
    ------
    ValueError
        Invalid probabilities or labels (see :func:`confcal._validation.check_probs`),
        unknown ``binning``/``norm``, ``n_bins < 1``.
    """
    conf, correct = _confidence_correct(probs, labels)
    return _ece_from_pairs(conf, correct, n_bins, binning, norm, return_n_bins)


def _ece_from_pairs(conf, correct, n_bins, binning, norm, return_n_bins=False):
    count, conf_sum, corr_sum, _ = bin_sums(conf, correct, check_n_bins(n_bins), binning)
    value = binned_gap(count, conf_sum, corr_sum, norm)
    return (value, int(np.count_nonzero(count))) if return_n_bins else value


def mce(probs, labels, n_bins: int = 15, binning: str = "equal_width") -> float:
    """Maximum calibration error: the largest ``|acc(b) - conf(b)|`` over non-empty bins
    (Guo et al. 2017, eq. 6). Same inputs and bin convention as :func:`ece`."""
    return ece(probs, labels, n_bins=n_bins, binning=binning, norm="max")


def classwise_ece(probs, labels, n_bins: int = 15, binning: str = "equal_width",
                  *, return_per_class: bool = False):
    """Class-wise ECE: the mean over classes ``k`` of the ECE of ``p[:, k]`` against
    ``labels == k`` (Kull et al. 2019, "Beyond temperature scaling", sec. 3).

    Every sample counts in every class's bins. Returns a float, or
    ``(float, per_class array (n_classes,))`` with ``return_per_class=True``.
    """
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    per_class = np.array([
        _ece_from_pairs(p[:, k], y == k, n_bins, binning, "l1") for k in range(p.shape[1])
    ])
    value = float(per_class.mean())
    return (value, per_class) if return_per_class else value


def reliability_table(probs, labels, n_bins: int = 10, binning: str = "equal_width") -> dict:
    """Per-bin statistics of the top-label confidence for a reliability diagram.

    Returns a dict of float64 arrays, each ``(n_bins,)`` — always ``n_bins`` rows:
    ``bin_lo``, ``bin_hi`` (edges, ``(lo, hi]`` with the first bin closed at 0),
    ``mean_confidence``, ``accuracy`` (NaN for empty bins) and ``count`` (int64).
    """
    conf, correct = _confidence_correct(probs, labels)
    count, conf_sum, corr_sum, edges = bin_sums(conf, correct, check_n_bins(n_bins), binning)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(count > 0, conf_sum / count, np.nan)
        acc = np.where(count > 0, corr_sum / count, np.nan)
    return {
        "bin_lo": edges[:-1].copy(),
        "bin_hi": edges[1:].copy(),
        "mean_confidence": mean_conf,
        "accuracy": acc,
        "count": count.astype(np.int64),
    }


class ECEAccumulator:
    """Streaming equal-width top-label ECE: feed batches with :meth:`update`, read :meth:`ece`.

    Gives exactly the pooled :func:`ece` (equal-width bins are data-independent,
    so per-bin sums add up). Equal-mass bins need all confidences and are not offered.
    """

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(n_bins)
        self.count = np.zeros(self.n_bins)
        self.conf_sum = np.zeros(self.n_bins)
        self.corr_sum = np.zeros(self.n_bins)

    def update(self, probs, labels) -> "ECEAccumulator":
        conf, correct = _confidence_correct(probs, labels)
        c, s, a, _ = bin_sums(conf, correct, self.n_bins, "equal_width")
        self.count += c
        self.conf_sum += s
        self.corr_sum += a
        return self

    def ece(self, norm: str = "l1") -> float:
        if self.count.sum() == 0:
            raise ValueError("ECEAccumulator: no samples seen; call update() first")
        return binned_gap(self.count, self.conf_sum, self.corr_sum, norm)


