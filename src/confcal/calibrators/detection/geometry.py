"""Box-score calibration conditioned on where the box is and how big it is.

Küppers, Kronenberger, Shantia & Haselhoff, "Multivariate Confidence Calibration for Object
Detection", CVPR Workshops 2020 (sec. 3): calibrate ``P(true positive | s, r)`` with ``s`` the
detector's confidence and ``r`` the box's geometry (centre, size), because the miscalibration of a
detector depends on position and size. Three maps, each taking 1-D box scores
``(n_boxes,)`` and the geometry ``features=`` ``(n_boxes, d)`` (columns named by ``box_features``,
e.g. ``"cx,cy,w,h"`` or ``"range"``, as written by ``confcal detections match``):

* ``det-platt-geo`` (:class:`GeometryLogisticCalibration`), the paper's *dependent logistic*
  calibration. With class-conditional Gaussians of ``x = [logit(s), r]`` with their own mean and
  full covariance, Bayes' rule gives ``P(TP | x) = sigmoid(z(x))`` with the log-density ratio
  ``z(x) = c + b^T x + x^T Q x`` (``Q = (Sigma_-^-1 - Sigma_+^-1) / 2``, symmetric), so the map is a
  logistic regression on ``x`` and all products ``x_i x_j`` (``i <= j``). confcal fits that function
  family discriminatively (penalised likelihood of the labels) rather than the Gaussians'
  moments. ``dependent=False`` drops the products: the paper's independent multivariate logistic
  map ``z = c + b^T x``.
* ``det-beta-geo`` (:class:`GeometryBetaCalibration`), the dependent *beta* map: every input is
  mapped into (0, 1): the confidence as it is; the box features that are fractions of the image
  (``cx, cy, w, h, edge``) as they are, as the paper's box inputs are relative to the image
  (``feature_scaling="auto"``); other features (``range`` in metres, ...) min-max scaled on the
  calibration set; all clipped to ``[eps, 1 - eps]``. Then ``z = c + sum_k
  (a_k log u_k - b_k log(1 - u_k))`` (beta calibration per input, Kull et al. 2017, eq. 3) plus,
  when ``dependent``, the products ``logit(u_i) logit(u_j)`` (``i < j``) that couple the inputs.
* ``det-hist-geo`` (:class:`GeometryHistogramBinning`): histogram binning over confidence x
  geometry. Each box feature is cut into ``n_feature_bins`` equal-mass bins (their product is a
  cell) and each cell's confidences into ``n_bins`` equal-mass bins; a bin predicts its m-estimate
  ``(positives + pi) / (boxes + 1)`` (``pi`` the calibration set's precision), so small bins shrink
  toward the base rate.

Scores are clipped to ``[eps, 1 - eps]`` before the logit; with ``clip_levels`` (default) the
basis also holds the indicators of a clipped score at either end, so that boxes whose score
reaches or passes 1 (3% of the KITTI BEV boxes score above 1) get their own fitted level instead
of all sitting at the arbitrary ``logit(1 - eps)``, where the quadratic terms would extrapolate to.

netcal's ``BetaCalibrationDependent`` is a different family (the log-ratio of two multivariate
generalised beta densities of Libby & Novick 1982, coupling the inputs through
``log(1 + sum_k lambda_k s_k / (1 - s_k))`` terms, fitted by gradient descent); the map here is
the convex, product-coupled beta basis above, fitted exactly.

The logistic and beta maps standardise their basis columns (mean and standard deviation of the
calibration set, stored) and minimise the mean NLL plus ``(reg_lambda / 2) ||beta||^2`` (intercept
free) by Newton (:mod:`._geofit`); ``reg="cv"`` (default) chooses ``reg_lambda`` among one value per
decade, 1e-6 ... 1, by 3-fold cross-validated NLL (stratified by label, seeded), as ``ms`` and
``dirichlet`` do for ODIR. None of the three maps is constrained to be monotone in the score: a
geometry-dependent map may rank two boxes of equal score differently, by design.

Per class and per domain: ``per_class=True`` with ``category_ids=``, and/or ``domains=`` at fit
time, fit one map per group through :func:`confcal.calibrators.grouping.fit_groups` (the rules of
``det-ts`` / ``det-platt``: small or single-label groups and unseen groups use the pooled map).

Fitted with features, a calibrator refuses input without them: ``predict_proba`` raises naming
the features, and ``confcal apply`` / ``evaluate`` read them by name from the scores' file.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, logit

from confcal._validation import as_numpy, check_domains, check_box_labels, check_features
from confcal.calibrators.protocol.constraints import (Array, Bool, Choice, Fields, GroupKey, GroupsAgree, Int, ListOf,
                                              Nullable, Opt, Pairs, Real, Rule, Text)
from confcal.calibrators._fit.geofit import REG_GRID, fit_penalised_logistic, select_penalty
from confcal.calibrators.protocol.base import Calibrator, _sha256, register
from confcal.calibrators.detection.box import _binary_metrics, _check_category_ids, _check_scores, _key_part, \
    box_group_keys
from confcal.calibrators.grouping import fit_groups, route_groups

__all__ = ["GeometryLogisticCalibration", "GeometryBetaCalibration", "GeometryHistogramBinning",
           "parse_box_features"]


#: box features that are fractions of the image (``confcal detections match``): already in [0, 1]
IMAGE_FRACTIONS = frozenset({"cx", "cy", "w", "h", "edge"})


def parse_box_features(text, d: int | None = None) -> list[str]:
    """``"cx,cy"`` -> ``["cx", "cy"]``; None -> ``["f0", ..., "f{d-1}"]``. ``ValueError`` naming
    ``box_features`` for empty or repeated names, or a count that differs from ``d``."""
    if text is None:
        if d is None:
            raise ValueError("box_features: expected comma-separated feature names, got None")
        return [f"f{i}" for i in range(d)]
    if not isinstance(text, str):
        raise ValueError(f"box_features: expected comma-separated names such as 'cx,cy', got {text!r}")
    names = [t.strip() for t in text.split(",")]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"box_features: expected distinct non-empty names, got {text!r}")
    if d is not None and len(names) != d:
        raise ValueError(f"box_features: {text!r} names {len(names)} features, but features= has {d} columns")
    return names


#: side inputs that define groups (per class and/or per domain), as for det-ts / det-platt
_GROUP_INPUTS = ("domains", "category_ids")
_GROUP_FIELDS = ("by_domain", "groups", "group_counts", "fallback_groups")


def _key(k) -> tuple:
    """A group key read from a manifest (a JSON list, or one id) as the tuple the fit uses."""
    return tuple(k) if isinstance(k, list) else (k,)


def _with_groups(spec: Fields) -> Fields:
    """The manifest table of a map (``spec``) plus the optional per-group maps of the same table."""
    return Fields({**spec.fields, "by_domain": Opt(Bool()), "groups": Opt(Pairs(GroupKey(), spec)),
                   "group_counts": Opt(Pairs(GroupKey(), Int(ge=0))), "fallback_groups": Opt(ListOf(GroupKey()))},
                  rules=(*spec.rules, GroupsAgree()))


class _GeometryBoxMap(Calibrator):
    """Shared inputs, manifest, groups and checks of the geometry-dependent box maps (1-D scores +
    features; optionally per class and/or per domain)."""

    side_inputs = ("features",)
    optional_side_inputs = _GROUP_INPUTS
    hyper_parameter_rules = (box_group_keys,)  # [category id] (per_class), [domain] (by_domain), or both
    #: tells ``confcal fit`` / ``apply`` to hand over 1-D box scores (validated here)
    takes_box_scores = True
    #: tells the CLI to read the named ``box_features`` columns from the scores' file
    takes_box_features = True

    # ----------------------------------------------------------------- inputs
    def _scores(self, scores, name="scores") -> np.ndarray:
        s = as_numpy(scores, name)
        if s.ndim != 1:
            raise ValueError(f"{name}: {self.method} takes 1-D box scores (n_boxes,), got shape {s.shape}")
        return _check_scores(s, name).astype(np.float64)

    def _as_x(self, s):
        """The base class's ``(n, K)`` slot: ``[0, s]`` (``n_classes_`` = 2, as the other box maps)."""
        return np.stack([np.zeros_like(s), s], axis=1)

    def _validate_logits(self, logits, name="scores"):
        return self._as_x(self._scores(logits, name))

    def _features(self, features, n, fitted: bool):
        names = getattr(self, "feature_names_", None) if fitted else None
        if features is None:
            what = f" {names}" if names else ""
            raise ValueError(f"features: this {self.method} calibrator was fitted on box features{what}; pass "
                             f"features= (n_boxes, {len(names) if names else 'd'}) with those columns (confcal: "
                             "--box-features, read from the `detections match` output)")
        f = check_features(features, n)
        if names is not None and f.shape[1] != len(names):
            raise ValueError(f"features: this {self.method} calibrator was fitted on box features {names} "
                             f"({len(names)} columns), got shape {f.shape}")
        return f

    def _side(self, side, n, fitted: bool) -> dict:
        unknown = sorted(set(k for k, v in side.items() if v is not None) - {"features", *_GROUP_INPUTS})
        if unknown:
            raise TypeError(f"{type(self).__name__} does not take {unknown}; it takes "
                            f"['features', {', '.join(repr(k) for k in _GROUP_INPUTS)}]")
        out = {"features": self._features(side.get("features"), n, fitted=fitted)}
        if side.get("domains") is not None:
            out["domains"] = check_domains(side["domains"], n)
        if side.get("category_ids") is not None:
            out["category_ids"] = _check_category_ids(side["category_ids"], n)
        return out

    def _check_side(self, side, n):
        return self._side(side, n, fitted=self._is_fitted())

    def _fit_inputs(self, scores, labels, sample_weight, side):
        s = self._scores(scores)
        y = check_box_labels(labels, s.shape[0])
        w = self._check_sample_weight(sample_weight, s.shape[0])
        side = self._side(side, s.shape[0], fitted=False)
        f = side["features"]
        parse_box_features(self.box_features, f.shape[1])
        if self.per_class and "category_ids" not in side:
            raise ValueError(f"category_ids: {type(self).__name__}(per_class=True) needs category_ids= "
                             "(n_boxes,) at fit and predict time")
        from confcal.calibrators._fit.jobs.reduce import check_box_label_values

        ww = np.ones(y.shape[0]) if w is None else w
        check_box_label_values(float(np.dot(ww, y)), float(ww.sum()), self.method, weighted=w is not None)
        groups = [side[k] for k in _GROUP_INPUTS if k in side]  # the digest of an ungrouped fit is unchanged
        record = {"data_sha256": _sha256(s, np.asarray(y), f, *groups, *([] if w is None else [w])),
                  "input_kind": "scores"}
        return self._as_x(s), y, w, side, record

    # --------------------------------------------------------------- groups
    def _sample_weight_refusal(self):
        import inspect

        if "sample_weight" in inspect.signature(self._fit_map).parameters:
            return None
        return "its objective is not a weighted mean over samples"

    def _group_keys(self, n, domains, category_ids):
        """One key per box (``(category id,)``, ``(domain,)`` or both), or None for one pooled map."""
        parts = []
        if self.per_class:
            if category_ids is None:
                raise ValueError(f"category_ids: {type(self).__name__}(per_class=True) needs category_ids= "
                                 "(n_boxes,) at fit and predict time")
            parts.append(category_ids)
        if getattr(self, "by_domain_", False):
            if domains is None:
                raise ValueError(f"domains: this {self.method} calibrator was fitted per domain; pass domains= "
                                 "(n_boxes,) (ids unseen at fit time use the pooled map)")
            parts.append(domains)
        if not parts:
            return None
        return [tuple(_key_part(p[i]) for p in parts) for i in range(n)]

    def _fit(self, x, y, sample_weight=None, features=None, domains=None, category_ids=None):
        """The pooled map on all boxes (on ``self``), then one map per group of ``category_ids``
        (``per_class``) and/or ``domains`` (given at fit time) by
        :func:`~confcal.calibrators.grouping.fit_groups`: a group with fewer than ``min_samples``
        boxes or one label only uses the pooled map."""
        w = sample_weight
        kw = {} if w is None else {"sample_weight": w}
        self._fit_map(x, y, features=features, **kw)
        self.by_domain_ = domains is not None
        self.groups_, self.group_counts_, self.fallback_groups_ = {}, {}, []
        keys = self._group_keys(x.shape[0], domains, category_ids)
        if keys is None:
            return

        def fit_one(rows):
            sub = type(self)(**{**self.get_params(), "per_class": False})
            sub.by_domain_ = False
            sub._fit_map(x[rows], y[rows], features=features[rows], **({} if w is None else {"sample_weight": w[rows]}))
            return sub

        fits = fit_groups(fit_one, keys, pooled=self, min_samples=self.min_samples, sample_weight=w, labels=y,
                          what="group", pooled_name="the pooled map", stacklevel=5)
        self.groups_, self.group_counts_ = fits.fits, fits.counts
        self.fallback_groups_ = list(fits.fallback)

    def _predict_proba(self, x, features=None, domains=None, category_ids=None):
        keys = self._group_keys(x.shape[0], domains, category_ids)
        if keys is None or not self.group_counts_:
            return self._predict_map(x, features=features)
        out = np.empty((x.shape[0], 2), dtype=np.float64)
        rows = route_groups(keys, self.group_counts_, what="group", pooled_name="the pooled map", stacklevel=5)
        for key, idx in rows.items():
            out[idx] = self.groups_.get(key, self)._predict_map(x[idx], features=features[idx])
        return out

    def _get_fitted(self):
        out = self._get_map()
        if getattr(self, "by_domain_", False) or self.per_class:
            enc = lambda k: list(k)  # noqa: E731  tuples -> JSON lists
            out.update({"by_domain": bool(self.by_domain_),
                        "groups": [[enc(k), c._get_map()] for k, c in self.groups_.items()],
                        "group_counts": [[enc(k), int(v)] for k, v in self.group_counts_.items()],
                        "fallback_groups": [enc(k) for k in self.fallback_groups_]})
        return out

    def _set_fitted(self, params):
        params = dict(params)
        grouped = {k: params.pop(k) for k in _GROUP_FIELDS if k in params}
        self._set_map(params)
        self.by_domain_ = bool(grouped.get("by_domain", False))
        self.groups_ = {}
        for k, p in grouped.get("groups", []):
            sub = type(self)(**{**self.get_params(), "per_class": False})
            sub.by_domain_ = False
            sub._set_map(dict(p))
            if sub.feature_names_ != self.feature_names_:
                raise ValueError(f"groups: group {k!r} has box features {sub.feature_names_}, the pooled map "
                                 f"{self.feature_names_}")
            self.groups_[_key(k)] = sub
        self.group_counts_ = {_key(k): int(v) for k, v in grouped.get("group_counts", [])}
        self.group_counts_.update({k: self.group_counts_.get(k, 0) for k in self.groups_})
        self.fallback_groups_ = [_key(k) for k in grouped.get("fallback_groups", [])]
        for k in self.fallback_groups_:
            self.group_counts_.setdefault(k, 0)
        width = int(bool(self.per_class)) + int(self.by_domain_)
        bad = [k for k in self.group_counts_ if len(k) != width]
        if bad:
            raise ValueError(f"groups: keys have {width} part(s) (per_class={self.per_class}, by_domain="
                             f"{self.by_domain_}), got {list(bad[0])!r}")

    def _fit_metrics(self, x, probs, y):
        before = np.clip(x[:, 1], 0.0, 1.0)
        return _binary_metrics(before, y), _binary_metrics(probs[:, 1], y)

    def predict_score(self, scores, features=None) -> np.ndarray:
        """Calibrated P(true positive) per box, ``(n_boxes,)``."""
        return self.predict_proba(scores, features=features)[:, 1]

    def _check_hyperparameters(self):
        super()._check_hyperparameters()
        if self.box_features is not None:
            parse_box_features(self.box_features)


