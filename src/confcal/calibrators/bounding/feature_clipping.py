"""Feature clipping (FC).

Source: Tao et al., "Feature Clipping for Uncertainty Calibration", AAAI 2025;
eq. 30 of Atarashi et al., arXiv 2506.10572: the penultimate features are
clipped, ``f~ = clip(f, -c, c)``, and passed through the model's last linear
layer, ``p = softmax(W f~ + b)``; ``c`` minimises the calibration-set NLL.

FC needs the features and the last layer. Pass ``weight`` ``(n_classes,
n_features)`` and ``bias`` ``(n_classes,)``, or leave them out: the layer is
then recovered from the calibration logits by least squares on row-centred
logits (softmax ignores a per-row constant, so log-probabilities work too), and
the fit refuses data whose logits are not a linear function of the features.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from confcal._numeric import log_softmax, softmax
from confcal.calibrators.protocol.constraints import NLL, Array, Fields, Nullable, Real, optional_value, \
    without_missing
from confcal.calibrators.protocol.base import Calibrator, register

__all__ = ["FeatureClipping"]

_LEVELS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


def _nll(features, labels, weight, bias, c) -> float:
    z = np.clip(features, -c, c) @ weight.T + bias
    return float(-np.mean(log_softmax(z)[np.arange(len(labels)), labels]))


@register
class FeatureClipping(Calibrator):
    """``p = softmax(W clip(f, -c, c) + b)`` with the threshold ``c`` fitted by NLL.

    Parameters
    ----------
    weight
        optional nested list ``(n_classes, n_features)``, the last linear layer
    bias : optional list
        ``(n_classes,)`` (zeros if ``weight`` is given without it)
    max_residual
        Largest relative residual accepted when the layer is recovered from
        the logits (default 1e-3)

    Attributes
    ----------
    threshold_ : float
        ``c`` (``inf`` when clipping does not help; stored as ``null`` in the manifest)
    weight_, bias_
        The layer used (given or recovered), float64 arrays
    nll_
        Calibration NLL at ``threshold_``; ``base_nll_`` without clipping

    Notes
    -----
    Side input ``features`` ``(n_samples, n_features)`` is required at fit and predict time.

    Raises ``ValueError`` for a layer whose shape does not match the features /
    classes, or features that do not reproduce the logits.

    Examples
    --------
    Features and the last layer of a model whose logits are ``W f``; the
    layer is recovered from the logits (up to a shift common to all classes,
    which softmax ignores) and clipping the features lowers the calibration
    NLL:

    >>> import numpy as np
    >>> from confcal.calibrators import FeatureClipping
    >>> rng = np.random.default_rng(0)
    >>> features = rng.normal(size=(200, 4))
    >>> weight = 3 * rng.normal(size=(3, 4))
    >>> logits, labels = features @ weight.T, rng.integers(0, 3, size=200)
    >>> fc = FeatureClipping().fit(logits, labels, features=features)
    >>> recovered = features @ fc.weight_.T + fc.bias_
    >>> bool(np.allclose(np.diff(recovered, axis=1), np.diff(logits, axis=1))), fc.nll_ < fc.base_nll_
    (True, True)
    >>> fc.predict_proba(logits, features=features).shape
    (200, 3)
    """

    method = "fc"
    side_inputs = ("features",)
    hyper_constraints = {"weight": Nullable(Array(("n_classes", "n_features"))),
                         "bias": Nullable(Array(("n_classes",))), "max_residual": Real(gt=0)}
    # threshold null: clipping did not help (c = inf, JSON has no inf)
    fitted_constraints = Fields({"threshold": Nullable(Real(gt=0)), "weight": Array(("n_classes", "n_features")),
                                 "bias": Array(("n_classes",)), "nll": NLL, "base_nll": NLL})

    def __init__(self, weight: list | None = None, bias: list | None = None, max_residual: float = 1e-3,
                 input_kind: str = "logits"):
        self.input_kind = input_kind
        self.weight = weight
        self.bias = bias
        self.max_residual = max_residual

    def _sample_weight_refusal(self):
        return "its layer recovery and threshold scan are unweighted (not implemented)"

    one_logit_head = False  # the last layer has one output per class

    def _layer(self, x, features):
        n, k = x.shape
        d = features.shape[1]
        if self.weight is not None:
            w = np.asarray(self.weight, dtype=np.float64)
            if w.shape != (k, d):
                raise ValueError(f"weight: expected shape (n_classes, n_features) = ({k}, {d}), got {w.shape}")
            b = np.zeros(k) if self.bias is None else np.asarray(self.bias, dtype=np.float64)
            if b.shape != (k,):
                raise ValueError(f"bias: expected shape ({k},), got {b.shape}")
            return w, b
        if np.isneginf(x).any():
            raise ValueError("logits: -inf entries; pass weight= and bias= to use feature clipping")
        zc = x - x.mean(axis=1, keepdims=True)
        a = np.hstack([features, np.ones((n, 1))])
        theta, *_ = np.linalg.lstsq(a, zc, rcond=None)
        resid = np.linalg.norm(a @ theta - zc) / max(np.linalg.norm(zc), 1e-300)
        if not resid <= self.max_residual:
            raise ValueError(f"features: the logits are not a linear function of the features (relative "
                             f"residual {resid:.3g} > max_residual={self.max_residual}); pass the last layer "
                             "as weight= (n_classes, n_features) and bias= (n_classes,)")
        return theta[:-1].T.copy(), theta[-1].copy()

    def _fit(self, logits, labels, features):
        x = np.asarray(logits, dtype=np.float64)
        w, b = self._layer(x, features)
        self.weight_, self.bias_ = w, b
        top = float(np.abs(features).max())
        self.base_nll_ = _nll(features, labels, w, b, math.inf)
        cands = sorted({float(q) for q in np.quantile(np.abs(features), _LEVELS) if q > 0})
        vals = [_nll(features, labels, w, b, c) for c in cands]
        best_c, best = math.inf, self.base_nll_
        if cands:
            i = int(np.argmin(vals))
            if vals[i] < best:
                best_c, best = cands[i], vals[i]
                lo = cands[i - 1] if i > 0 else cands[i] / 2
                hi = cands[i + 1] if i + 1 < len(cands) else top
                r = minimize_scalar(lambda c: _nll(features, labels, w, b, c), bounds=(lo, hi),
                                    method="bounded", options={"xatol": 1e-6 * max(hi, 1.0)})
                if r.fun < best:
                    best_c, best = float(r.x), float(r.fun)
        self.threshold_ = best_c
        self.nll_ = best

    def _predict_proba(self, logits, features):
        if features.shape[1] != self.weight_.shape[1]:
            raise ValueError(f"features: expected {self.weight_.shape[1]} features, got shape {features.shape}")
        c = self.threshold_
        return softmax(np.clip(features, -c, c) @ self.weight_.T + self.bias_)

    def _get_fitted(self):
        # no clipping (c = inf) is stored as null: JSON has no inf, and the loader refuses "inf" strings
        return {"threshold": self.threshold_ if math.isfinite(self.threshold_) else None,
                "weight": self.weight_.tolist(), "bias": self.bias_.tolist(),
                **without_missing({"nll": self.nll_, "base_nll": self.base_nll_})}

    def _set_fitted(self, params):
        t = params["threshold"]
        self.threshold_ = math.inf if t is None else float(t)
        self.weight_ = np.asarray(params["weight"], dtype=np.float64)
        self.bias_ = np.asarray(params["bias"], dtype=np.float64)
        self.nll_ = optional_value(params, "nll", float)  # None: the manifest has none (nothing invented)
        self.base_nll_ = optional_value(params, "base_nll", float)
