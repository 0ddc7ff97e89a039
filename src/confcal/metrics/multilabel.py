"""Per-label calibration metrics of sigmoid heads (multilabel outputs).

``probs`` ``(n_samples, n_labels)``: each entry the probability that the label is present (rows do
not sum to 1); ``labels`` multi-hot ``(n_samples, n_labels)`` of 0/1.
"""

from __future__ import annotations

import numpy as np

from confcal._validation import as_numpy
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece

__all__ = ["check_multihot", "multilabel_metrics", "label_checks"]


def check_multihot(labels, n: int, n_labels: int) -> np.ndarray:
    """Multi-hot labels ``(n, n_labels)`` of 0/1 (or bool) as int8; ``ValueError`` naming ``labels``."""
    y = as_numpy(labels, "labels")
    if y.ndim == 1 and n_labels == 1:
        y = y[:, None]
    if y.shape != (n, n_labels):
        raise ValueError(f"labels: expected multi-hot labels of shape ({n}, {n_labels}) (one 0/1 column per "
                         f"label), got {y.shape}")
    if y.dtype == bool:
        return y.astype(np.int8)
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise TypeError(f"labels: expected 0/1 values, got dtype {y.dtype}")
    bad = ~((y == 0) | (y == 1))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"labels: expected 0/1 values, got {y[i, j].item()!r} at row {i}, label {j}")
    return y.astype(np.int8)


def label_checks(p, y, n_bins: int = 15, alpha: float = 0.05) -> dict:
    """The calibration checks of one label (issue 42): ``ece_lower`` / ``ece_upper`` (simultaneous
    ``1 - alpha`` bounds of its binned error, :func:`confcal.metrics.ece_bounds`), ``ece_bias_corrected``,
    ``l2_ce_debiased`` (Kumar, Liang & Ma 2019) and ``tests`` (Spiegelhalter, Kolmogorov-Smirnov, Kuiper:
    ``statistic``, ``p_value``, ``n``) of ``p`` ``(n,)`` against 0/1 ``y`` ``(n,)``."""
    from confcal.metrics.accumulators import BinnedAccumulator
    from confcal.metrics.calibration_tests import CalibrationTestAccumulator
    from confcal.metrics.debiased import bias_corrected_ece, debiased_l2_ce
    from confcal.metrics.intervals import ece_bounds

    b = BinnedAccumulator(n_bins).update_pairs(p, y)
    lo, hi = ece_bounds(b.count, b.conf_sum, b.corr_sum, alpha)
    tests = CalibrationTestAccumulator().update_pairs(p, y).result()
    return {"alpha": alpha, "ece_lower": lo, "ece_upper": hi,
            "ece_bias_corrected": bias_corrected_ece(b.count, b.conf_sum, b.corr_sum),
            "l2_ce_debiased": debiased_l2_ce(b.count, b.conf_sum, b.corr_sum),
            "tests": {k: r.as_dict() for k, r in tests.items()}}


def multilabel_metrics(probs, labels, n_bins: int = 15, *, checks: bool = False, alpha: float = 0.05) -> dict:
    """Per-label binary calibration metrics of ``probs`` ``(n, L)`` (P(label present)) against
    multi-hot ``labels`` ``(n, L)``: ``{"per_label": [{"ece", "nll", "brier", "prevalence",
    "calibration"}, ...], "mean": the macro averages}``. ECE: ``n_bins`` equal-width bins of each
    label's probability (the binary form of Guo et al. 2017, eq. 3); ``calibration`` (only with
    ``checks=True``): :func:`label_checks` at level ``alpha``.

    Examples
    --------
    >>> m = multilabel_metrics([[0.9, 0.2], [0.8, 0.1]], [[1, 0], [1, 1]])
    >>> round(m["per_label"][0]["ece"], 4), round(m["per_label"][1]["ece"], 4)
    (0.15, 0.55)
    """
    p = np.asarray(probs, dtype=np.float64)
    y = check_multihot(labels, p.shape[0], p.shape[1] if p.ndim == 2 else 1)
    p = p.reshape(y.shape)
    rows = [{"ece": detection_ece(p[:, j], y[:, j], n_bins), "nll": binary_nll(p[:, j], y[:, j]),
             "brier": binary_brier(p[:, j], y[:, j]), "prevalence": float(y[:, j].mean()),
             **({"calibration": label_checks(p[:, j], y[:, j], n_bins, alpha)} if checks else {})}
            for j in range(y.shape[1])]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("ece", "nll", "brier")}
    return {"per_label": rows, "mean": mean}
