"""Independent numpy oracles for the calibrator tests (float64, slow and simple on purpose)."""

from __future__ import annotations

import numpy as np


def bcsoftmax_bisect(x: np.ndarray, a: float, b: float, iters: int = 200) -> np.ndarray:
    """BCSoftmax by bisection on the KKT multiplier: ``p_i = clip(exp(x_i - nu), a, b)``, ``sum p = 1``."""
    with np.errstate(over="ignore"):
        return _bisect(np.asarray(x, dtype=np.float64), a, b, iters)


def _bisect(x, a, b, iters):
    lo = x.min(axis=1) - 800.0  # every exp(x - nu) >= 1 >= b: the sum is K b >= 1
    hi = x.max(axis=1) + 800.0  # every exp(x - nu) ~ 0: the sum is K a <= 1
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        s = np.clip(np.exp(x - mid[:, None]), a, b).sum(axis=1)
        big = s > 1
        lo = np.where(big, mid, lo)
        hi = np.where(big, hi, mid)
    p = np.clip(np.exp(x - (0.5 * (lo + hi))[:, None]), a, b)
    return p / p.sum(axis=1, keepdims=True)


def mean_nll(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.mean(np.log(np.maximum(p[np.arange(len(y)), y], 1e-300))))


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def simulate(n: int, k: int, seed: int, scale: float = 3.0, temperature: float = 1.0):
    """Random logits ``(n, k)`` and labels drawn from ``softmax(logits / temperature)``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * scale
    p = np.exp(log_softmax(z / temperature))
    u = rng.random(n)[:, None]
    y = (np.cumsum(p, axis=1) < u).sum(axis=1).clip(0, k - 1)
    return z, y.astype(np.int64)
