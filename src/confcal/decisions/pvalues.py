"""p-values for the null hypothesis ``H_j: R(lambda_j) > alpha`` of Learn-then-Test.

Learn-then-Test (LTT; Angelopoulos, Bates, Candes, Jordan & Lei 2021, arXiv:2110.01052) turns risk
control into multiple testing: for every candidate threshold ``lambda_j`` a valid p-value for
``H_j: R(lambda_j) > alpha`` (``P(p_j <= u) <= u`` under ``H_j``), then a family-wise error rate (FWER)
procedure at level ``delta`` (:mod:`.fwer`). Two p-values are implemented, both from LTT Sec. 3:

* the **binomial** p-value ``p = P(Binomial(n, alpha) <= k)`` for ``k`` losses among ``n`` Bernoulli
  trials. It is exact (the smallest valid p-value of a binary loss) whenever ``k`` given ``n`` is
  ``Binomial(n, R)``. That holds for every risk of :mod:`.risks`: each is a conditional proportion
  (false discoveries among the ``n`` accepted items, misses among the ``n`` positives, ...), so given
  the random count ``n`` the ``k`` errors are binomial with the risk as success probability.
* the **Hoeffding--Bentkus** p-value for the mean ``r_hat`` of ``n`` i.i.d. losses in ``[0, 1]`` (not
  necessarily binary): ``p = min(exp(-n h1(min(r_hat, alpha), alpha)), e * P(Binomial(n, alpha) <=
  ceil(n r_hat)))`` with ``h1(a, b) = a log(a / b) + (1 - a) log((1 - a) / (1 - b))`` (Hoeffding 1963
  in its Kullback--Leibler form; Bentkus 2004). Valid for any bounded loss, never smaller than the
  binomial p-value of a binary loss: use it when the loss is not 0/1.
"""

from __future__ import annotations

import math

import numpy as np
from confcal._validation import plain

__all__ = ["binomial_pvalue", "hoeffding_bentkus_pvalue", "check_level"]


def check_level(value, name: str) -> float:
    """``value`` as a float strictly inside (0, 1), else a one-line ``ValueError`` naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number in (0, 1), got {plain(value)}") from None
    if not (0.0 < v < 1.0):
        raise ValueError(f"{name}: expected a number in (0, 1), got {plain(value)}")
    return v


def binomial_pvalue(k, n, alpha: float) -> np.ndarray:
    """Exact binomial p-value ``P(Binomial(n, alpha) <= k)`` of ``H: R > alpha`` (LTT Sec. 3).

    Parameters
    ----------
    k : array_like of int
        Observed losses (errors), ``0 <= k <= n``.
    n : array_like of int
        Trials; broadcast against ``k``. Where ``n == 0`` the p-value is 1 (no evidence).
    alpha : float
        Risk level in (0, 1).

    Returns
    -------
    numpy.ndarray of float64
        The p-values, shape of ``broadcast(k, n)``.

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1), or ``k`` outside ``[0, n]``.
    """
    from scipy.special import bdtr

    alpha = check_level(alpha, "alpha")
    k, n = np.broadcast_arrays(np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64))
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("k: expected 0 <= k <= n losses for every threshold")
    # bdtr(k, n, p) = P(Bin(n, p) <= k), the regularised incomplete beta: exact, no summation
    p = np.where(n > 0, bdtr(k, np.maximum(n, 1), alpha), 1.0)
    return np.minimum(p.astype(np.float64), 1.0)


def _h1(a, b):
    """Bernoulli Kullback--Leibler divergence ``KL(a || b)`` with ``0 log 0 = 0``."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = np.where(a > 0, a * np.log(a / b), 0.0)
        t2 = np.where(a < 1, (1 - a) * np.log((1 - a) / (1 - b)), 0.0)
    return t1 + t2


def hoeffding_bentkus_pvalue(risk_hat, n, alpha: float) -> np.ndarray:
    """Hoeffding--Bentkus p-value of ``H: R > alpha`` for a mean of ``n`` losses in [0, 1] (LTT Sec. 3).

    ``p = min(exp(-n * h1(min(risk_hat, alpha), alpha)), e * P(Binomial(n, alpha) <= ceil(n * risk_hat)))``.

    Parameters
    ----------
    risk_hat : array_like of float
        Empirical risk (mean loss) in [0, 1].
    n : array_like of int
        Number of losses averaged; ``n == 0`` gives p = 1.
    alpha : float
        Risk level in (0, 1).

    Returns
    -------
    numpy.ndarray of float64
        p-values in (0, 1].

    Raises
    ------
    ValueError
        ``alpha`` outside (0, 1); ``risk_hat`` outside [0, 1] or not finite.
    """
    from scipy.special import bdtr

    alpha = check_level(alpha, "alpha")
    r, n = np.broadcast_arrays(np.asarray(risk_hat, dtype=np.float64), np.asarray(n, dtype=np.int64))
    if not np.all(np.isfinite(r)) or np.any(r < 0) or np.any(r > 1):
        raise ValueError("risk_hat: expected empirical risks in [0, 1]")
    hoeffding = np.exp(-n * _h1(np.minimum(r, alpha), alpha))
    # ceil(n r) with a guard against r * n = 3.0000000000000004 rounding one count up
    k = np.ceil(np.round(n * r, 9)).astype(np.int64)
    bentkus = math.e * np.where(n > 0, bdtr(np.minimum(k, n), np.maximum(n, 1), alpha), 1.0)
    return np.where(n > 0, np.minimum(np.minimum(hoeffding, bentkus), 1.0), 1.0)
