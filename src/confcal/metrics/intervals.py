"""Per-bin confidence intervals for the accuracy (precision) of a reliability bin, and bounds on the
binned calibration error built from them.

Clopper–Pearson is used, not Jeffreys: it is exact (coverage at least ``1 - alpha`` for every true
fraction and every bin size), where Jeffreys' equal-tailed interval covers ``1 - alpha`` only on
average and falls below it near 0 and 1 — exactly where the top bins of a confident classifier sit
(accuracy 0.95-1). An audit that gates on these bounds must not claim more than it has. The price is
width: at ``n = 100`` and an observed fraction of 0.9, the 95% interval is [0.824, 0.951] (Jeffreys
[0.830, 0.947]).

Within a bin the outcomes are Bernoulli with possibly different success probabilities (a
Poisson-binomial count); Clopper–Pearson stays conservative for their mean (Hoeffding, "On the
distribution of the number of successes in independent trials", Ann. Math. Statist. 1956, thm. 4).

Everything here is a function of per-bin counts, so it is mergeable: the sums of
:class:`~confcal.metrics.BinnedAccumulator` give the same intervals as the whole arrays.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_alpha", "clopper_pearson", "bin_intervals", "ece_bounds"]


def check_alpha(alpha, name: str = "alpha") -> float:
    """``alpha`` as a float in the open interval (0, 1); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}: expected a number in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not (math.isfinite(a) and 0.0 < a < 1.0):
        raise ValueError(f"{name}: expected a number in (0, 1), got {alpha!r}")
    return a


def clopper_pearson(successes, trials, alpha: float = 0.05):
    """Exact (Clopper–Pearson) two-sided ``1 - alpha`` interval for a binomial proportion.

    ``lower = B(alpha/2; k, n - k + 1)`` and ``upper = B(1 - alpha/2; k + 1, n - k)``, ``B`` the
    beta quantile; ``lower = 0`` at ``k = 0`` and ``upper = 1`` at ``k = n``.

    Source: Clopper & Pearson, "The use of confidence or fiducial limits illustrated in the case of
    the binomial", Biometrika 26 (1934); the beta form is eq. 2.2 of Brown, Cai & DasGupta,
    "Interval estimation for a binomial proportion", Statist. Sci. 16 (2001).

    Parameters
    ----------
    successes : array-like of shape (n_bins,)
        Successes per bin (correct predictions, true positives); whole numbers in ``[0, trials]``.
    trials : array-like of shape (n_bins,)
        Trials per bin (samples in the bin), whole numbers ``>= 0``.
    alpha : float, default=0.05
        In (0, 1): the interval covers with probability at least ``1 - alpha``.

    Returns
    -------
    lower, upper : ndarray of shape (n_bins,)
        float64 in [0, 1]; NaN where ``trials == 0`` (an empty bin has no interval).

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1); shapes differ; counts negative, not whole, or ``successes > trials``.

    Examples
    --------
    >>> lo, hi = clopper_pearson([9, 0], [10, 4], alpha=0.05)
    >>> lo.round(4).tolist(), hi.round(4).tolist()
    ([0.555, 0.0], [0.9975, 0.6024])
    """
    from scipy.special import betaincinv

    a = check_alpha(alpha)
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if k.shape != n.shape:
        raise ValueError(f"successes: expected the shape of trials {n.shape}, got {k.shape}")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(n))) or np.any(n < 0) or np.any(k < 0) or np.any(k > n) \
            or np.any(k != np.round(k)) or np.any(n != np.round(n)):
        raise ValueError("successes, trials: expected whole counts with 0 <= successes <= trials")
    empty = n == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        # betaincinv(a, b, q) is the q-quantile of Beta(a, b); a zero shape parameter is the k = 0 / k = n edge
        lower = np.where(k > 0, betaincinv(np.maximum(k, 1e-300), n - k + 1, a / 2), 0.0)
        upper = np.where(k < n, betaincinv(k + 1, np.maximum(n - k, 1e-300), 1 - a / 2), 1.0)
    lower[empty] = np.nan
    upper[empty] = np.nan
    return lower, upper


