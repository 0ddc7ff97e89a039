"""Sigmoid heads (multilabel classifiers, per-class detector scores): one binary map per label.

A multilabel model gives ``(n_samples, n_labels)`` logits, each label's ``sigmoid(z_l)`` read on
its own, and multi-hot targets ``(n_samples, n_labels)`` of 0/1. Softmax temperature scaling does
not apply (the labels are not exclusive; ``ts`` refuses multi-hot labels), so each label gets its
own map, fitted on its own column by the exact binary Newton of :mod:`._logistic`:

* ``ts-multilabel`` (:class:`MultilabelTemperatureScaling`): ``p_l = sigmoid(z_l / T_l)`` (Guo et
  al., ICML 2017, sec. 4.2, binary temperature scaling per label); keeps each label's ranking.
* ``platt-multilabel`` (:class:`MultilabelPlattScaling`): ``p_l = sigmoid(a_l z_l + b_l)`` (Platt
  1999), ``a_l >= 0`` with ``increasing=True`` (default).

``predict_proba`` returns float64 ``(n_samples, n_labels)``: each entry the probability that the
label is present. Rows do **not** sum to 1. ``predict`` is the multi-hot ``p >= 0.5``; ``score``
minus the mean per-label binary NLL. Per-label metrics:
:func:`confcal.metrics.multilabel.multilabel_metrics`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, logit

from confcal._validation import as_numpy
from confcal.calibrators.protocol.constraints import T_BOUNDS, T_RULE, Array, Bool, Fields, Real
from confcal.calibrators._fit.logistic import binary_ts_params, fit_logistic
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS
from confcal.calibrators.protocol.base import Calibrator, _sha256, register
from confcal.calibrators.protocol.temperature_bounds import temperatures_within_bounds
from confcal.metrics.multilabel import check_multihot, multilabel_metrics

__all__ = ["MultilabelTemperatureScaling", "MultilabelPlattScaling"]


class _PerLabelMaps(Calibrator):
    """Inputs, outputs and metrics shared by the per-label sigmoid-head maps."""

    #: ``predict_proba`` columns are independent label probabilities, not a distribution
    multilabel = True

    def _logits(self, logits, name="logits") -> np.ndarray:
        z = as_numpy(logits, name)
        if z.ndim == 1:
            z = z[:, None]
        if z.ndim != 2 or z.shape[0] == 0:
            raise ValueError(f"{name}: expected sigmoid-head logits of shape (n_samples, n_labels), got {z.shape}")
        if z.dtype == bool or not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
            raise TypeError(f"{name}: expected float logits, got dtype {z.dtype}")
        z = z.astype(np.float64)
        bad = ~np.isfinite(z)
        if bad.any():
            i = int(np.flatnonzero(bad.any(axis=1))[0])
            raise ValueError(f"{name}: expected finite logits, found NaN/inf in row {i}")
        if self._input_kind() == "probs":
            if np.any((z < 0) | (z > 1)):
                i = int(np.flatnonzero(((z < 0) | (z > 1)).any(axis=1))[0])
                raise ValueError(f"{name}: input_kind='probs' expects per-label probabilities in [0, 1], "
                                 f"got row {i} = {z[i].tolist()}")
            eps = np.finfo(np.float64).eps
            z = logit(np.clip(z, eps, 1 - eps))
        return z

    def _validate_logits(self, logits, name="logits"):
        z = self._logits(logits, name)
        if self._is_fitted() and z.shape[1] != self.n_classes_:
            raise ValueError(f"{name}: calibrator was fitted on {self.n_classes_} labels, got shape {z.shape}")
        return z

    def _predict_batch(self, logits, *, input_kind, first_row, **side):
        return self._predict_proba(self._validate_logits(logits)), False

    def _fit_inputs(self, logits, labels, sample_weight, side):
        z = self._logits(logits)
        y = check_multihot(labels, z.shape[0], z.shape[1])
        w = self._check_sample_weight(sample_weight, z.shape[0])
        side = self._check_side(side, z.shape[0])
        return z, y, w, side, {"data_sha256": _sha256(z, y, *([] if w is None else [w]))}

    def _fit(self, z, y, sample_weight=None):
        self.maps_ = [self._fit_label(z[:, j], y[:, j], sample_weight) for j in range(z.shape[1])]

    def _predict_proba(self, z, **side):
        return np.stack([expit(self._apply_label(z[:, j], m)) for j, m in enumerate(self.maps_)], axis=1)

    def _fit_metrics(self, z, probs, y):
        before, after = multilabel_metrics(expit(z), y), multilabel_metrics(probs, y)
        self._per_label = {"before": before["per_label"], "after": after["per_label"]}
        return before["mean"], after["mean"]

    def fit(self, logits, labels, **kw):
        super().fit(logits, labels, **kw)
        per = getattr(self, "_per_label", None)
        if per is not None:
            self.fit_record_["per_label_metrics"] = per
            del self._per_label
        return self

    def predict(self, logits, **side) -> np.ndarray:
        """Multi-hot ``(n_samples, n_labels)`` int8: ``p >= 0.5``."""
        return (self.predict_proba(logits, **side) >= 0.5).astype(np.int8)

    def score(self, logits, labels, sample_weight=None, **side) -> float:
        """Minus the mean per-label binary NLL (nats): higher is better."""
        p = self.predict_proba(logits, **side)
        y = check_multihot(labels, p.shape[0], p.shape[1])
        q = np.clip(np.where(y == 1, p, 1 - p), 1e-300, 1.0)
        per_row = -np.log(q).mean(axis=1)
        return -float(np.average(per_row, weights=sample_weight))


@register
class MultilabelTemperatureScaling(_PerLabelMaps):
    """One temperature per label of a sigmoid head (``ts-multilabel``): ``p_l = sigmoid(z_l / T_l)``.

    Each ``T_l`` minimises that label's mean binary NLL over ``[t_min, t_max]`` (Guo et al.,
    ICML 2017, sec. 4.2, binary form); see the module docstring for inputs and outputs.

    Parameters
    ----------
    t_min, t_max : search range of every temperature
    input_kind : ``"logits"`` (default) or ``"probs"`` (per-label sigmoid outputs; their logit is used)

    Attributes
    ----------
    temperatures_ : float64 ``(n_labels,)``

    Raises
    ------
    ValueError
        Logits not 2-D or not finite, labels not multi-hot of the same shape.

    Examples
    --------
    Label 0: logit 2 with 2 of 3 positives, so ``sigmoid(2 / T) = 2/3`` and ``T = 2 / ln 2``;
    label 1: logit -1 with 1 of 3 positives, ``sigmoid(-1 / T) = 1/3``, ``T = 1 / ln 2``:

    >>> import numpy as np
    >>> z = np.array([[2.0, -1.0]] * 3)
    >>> y = np.array([[1, 1], [1, 0], [0, 0]])
    >>> cal = MultilabelTemperatureScaling().fit(z, y)
    >>> (cal.temperatures_ * np.log(2)).round(6).tolist()
    [2.0, 1.0]
    >>> cal.predict_proba(z[:1]).round(4).tolist()
    [[0.6667, 0.3333]]
    """

    method = "ts-multilabel"
    hyper_constraints = dict(T_BOUNDS)
    hyper_rules = (T_RULE,)
    hyper_parameter_rules = (temperatures_within_bounds("label_temperatures"),)  # as ts: each T_l on load
    fitted_constraints = Fields({"label_temperatures": Array(("n_classes",), Real(gt=0)),
                                 "nll": Array(("n_classes",), Real(max_abs=math.inf))})

    def __init__(self, t_min: float = DEFAULT_T_BOUNDS[0], t_max: float = DEFAULT_T_BOUNDS[1],
                 input_kind: str = "logits"):
        self.t_min = t_min
        self.t_max = t_max
        self.input_kind = input_kind

    @property
    def temperatures_(self) -> np.ndarray:
        self._check_fitted()
        return np.asarray([m["temperature"] for m in self.maps_])

    def _fit_label(self, z, y, w):
        res = fit_logistic(z, y, slope_bounds=(1.0 / self.t_max, 1.0 / self.t_min), fit_bias=False, sample_weight=w)
        # as ts: a T_l that ends on t_min or t_max warns (CalibrationWarning), and sits exactly on the bound
        fit = binary_ts_params(res, self.t_min, self.t_max, stacklevel=6)
        return {"temperature": fit["temperature"], "nll": res.nll}

    def _apply_label(self, z, m):
        return z / m["temperature"]

    def _get_fitted(self):
        return {"label_temperatures": [m["temperature"] for m in self.maps_],
                "nll": [m["nll"] for m in self.maps_]}

    def _set_fitted(self, params):
        self.maps_ = [{"temperature": float(t), "nll": float(v)}
                      for t, v in zip(params["label_temperatures"], params["nll"])]


@register
class MultilabelPlattScaling(_PerLabelMaps):
    """Platt scaling per label of a sigmoid head (``platt-multilabel``): ``p_l = sigmoid(a_l z_l + b_l)``.

    Each ``(a_l, b_l)`` minimises that label's mean binary NLL (Platt 1999, with hard targets);
    ``increasing=True`` keeps ``a_l >= 0`` so no label's ranking is reversed.

    Parameters
    ----------
    increasing : constrain every slope ``a_l >= 0``
    input_kind : ``"logits"`` (default) or ``"probs"``

    Attributes
    ----------
    slopes_, biases_ : float64 ``(n_labels,)``

    Examples
    --------
    Constant logits carry no signal: each label gets its base rate through the bias:

    >>> import numpy as np
    >>> cal = MultilabelPlattScaling().fit(np.zeros((4, 2)), np.array([[1, 0], [1, 0], [1, 1], [0, 0]]))
    >>> cal.predict_proba(np.zeros((1, 2))).round(4).tolist()
    [[0.75, 0.25]]
    """

    method = "platt-multilabel"
    hyper_constraints = {"increasing": Bool()}
    fitted_constraints = Fields({"slopes": Array(("n_classes",)), "biases": Array(("n_classes",)),
                                 "nll": Array(("n_classes",), Real(max_abs=math.inf))})

    def __init__(self, increasing: bool = True, input_kind: str = "logits"):
        self.increasing = increasing
        self.input_kind = input_kind

    @property
    def slopes_(self) -> np.ndarray:
        self._check_fitted()
        return np.asarray([m["a"] for m in self.maps_])

    @property
    def biases_(self) -> np.ndarray:
        self._check_fitted()
        return np.asarray([m["b"] for m in self.maps_])

    def _fit_label(self, z, y, w):
        bounds = (0.0, math.inf) if self.increasing else (-math.inf, math.inf)
        res = fit_logistic(z, y, slope_bounds=bounds, fit_bias=True, sample_weight=w)
        return {"a": res.slope, "b": res.bias, "nll": res.nll}

    def _apply_label(self, z, m):
        return m["a"] * z + m["b"]

    def _get_fitted(self):
        return {"slopes": [m["a"] for m in self.maps_], "biases": [m["b"] for m in self.maps_],
                "nll": [m["nll"] for m in self.maps_]}

    def _set_fitted(self, params):
        if self.increasing and any(a < 0 for a in params["slopes"]):
            raise ValueError("slopes: expected values >= 0 (increasing=True)")
        self.maps_ = [{"a": float(a), "b": float(b), "nll": float(v)}
                      for a, b, v in zip(params["slopes"], params["biases"], params["nll"])]
