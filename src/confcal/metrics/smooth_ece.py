"""Smooth ECE (smECE): top-label calibration error by kernel smoothing.

Błasiok & Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel
Smoothing" (ICLR 2024, arXiv 2309.12236), sec. 3-4. With top-label confidences
``f_i`` and correctness ``y_i in {0, 1}``, residuals ``r_i = f_i - y_i`` and the
reflected Gaussian kernel ``K_sigma`` on ``[0, 1]``,

    smECE_sigma = integral_0^1 | (1/n) sum_i K_sigma(t, f_i) r_i | dt

which is ``integral |r_hat(t)| delta_hat(t) dt`` with the Nadaraya-Watson
residual ``r_hat`` and the kernel density ``delta_hat`` of the paper (their
eq. for smECE_sigma, sec. 3). The reflected kernel is the law of
``pi(f + eta)``, ``eta ~ N(0, sigma^2)``, with ``pi`` folding the real line onto
``[0, 1]`` (reflections at 0 and 1, repeated): ``K_sigma(t, f) = sum_k
phi_sigma(t - f - 2k) + phi_sigma(t + f - 2k)``. It integrates to 1 over
``[0, 1]`` for every ``f``, so a sample block with one confidence ``c`` and
accuracy ``a`` contributes exactly ``|c - a|`` times its weight when alone.

smECE itself uses the bandwidth ``sigma*`` that solves ``smECE_sigma = sigma``
(unique because smECE_sigma is non-increasing in sigma; the paper's sec. 4),
and equals ``sigma*``.

Numerics: the residuals are spread onto a uniform grid of ``M + 1`` points by
linear interpolation, the folded (period-2, even) extension is convolved with
the wrapped Gaussian by FFT, and ``|.|`` is integrated by the trapezoid rule:
``O(n + M log M)`` per bandwidth, ``M >= 256 / sigma`` (relative error of the
kernel values about ``(h / sigma)^2 / 8 < 2e-6``). The fixed point is found by
Brent's method on ``[SIGMA_MIN, 1]``.
"""

from __future__ import annotations

import numpy as np

from confcal.metrics.calibration import _confidence_correct
from confcal._validation import plain

__all__ = ["smooth_ece", "SIGMA_MIN"]

#: Smallest bandwidth searched for the fixed point. A model whose smECE is below
#: this gets the smECE at ``SIGMA_MIN`` (which is then ``< SIGMA_MIN``).
SIGMA_MIN = 1e-3

_GRID_PER_SIGMA = 256
_MIN_GRID = 1024
_MAX_GRID = 1 << 19


def _grid_size(sigma: float) -> int:
    m = max(_MIN_GRID, int(np.ceil(_GRID_PER_SIGMA / sigma)))
    return min(_MAX_GRID, 1 << int(np.ceil(np.log2(m))))


def _grid_masses(f: np.ndarray, r: np.ndarray, m: int) -> np.ndarray:
    """Residual masses on the grid ``s_j = j / m``, ``j = 0 .. m``: each ``r_i`` is split
    linearly between the two grid points around ``f_i``."""
    pos = f * m
    j = np.minimum(np.floor(pos).astype(np.intp), m - 1)
    frac = pos - j
    v = np.bincount(j, weights=(1.0 - frac) * r, minlength=m + 1)
    v += np.bincount(j + 1, weights=frac * r, minlength=m + 1)
    return v


def _restrict(v: np.ndarray, m: int) -> np.ndarray:
    """Masses on the grid of ``m`` intervals from masses on a finer grid of ``len(v) - 1`` intervals
    (a multiple of ``m``). Exact: the coarse hat function is linear between fine grid points, so
    a fine point ``d`` steps above coarse point ``J`` gives ``1 - d / q`` of its mass to ``J`` and
    ``d / q`` to ``J + 1`` (``q`` fine steps per coarse step)."""
    fine = v.shape[0] - 1
    if fine == m:
        return v
    q = fine // m
    blocks = v[:-1].reshape(m, q)
    d = np.arange(q) / q
    out = np.zeros(m + 1)
    out[:m] += blocks @ (1.0 - d)
    out[1:] += blocks @ d
    out[m] += v[-1]
    return out


