"""Tail probabilities of the maximum absolute value and of the range of a standard Brownian motion on
[0, 1]: the asymptotic null distributions of the Kolmogorov–Smirnov and Kuiper statistics of
cumulative calibration differences (Arrieta-Ibarra, Gujral, Tannenbaum & Tygert, JMLR 23 (2022),
sec. 3; Tygert, arXiv 2202.00100, sec. 2).

Each distribution has two series: one converges fast for small ``x`` (a theta series of the
distribution function), the other for large ``x`` (a series of normal tails). Each is used where it
converges in a few terms, so the survival function keeps its relative accuracy in the far tail
(a p-value of 1e-30 is not rounded to 0). The two agree to 1e-14 where they meet (tested).
"""

from __future__ import annotations

import math
from confcal._validation import plain


def ndtr(x: float) -> float:
    """Standard normal distribution function (``erfc`` keeps the lower tail's relative accuracy)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))

__all__ = ["max_abs_sf", "range_sf"]

_TERMS = 60  # each series is below 1e-17 after a handful of terms on its side of the switch
_SWITCH = 1.25


def _check_x(x) -> float:
    v = float(x)
    if math.isnan(v) or v < 0:
        raise ValueError(f"x: expected a number >= 0, got {plain(x)}")
    return v


def max_abs_sf(x) -> float:
    """``P(sup_{0<=t<=1} |B(t)| > x)`` for a standard Brownian motion ``B``.

    Small ``x``: ``1 - (4/pi) sum_k (-1)^k / (2k+1) exp(-pi^2 (2k+1)^2 / (8 x^2))`` (Darling & Siegert,
    Ann. Math. Statist. 1953); large ``x``: ``4 sum_{k>=1} (-1)^(k-1) Q((2k-1) x)``, ``Q`` the standard
    normal tail (the reflection principle, Feller, vol. II, X.5).

    Parameters
    ----------
    x : float, >= 0

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ValueError
        ``x`` negative or NaN.

    Examples
    --------
    >>> round(max_abs_sf(1.0), 4), round(max_abs_sf(2.241), 3)
    (0.6292, 0.05)
    """
    v = _check_x(x)
    if v == 0:
        return 1.0
    if v < _SWITCH:
        c = 0.0
        for k in range(_TERMS):
            term = math.exp(-(math.pi * (2 * k + 1)) ** 2 / (8 * v * v)) / (2 * k + 1)
            c += -term if k % 2 else term
            if term < 1e-18:
                break
        return min(1.0, max(0.0, 1.0 - 4.0 / math.pi * c))
    s = 0.0
    for k in range(1, _TERMS):
        term = float(ndtr(-(2 * k - 1) * v))
        s += term if k % 2 else -term
        if term < 1e-300 or term < 1e-17 * s:
            break
    return min(1.0, max(0.0, 4.0 * s))


def range_sf(x) -> float:
    """``P(sup B - inf B > x)`` over ``0 <= t <= 1`` (the range of a standard Brownian motion, which
    starts at 0).

    Small ``x``: ``1 - sum_{k>=0} (8 / x^2 + 2 / (pi^2 (k + 1/2)^2)) exp(-2 pi^2 (k + 1/2)^2 / x^2)``
    (Feller, "The asymptotic distribution of the range of sums of independent random variables",
    Ann. Math. Statist. 1951); large ``x``: ``8 sum_{k>=1} (-1)^(k-1) k Q(k x)``, the integral of
    Feller's density ``(8 / sqrt(2 pi)) sum_{k>=1} (-1)^(k-1) k^2 exp(-k^2 r^2 / 2)``.

    Parameters
    ----------
    x : float, >= 0

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ValueError
        ``x`` negative or NaN.

    Examples
    --------
    >>> round(range_sf(1.0), 4), round(range_sf(2.4977), 3)
    (0.9366, 0.05)
    """
    v = _check_x(x)
    if v == 0:
        return 1.0
    if v < _SWITCH:
        c = 0.0
        for k in range(_TERMS):
            h = k + 0.5
            term = (8.0 / (v * v) + 2.0 / (math.pi * h) ** 2) * math.exp(-2.0 * (math.pi * h) ** 2 / (v * v))
            c += term
            if term < 1e-18:
                break
        return min(1.0, max(0.0, 1.0 - c))
    s = 0.0
    for k in range(1, _TERMS):
        term = k * float(ndtr(-k * v))
        s += term if k % 2 else -term
        if term < 1e-300 or term < 1e-17 * s:
            break
    return min(1.0, max(0.0, 8.0 * s))
