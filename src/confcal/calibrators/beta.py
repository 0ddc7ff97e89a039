"""Beta calibration (Kull, Silva Filho & Flach, AISTATS 2017): binary, one-vs-rest, and box scores.

The map (eq. 4 of the paper, the 3-parameter family)

    p' = sigmoid(a ln p - b ln(1 - p) + c),    a, b >= 0

is a logistic regression on the two features ``[ln p, -ln(1 - p)]``; ``a, b >= 0``
keeps it monotone non-decreasing in ``p``. It is fitted by exact constrained
maximum likelihood (:func:`confcal.calibrators._logistic.fit_constrained_logistic`:
every active set of the two sign constraints, Newton on each, best feasible one),
which is the paper's recipe of refitting without a feature whose coefficient
came out negative, made exact. The features are computed from the logits
without cancellation and clipped to ``+-36.04`` (``p`` within float64 eps of 0 or 1).

* ``beta``: two classes -> one map on ``p_1`` (the binary case of the paper);
  ``K`` classes -> one map per class on ``p_k`` against ``1[y = k]``, renormalised
  (may change the arg-max; reported in the fit record).
* ``det-beta``: box scores in [0, 1] (1-D), per class and/or per domain like
  ``det-ts``/``det-platt``, pooled map as fallback.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from confcal.calibrators._logistic import fit_constrained_logistic
from confcal.calibrators._reduce import OneVsRestCalibrator
from confcal.calibrators.base import register

__all__ = ["BetaCalibration", "beta_features", "fit_beta", "apply_beta"]


def beta_features(log_odds) -> np.ndarray:
    """``[ln p, -ln(1 - p)]`` ``(n, 2)`` from ``log(p / (1 - p))`` ``(n,)``, without cancellation."""
    lo = np.asarray(log_odds, dtype=np.float64)
    return np.column_stack([-np.logaddexp(0.0, -lo), np.logaddexp(0.0, lo)])


def fit_beta(log_odds, targets, *, sample_weight=None) -> dict:
    """Maximum-likelihood ``(a, b, c)`` of the beta map with ``a, b >= 0`` (see the module docstring)."""
    res = fit_constrained_logistic(beta_features(log_odds), targets, nonneg=(0, 1), sample_weight=sample_weight)
    return {"a": res.coef[0], "b": res.coef[1], "c": res.intercept}


def apply_beta(params: dict, log_odds) -> np.ndarray:
    f = beta_features(log_odds)
    return expit(params["a"] * f[:, 0] + params["b"] * f[:, 1] + params["c"])


def check_beta_params(params) -> dict:
    if not isinstance(params, dict):
        raise TypeError(f"expected a dict {{a, b, c}}, got {type(params).__name__}")
    out = {}
    for key in ("a", "b", "c"):
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"{key}: expected a finite number, got {v!r}")
        if key in ("a", "b") and v < 0:
            raise ValueError(f"{key}: expected >= 0 (monotone beta map), got {v!r}")
        out[key] = float(v)
    return out


@register
class BetaCalibration(OneVsRestCalibrator):
    """Beta calibration: binary, or one-vs-rest renormalised for ``K`` classes (``beta``).

    ``p' = sigmoid(a ln p - b ln(1 - p) + c)`` with ``a, b >= 0``, fitted by maximum
    likelihood. Two classes: one map on ``p_1 = softmax(logits)_1``, ``p'_0 = 1 - p'_1``.
    ``K > 2``: one map per class, outputs divided by their sum (all-zero rows: ``1/K``);
    the arg-max may change, and ``fit_record_["accuracy_change"]`` says by how much.

    Attributes
    ----------
    maps_ : list of ``{"a", "b", "c"}`` (one for two classes)

    Source: M. Kull, T. Silva Filho and P. Flach, "Beta calibration: a well-founded and
    easily implemented improvement on logistic calibration for binary classifiers",
    AISTATS 2017, eq. 4 (3-parameter family) with the sec. 3 monotonicity constraint.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 2, size=500)
    >>> logits = np.column_stack([np.zeros(500), 3.0 * (y - 0.5) + rng.normal(size=500)])
    >>> cal = METHODS["beta"]().fit(logits, y)
    >>> m = cal.maps_[0]
    >>> m["a"] >= 0 and m["b"] >= 0
    True
    """

    method = "beta"
    space = "logit"

    def __init__(self):
        pass

    def _fit_map(self, scores, targets, sample_weight):
        return fit_beta(scores, targets, sample_weight=sample_weight)

    def _apply_map(self, params, scores):
        return apply_beta(params, scores)

    def _check_map(self, params):
        return check_beta_params(params)