def _folded(v: np.ndarray) -> np.ndarray:
    """Masses ``v`` on ``j / m``, ``j = 0 .. m``, extended to the period-2 grid ``j = 0 .. 2m - 1``:
    the mirror image of a point at ``s`` is at ``2 - s``; points 0 and ``m`` are their own mirror
    images, so they carry twice their mass."""
    m = v.shape[0] - 1
    w = np.empty(2 * m)
    w[0] = 2.0 * v[0]
    w[1:m] = v[1:m]
    w[m] = 2.0 * v[m]
    w[m + 1:] = v[m - 1:0:-1]
    return w


def _wrapped_gaussian(sigma: float, m: int) -> np.ndarray:
    """Period-2 Gaussian density ``sum_k phi_sigma(d + 2k)`` at ``d = j / m``, ``j = 0 .. 2m - 1``."""
    d = np.arange(2 * m) / m
    d = np.where(d > 1.0, d - 2.0, d)  # signed offset in (-1, 1]
    norm = 1.0 / (sigma * np.sqrt(2.0 * np.pi))
    if 40.0 * sigma < 1.0:  # other images and |d| > 40 sigma add < e^-800: skip them
        out = np.zeros(2 * m)
        near = np.abs(d) <= 40.0 * sigma
        z = d[near] / sigma
        out[near] = norm * np.exp(-0.5 * z * z)
        return out
    n_images = int(np.ceil(5.0 * sigma)) + 1  # images beyond 2k - 1 > 10 sigma add < e^-50
    k = np.arange(-n_images, n_images + 1)
    z = (d[:, None] + 2.0 * k[None, :]) / sigma
    return norm * np.exp(-0.5 * z * z).sum(axis=1)


def _smece_at(fine: np.ndarray, n: int, sigma: float, memo: dict | None = None) -> float:
    """smECE at bandwidth ``sigma`` from the finest-grid masses ``fine``. ``memo`` keeps, per grid
    size ``m``, the transform of the folded masses (it depends on ``m`` only, and the grid sizes are
    powers of two, so one root search needs a handful of them); a callable ``fine`` gives the masses
    on a grid of ``m`` intervals directly (``fine(m)``)."""
    m = _grid_size(sigma)
    spec = None if memo is None else memo.get(m)
    if spec is None:
        coarse = fine(m) if callable(fine) else _restrict(fine, m)
        spec = np.fft.rfft(_folded(coarse))
        if memo is not None:
            memo[m] = spec
    ker = _wrapped_gaussian(sigma, m)
    g = np.fft.irfft(spec * np.fft.rfft(ker), n=2 * m)[: m + 1]
    g = np.abs(g) / n
    h = 1.0 / m
    return float(h * (g.sum() - 0.5 * (g[0] + g[-1])))


def _check_sigma(sigma) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)) \
            or not np.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma: expected a positive finite bandwidth, got {plain(sigma)}")
    return float(sigma)


def _smooth_ece_pairs(conf: np.ndarray, correct: np.ndarray, sigma=None):
    f = np.asarray(conf, dtype=np.float64)
    r = f - np.asarray(correct, dtype=np.float64)
    if 8 * f.shape[0] < _MAX_GRID:
        # few samples: their masses on each coarse grid directly (O(n) per grid size) cost less
        # than spreading them on the finest grid and restricting it (O(_MAX_GRID) per grid size);
        # the restriction is exact, so both are the same masses up to rounding
        return _smooth_ece_masses(lambda m: _grid_masses(f, r, m), f.shape[0], sigma)
    return _smooth_ece_masses(_grid_masses(f, r, _MAX_GRID), f.shape[0], sigma)