def _clip01(v, eps):
    return np.clip(v, eps, 1.0 - eps)


def _cv_chose(cv_scores, reg_lambda) -> bool:
    """``cv_scores`` (``[[lambda, held-out NLL], ...]``, one row per penalty tried) choose ``reg_lambda``:
    each penalty listed once, ``reg_lambda`` among them with the lowest NLL (up to the fit's rounding of
    the NLL to 12 digits, :func:`~confcal.calibrators._fit.geofit.select_penalty`). An empty list (no
    cross-validation: ``reg="fixed"``, or a label with fewer than ``cv_folds`` boxes) chooses nothing."""
    rows = [r for r in cv_scores if isinstance(r, (list, tuple)) and len(r) == 2]
    if not rows:
        return True
    lams = [r[0] for r in rows]
    if len(set(lams)) != len(lams) or reg_lambda not in lams:
        return False
    best = min(r[1] for r in rows)
    return rows[lams.index(reg_lambda)][1] <= best + 1e-9 * max(1.0, abs(best))


def _show_cv(cv_scores, reg_lambda) -> str:
    rows = [r for r in cv_scores if isinstance(r, (list, tuple)) and len(r) == 2]
    lams = [r[0] for r in rows]
    if len(set(lams)) != len(lams):
        return f"a penalty listed twice ({next(x for x in lams if lams.count(x) > 1)!r})"
    if reg_lambda not in lams:
        return f"reg_lambda={reg_lambda!r}, not among the {len(lams)} penalties listed"
    best = min(rows, key=lambda r: r[1])
    return f"reg_lambda={reg_lambda!r} with NLL {rows[lams.index(reg_lambda)][1]!r}, lowest {best[1]!r} at {best[0]!r}"