def bin_intervals(table: dict, alpha: float = 0.05, *, fraction: str = "accuracy") -> dict:
    """A reliability table (:func:`confcal.metrics.reliability_table`) with the Clopper–Pearson
    interval of each bin's fraction added as ``lower`` and ``upper`` (NaN for empty bins).

    The number correct of a bin is recovered as ``round(fraction * count)`` (exact: the fraction is a
    ratio of whole numbers held in float64).

    Parameters
    ----------
    table : dict of str to ndarray of shape (n_bins,)
        With ``count`` and ``fraction``.
    alpha : float, default=0.05
        Each bin's interval covers with probability at least ``1 - alpha`` (pointwise, not
        simultaneous over bins).
    fraction : str, default="accuracy"
        The key of the per-bin fraction (``"precision"`` for box scores).

    Returns
    -------
    dict
        A copy of ``table`` plus ``lower``, ``upper`` and ``alpha``.

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import reliability_table
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> t = bin_intervals(reliability_table(probs, [0, 0, 0, 1], n_bins=5), alpha=0.1)
    >>> t["lower"].round(3).tolist(), t["upper"].round(3).tolist()
    ([nan, nan, 0.05, 0.025, 0.05], [nan, nan, 1.0, 0.975, 1.0])
    """
    count = np.asarray(table["count"], dtype=np.float64)
    frac = np.asarray(table[fraction], dtype=np.float64)
    hits = np.where(count > 0, np.round(np.nan_to_num(frac) * count), 0.0)
    lower, upper = clopper_pearson(hits, count, alpha)
    return {**table, "lower": lower, "upper": upper, "alpha": check_alpha(alpha)}


def ece_bounds(count, conf_sum, corr_sum, alpha: float = 0.05) -> tuple[float, float]:
    """Simultaneous ``1 - alpha`` bounds ``(lower, upper)`` on the binned calibration error
    ``sum_b (n_b / n) |a_b - conf_b|``, ``a_b`` the true accuracy of bin ``b`` (the mean of
    P(correct | input) over its rows) and ``conf_b`` its mean confidence.

    Each of the ``m`` non-empty bins gets a two-sided Clopper–Pearson interval ``[L_b, U_b]`` at level
    ``alpha / m`` (Bonferroni), so all ``m`` cover at once with probability at least ``1 - alpha``;
    then ``lower = sum_b w_b dist(conf_b, [L_b, U_b])`` and ``upper = sum_b w_b max(|L_b - conf_b|,
    |U_b - conf_b|)``. ``lower`` is the one-sided ``1 - alpha`` lower bound of the gate rule
    ``confident``: it exceeds the true binned error with probability at most ``alpha``, given the
    confidences (Clopper–Pearson's exactness, Hoeffding 1956 for unequal probabilities in a bin).

    Parameters
    ----------
    count, conf_sum, corr_sum : array-like of shape (n_bins,)
        Per-bin sample count, sum of confidences and number correct (the attributes of
        :class:`~confcal.metrics.BinnedAccumulator`).
    alpha : float, default=0.05
        In (0, 1).

    Returns
    -------
    lower, upper : float
        In [0, 1]; ``lower <= ECE <= upper`` for the plug-in ECE of the same bins.

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1); no samples.

    Examples
    --------
    One bin of 100 predictions at confidence 0.9 with 70 right: the plug-in ECE is 0.2 and the
    95% Clopper–Pearson interval of the accuracy is [0.600, 0.788], so the error is at least 0.112:

    >>> lo, hi = ece_bounds([100], [90.0], [70], alpha=0.05)
    >>> round(lo, 3), round(hi, 3)
    (0.112, 0.3)
    """
    a = check_alpha(alpha)
    count = np.asarray(count, dtype=np.float64)
    nz = count > 0
    m = int(np.count_nonzero(nz))
    if m == 0:
        raise ValueError("count: expected at least one sample in the bins, got none")
    n_b = count[nz]
    conf = np.asarray(conf_sum, dtype=np.float64)[nz] / n_b
    lo, hi = clopper_pearson(np.round(np.asarray(corr_sum, dtype=np.float64)[nz]), n_b, a / m)
    w = n_b / n_b.sum()
    below = np.maximum(0.0, np.maximum(lo - conf, conf - hi))
    above = np.maximum(np.abs(lo - conf), np.abs(hi - conf))
    return float(np.sum(w * below)), float(min(1.0, np.sum(w * above)))
