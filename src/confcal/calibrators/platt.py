"""Platt scaling one-vs-rest (``platt-ovr``): scikit-learn's ``CalibratedClassifierCV(method="sigmoid")`` rule.

Per class ``k``: ``p'_k = sigmoid(a_k s_k + b_k)`` on the class score
``s_k = log(p_k / (1 - p_k))`` (the log-odds of ``softmax(logits)_k``; with two
classes this is the logit margin ``z_1 - z_0``, i.e. scikit-learn's binary
decision function), fitted by maximum likelihood against Platt's smoothed
targets ``(N+ + 1)/(N+ + 2)`` and ``1/(N- + 2)`` (Platt 1999, sec. 2.2). Two
classes: one map on class 1, ``p'_0 = 1 - p'_1``. ``K > 2``: the ``K`` outputs are
divided by their sum; rows where all are 0 get ``1/K`` -- scikit-learn's rule.
The slope is not constrained, so the map may reverse a class's ranking, and the
arg-max may change (``fit_record_["accuracy_change"]``). Log-odds are clipped to
``+-36.04`` (float64 eps of 0 or 1).
"""

from __future__ import annotations

import numpy as np

from confcal.calibrators._constraints import Fields, ListOf, Real
from confcal.calibrators._reduce import OneVsRestCalibrator
from confcal.calibrators._univariate import apply_platt, fit_platt
from confcal.calibrators.base import register

__all__ = ["PlattOneVsRest"]


@register
class PlattOneVsRest(OneVsRestCalibrator):
    """Platt scaling one-vs-rest with scikit-learn's sigmoid rule (``platt-ovr``).

    See the module docstring for the rule.

    Attributes
    ----------
    maps_ : list of ``{"a", "b"}``, one per class (one for two classes)

    Source: J. Platt, "Probabilistic Outputs for Support Vector Machines and Comparisons to
    Regularized Likelihood Methods", 1999; multiclass as scikit-learn's
    ``CalibratedClassifierCV(method="sigmoid")`` (one-vs-rest, normalised by the row sum).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(300, 3)) * 4, rng.integers(0, 3, size=300)
    >>> probs = METHODS["platt-ovr"]().fit(logits, labels).predict_proba(logits)
    >>> bool(np.allclose(probs.sum(axis=1), 1.0))
    True
    """

    method = "platt-ovr"
    hyper_constraints: dict = {}
    fitted_constraints = Fields({"maps": ListOf(Fields({"a": Real(), "b": Real()}))})
    space = "logit"

    def __init__(self, input_kind: str = "logits"):
        self.input_kind = input_kind

    def _fit_map(self, scores, targets, sample_weight):
        return fit_platt(scores, targets, sample_weight=sample_weight, smoothed=True)

    def _apply_map(self, params, scores):
        return apply_platt(params, scores)

    def _check_map(self, params):
        if not isinstance(params, dict):
            raise TypeError(f"expected a dict {{a, b}}, got {type(params).__name__}")
        out = {}
        for key in ("a", "b"):
            v = params[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"{key}: expected a finite number, got {v!r}")
            out[key] = float(v)
        return out