#: the cross-validation scores describe the chosen penalty (T34)
_CV_RULE = Rule(("cv_scores", "reg_lambda"), _cv_chose,
                "cross-validated NLLs [[lambda, NLL], ...] of distinct penalties whose lowest NLL is at "
                "{at}.reg_lambda (the penalty they chose)", show=_show_cv)


def fixed_penalty_without_cv(hyper: dict, params: dict) -> str | None:
    """With ``reg="fixed"`` nothing is cross-validated: every ``cv_scores`` (pooled and per group) is empty."""
    if hyper.get("reg", "cv") != "fixed":
        return None
    maps = [("", params)] + [(f"groups[{i}][1].", g[1]) for i, g in enumerate(params.get("groups") or [])
                             if isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[1], dict)]
    for at, m in maps:
        if m.get("cv_scores"):
            return (f"{at}cv_scores: expected [] (hyper-parameter reg='fixed' cross-validates nothing), "
                    f"got {len(m['cv_scores'])} rows")
    return None



class _PenalisedBasisMap(_GeometryBoxMap):
    """Logistic regression on a basis of (score, features), standardised, L2-penalised."""

    hyper_common = {"box_features": Nullable(Text()), "reg": Choice("cv", "fixed"), "reg_lambda": Real(ge=0),
                    "clip_levels": Bool(), "per_class": Bool(), "min_samples": Int(ge=1),
                    "dependent": Bool(), "eps": Real(gt=0, lt=0.5), "cv_folds": Int(ge=2),
                    "random_state": Int(ge=0)}
    hyper_parameter_rules = (box_group_keys, fixed_penalty_without_cv)

    def _basis(self, s, f) -> np.ndarray:
        raise NotImplementedError

    def _clips_scores(self) -> bool:
        return getattr(self, "score_transform", "logit") == "logit"

    def _n_levels(self) -> int:
        return 2 if self.clip_levels and self._clips_scores() else 0

    def _full_basis(self, s, f) -> np.ndarray:
        """The map's basis, plus (``clip_levels``) the indicators of a score clipped at the bottom
        (``s <= eps``) and at the top (``s >= 1 - eps``): such boxes all sit at ``logit(eps)`` or
        ``logit(1 - eps)``, a point set by ``eps`` rather than by the data (detectors whose scores
        reach or pass 1, as the KITTI BEV set's 3% of boxes above 1); a free level per end lets the
        fit place them where their labels say instead of bending the curve to an arbitrary point."""
        phi = self._basis(s, f)
        if not self._n_levels():
            return phi
        return np.concatenate([phi, (s <= self.eps)[:, None].astype(np.float64),
                               (s >= 1.0 - self.eps)[:, None].astype(np.float64)], axis=1)

    def _fit_map(self, x, y, sample_weight=None, features=None):
        s, f = x[:, 1], features
        self.feature_names_ = parse_box_features(self.box_features, f.shape[1])
        self._set_ranges(f, sample_weight)
        phi = self._full_basis(s, f)
        w = np.ones(len(y)) if sample_weight is None else sample_weight
        wn = w / w.sum()
        mean = wn @ phi
        std = np.sqrt(np.maximum(wn @ (phi - mean) ** 2, 0.0))
        std = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)  # constant column: left as is
        self.phi_mean_, self.phi_std_ = mean, std
        z = (phi - mean) / std
        yf = y.astype(np.float64)
        if self.reg == "cv" and min(int(yf.sum()), int((1 - yf).sum())) >= self.cv_folds:
            lam, self.cv_scores_ = select_penalty(z, yf, sample_weight, n_folds=self.cv_folds, seed=self.random_state)
        else:
            lam, self.cv_scores_ = float(self.reg_lambda), []
        theta = fit_penalised_logistic(z, yf, sample_weight, lam)
        self.reg_lambda_ = lam
        self.intercept_, self.coef_ = float(theta[0]), theta[1:]

    def _set_ranges(self, f, w):
        pass

    def _logit(self, s, f):
        return self.intercept_ + ((self._full_basis(s, f) - self.phi_mean_) / self.phi_std_) @ self.coef_

    def _predict_map(self, x, features=None):
        z = self._logit(x[:, 1], features)
        return np.stack([expit(-z), expit(z)], axis=1)

    def _get_map(self):
        return {"feature_names": list(self.feature_names_), "intercept": self.intercept_,
                "coef": self.coef_.tolist(), "phi_mean": self.phi_mean_.tolist(),
                "phi_std": self.phi_std_.tolist(), "reg_lambda": self.reg_lambda_,
                "cv_scores": [list(r) for r in self.cv_scores_], **self._get_ranges()}

    def _get_ranges(self):
        return {}

    def _set_map(self, params):
        self.feature_names_ = list(params["feature_names"])
        self.intercept_ = float(params["intercept"])
        self.coef_ = np.asarray(params["coef"], dtype=np.float64)
        self.phi_mean_ = np.asarray(params["phi_mean"], dtype=np.float64)
        self.phi_std_ = np.asarray(params["phi_std"], dtype=np.float64)
        self.reg_lambda_ = float(params["reg_lambda"])
        self.cv_scores_ = [list(r) for r in params.get("cv_scores", [])]
        self._set_ranges_fitted(params)
        d = len(self.feature_names_)
        if self._n_levels() and self.coef_.shape == (self._n_basis(d),):
            self.clip_levels = False  # a manifest written before clip_levels existed (no level columns)
        want = self._n_basis(d) + self._n_levels()
        for key in ("coef", "phi_mean", "phi_std"):
            have = getattr(self, key + "_").shape
            if have != (want,):
                raise ValueError(f"{key}: expected {want} values for {d} box features "
                                 f"(dependent={self.dependent}), got shape {have}")

    def _set_ranges_fitted(self, params):
        pass


