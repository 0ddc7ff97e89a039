"""Beta calibration (Kull, Silva Filho & Flach, AISTATS 2017): binary, one-vs-rest, and box scores.

The map (eq. 4 of the paper, the 3-parameter family)

    p' = sigmoid(a ln p - b ln(1 - p) + c),    a, b >= 0

is a logistic regression on the two features ``[ln p, -ln(1 - p)]``; ``a, b >= 0``
keeps it monotone non-decreasing in ``p``. It is fitted by exact constrained
maximum likelihood (:func:`confcal.calibrators._constrained_logistic.fit_constrained_logistic`:
every active set of the two sign constraints, Newton on each, best feasible one),
which is the paper's recipe of refitting without a feature whose coefficient
came out negative, made exact. The features are computed from the logits
without cancellation and clipped to ``+-36.04`` (``p`` within float64 eps of 0 or 1).

* ``beta``: two classes -> one map on ``p_1`` (the binary case of the paper);
  ``K`` classes -> one map per class on ``p_k`` against ``1[y = k]``, renormalised
  (``multiclass="ovr"``, the default), or ``multiclass="multinomial"``: the same ``K`` maps as
  logits of one softmax, ``p'_k ∝ exp(a_k ln p_k - b_k ln(1 - p_k) + c_k)``, fitted jointly on the
  multiclass NLL (netcal's multiclass extension, Küppers et al.); both may change the arg-max
  (reported in the fit record).
* ``det-beta``: box scores in [0, 1] (1-D), per class and/or per domain like
  ``det-ts``/``det-platt``, pooled map as fallback.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from confcal._numeric import softmax
from confcal.calibrators._constrained_logistic import fit_constrained_logistic
from confcal.calibrators._constraints import NLL, Bool, Choice, Fields, Int, ListOf, Real, per_class_maps
from confcal.calibrators._reduce import OneVsRestCalibrator
from confcal.calibrators.base import register
from confcal.calibrators.detection import _BoxScoreMaps, _grouped_fields, score_logit

__all__ = ["BetaCalibration", "DetectionBetaCalibration", "beta_features", "fit_beta", "fit_beta_batch",
           "fit_beta_multinomial", "apply_beta"]


def beta_features(log_odds) -> np.ndarray:
    """``[ln p, -ln(1 - p)]`` ``(n, 2)`` from ``log(p / (1 - p))`` ``(n,)``, without cancellation."""
    lo = np.asarray(log_odds, dtype=np.float64)
    return np.column_stack([-np.logaddexp(0.0, -lo), np.logaddexp(0.0, lo)])


def fit_beta(log_odds, targets, *, sample_weight=None) -> dict:
    """Maximum-likelihood ``(a, b, c)`` of the beta map with ``a, b >= 0`` (see the module docstring)."""
    res = fit_constrained_logistic(beta_features(log_odds), targets, nonneg=(0, 1), sample_weight=sample_weight)
    return {"a": res.coef[0], "b": res.coef[1], "c": res.intercept}


def fit_beta_batch(log_odds, targets, *, sample_weight=None) -> list[dict]:
    """:func:`fit_beta` for the ``K`` columns of ``log_odds`` / ``targets`` ``(n, K)`` at once.

    The same exact constrained maximum likelihood: every active set of ``a, b >= 0`` (none, ``a = 0``,
    ``b = 0``, both) is a batch of ``K`` logistic fits (:func:`._platt_batch.fit_logistic_batch`,
    batched Newton with closed-form gradients and Hessians), and per class the lowest loss among the
    feasible sets is kept, in :func:`fit_constrained_logistic`'s order and tie rule (a class whose free fit
    is feasible stops there: that is its constrained optimum, the problem being convex). A class whose
    Newton did not converge warns as there.
    """
    import warnings

    from confcal.calibrators._platt_batch import fit_logistic_batch
    from confcal.calibrators._tsfit import CalibrationWarning

    lo = np.asarray(log_odds, dtype=np.float64).T                    # (K, n)
    t = np.asarray(targets, dtype=np.float64).T
    k = lo.shape[0]
    feats = np.stack([-np.logaddexp(0.0, -lo), np.logaddexp(0.0, lo)], axis=2)  # (K, n, 2)
    best_loss = np.full(k, np.inf)
    best = np.zeros((k, 3))
    best_conv = np.zeros(k, dtype=bool)
    todo = np.arange(k)
    for fixed in ((), (0,), (1,), (0, 1)):
        free = [j for j in (0, 1) if j not in fixed]
        coef, icpt, loss, conv = fit_logistic_batch(feats[todo][:, :, free], t[todo], sample_weight=sample_weight)
        full = np.zeros((todo.size, 2))
        full[:, free] = coef
        ok = np.all(full >= 0, axis=1) & (loss < best_loss[todo] - 1e-15)
        sel = todo[ok]
        best[sel, :2], best[sel, 2], best_loss[sel], best_conv[sel] = full[ok], icpt[ok], loss[ok], conv[ok]
        if not fixed:
            # a feasible unconstrained optimum of this convex problem is the constrained one: only the
            # classes whose free fit broke a sign constraint need the smaller active sets
            todo = todo[~ok]
            if todo.size == 0:
                break
    for j in np.flatnonzero(~best_conv):
        warnings.warn(f"logistic fit did not converge in 100 Newton steps (coef {best[j, :2].tolist()}); "
                      "the classes may be separable on this calibration set", CalibrationWarning, stacklevel=3)
    return [{"a": float(a), "b": float(b), "c": float(c)} for a, b, c in best]


def _multinomial_logits(theta: np.ndarray, f1: np.ndarray, f2: np.ndarray) -> np.ndarray:
    k = f1.shape[1]
    return f1 * theta[:k] + f2 * theta[k:2 * k] + theta[2 * k:]


def multinomial_beta_objective(theta: np.ndarray, f1: np.ndarray, f2: np.ndarray, y: np.ndarray, r: np.ndarray):
    """Weighted mean NLL of ``softmax(a * f1 + b * f2 + c)`` and its gradient, ``theta = [a, b, c]``
    ``(3K,)``, features ``f1 = ln p``, ``f2 = -ln(1 - p)`` ``(n, K)``, row weights ``r`` summing to 1."""
    u = _multinomial_logits(theta, f1, f2)
    rows = np.arange(len(y))
    u_y = u[rows, y]
    m = u.max(axis=1, keepdims=True)
    np.subtract(u, m, out=u)
    np.exp(u, out=u)
    tot = u.sum(axis=1)
    f = float(r @ (np.log(tot) + m[:, 0] - u_y))
    g = u  # G = r (P - Y), in place
    g *= (r / tot)[:, None]
    g[rows, y] -= r
    return f, np.concatenate([np.einsum("ij,ij->j", g, f1), np.einsum("ij,ij->j", g, f2), g.sum(axis=0)])


def fit_beta_multinomial(log_odds, labels, *, sample_weight=None, tol: float = 1e-9,
                         max_iter: int = 1000) -> list[dict]:
    """Maximum-likelihood ``K`` beta maps ``(a_k, b_k, c_k)``, ``a, b >= 0``, as logits of one softmax.

    ``log_odds`` ``(n, K)`` of ``p = softmax(logits)``, ``labels`` ``(n,)``. The objective
    (:func:`multinomial_beta_objective`) is convex in the ``3K`` parameters (a softmax NLL of
    logits linear in them), so L-BFGS-B under the bounds from the identity map (``a = 1, b = 0,
    c = 0``: ``softmax(ln p) = p``) reaches its global optimum; it stops at a projected gradient
    of ``tol``. The intercepts are shifted to sum to 0 (the NLL does not see a common shift).
    Warns (:class:`CalibrationWarning`) when the iteration limit is reached."""
    import warnings

    from scipy.optimize import minimize

    from confcal.calibrators._tsfit import CalibrationWarning

    feats = beta_features(np.asarray(log_odds, dtype=np.float64).ravel()).reshape(*np.shape(log_odds), 2)
    f1, f2 = np.ascontiguousarray(feats[..., 0]), np.ascontiguousarray(feats[..., 1])
    n, k = f1.shape
    y = np.asarray(labels, dtype=np.int64)
    r = np.full(n, 1.0 / n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    r = r / r.sum()
    x0 = np.concatenate([np.ones(k), np.zeros(2 * k)])
    bounds = [(0.0, None)] * (2 * k) + [(None, None)] * k
    res = minimize(multinomial_beta_objective, x0, args=(f1, f2, y, r), jac=True, method="L-BFGS-B",
                   bounds=bounds, options={"maxiter": int(max_iter), "gtol": tol, "ftol": 1e-15, "maxcor": 20})
    if res.status == 1:
        warnings.warn(f"multinomial beta fit stopped at its iteration limit ({max_iter}); the classes may be "
                      "separable on this calibration set", CalibrationWarning, stacklevel=3)
    a, b, c = res.x[:k], res.x[k:2 * k], res.x[2 * k:]
    c = c - c.mean()
    return [{"a": float(ai), "b": float(bi), "c": float(ci)} for ai, bi, ci in zip(a, b, c)]


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

    Parameters
    ----------
    multiclass
        ``"ovr"`` (default: each map fitted one-vs-rest on ``1[y = k]``, then renormalised)
        or ``"multinomial"`` (the ``K`` maps are the logits of one softmax, fitted jointly on the
        multiclass NLL, as netcal's multiclass ``BetaCalibration``; it minimises the NLL it is
        judged by: test NLL 0.2305 against one-vs-rest's 0.2372 on the WRN CIFAR-10 outputs,
        5,000 / 5,000 rows). Two classes: the binary map either way.

    Attributes
    ----------
    maps_
        list of ``{"a", "b", "c"}`` (one for two classes)

    Notes
    -----
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
    hyper_constraints: dict = {"multiclass": Choice("ovr", "multinomial")}
    fitted_constraints = Fields({"maps": ListOf(Fields({"a": Real(ge=0), "b": Real(ge=0), "c": Real()}),
                                                length=per_class_maps)})
    space = "logit"

    def __init__(self, multiclass: str = "ovr", input_kind: str = "logits"):
        self.multiclass = multiclass
        self.input_kind = input_kind

    def _multinomial(self) -> bool:
        if self.multiclass not in ("ovr", "multinomial"):
            raise ValueError(f"multiclass: expected 'ovr' or 'multinomial', got {self.multiclass!r}")
        return self.multiclass == "multinomial"

    def _fit(self, logits, labels, sample_weight=None, **side):
        s = self._scores(logits)
        if self._multinomial() and logits.shape[1] > 2:
            self.maps_ = fit_beta_multinomial(s, labels, sample_weight=sample_weight)
            return
        cols = [1] if logits.shape[1] == 2 else list(range(logits.shape[1]))
        targets = (labels[:, None] == np.asarray(cols)[None, :]).astype(np.float64)
        self.maps_ = fit_beta_batch(s[:, cols], targets, sample_weight=sample_weight)

    def _fit_map(self, scores, targets, sample_weight):
        return fit_beta(scores, targets, sample_weight=sample_weight)

    def _predict_block(self, logits):
        if len(self.maps_) == 1 or not self._multinomial():
            return super()._predict_block(logits)
        feats = beta_features(self._scores(logits).ravel()).reshape(logits.shape[0], -1, 2)
        theta = np.array([[m["a"] for m in self.maps_], [m["b"] for m in self.maps_], [m["c"] for m in self.maps_]])
        return softmax(_multinomial_logits(theta.ravel(), feats[..., 0], feats[..., 1]))

    def _apply_map(self, params, scores):
        return apply_beta(params, scores)

    def _check_map(self, params):
        return check_beta_params(params)


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
        return score_logit(arr, clip_scores=self.clip_scores, first_row=first_row)

    def _score_kind(self, input_kind) -> str:
        return "probs"  # box scores in [0, 1], whatever input_kind says

    def _raw_proba(self, x):
        p = expit(x)
        return np.stack([1.0 - p, p], axis=1)

    def _fit_group(self, x, y, sample_weight=None):
        params = fit_beta(x, y.astype(np.float64), sample_weight=sample_weight)
        return {**params, "nll": float(_beta_nll(params, x, y, sample_weight))}

    def _set_fitted(self, params):
        super()._set_fitted(params)
        check = lambda p: {**check_beta_params(p), "nll": p.get("nll")}  # noqa: E731
        self.pooled_ = check(self.pooled_)
        self.groups_ = {k: check(v) for k, v in self.groups_.items()}

    def _binary_logit(self, x, p):
        f = beta_features(x)
        return p["a"] * f[:, 0] + p["b"] * f[:, 1] + p["c"]


def _beta_nll(params, x, y, sample_weight=None):
    f = beta_features(x)
    u = params["a"] * f[:, 0] + params["b"] * f[:, 1] + params["c"]
    return np.average(y * np.logaddexp(0.0, -u) + (1 - y) * np.logaddexp(0.0, u), weights=sample_weight)
