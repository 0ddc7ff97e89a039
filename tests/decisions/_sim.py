"""Synthetic calibration sets with a known risk curve (the oracle of the validity simulations).

Scores ``S ~ Uniform(0, 1)`` and ``P(Y = 1 | S = s) = s ** power``. Then, in closed form,
``P(Y = 0 | S >= l) = 1 - (1 - l^(p+1)) / ((p + 1)(1 - l))`` (false discovery of accepting ``S >= l``) and
``P(Y = 1 | S < l) = l^p / (p + 1)`` (false omission of rejecting ``S < l``).
"""

import numpy as np


def draw(rng, n, power=1.0):
    s = rng.random(n)
    return s, rng.random(n) < s**power


def true_fdr(lam, power=1.0):
    lam = np.asarray(lam, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = 1 - (1 - lam ** (power + 1)) / ((power + 1) * (1 - lam))
    return np.where(lam >= 1, 0.0, r)


def true_for(lam, power=1.0):
    return np.asarray(lam, dtype=np.float64) ** power / (power + 1)


def mc_upper(delta, draws, z=3.0):
    """delta plus ``z`` Monte-Carlo standard errors of a violation rate over ``draws`` draws."""
    return delta + z * np.sqrt(delta * (1 - delta) / draws)
