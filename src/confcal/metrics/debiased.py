"""Debiased binned calibration errors, from per-bin sums (so mergeable, and the same on every engine).

The plug-in binned ECE is biased upward: with ``n_b`` rows in a bin, ``|acc_b - conf_b|`` has a noise
floor of about ``sqrt(acc_b (1 - acc_b) / n_b)`` even when the model is perfectly calibrated (a
calibrated model on 500 rows reads 0.03-0.05 with 15 bins). Two corrections, both from Kumar, Liang &
Ma, "Verified uncertainty calibration", NeurIPS 2019, sec. 5:

* :func:`debiased_l2_ce`: the unbiased estimate of the squared ℓ2 binned calibration error,
  ``sum_b w_b [(ybar_b - pbar_b)^2 - ybar_b (1 - ybar_b) / (n_b - 1)]`` (their debiased estimator;
  ``ybar_b (1 - ybar_b) / (n_b - 1)`` is the unbiased variance of a Bernoulli mean);
* :func:`bias_corrected_ece`: the ℓ1 ECE with their Gaussian bias correction,
  ``2 ECE - E[ECE*]``, ``ECE*`` the ECE when each bin's accuracy is redrawn as
  ``N(ybar_b, ybar_b (1 - ybar_b) / n_b)``; the expectation is the folded-normal mean, in closed
  form here (their code averages resamples).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["debiased_l2_ce", "bias_corrected_ece"]


def _bins(count, conf_sum, corr_sum):
    count = np.asarray(count, dtype=np.float64)
    if count.sum() <= 0:
        raise ValueError("count: expected at least one sample in the bins, got none")
    nz = count > 0
    n_b = count[nz]
    return n_b, np.asarray(conf_sum, dtype=np.float64)[nz] / n_b, np.asarray(corr_sum, dtype=np.float64)[nz] / n_b


def debiased_l2_ce(count, conf_sum, corr_sum, *, squared: bool = False) -> float:
    """Debiased ℓ2 binned calibration error of Kumar, Liang & Ma (NeurIPS 2019, sec. 5).

    ``CE^2 = sum_b (n_b / n) [(ybar_b - pbar_b)^2 - ybar_b (1 - ybar_b) / (n_b - 1)]`` over bins with
    ``n_b >= 2``; a bin with one row has no variance estimate and contributes its plug-in
    ``(y - p)^2``, uncorrected. The estimate of ``CE^2`` is unbiased and can be negative; the returned ``CE`` is
    ``sqrt(max(CE^2, 0))``.

    Parameters
    ----------
    count, conf_sum, corr_sum : array-like of shape (n_bins,)
        Per-bin sample count, sum of confidences, number correct (of any fixed bins, e.g. the
        attributes of :class:`~confcal.metrics.BinnedAccumulator`).
    squared : bool, default=False
        Return the estimate of ``CE^2`` itself (possibly negative).

    Returns
    -------
    float
        ``CE`` in [0, 1], or ``CE^2`` with ``squared=True``.

    Raises
    ------
    ValueError
        No samples.

    Examples
    --------
    Two bins: 10 rows at mean confidence 0.9 with 8 right, 4 rows at 0.6 with 2 right.
    ``(10/14) [(0.8 - 0.9)^2 - 0.8 * 0.2 / 9] + (4/14) [(0.5 - 0.6)^2 - 0.5 * 0.5 / 3]``:

    >>> v = debiased_l2_ce([10, 4], [9.0, 2.4], [8, 2], squared=True)
    >>> round(v, 6), round(10 / 14 * (0.01 - 0.16 / 9) + 4 / 14 * (0.01 - 0.25 / 3), 6)
    (-0.026508, -0.026508)
    """
    n_b, p, y = _bins(count, conf_sum, corr_sum)
    var = np.where(n_b > 1, y * (1.0 - y) / np.maximum(n_b - 1.0, 1.0), 0.0)
    sq = float(np.sum(n_b / n_b.sum() * ((y - p) ** 2 - var)))
    return sq if squared else math.sqrt(max(sq, 0.0))


def bias_corrected_ece(count, conf_sum, corr_sum) -> float:
    """Binned ECE with the Gaussian bias correction of Kumar, Liang & Ma (NeurIPS 2019, sec. 5).

    ``ECE_bc = 2 ECE - sum_b w_b E|g_b + s_b Z|``, ``g_b = ybar_b - pbar_b`` the bin's gap,
    ``s_b^2 = ybar_b (1 - ybar_b) / n_b``, ``Z`` standard normal, ``w_b = n_b / n``: the plug-in minus
    its estimated bias. ``E|g + s Z| = s sqrt(2/pi) exp(-g^2 / 2 s^2) + g (1 - 2 Q(g / s))`` (the
    folded-normal mean). It can be below 0 (a calibrated model: its noise floor is removed) and is
    not clipped, so it stays unbiased to first order; bins with ``s_b = 0`` (all right or all wrong)
    are not corrected.

    Parameters
    ----------
    count, conf_sum, corr_sum : array-like of shape (n_bins,)
        As :func:`debiased_l2_ce`.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        No samples.

    Examples
    --------
    One bin of 100 rows, mean confidence 0.8, 75 right: ``g = -0.05``, ``s = sqrt(0.75 * 0.25 / 100)``;
    the plug-in 0.05 minus the bias ``E|g + sZ| - |g|``:

    >>> round(bias_corrected_ece([100], [80.0], [75]), 5)
    0.04467
    """
    from scipy.special import ndtr  # here: importing confcal.metrics loads no scipy

    n_b, p, y = _bins(count, conf_sum, corr_sum)
    w = n_b / n_b.sum()
    g = y - p
    s = np.sqrt(y * (1.0 - y) / n_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        folded = np.where(s > 0, s * math.sqrt(2.0 / math.pi) * np.exp(-0.5 * (g / s) ** 2)
                          + g * (1.0 - 2.0 * ndtr(-g / s)), np.abs(g))
    return float(np.sum(w * (2.0 * np.abs(g) - folded)))