def _smooth_ece_masses(fine, n: int, sigma=None):
    """smECE (and the bandwidth used) from residual masses on the finest grid (``_MAX_GRID``), or
    from a callable giving the masses on a grid of ``m`` intervals (see :func:`_smece_at`)."""
    memo: dict = {}
    if sigma is not None:
        s = _check_sigma(sigma)
        return _smece_at(fine, n, s, memo), s
    # smECE_1 <= mean |r| <= 1, so sigma = 1 is at or above the fixed point; halve
    # the bandwidth until smECE_sigma exceeds sigma, then refine inside that bracket.
    # Coarse bandwidths first: their grids are small, SIGMA_MIN's is the largest.
    hi = 1.0
    while True:
        lo = max(hi / 2.0, SIGMA_MIN)
        value = _smece_at(fine, n, lo, memo)
        if value > lo:
            break
        if lo == SIGMA_MIN:
            return value, SIGMA_MIN
        hi = lo
    from scipy.optimize import brentq  # here: scipy.optimize costs ~0.5 s to import, and only this needs it

    s = brentq(lambda t: _smece_at(fine, n, t, memo) - t, lo, hi, xtol=1e-12, rtol=1e-10)
    return _smece_at(fine, n, s, memo), float(s)


def smooth_ece(probs, labels, *, sigma: float | None = None, return_sigma: bool = False):
    """Top-label smooth ECE (smECE): calibration error by kernel smoothing.

    ``smECE_sigma = integral_0^1 |(1/n) sum_i K_sigma(t, f_i) (f_i - y_i)| dt``
    with the reflected Gaussian kernel on ``[0, 1]``, top-label confidences
    ``f_i`` and correctness ``y_i``; smECE is its value at the bandwidth
    ``sigma*`` where ``smECE_sigma* = sigma*``.

    Source: Błasiok & Nakkiran, "Smooth ECE: Principled Reliability Diagrams
    via Kernel Smoothing", ICLR 2024 (arXiv 2309.12236), sec. 3-4.

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: positive-class probabilities of a binary problem
        (read as ``[1 - p, p]``).  Confidence is the top-label probability
        (ties: lowest class index wins, as in :func:`confcal.metrics.accuracy`).
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    sigma : float or None, default=None
        Fixed kernel bandwidth (confidence units, ``> 0``) for
        ``smECE_sigma``; ``None`` uses the paper's self-consistent ``sigma*``
        (searched on ``[SIGMA_MIN, 1]``; below ``SIGMA_MIN`` the value at
        ``SIGMA_MIN`` is returned).
    return_sigma : bool, default=False
        Also return the bandwidth used.

    Returns
    -------
    smece : float
        In ``[0, 1]`` (a fraction, not percent).  Computed in float64 in
        ``O(n + M log M)`` per bandwidth with ``M >= 256 / sigma`` grid points.
    sigma : float
        Only with ``return_sigma=True``.

    Raises
    ------
    ValueError
        Invalid probabilities or labels (see
        :func:`confcal._validation.check_probs`), non-positive ``sigma``.

    Examples
    --------
    The kernel integrates to one over ``[0, 1]``, so a block of samples with
    one confidence ``c`` and accuracy ``a`` contributes ``|c - a|``: always
    0.9 confident and always wrong gives 0.9 (and ``sigma* = 0.9``); 0.5
    confident and right half of the time gives 0:

    >>> import numpy as np
    >>> from confcal.metrics import smooth_ece
    >>> value, sigma = smooth_ece(np.full(8, 0.9), np.zeros(8, dtype=int), return_sigma=True)
    >>> round(value, 6), round(sigma, 6)
    (0.9, 0.9)
    >>> smooth_ece(np.full(4, 0.5), [0, 1, 0, 1])
    0.0
    """
    conf, correct = _confidence_correct(probs, labels)
    value, s = _smooth_ece_pairs(conf, correct, sigma)
    value = min(max(value, 0.0), 1.0)  # rounding of the FFT only; the exact value is in [0, 1]
    return (value, s) if return_sigma else value
