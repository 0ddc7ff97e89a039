"""Bootstrap ECE and the improvement ratio (Gong et al., ICCV 2021, sec. 5 and eq. 19).

The paper reports the ECE on a target domain as the mean over ``B`` random
draws of ``m`` target samples, with its spread. :func:`bootstrap_ece` does that
in one vectorised pass for equal-width bins (a sample's bin does not depend on
the draw), and per draw for equal-mass bins (the edges do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from confcal._validation import renamed_seed
from confcal.metrics._binning import BINNINGS, assign_bins, bin_edges, check_n_bins
from confcal.metrics.calibration import _confidence_correct, _ece_from_pairs
from confcal._validation import plain

__all__ = ["BootstrapResult", "bootstrap_ece", "bootstrap_indices", "improvement_ratio"]


@dataclass(frozen=True)
class BootstrapResult:
    """Summary of ``B`` bootstrap ECE values (fractions in [0, 1], not percent), from :func:`bootstrap_ece`.

    Source: the bootstrapped target ECE of Gong et al., "Confidence
    Calibration for Domain Generalization under Covariate Shift", ICCV 2021,
    sec. 5.

    Parameters
    ----------
    mean : float
        Mean of the draws' ECE.
    std : float
        Their standard deviation (``ddof=1``; 0 for one draw).
    lo, hi : float
        The 2.5 and 97.5 percentiles (linear interpolation).
    values : ndarray of shape (n_draws,)
        The ECE of every draw.
    n_samples : int
        The ``m`` actually drawn per replicate.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import BootstrapResult
    >>> values = np.array([0.02, 0.04])
    >>> res = BootstrapResult(mean=0.03, std=float(values.std(ddof=1)), lo=0.0205, hi=0.0395,
    ...                       values=values, n_samples=100)
    >>> round(res.std, 6), res.lo <= res.mean <= res.hi
    (0.014142, True)
    """

    mean: float
    std: float
    lo: float
    hi: float
    values: np.ndarray
    n_samples: int


def bootstrap_indices(n: int, n_draws: int, n_samples: int | None, seed) -> np.ndarray:
    """Row indices ``(n_draws, m)`` drawn with replacement, ``m = min(n_samples, n)``
    (all ``n`` when ``n_samples`` is None). ``seed`` is anything
    ``numpy.random.default_rng`` takes, so the draws are reproducible."""
    if isinstance(n_draws, bool) or not isinstance(n_draws, (int, np.integer)) or n_draws < 1:
        raise ValueError(f"n_draws: expected a positive integer, got {plain(n_draws)}")
    if n_samples is not None and (isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer))
                                  or n_samples < 1):
        raise ValueError(f"n_samples: expected a positive integer or None, got {plain(n_samples)}")
    m = n if n_samples is None else min(int(n_samples), n)
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size=(n_draws, m))


def bootstrap_ece(probs, labels, *, n_draws: int = 1000, n_samples: int | None = 1500,
                  n_bins: int = 15, binning: str = "equal_width", random_state=0, seed=None) -> BootstrapResult:
    """ECE over ``n_draws`` bootstrap draws of ``m`` samples.

    Each draw takes ``m = min(n_samples, n)`` rows with replacement (so the
    draws differ even when ``m = n``) and computes the top-label ECE with
    ``n_bins`` bins exactly as :func:`confcal.metrics.ece` does.

    Source: Gong et al., "Confidence Calibration for Domain Generalization
    under Covariate Shift", ICCV 2021, sec. 5 (B = 1000 draws of 1500).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    n_draws : int, default=1000
        ``B``, as in the paper.
    n_samples : int or None, default=1500
        ``m``, as in the paper; ``None``: all ``n``.
    n_bins : int, default=15
        As in :func:`confcal.metrics.ece`.
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        As in :func:`confcal.metrics.ece`.
    random_state : int, numpy.random.Generator or None, default=0
        Seed of the draws (anything ``numpy.random.default_rng`` takes).
    seed : deprecated name of ``random_state`` (``FutureWarning``).

    Returns
    -------
    BootstrapResult

    Raises
    ------
    ValueError
        Invalid probabilities/labels, ``n_draws``, ``n_samples`` or ``n_bins``
        below 1, unknown ``binning``.

    Examples
    --------
    Identical samples give the same ECE in every draw (0.9 confident, all
    wrong: 0.9), with no spread:

    >>> import numpy as np
    >>> from confcal.metrics import bootstrap_ece, ece
    >>> res = bootstrap_ece(np.full(20, 0.9), np.zeros(20, dtype=int), n_draws=50)
    >>> round(res.mean, 6), res.std, res.n_samples
    (0.9, 0.0, 20)

    In general the full-sample ECE lies within the percentile interval:

    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> res = bootstrap_ece(probs, [0, 0, 0, 1], n_draws=200, n_bins=5, random_state=0)
    >>> res.values.shape, bool(res.lo <= ece(probs, [0, 0, 0, 1], n_bins=5) <= res.hi)
    ((200,), True)
    """
    conf, correct = _confidence_correct(probs, labels)
    n_bins = check_n_bins(n_bins)
    if binning not in BINNINGS:
        raise ValueError(f"binning: expected one of {BINNINGS}, got {binning!r}")
    idx = bootstrap_indices(conf.shape[0], n_draws, n_samples, renamed_seed(random_state, seed, "bootstrap_ece"))
    b, m = idx.shape
    if binning == "equal_width":
        # Signed gap per sample; a bin's |sum of gaps| / m is its ECE term.
        bins = assign_bins(conf, bin_edges(conf, n_bins, binning))
        gap = conf - correct.astype(np.float64)
        flat = (np.arange(b)[:, None] * n_bins + bins[idx]).ravel()
        sums = np.bincount(flat, weights=gap[idx].ravel(), minlength=b * n_bins).reshape(b, n_bins)
        values = np.abs(sums).sum(axis=1) / m
    else:
        values = np.array([_ece_from_pairs(conf[i], correct[i], n_bins, binning, "l1") for i in idx])
    std = float(values.std(ddof=1)) if b > 1 else 0.0
    lo, hi = np.percentile(values, [2.5, 97.5])
    return BootstrapResult(mean=float(values.mean()), std=std, lo=float(lo), hi=float(hi),
                           values=values, n_samples=int(m))


def improvement_ratio(ece, ece_source_only, ece_target_only, *, eps: float = 1e-12):
    """Improvement ratio ``IR = (ECE_s - ECE) / (ECE_s - ECE_t)``.

    ``ECE_s``: source-only calibration (the baseline, IR = 0); ``ECE_t``:
    target-only (oracle) calibration (IR = 1).  IR > 1 beats the oracle,
    IR < 0 is worse than doing nothing beyond source calibration.

    Source: Gong et al., ICCV 2021, eq. 19.

    Parameters
    ----------
    ece : float or array-like
        ECE of the method under test.
    ece_source_only : float or array-like
        ECE of source-only calibration.
    ece_target_only : float or array-like
        ECE of target-only (oracle) calibration.
    eps : float, default=1e-12
        Smallest ``|ECE_s - ECE_t|`` for which the ratio is defined.

    Returns
    -------
    float or ndarray
        The arguments broadcast; a float in, a float out.

    Raises
    ------
    ValueError
        Non-finite inputs, or ``|ECE_s - ECE_t| <= eps`` somewhere (the ratio
        is undefined when the oracle gains nothing over source-only
        calibration).

    Examples
    --------
    Halfway from source-only (0.05) to the oracle (0.01):

    >>> from confcal.metrics import improvement_ratio
    >>> round(improvement_ratio(0.03, 0.05, 0.01), 6)
    0.5
    >>> improvement_ratio([0.05, 0.01], 0.05, 0.01).tolist()
    [0.0, 1.0]
    """
    e, s, t = (np.asarray(v, dtype=np.float64) for v in (ece, ece_source_only, ece_target_only))
    for name, v in (("ece", e), ("ece_source_only", s), ("ece_target_only", t)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{name}: expected finite values, got {v}")
    denom = s - t
    if np.any(np.abs(denom) <= eps):
        raise ValueError("improvement_ratio: ece_source_only equals ece_target_only "
                         f"(difference {denom.min() if denom.ndim else float(denom):g}), so eq. 19 is "
                         "undefined")
    out = (s - e) / denom
    return float(out) if out.ndim == 0 else out
