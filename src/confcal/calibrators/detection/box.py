"""Calibrating object-detector box scores against "this box is a true positive".

Two calibrators, each optionally per class and/or per domain (sensor), with
the pooled fit as fallback for groups that are unseen, too small, or hold
only true or only false positives:

* ``det-ts`` (:class:`DetectionTemperatureScaling`). For 1-D box scores that are
  probabilities: binary temperature scaling ``p = sigmoid(logit(s) / T)``
  (Guo et al. 2017, sec. 4.2, in its binary form), or with ``bias=True``
  ``sigmoid(logit(s) / T + b)`` (logistic calibration on the logit,
  Kueppers et al. CVPR-W 2020, eq. 6 with the confidence as only feature).
  Scores are clipped to ``(eps, 1 - eps)`` with ``eps`` the machine epsilon of
  their dtype (float16: 9.8e-4, float32: 1.2e-7, float64: 2.2e-16) before the
  logit, so a score of exactly 0 or 1 maps to a finite logit (about 7, 16 or
  36 in magnitude) instead of an infinite one. For 2-D class vectors
  ``(n_boxes, n_classes)`` (logits, or probabilities with
  ``input_kind="probs"``): multiclass temperature scaling.
* ``det-platt`` (:class:`DetectionPlattScaling`). Platt scaling on the raw score,
  ``p = sigmoid(a * s + b)`` (Platt 1999), for scores that are not
  probabilities (e.g. KITTI scores up to 1.235). With ``increasing=True``
  (default) ``a >= 0``, so the map never reverses the detector's ranking.
  Platt's smoothed targets ``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` keep the
  fit finite on separable groups.

Within a group every map is non-decreasing in the score (strictly increasing
unless a slope sits at 0), so the order of boxes inside a group, and any
ranking metric computed within it (per-class AP with per-class maps), is unchanged.

Inputs: ``fit(scores, labels, category_ids=None, domains=None)`` with
``scores`` float ``(n_boxes,)`` and ``labels`` 0/1 ``(n_boxes,)`` (1 = true
positive), or class vectors ``(n_boxes, n_classes)`` with integer class labels
(rows labelled ``-1`` have no target and are left out of the fit).
``category_ids`` int ``(n_boxes,)`` are needed with ``per_class=True``;
passing ``domains`` ``(n_boxes,)`` at fit time makes the fit per domain, and
then ``domains`` are required at predict time.

These are ordinary calibrators: 1-D scores are the one-logit binary head ``[0, u]``
of :class:`~confcal.calibrators.protocol.base.Calibrator` (``u`` the score's logit, or the raw
score for ``det-platt``) and the public ``fit`` / ``predict_proba`` are the base
class's. Every 1-D map is a logistic model fitted by the sufficient-statistics Newton
of :mod:`confcal.calibrators._fit.logistic`; given sources or specs instead of arrays,
``det-ts`` / ``det-platt`` stream them (each Newton pass reads row batches,
:mod:`confcal.calibrators._fit.jobs.boxfit`), and the Dask engine runs the same job
passes on a Dask cluster.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.special import expit

from confcal._numeric import softmax
from confcal._validation import as_numpy, check_box_labels, check_labels, check_logits
from confcal.calibrators.protocol.group_keys import group_key
from confcal.calibrators.protocol.constraints import NLL, T_BOUNDS, T_RULE, TEMPERATURE, Bool, Choice, Fields, GroupKey, \
    GroupsAgree, Int, ListOf, Nullable, Opt, Pairs, Real, group_keys_of, increasing_slopes, \
    temperature_within_bounds
from confcal.calibrators._fit.logistic import LogisticFit, binary_ts_params, fit_logistic, platt_params
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, CalibrationWarning, fit_temperature
from confcal.calibrators.protocol.base import Calibrator, _sha256, register, summary_metrics
from confcal.calibrators.grouping import base_rules, fit_groups, route_groups
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece

__all__ = ["DetectionTemperatureScaling", "DetectionPlattScaling", "score_logit", "fit_logistic",
           "LogisticFit"]


# --------------------------------------------------------------------------- inputs
def _check_scores(scores, name: str = "scores", first_row: int = 0) -> np.ndarray:
    s = as_numpy(scores, name)
    if s.ndim != 1:
        raise ValueError(f"{name}: expected shape (n_boxes,), got {s.shape}")
    if s.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one box, got 0")
    if s.dtype == bool or not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise TypeError(f"{name}: expected float scores, got dtype {s.dtype}")
    if not np.issubdtype(s.dtype, np.floating):
        s = s.astype(np.float64)
    bad = ~np.isfinite(s)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected finite scores, got {float(s[i])!r} at index {first_row + i}")
    return s


def score_logit(scores, *, clip_scores: bool = False, name: str = "scores", warn_saturated: bool = False,
                first_row: int = 0, method: str = "det-ts") -> np.ndarray:
    """``log(s / (1 - s))`` in float64 after a dtype-aware clip to ``(eps, 1 - eps)``.

    ``eps = np.finfo(scores.dtype).eps`` (float64 for integer input), so ``1 - eps``
    is representable in the scores' own dtype. Scores outside [0, 1] raise
    ``ValueError`` (they are not probabilities: use ``det-platt``) unless
    ``clip_scores=True``, which clips them into [0, 1] first. With
    ``warn_saturated``, scores that are exactly 0 or 1 in their dtype (a sigmoid
    output that lost its logit: float32 ``sigmoid(20) == 1``) give one
    :class:`CalibrationWarning` with their count. ``first_row``: index of the first score in
    the whole data (for messages about one batch); ``method``: the map named in that error.
    """
    s = _check_scores(scores, name, first_row)
    out = (s < 0) | (s > 1)
    if out.any() and not clip_scores:
        i = int(np.flatnonzero(out)[0])
        raise ValueError(f"{name}: {method} expects probability scores in [0, 1], got {float(s[i])!r} at index "
                         f"{first_row + i} ({int(out.sum())} of {s.size} outside); use det-platt for raw scores, "
                         "or set clip_scores=True (command line: --param clip_scores=true) to clip them into [0, 1]")
    if warn_saturated:
        sat = int(np.count_nonzero((s == 0) | (s == 1)))
        if sat:
            warnings.warn(f"{name}: {sat} of {s.size} probability scores are exactly 0 or 1 in {s.dtype} "
                          "(saturated: their logit is lost and clipped to the dtype's epsilon); pass the "
                          "detector's raw logits with input_kind='logits' if you have them",
                          CalibrationWarning, stacklevel=6)
    eps = float(np.finfo(s.dtype).eps)
    p = np.clip(s.astype(np.float64), eps, 1.0 - eps)
    return np.log(p) - np.log1p(-p)


def _check_weight_batch(w, first_row: int) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 1 or w.dtype == bool or w.dtype.kind not in "fiu":
        raise ValueError(f"sample_weight: expected float weights of shape (n_samples,), got dtype {w.dtype} "
                         f"and row shape {w.shape[1:]}")
    w = w.astype(np.float64)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sample_weight: expected finite weights >= 0, got {w[i]!r} at index {first_row + i}")
    return w


def _check_category_ids(category_ids, n: int) -> np.ndarray:
    c = as_numpy(category_ids, "category_ids")
    if c.shape != (n,):
        raise ValueError(f"category_ids: expected shape ({n},), got {c.shape}")
    if np.issubdtype(c.dtype, np.floating):
        if not np.all(np.isfinite(c)) or not np.all(c == np.round(c)):
            raise ValueError("category_ids: expected integer ids, got non-integer floats")
    elif not np.issubdtype(c.dtype, np.integer) or c.dtype == bool:
        raise TypeError(f"category_ids: expected integer ids, got dtype {c.dtype}")
    return c.astype(np.int64)


# ------------------------------------------------------------------ grouped base
def _key_part(v):
    return group_key(v, where="domains")  # the one id-key rule (a part of a box map's tuple key)


def _box_key_parts(hyper, params) -> int:
    return int(bool(hyper.get("per_class", False))) + int(params.get("by_domain") is True)


#: a box map's group keys: [category id] (per_class), [domain] (by_domain) or [category id, domain]
box_group_keys = group_keys_of(_box_key_parts, lambda h, p: f"hyper-parameter per_class={h.get('per_class', False)}"
                                                            f", parameters.by_domain={p.get('by_domain')}")


def _check_box_label_values(y: np.ndarray, w, method: str) -> None:
    from confcal.calibrators._fit.jobs.reduce import check_box_label_values

    ww = np.ones(y.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    check_box_label_values(float(np.dot(ww, y)), float(ww.sum()), method, weighted=w is not None)


class _TemperatureRules:
    """The rules of one det-ts map (pooled or a group's): its temperature inside ``[t_min, t_max]``."""

    hyper_parameter_rules = (temperature_within_bounds,)


def _grouped_fields(group: Fields) -> Fields:
    """Manifest parameters of a box-score calibrator whose per-group fit is ``group``."""
    return Fields({"kind": Choice("binary", "multiclass"), "by_domain": Bool(),
                   "pooled": group,
                   "groups": Pairs(GroupKey(), group), "group_counts": Opt(Pairs(GroupKey(), Int(ge=0))),
                   "fallback_groups": Opt(ListOf(GroupKey()))}, rules=(GroupsAgree(),))


class _BoxScoreMaps(Calibrator):
    """The calibrator hooks shared by the box-score methods (no public method overridden).

    Inputs: 1-D box scores ``(n_boxes,)`` become the one-logit binary head ``[0, u]``
    ``(n_boxes, 2)``, ``u = self._features(scores)`` (the score's logit, or the raw score
    for ``det-platt``); class vectors ``(n_boxes, n_classes)`` (``det-ts`` only) are
    logits. Groups (``category_ids`` with ``per_class``, crossed with ``domains`` when
    given at fit time) go through :func:`~confcal.calibrators.grouping.fit_groups` /
    :func:`~confcal.calibrators.grouping.route_groups`; each group's map is a dict of
    parameters from ``_fit_group`` and applied by ``_binary_logit``.
    """

    optional_side_inputs = ("domains", "category_ids")
    hyper_parameter_rules = (box_group_keys,)  # group keys of the form per_class / by_domain give them
    #: tells ``confcal fit`` / ``apply`` to hand over 1-D box scores unvalidated (validated here)
    takes_box_scores = True
    supports_multiclass = False

    # -------------------------------------------------------------- validation
    def _input_kind(self):
        """``None`` is allowed here: 1-D scores are then probabilities, class vectors logits."""
        kind = self.input_kind
        if kind not in (None, "logits", "probs"):
            raise ValueError(f"input_kind: expected 'logits', 'probs' or None, got {kind!r}")
        return kind

    def _score_kind(self, input_kind) -> str:
        """What 1-D scores are (the fit record's ``input_kind``): ``"probs"`` unless ``"logits"``."""
        return "logits" if input_kind == "logits" else "probs"

    @property
    def clips_scores(self) -> bool:
        """Whether 1-D box scores are clipped into ``[0, 1]`` before the map reads them
        (``clip_scores=True`` with probability scores). ``confcal fit`` then records the drift summary
        of the clipped scores (:func:`confcal.metrics.drift.data_summary`), as the map sees them."""
        return bool(getattr(self, "clip_scores", False)) and self._score_kind(self._input_kind()) == "probs"

    def _scores(self, scores, name: str = "scores"):
        """``(kind, x)``: ``("binary", [0, u])`` for 1-D scores, ``("multiclass", logits)``."""
        arr = as_numpy(scores, name)
        if arr.ndim == 1:
            u = self._features(arr, self._input_kind())
            return "binary", np.stack([np.zeros_like(u), u], axis=1)
        if not self.supports_multiclass:
            raise ValueError(f"{name}: {self.method} takes 1-D box scores (n_boxes,), got shape {arr.shape}; "
                             "use det-ts for class vectors")
        return "multiclass", check_logits(arr, name=name, input_kind=self._input_kind() or "logits")

    def _validate_logits(self, logits, name: str = "scores"):
        """Predict-time inputs (fit reads them in :meth:`_fit_inputs`): of the kind seen at fit time."""
        kind, x = self._scores(logits, name)
        if kind != self.kind_:
            raise ValueError(f"{name}: calibrator was fitted on {self.kind_} inputs, got shape {np.shape(logits)}")
        if kind == "multiclass" and x.shape[1] != self.n_classes_:
            raise ValueError(f"{name}: calibrator was fitted on {self.n_classes_} classes, got shape {x.shape}")
        return x

    def _fit_inputs(self, scores, labels, sample_weight, side):
        kind, x = self._scores(scores)
        keep = None
        if kind == "binary":
            y = check_box_labels(labels, x.shape[0])
        else:
            lab = as_numpy(labels, "labels")
            if lab.ndim == 1 and lab.shape[0] == x.shape[0] and np.issubdtype(lab.dtype, np.integer):
                keep = lab >= 0  # -1: detection without a class target (no GT, no background column)
                lab = lab[keep]
            y = check_labels(lab, x.shape[0] if keep is None else int(keep.sum()), x.shape[1])
        w = self._check_sample_weight(sample_weight, x.shape[0])
        side = self._check_side(side, x.shape[0])
        if "category_ids" in side:
            side["category_ids"] = _check_category_ids(side["category_ids"], x.shape[0])
        if self.per_class and "category_ids" not in side:
            raise ValueError(f"category_ids: {type(self).__name__}(per_class=True) needs category_ids= "
                             "(n_boxes,) at fit and predict time")
        record = {"n_left_out": 0 if keep is None else int((~keep).sum()),
                  "data_sha256": _sha256(as_numpy(scores, "scores"), as_numpy(labels, "labels"),
                                         *[side[k] for k in sorted(side)], *([] if w is None else [w])),
                  "input_kind": self._score_kind(self._input_kind()) if kind == "binary"
                  else (self._input_kind() or "logits")}
        if keep is not None:
            x = x[keep]
            side = {k: v[keep] for k, v in side.items()}
            w = None if w is None else w[keep]
            if x.shape[0] == 0:
                raise ValueError("labels: no box has a class target (all labels are -1)")
            if w is not None and not w.sum() > 0:
                raise ValueError("sample_weight: every box with a class target has weight 0")
        if kind == "binary":
            _check_box_label_values(y, w, self.method)
        self.kind_ = kind
        return x, y, w, side, record

    def _group_keys(self, n, domains, category_ids):
        parts = []
        if self.per_class:
            if category_ids is None:
                raise ValueError(f"category_ids: {type(self).__name__}(per_class=True) needs category_ids= "
                                 "(n_boxes,) at fit and predict time")
            parts.append(_check_category_ids(category_ids, n))
        if self.by_domain_:
            if domains is None:
                raise ValueError(f"domains: this {self.method} calibrator was fitted per domain; pass "
                                 "domains= (n_boxes,) (ids unseen at fit time use the pooled map)")
            parts.append(domains)
        if not parts:
            return None
        return [tuple(_key_part(p[i]) for p in parts) for i in range(n)]

    # --------------------------------------------------------------------- fit
    def _features_of(self, x):
        return x[:, 1] if self.kind_ == "binary" else x

    def _fit(self, x, y, sample_weight=None, domains=None, category_ids=None):
        w = sample_weight
        self.by_domain_ = domains is not None
        f = self._features_of(x)
        keys = self._group_keys(x.shape[0], domains, category_ids)
        pooled = self._fit_group(f, y, w)  # here, so its warnings point at the caller of fit
        if keys is None:
            self.pooled_ = pooled
            self.groups_, self.group_counts_, self.fallback_groups_ = {}, {}, []
            return

        def fit_one(rows):
            return self._fit_group(f[rows], y[rows], None if w is None else w[rows])

        # a box of weight 0 counts as absent; an integer weight as that many repeated boxes
        fits = fit_groups(fit_one, keys, pooled=pooled, min_samples=self.min_samples, sample_weight=w,
                          labels=y if self.kind_ == "binary" else None, what="group",
                          pooled_name="the pooled map", stacklevel=4)
        self.pooled_, self.groups_ = fits.pooled, fits.fits
        self.group_counts_, self.fallback_groups_ = fits.counts, list(fits.fallback)

    #: 1-D fits that are sums over rows: ``fit`` on sources streams them in row batches
    streams_box_scores = False

    def _fit_source(self, scores, labels, *, sample_weight, progress, **side):
        """Sources or specs of 1-D scores (``det-ts`` / ``det-platt``): every pass reads them in row
        batches (the job :func:`confcal.calibrators._fit.jobs.boxfit.box_fit_job` on a
        :class:`confcal.passes.LocalEngine`), never the whole set at once. Arrays, and class
        vectors, take the in-memory path (same parameters to rounding)."""
        import os

        from confcal.sources import Source

        if not self.streams_box_scores or not isinstance(scores, (Source, str, os.PathLike)):
            return NotImplemented
        from confcal._digest import DataDigest
        from confcal.calibrators._fit.jobs.boxfit import box_fit_job
        from confcal.passes import LocalEngine, run_job
        from confcal.sources import open_source

        xs = open_source(scores, name="scores")
        if xs.ndim != 1:
            return NotImplemented
        allowed = set(self.optional_side_inputs)
        unknown = sorted(set(k for k, v in side.items() if v is not None) - allowed)
        if unknown:
            raise TypeError(f"{type(self).__name__} does not take {unknown}; it takes {sorted(allowed)}")
        srcs = {"logits": xs, "labels": open_source(labels, name="labels"),
                **{k: open_source(v, name=k) for k, v in sorted(side.items()) if v is not None},
                "sample_weight": None if sample_weight is None else open_source(sample_weight, name="sample_weight")}
        if self.per_class and "category_ids" not in srcs:
            raise ValueError(f"category_ids: {type(self).__name__}(per_class=True) needs category_ids= "
                             "(n_boxes,) at fit and predict time")
        engine = LocalEngine(srcs, progress=progress, reference="logits")
        names = [k for k in ("category_ids", "domains") if k in engine.sources]
        n_passes = run_job(box_fit_job(self, by_domain="domains" in engine.sources, grouped=bool(names),
                                       digest=DataDigest(2 + len(names) + int(sample_weight is not None)),
                                       stacklevel=4), engine)
        self.fit_record_ = {**self.fit_record_, **self._fit_record(
            n_samples=engine.n_rows, data_sha256=self.fit_record_["data_sha256"],
            input_kind=self._score_kind(self._input_kind()),
            metrics_before=self.fit_record_["metrics_before"], metrics_after=self.fit_record_["metrics_after"],
            sample_weight=sample_weight is not None), "n_passes": n_passes}
        return self

    def fit_job(self, inputs):
        """The full-data fit as a job of :mod:`confcal.passes` over batches of ``inputs`` (``"logits"``:
        1-D scores, ``"labels"``, optionally ``"domains"`` / ``"category_ids"``), or None when this
        method or these inputs need another path. Sets the fitted state and the fit record."""
        inputs = set(inputs)
        if not self.streams_box_scores or not {"logits", "labels"} <= inputs \
                or inputs - {"logits", "labels", "domains", "category_ids"} \
                or (self.per_class and "category_ids" not in inputs):
            return None
        return self._run_box_job("domains" in inputs, bool(inputs & {"domains", "category_ids"}))

    def _run_box_job(self, by_domain: bool, grouped: bool):
        from confcal.calibrators._fit.jobs.boxfit import box_fit_job

        self._check_hyperparameters()
        n_passes = yield from box_fit_job(self, by_domain=by_domain, grouped=grouped, stacklevel=3)
        self.fit_record_ = {**self.fit_record_, **self._fit_record(
            n_samples=self.fit_record_["n_samples"], data_sha256=self.fit_record_["data_sha256"],
            input_kind=self._score_kind(self._input_kind()), metrics_before=self.fit_record_["metrics_before"],
            metrics_after=self.fit_record_["metrics_after"]), "n_passes": n_passes}
        return n_passes

    def _box_chunk(self, batch: dict, first: int):
        """One batch of raw columns as a validated :class:`confcal.calibrators._fit.jobs.boxfit.BoxChunk`
        (``"logits"``: the 1-D scores; rows named by their index ``first + i`` in the whole data)."""
        from confcal._validation import check_domains
        from confcal.calibrators._fit.jobs.boxfit import BoxChunk

        s = np.asarray(batch["logits"])
        if s.ndim != 1:
            raise ValueError(f"scores: {self.method} takes one score column (n_boxes,), got shape {s.shape}")
        k = s.shape[0]
        sat = 0
        if self.method == "det-ts" and self._input_kind() != "logits" and s.dtype.kind == "f":
            sat = int(np.count_nonzero((s == 0) | (s == 1)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)  # counted: the job warns once
            u = self._features(s, self._input_kind(), first_row=first)
        y = check_box_labels(batch["labels"], k, first_row=first)
        cols = {}
        if "domains" in batch:
            cols["domains"] = check_domains(batch["domains"], k)
        if "category_ids" in batch:
            cols["category_ids"] = _check_category_ids(batch["category_ids"], k)
        w = batch.get("sample_weight")
        if w is not None:
            w = _check_weight_batch(w, first)
        keys = self._group_keys(k, cols.get("domains"), cols.get("category_ids"))
        digest = [batch["logits"], batch["labels"], *[cols[c] for c in sorted(cols)], *([] if w is None else [w])]
        return BoxChunk(u=u, y=y, w=w, keys=keys, saturated=sat, digest_arrays=digest)

    def _fit_metrics(self, x, probs, y):
        before = self._raw_proba(self._features_of(x))
        if self.kind_ == "multiclass":
            return summary_metrics(before, y), summary_metrics(probs, y)
        return _binary_metrics(before[:, 1], y), _binary_metrics(probs[:, 1], y)

    # ----------------------------------------------------------------- predict
    def predict_score(self, scores, **side) -> np.ndarray:
        """Calibrated box confidence ``(n_boxes,)``: P(true positive) for 1-D scores,
        the top-class probability for class vectors."""
        p = self.predict_proba(scores, dtype=np.float64, **side)
        return p[:, 1] if self.kind_ == "binary" else p.max(axis=1)

    def _predict_proba(self, x, domains=None, category_ids=None):
        f = self._features_of(x)
        keys = self._group_keys(x.shape[0], domains, category_ids)
        if keys is None:
            return self._apply_one(f, self.pooled_)
        out = np.empty((x.shape[0], self.n_classes_), dtype=np.float64)
        rows = route_groups(keys, self.group_counts_, what="group", pooled_name="the pooled map", stacklevel=4)
        for key, idx in rows.items():
            out[idx] = self._apply_one(f[idx], self.groups_.get(key, self.pooled_))
        return out

    def _apply_one(self, f, p):
        if self.kind_ == "multiclass":  # divided in float64: f / T of float32 logits lost 6e-7 relative
            return softmax(np.asarray(f, dtype=np.float64) / p["temperature"])
        u = self._binary_logit(f, p)
        return np.stack([expit(-u), expit(u)], axis=1)

    # --------------------------------------------------------------- manifests
    def _get_fitted(self):
        enc = lambda k: list(k)  # noqa: E731  tuples -> JSON lists
        return {
            "kind": self.kind_, "by_domain": self.by_domain_, "pooled": self.pooled_,
            "groups": [[enc(k), v] for k, v in self.groups_.items()],
            "group_counts": [[enc(k), v] for k, v in self.group_counts_.items()],
            "fallback_groups": [enc(k) for k in self.fallback_groups_],
        }

    def _set_fitted(self, params):
        self.kind_ = params["kind"]
        self.by_domain_ = bool(params["by_domain"])
        self.pooled_ = dict(params["pooled"])
        self.groups_ = {tuple(k): dict(v) for k, v in params["groups"]}
        self.group_counts_ = {tuple(k): int(v) for k, v in params.get("group_counts", [])}
        self.group_counts_.update({k: self.group_counts_.get(k, 0) for k in self.groups_})
        self.fallback_groups_ = [tuple(k) for k in params.get("fallback_groups", [])]
        for k in self.fallback_groups_:
            self.group_counts_.setdefault(k, 0)


def _binary_metrics(p, y) -> dict:
    return {"precision": float(y.mean()), "mean_confidence": float(p.mean()),
            "d_ece": detection_ece(p, y, 15), "nll": binary_nll(p, y), "brier": binary_brier(p, y)}


@register
class DetectionTemperatureScaling(_BoxScoreMaps):
    """Temperature scaling of box scores, per class and/or per domain (``det-ts``).

    Binary (1-D probability scores): ``p = sigmoid(logit(clip(s)) / T [+ b])``;
    multiclass (class vectors): ``p = softmax(z / T)``. See the module docstring
    for the clip and the grouping rules.

    Parameters
    ----------
    per_class : one map per ``category_ids`` value (crossed with domains when given)
    bias : binary only; also fit an offset ``b`` (logistic calibration), which lets
        the map reach the base rate when scores carry no signal
    clip_scores : clip scores outside [0, 1] into it instead of raising
    min_samples : groups with fewer boxes use the pooled map
    t_min, t_max : search range of every temperature
    input_kind : None (default: 1-D scores are probabilities, class vectors logits),
        ``"logits"`` (1-D raw detector logits, taken as they are: no clip, no
        saturation) or ``"probs"`` (both are probabilities). Probability scores that
        are exactly 0 or 1 in their dtype give a warning with their count.

    Attributes
    ----------
    pooled_ : dict ``{"temperature", "bias"}`` of the pooled fit
    groups_ : dict ``{(category_id?, domain?): {"temperature", "bias"}}``
    group_counts_ : dict
        Boxes per group at fit time.
    fallback_groups_ : list
        Groups that use ``pooled_``.

    Examples
    --------
    Three boxes of score ``sigmoid(2)``, two of them true positives: the
    temperature makes ``sigmoid(2 / T) = 2/3``, so ``T = 2 / ln 2``:

    >>> import numpy as np
    >>> from confcal.calibrators import DetectionTemperatureScaling
    >>> scores = np.full(3, 1 / (1 + np.exp(-2.0)))
    >>> det = DetectionTemperatureScaling(min_samples=1, input_kind="probs").fit(scores, [1, 1, 0])
    >>> round(det.temperature_, 4), round(2 / float(np.log(2)), 4)
    (2.8854, 2.8854)
    >>> det.predict_proba(scores)[0].round(4).tolist()
    [0.3333, 0.6667]
    """

    method = "det-ts"
    supports_multiclass = True
    streams_box_scores = True
    hyper_constraints = {"per_class": Bool(), "bias": Bool(), "clip_scores": Bool(), "min_samples": Int(ge=1),
                         **T_BOUNDS, "input_kind": Nullable(Choice("logits", "probs"))}
    hyper_rules = (T_RULE,)
    #: the group keys, and every temperature (pooled and per group) inside the manifest's [t_min, t_max]
    hyper_parameter_rules = (box_group_keys, base_rules(lambda h: (_TemperatureRules, {
        "t_min": h.get("t_min", DEFAULT_T_BOUNDS[0]), "t_max": h.get("t_max", DEFAULT_T_BOUNDS[1])})))
    fitted_constraints = _grouped_fields(Fields({"temperature": TEMPERATURE, "bias": Real(), "nll": NLL,
                                                 "at_bound": Opt(Bool())}))

    def __init__(self, per_class: bool = False, bias: bool = False, clip_scores: bool = False,
                 min_samples: int = 20, t_min: float = DEFAULT_T_BOUNDS[0], t_max: float = DEFAULT_T_BOUNDS[1],
                 input_kind: str | None = None):
        self.input_kind = input_kind
        self.per_class = per_class
        self.bias = bias
        self.clip_scores = clip_scores
        self.min_samples = min_samples
        self.t_min = t_min
        self.t_max = t_max

    @property
    def temperature_(self) -> float:
        """Pooled temperature."""
        return self.pooled_["temperature"]

    def _features(self, arr, input_kind=None, first_row: int = 0):
        if input_kind == "logits":  # raw detector logits: no clip, no saturation
            return _check_scores(arr, first_row=first_row).astype(np.float64)
        return score_logit(arr, clip_scores=self.clip_scores, warn_saturated=True, first_row=first_row,
                           method=self.method)

    def _raw_proba(self, x):
        if self.kind_ == "multiclass":
            return softmax(x)
        p = expit(x)
        return np.stack([1.0 - p, p], axis=1)

    def _fit_group(self, x, y, sample_weight=None):
        if self.kind_ == "multiclass":
            res = fit_temperature(x, y, sample_weight=sample_weight, t_bounds=(self.t_min, self.t_max))
            return {"temperature": res.temperature, "bias": 0.0, "nll": res.nll, "at_bound": res.at_bound}
        res = fit_logistic(x, y, slope_bounds=(1.0 / self.t_max, 1.0 / self.t_min), fit_bias=self.bias,
                           sample_weight=sample_weight)
        return binary_ts_params(res, self.t_min, self.t_max)

    def _binary_logit(self, x, p):
        return x / p["temperature"] + p["bias"]


@register
class DetectionPlattScaling(_BoxScoreMaps):
    """Platt scaling of raw box scores, ``p = sigmoid(a * s + b)``, per class and/or domain (``det-platt``).

    For detectors whose scores are not probabilities (any finite real). 1-D scores only.

    Parameters
    ----------
    per_class
        One map per ``category_ids`` value (crossed with domains when given)
    increasing
        Constrain ``a >= 0`` so the detector's ranking is never reversed; when
        the best increasing map is flat (``a = 0``: scores carry no signal) the output is
        the base rate and a ``CalibrationWarning`` says so
    platt_targets
        Use Platt's smoothed targets (finite fit on separable groups)
    min_samples
        Groups with fewer boxes use the pooled map

    Attributes
    ----------
    pooled_ : dict
        ``{"a", "b"}`` of the pooled fit
    groups_ : dict
        ``{(category_id?, domain?): parameters}``, as in ``det-ts``
    group_counts_ : dict
        Boxes per group at fit time.
    fallback_groups_ : list
        Groups that use ``pooled_``.

    Notes
    -----
    Source: J. Platt, "Probabilistic Outputs for Support Vector Machines and
    Comparisons to Regularized Likelihood Methods", 1999.

    Examples
    --------
    Constant scores carry no signal, so the fit returns the mean of Platt's
    smoothed targets: ``(N+ + 1) / (N+ + 2) = 3/4`` for the two positives and
    ``1 / (N- + 2) = 1/3`` for the negative, ``(2 * 3/4 + 1/3) / 3 = 0.6111``:

    >>> import numpy as np
    >>> from confcal.calibrators import DetectionPlattScaling
    >>> scores = np.full(3, 0.8)
    >>> platt = DetectionPlattScaling(min_samples=1, input_kind="probs").fit(scores, [1, 1, 0])
    >>> platt.predict_proba(scores)[0].round(4).tolist()
    [0.3889, 0.6111]
    """

    method = "det-platt"
    streams_box_scores = True
    hyper_parameter_rules = (increasing_slopes, box_group_keys)  # a negated slope would invert the ranking
    hyper_constraints = {"per_class": Bool(), "increasing": Bool(), "platt_targets": Bool(),
                         "min_samples": Int(ge=1)}
    fitted_constraints = _grouped_fields(Fields({"a": Real(), "b": Real(), "nll": NLL, "at_bound": Opt(Bool())}))

    def __init__(self, per_class: bool = False, increasing: bool = True, platt_targets: bool = True,
                 min_samples: int = 20, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.per_class = per_class
        self.increasing = increasing
        self.platt_targets = platt_targets
        self.min_samples = min_samples

    def _features(self, arr, input_kind=None, first_row: int = 0):
        return _check_scores(arr, first_row=first_row).astype(np.float64)

    def _score_kind(self, input_kind) -> str:
        # Platt reads any real score as is; the fit record says what the hyper-parameter says
        # (it once said "scores" beside hyperparameters.input_kind "logits": two answers to one question)
        return input_kind or "logits"

    def _raw_proba(self, x):
        p = np.clip(x, 0.0, 1.0)  # raw scores as if probabilities, for the "before" metrics
        return np.stack([1.0 - p, p], axis=1)

    def _fit_group(self, x, y, sample_weight=None):
        res = fit_logistic(x, y, slope_bounds=(0.0, math.inf) if self.increasing else (-math.inf, math.inf),
                           targets="platt" if self.platt_targets else "hard", sample_weight=sample_weight)
        return platt_params(res, self.increasing)

    def _binary_logit(self, x, p):
        return p["a"] * x + p["b"]