def _pairs(cols):
    m = len(cols)
    return [cols[i] * cols[j] for i in range(m) for j in range(i, m)]


# lengths follow from feature_names and `dependent`: checked by _set_fitted, each array on its own
_BASIS_FIELDS = {"feature_names": ListOf(Text()), "intercept": Real(), "coef": Array((None,)),
                 "phi_mean": Array((None,)), "phi_std": Array((None,), Real(gt=0)),
                 "reg_lambda": Real(ge=0), "cv_scores": ListOf(Array((2,), Real(ge=0, max_abs=np.inf)))}


@register
class GeometryLogisticCalibration(_PenalisedBasisMap):
    """Dependent logistic calibration of box scores on box geometry (``det-platt-geo``).

    ``P(TP) = sigmoid(c + b^T x + sum_{i <= j} Q_ij x_i x_j)``, ``x = [logit(clip(s, eps)), r]``
    (``dependent=False``: no products). Küppers et al., CVPR-W 2020, sec. 3 (multivariate
    logistic calibration with dependent features: the log-ratio of two class-conditional
    Gaussians); see the module docstring for the fit.

    Parameters
    ----------
    box_features
        comma-separated names of the ``features=`` columns (e.g. ``"cx,cy,w,h"``), stored
        in the manifest; None: ``f0, f1, ...``
    reg
        ``"cv"`` (choose ``reg_lambda`` by ``cv_folds``-fold cross-validated NLL) or ``"fixed"``
    reg_lambda
        The penalty with ``reg="fixed"`` (and when a label has fewer than ``cv_folds`` boxes)
    dependent
        Include the products ``x_i x_j``
    clip_levels
        Add a free level for boxes whose score is clipped at ``eps`` or ``1 - eps`` (see the
        module docstring); a manifest written before this option loads without them
    score_transform
        ``"logit"`` (default; scores clipped to ``[eps, 1 - eps]``, so raw scores above 1 are
        clipped) or ``"raw"`` (the score as it is, for detectors whose scores are not probabilities)
    eps, cv_folds, random_state
        The clip of the scores; folds and seed of the cross-validation
    per_class
        One map per ``category_ids`` value (needs ``category_ids=`` at fit and predict time);
        ``domains=`` given at fit time also groups the boxes (crossed with the classes). Each group's
        map is this method fitted on its boxes alone; groups with fewer than ``min_samples`` boxes or
        one label, and groups unseen at predict time (one warning), use the pooled map (all boxes)
    min_samples
        The smallest group with its own map (default 50)

    Raises
    ------
    ValueError
        Scores not 1-D or not finite, labels other than 0/1, ``features`` missing, non-finite or of
        another width than at fit time (the message names the fitted features).

    Notes
    -----
    Inputs: ``fit(scores (n,), labels 0/1 (n,), features=(n, d)[, category_ids=(n,), domains=(n,)])``;
    ``predict_proba(scores, features=[, ...])`` gives float64 ``(n, 2)`` (false, true positive).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s, cx = rng.uniform(0.05, 0.95, 400), rng.uniform(0, 1, 400)
    >>> y = (rng.uniform(size=400) < s * (cx < 0.5) + s ** 3 * (cx >= 0.5)).astype(int)
    >>> cal = GeometryLogisticCalibration(box_features="cx").fit(s, y, features=cx[:, None])
    >>> p = cal.predict_proba(np.array([0.7, 0.7]), features=np.array([[0.2], [0.8]]))[:, 1]
    >>> bool(p[0] > p[1] + 0.2)
    True
    """

    method = "det-platt-geo"
    hyper_constraints = {**_PenalisedBasisMap.hyper_common, "score_transform": Choice("logit", "raw")}
    fitted_constraints = _with_groups(Fields(dict(_BASIS_FIELDS), rules=(_CV_RULE,)))

    def __init__(self, box_features: str | None = None, reg: str = "cv", reg_lambda: float = 1e-4,
                 dependent: bool = True, score_transform: str = "logit", clip_levels: bool = True,
                 eps: float = 1e-4, cv_folds: int = 3, random_state: int = 0, per_class: bool = False,
                 min_samples: int = 50, input_kind: str = "logits"):
        self.box_features = box_features
        self.clip_levels = clip_levels
        self.per_class = per_class
        self.min_samples = min_samples
        self.reg = reg
        self.reg_lambda = reg_lambda
        self.dependent = dependent
        self.score_transform = score_transform
        self.eps = eps
        self.cv_folds = cv_folds
        self.random_state = random_state
        self.input_kind = input_kind

    def _n_basis(self, d):
        m = d + 1
        return m + (m * (m + 1) // 2 if self.dependent else 0)

    def _basis(self, s, f):
        u = logit(_clip01(s, self.eps)) if self.score_transform == "logit" else s
        cols = [u] + [f[:, j] for j in range(f.shape[1])]
        return np.stack(cols + (_pairs(cols) if self.dependent else []), axis=1)


@register
class GeometryBetaCalibration(_PenalisedBasisMap):
    """Dependent beta calibration of box scores on box geometry (``det-beta-geo``).

    Inputs mapped into (0, 1): ``u_0 = clip(s, eps)``, ``u_k = clip((r_k - lo_k) / (hi_k - lo_k), eps)``
    (``lo``, ``hi``: stored; see ``feature_scaling``). ``P(TP) = sigmoid(c + sum_k (a_k log u_k
    - b_k log(1 - u_k)) [+ sum_{i < j} g_ij logit(u_i) logit(u_j)])``: beta calibration per input (Kull,
    Silva Filho & Flach, AISTATS 2017, eq. 3) made multivariate and dependent as in Küppers et al.,
    CVPR-W 2020, sec. 3. ``feature_scaling``: ``"auto"`` (default: the image fractions ``cx, cy, w, h,
    edge`` read on ``[0, 1]`` as they are, ``lo = 0``, ``hi = 1``; other features min-max scaled),
    ``"minmax"`` (every feature), ``"none"`` (every feature taken as already in ``[0, 1]``).
    Other parameters, inputs and errors as :class:`GeometryLogisticCalibration`
    (no ``score_transform``: the beta map reads scores as probabilities, clipped to ``[eps, 1 - eps]``).

    Examples
    --------
    Boxes far from the sensor are right less often than their score says:

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s, rng_m = rng.uniform(0.05, 0.95, 600), rng.uniform(0, 50, 600)
    >>> y = (rng.uniform(size=600) < s * (1 - rng_m / 60)).astype(int)
    >>> cal = GeometryBetaCalibration(box_features="range").fit(s, y, features=rng_m[:, None])
    >>> near, far = cal.predict_proba(np.array([0.8, 0.8]), features=np.array([[5.0], [45.0]]))[:, 1]
    >>> bool(near > far + 0.3)
    True
    """

    method = "det-beta-geo"
    hyper_constraints = {**_PenalisedBasisMap.hyper_common, "feature_scaling": Choice("auto", "minmax", "none")}
    fitted_constraints = _with_groups(Fields({**_BASIS_FIELDS, "lo": Array((None,)), "hi": Array((None,))},
                                             rules=(_CV_RULE,)))

    def __init__(self, box_features: str | None = None, reg: str = "cv", reg_lambda: float = 1e-4,
                 dependent: bool = True, feature_scaling: str = "auto", clip_levels: bool = True,
                 eps: float = 1e-4, cv_folds: int = 3, random_state: int = 0, per_class: bool = False,
                 min_samples: int = 50, input_kind: str = "logits"):
        self.box_features = box_features
        self.clip_levels = clip_levels
        self.per_class = per_class
        self.min_samples = min_samples
        self.feature_scaling = feature_scaling
        self.reg = reg
        self.reg_lambda = reg_lambda
        self.dependent = dependent
        self.eps = eps
        self.cv_folds = cv_folds
        self.random_state = random_state
        self.input_kind = input_kind

    def _n_basis(self, d):
        m = d + 1
        return 2 * m + (m * (m - 1) // 2 if self.dependent else 0)

    def _set_ranges(self, f, w):
        live = f if w is None else f[w > 0]  # a box of weight 0 counts as absent
        self.lo_, self.hi_ = live.min(axis=0), live.max(axis=0)
        names = parse_box_features(self.box_features, f.shape[1])
        fixed = [self.feature_scaling == "none" or (self.feature_scaling == "auto" and n in IMAGE_FRACTIONS)
                 for n in names]
        self.lo_ = np.where(fixed, 0.0, self.lo_)
        self.hi_ = np.where(fixed, 1.0, self.hi_)

    def _get_ranges(self):
        return {"lo": self.lo_.tolist(), "hi": self.hi_.tolist()}

    def _set_ranges_fitted(self, params):
        self.lo_ = np.asarray(params["lo"], dtype=np.float64)
        self.hi_ = np.asarray(params["hi"], dtype=np.float64)
        for key in ("lo", "hi"):
            have = getattr(self, key + "_").shape
            if have != (len(self.feature_names_),):
                raise ValueError(f"{key}: expected {len(self.feature_names_)} values, one per box feature, "
                                 f"got shape {have}")

    def _basis(self, s, f):
        span = np.where(self.hi_ > self.lo_, self.hi_ - self.lo_, 1.0)
        u = [_clip01(s, self.eps)] + [_clip01((f[:, j] - self.lo_[j]) / span[j], self.eps)
                                      for j in range(f.shape[1])]
        cols = [c for v in u for c in (np.log(v), -np.log1p(-v))]
        if self.dependent:
            lo = [np.log(v) - np.log1p(-v) for v in u]
            cols += [lo[i] * lo[j] for i in range(len(lo)) for j in range(i + 1, len(lo))]
        return np.stack(cols, axis=1)


@register
class GeometryHistogramBinning(_GeometryBoxMap):
    """Histogram binning over confidence x box geometry (``det-hist-geo``).

    Each box feature is cut at its equal-mass quantiles into ``n_feature_bins`` bins (a cell is one
    bin per feature); within a cell, the scores are cut into ``n_bins`` equal-mass bins, and a bin
    predicts ``(positives + pi) / (boxes + 1)`` with ``pi`` the calibration set's precision (an
    m-estimate with m = 1). Bins are ``(lo, hi]`` with open outer bins (as ``histogram-binning``), so
    values outside the calibration range take the first or last bin; a cell without calibration
    boxes predicts ``pi``. Source: Zadrozny & Elkan, ICML 2001 (equal-mass histogram binning),
    conditioned on geometry as the multivariate binning of Küppers et al., CVPR-W 2020, sec. 3.

    Parameters
    ----------
    box_features : as :class:`GeometryLogisticCalibration`
    n_bins : score bins per cell; n_feature_bins : bins per box feature
    per_class, min_samples : groups per class and/or domain, as :class:`GeometryLogisticCalibration`

    Examples
    --------
    Two cells of ``cx`` (left, right), one score bin each: each predicts its m-estimate
    ``(positives + pi) / (boxes + 1)`` with ``pi = 2/4``:

    >>> import numpy as np
    >>> cal = GeometryHistogramBinning(box_features="cx", n_bins=1, n_feature_bins=2)
    >>> cal = cal.fit(np.full(4, 0.6), [1, 1, 0, 0], features=np.array([[0.1], [0.2], [0.8], [0.9]]))
    >>> cal.predict_proba(np.array([0.6, 0.6]), features=np.array([[0.0], [1.0]]))[:, 1].round(4).tolist()
    [0.8333, 0.1667]
    """

    method = "det-hist-geo"
    hyper_constraints = {"box_features": Nullable(Text()), "per_class": Bool(), "min_samples": Int(ge=1),
                         "n_bins": Int(ge=1, le=1000),
                         "n_feature_bins": Int(ge=1, le=100)}
    fitted_constraints = _with_groups(Fields({"feature_names": ListOf(Text()), "prior": Real(ge=0, le=1),
                                 "feature_edges": ListOf(ListOf(Real())),
                                 "score_edges": ListOf(ListOf(Real())),
                                 "values": ListOf(ListOf(Real(ge=0, le=1)))}))

    def __init__(self, box_features: str | None = None, n_bins: int = 5, n_feature_bins: int = 3,
                 per_class: bool = False, min_samples: int = 50, input_kind: str = "logits"):
        self.box_features = box_features
        self.per_class = per_class
        self.min_samples = min_samples
        self.n_bins = n_bins
        self.n_feature_bins = n_feature_bins
        self.input_kind = input_kind

    @staticmethod
    def _inner_edges(v, k):
        """The ``k - 1`` inner equal-mass edges (distinct: tied values share a bin)."""
        if k <= 1 or v.size == 0:
            return []
        q = np.quantile(v, np.arange(1, k) / k, method="inverted_cdf")
        return sorted(set(float(e) for e in q if e < v.max()))

    def _cells(self, f):
        cell = np.zeros(f.shape[0], dtype=np.int64)
        for j, edges in enumerate(self.feature_edges_):
            b = np.searchsorted(np.asarray(edges), f[:, j], side="left")  # (lo, hi]
            cell = cell * self.n_feature_bins + b
        return cell

    def _fit_map(self, x, y, features=None):
        s, f = x[:, 1], features
        self.feature_names_ = parse_box_features(self.box_features, f.shape[1])
        self.prior_ = float(np.mean(y))
        self.feature_edges_ = [self._inner_edges(f[:, j], self.n_feature_bins) for j in range(f.shape[1])]
        cell = self._cells(f)
        n_cells = self.n_feature_bins ** f.shape[1]
        self.score_edges_, self.values_ = [], []
        for c in range(n_cells):
            m = cell == c
            edges = self._inner_edges(s[m], self.n_bins)
            b = np.searchsorted(np.asarray(edges), s[m], side="left")
            pos = np.bincount(b, weights=y[m].astype(np.float64), minlength=len(edges) + 1)
            cnt = np.bincount(b, minlength=len(edges) + 1)
            self.score_edges_.append(edges)
            self.values_.append(((pos + self.prior_) / (cnt + 1.0)).tolist())

    def _predict_map(self, x, features=None):
        s = x[:, 1]
        cell = self._cells(features)
        p = np.empty(s.shape[0])
        for c in np.unique(cell):
            m = cell == c
            b = np.searchsorted(np.asarray(self.score_edges_[c]), s[m], side="left")
            p[m] = np.asarray(self.values_[c])[b]
        return np.stack([1.0 - p, p], axis=1)

    def _get_map(self):
        return {"feature_names": list(self.feature_names_), "prior": self.prior_,
                "feature_edges": [list(e) for e in self.feature_edges_],
                "score_edges": [list(e) for e in self.score_edges_], "values": [list(v) for v in self.values_]}

    def _set_map(self, params):
        self.feature_names_ = list(params["feature_names"])
        self.prior_ = float(params["prior"])
        self.feature_edges_ = [[float(v) for v in e] for e in params["feature_edges"]]
        self.score_edges_ = [[float(v) for v in e] for e in params["score_edges"]]
        self.values_ = [[float(v) for v in e] for e in params["values"]]
        d = len(self.feature_names_)
        if len(self.feature_edges_) != d or any(len(e) > self.n_feature_bins - 1 for e in self.feature_edges_):
            raise ValueError(f"feature_edges: expected {d} lists (one per box feature) of at most "
                             f"{self.n_feature_bins - 1} edges, got lengths {[len(e) for e in self.feature_edges_]}")
        n_cells = self.n_feature_bins ** d
        if len(self.score_edges_) != n_cells or len(self.values_) != n_cells:
            raise ValueError(f"score_edges: expected {n_cells} cells, as parameters.values, got "
                             f"{len(self.score_edges_)} and {len(self.values_)}")
        for c, (e, v) in enumerate(zip(self.score_edges_, self.values_)):
            if len(v) != len(e) + 1:
                raise ValueError(f"score_edges: cell {c} has {len(e)} edges, so parameters.values[{c}] needs "
                                 f"{len(e) + 1} values (one per bin), got {len(v)}")
            if any(b <= a for a, b in zip(e, e[1:])):
                raise ValueError(f"score_edges: expected increasing edges in cell {c}, got {e}")
        for j, e in enumerate(self.feature_edges_):
            if any(b <= a for a, b in zip(e, e[1:])):
                raise ValueError(f"feature_edges: expected increasing edges for feature {j}, got {e}")
