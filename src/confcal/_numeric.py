"""Small numpy numerics shared across layers (float64, -inf-safe)."""

from __future__ import annotations

import numpy as np


def row_max(z: np.ndarray) -> np.ndarray:
    """``np.max(z, axis=-1, keepdims=True)``, the same values (a NaN propagates), faster on 2-D rows.

    numpy reduces a short last axis row by row (0.2-0.3 ms on 5,000 x 10); an element-wise maximum
    over the columns (up to 16) or the entry at each row's arg-max (more columns) gives the same
    maximum in a fraction of it. Only the sign of a zero maximum can differ, and ``z - max`` is
    the same either way."""
    if z.ndim != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        return np.max(z, axis=-1, keepdims=True)
    if z.shape[1] <= 16:
        m = z[:, 0].copy()
        for j in range(1, z.shape[1]):
            np.maximum(m, z[:, j], out=m)
        return m[:, None]
    return np.take_along_axis(z, np.argmax(z, axis=1)[:, None], axis=1)


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64; ``-inf`` entries (masked classes) give ``-inf``."""
    z = np.asarray(z, dtype=np.float64)
    m = row_max(z)
    with np.errstate(invalid="ignore"):
        zc = z - m
    lse = np.log(np.sum(np.exp(zc), axis=-1, keepdims=True))
    return zc - lse


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64; rows sum to 1 and ``-inf`` entries get probability 0.

    ``exp(z - max z)`` divided by its row sum: one ``exp`` pass (``exp(log_softmax)`` took two and a
    ``log``, 2.4x the time on 5,000 x 100), within 4e-15 relative of it per entry."""
    z = np.asarray(z, dtype=np.float64)
    m = row_max(z)
    with np.errstate(invalid="ignore"):
        p = np.subtract(z, m)
    np.exp(p, out=p)
    p /= p.sum(axis=-1, keepdims=True)
    return p
