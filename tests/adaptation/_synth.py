"""Synthetic label shift with a known p(x | y): Gaussian classes, exact Bayes posteriors."""

from __future__ import annotations

import numpy as np


def means(k: int, sep: float = 2.0) -> np.ndarray:
    """Class means: ``sep`` times the first ``k`` unit vectors in ``k`` dimensions."""
    return sep * np.eye(k)


def draw(prior, n: int, rng, sep: float = 2.0):
    """``(x, y)``: ``y ~ prior``, ``x | y ~ N(mu_y, I)``."""
    prior = np.asarray(prior, dtype=np.float64)
    y = rng.choice(prior.shape[0], size=n, p=prior)
    x = means(prior.shape[0], sep)[y] + rng.normal(size=(n, prior.shape[0]))
    return x, y


def log_likelihood(x, sep: float = 2.0) -> np.ndarray:
    """``log p(x | y)`` up to a constant shared by the classes: ``x . mu_y - |mu_y|^2 / 2``."""
    mu = means(x.shape[1], sep)
    return x @ mu.T - 0.5 * (mu ** 2).sum(axis=1)


def posterior(x, prior, sep: float = 2.0) -> np.ndarray:
    """Exact ``p(y | x)`` under ``prior`` (Bayes' rule)."""
    z = log_likelihood(x, sep) + np.log(prior)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def logits(x, source_prior, sep: float = 2.0) -> np.ndarray:
    """Calibrated source logits: ``log p(x | y) + log pi_s`` (softmax = the exact source posterior)."""
    return log_likelihood(x, sep) + np.log(source_prior)
