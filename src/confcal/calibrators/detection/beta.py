"""Beta calibration of box scores per class and/or per domain (``det-beta``; Kull, Silva Filho & Flach,
AISTATS 2017, eq. 4, on the box score as ``p``)."""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from confcal.calibrators._fit.beta import beta_features, beta_nll, check_beta_params, fit_beta
from confcal.calibrators.detection.box import _BoxScoreMaps, _grouped_fields, score_logit
from confcal.calibrators.protocol.base import register
from confcal.calibrators.protocol.constraints import NLL, Bool, Fields, Int, Real

__all__ = ["DetectionBetaCalibration"]

@register
class DetectionBetaCalibration(_BoxScoreMaps):
    """Beta calibration of box scores, per class and/or per domain (``det-beta``).

    For 1-D box scores ``s`` in [0, 1] against "this box is a true positive":
    ``p = sigmoid(a ln s - b ln(1 - s) + c)`` with ``a, b >= 0`` (never reverses the
    detector's ranking within a group), fitted by maximum likelihood. Scores are clipped
    to ``(eps, 1 - eps)`` of their dtype as in ``det-ts``; scores outside [0, 1] raise
    unless ``clip_scores=True``. Groups (``per_class``, ``domains=`` at fit time) and the
    pooled fallback for unseen, small or one-label groups work as in ``det-ts``/``det-platt``.

    Parameters
    ----------
    per_class
        One map per ``category_ids`` value (crossed with domains when given)
    clip_scores
        Clip scores outside [0, 1] into it instead of raising
    min_samples
        Groups with fewer boxes use the pooled map

    Attributes
    ----------
    pooled_ : dict
        ``{"a", "b", "c"}`` of the pooled fit
    groups_ : dict
        ``{(category_id?, domain?): parameters}``, as in ``det-ts``
    group_counts_ : dict
        Boxes per group at fit time.
    fallback_groups_ : list
        Groups that use ``pooled_``.

    Notes
    -----
    Source: Kull, Silva Filho & Flach, AISTATS 2017 (eq. 4, a, b >= 0); for detectors as in
    Küppers et al., "Multivariate Confidence Calibration for Object Detection", CVPR-W 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.05, 0.95, size=400)
    >>> correct = (rng.random(400) < scores ** 2).astype(int)
    >>> cal = METHODS["det-beta"]().fit(scores, correct)
    >>> p = cal.predict_score(scores)
    >>> bool(np.all(np.diff(p[np.argsort(scores)]) >= 0))
    True
    """

    method = "det-beta"
    hyper_constraints = {"per_class": Bool(), "clip_scores": Bool(), "min_samples": Int(ge=1)}
    fitted_constraints = _grouped_fields(Fields({"a": Real(ge=0), "b": Real(ge=0), "c": Real(), "nll": NLL}))

    def __init__(self, per_class: bool = False, clip_scores: bool = False, min_samples: int = 20,
                 input_kind: str = "logits"):
        self.per_class = per_class
        self.clip_scores = clip_scores
        self.min_samples = min_samples
        self.input_kind = input_kind

    def _features(self, arr, input_kind=None, first_row: int = 0):
        return score_logit(arr, clip_scores=self.clip_scores, first_row=first_row, method=self.method)

    def _score_kind(self, input_kind) -> str:
        return "probs"  # box scores in [0, 1], whatever input_kind says

    def _raw_proba(self, x):
        p = expit(x)
        return np.stack([1.0 - p, p], axis=1)

    def _fit_group(self, x, y, sample_weight=None):
        params = fit_beta(x, y.astype(np.float64), sample_weight=sample_weight)
        return {**params, "nll": float(beta_nll(params, x, y, sample_weight))}

    def _set_fitted(self, params):
        super()._set_fitted(params)
        check = lambda p: {**check_beta_params(p), "nll": p.get("nll")}  # noqa: E731
        self.pooled_ = check(self.pooled_)
        self.groups_ = {k: check(v) for k, v in self.groups_.items()}

    def _binary_logit(self, x, p):
        f = beta_features(x)
        return p["a"] * f[:, 0] + p["b"] * f[:, 1] + p["c"]
