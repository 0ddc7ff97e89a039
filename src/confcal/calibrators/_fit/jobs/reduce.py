"""Multiclass calibration from a 1-D map: one-vs-rest (renormalised) and top-label (arg-max kept).

* **One-vs-rest** (Zadrozny & Elkan, KDD 2002): one map per class ``k`` on the score of
  class ``k`` against ``1[y = k]``; the ``K`` outputs are divided by their row sum
  (rows whose outputs are all 0 get ``1/K``, scikit-learn's ``CalibratedClassifierCV``
  rule). With two classes a single map on class 1 is fitted and class 0 gets its
  complement (the binary rule). A tie between the original arg-max and another class
  (common after binning) is broken toward the original by one ulp. The arg-max can still
  change, so the fit record carries ``accuracy_change`` and ``argmax_changed`` on the
  calibration set, and ``confcal compare`` a ``Δacc`` column.
* **Top-label** (Kumar et al. 2019, sec. 3; Gupta & Ramdas 2022): one map on the
  confidence ``c = max_k p_k`` against "the arg-max is right". The new confidence ``c'``
  replaces ``c`` and the other classes share ``1 - c'`` in proportion to their
  probabilities, each capped at ``c'`` (water-filling; see :func:`spread_top_label`), so
  no class overtakes the arg-max; ``c'`` below ``1/K`` is raised to it, and a tie with the
  arg-max is broken toward it by one ulp. Accuracy is unchanged exactly.

Masked classes (``-inf`` logits, probability 0 with ``input_kind="probs"``) stay exactly 0 in both,
as in ``softmax``: one-vs-rest sets their maps' outputs to 0 before the row sum (an all-zero row is
uniform over the unmasked classes); top-label counts only the unmasked classes in ``K``.

Scores handed to the maps: probabilities ``p`` (``space = "prob"``) or their log-odds
``log(p / (1 - p))`` computed from the logits without cancellation (``space = "logit"``),
clipped to ``+-log(1/eps)`` (``eps`` = float64 machine epsilon, about 36.04) so that
masked classes (``-inf`` logits, zero probabilities) stay finite.
"""

from __future__ import annotations

import abc

from typing import Any, ClassVar

import numpy as np
from scipy.special import logsumexp

from confcal._numeric import log_softmax, row_max, softmax
from confcal.calibrators.protocol.base import Calibrator

__all__ = ["OneVsRestCalibrator", "TopLabelCalibrator", "log_odds", "log_odds_from_log_softmax", "top_label_log_odds",
           "spread_top_label", "predicted_class", "break_ties_toward", "LOGIT_CLIP", "check_label_classes",
           "check_box_label_values", "warn_few_top_label_rows", "MIN_TOP_LABEL_ROWS"]

LOGIT_CLIP = float(np.log(1.0 / np.finfo(np.float64).eps))
#: fewer calibration rows than this and a top-label map warns (:func:`warn_few_top_label_rows`); the
#: minimum ``auto`` also asks of a cross-validated choice (:data:`confcal.evaluation.selection.MIN_ROWS`)
MIN_TOP_LABEL_ROWS = 50


def _log1m_softmax(z: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """``log(1 - p)`` for every entry, from the logits: ``log1p(-p)`` where ``p <= 1/2`` and
    ``logsumexp`` of the other logits minus the row's ``logsumexp`` for the (single) larger entry."""
    with np.errstate(divide="ignore"):
        out = np.log1p(-np.exp(logp))
    big = logp > -np.log(2.0)
    if big.any():
        rows, cols = np.nonzero(big)
        zz = z[rows].copy()
        lse_all = logsumexp(zz, axis=1)
        zz[np.arange(rows.size), cols] = -np.inf
        with np.errstate(divide="ignore"):
            out[rows, cols] = logsumexp(zz, axis=1) - lse_all
    return out


def log_odds(logits: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` of ``p = softmax(logits)``, float64 ``(n, K)``, clipped to ``+-LOGIT_CLIP``."""
    z = np.asarray(logits, dtype=np.float64)
    logp = log_softmax(z)
    with np.errstate(invalid="ignore"):
        lo = logp - _log1m_softmax(z, logp)
    return np.clip(np.nan_to_num(lo, nan=-LOGIT_CLIP), -LOGIT_CLIP, LOGIT_CLIP)


def log_odds_from_log_softmax(logp: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
    """:func:`log_odds` from ``logp = log_softmax(logits)`` (and optionally ``p = exp(logp)``), float64
    ``(n, K)``, clipped to ``+-LOGIT_CLIP``; equal to :func:`log_odds` to a few float64 ulps.

    ``log(1 - p)`` is ``log(1 - p)`` where ``p <= 1/2`` (``1 - p`` in ``[1/2, 1]`` rounds with an absolute
    error below 2**-54, so the log-odds are off by less than that) and, for the (single) larger entry
    of a row, the log of the sum of the row's other probabilities (a sum of positive terms, no
    cancellation; a term that underflows is below 1e-300 of a sum that matters only above ``e**-37``:
    below, the log-odds are clipped). Two exponential/log passes over the array instead of the
    ``logsumexp`` of every such row's other logits.
    """
    logp = np.asarray(logp, dtype=np.float64)
    if p is None:
        p = np.exp(logp)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = logp - np.log(1.0 - p)
    rows = np.flatnonzero(np.max(logp, axis=1) > -np.log(2.0))
    if rows.size:
        cols = np.argmax(logp[rows], axis=1)
        others = p[rows]
        others[np.arange(rows.size), cols] = 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            lo[rows, cols] = logp[rows, cols] - np.log(others.sum(axis=1))
    bad = np.isnan(lo)
    if bad.any():
        lo[bad] = -LOGIT_CLIP
    return np.clip(lo, -LOGIT_CLIP, LOGIT_CLIP, out=lo)


def top_label_log_odds(logits: np.ndarray, top: np.ndarray) -> np.ndarray:
    """``log(c / (1 - c))`` of the confidence ``c = p[top]``, float64 ``(n,)``, clipped to ``+-LOGIT_CLIP``."""
    z = np.asarray(logits, dtype=np.float64)
    rows = np.arange(z.shape[0])
    zt = z[rows, top]
    others = z.copy()
    others[rows, top] = -np.inf
    with np.errstate(divide="ignore"):
        lo = zt - logsumexp(others, axis=1)
    return np.clip(lo, -LOGIT_CLIP, LOGIT_CLIP)


def spread_top_label(p: np.ndarray, top: np.ndarray, conf: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Rows with confidence ``conf`` on class ``top`` and ``1 - conf`` shared by the other classes,
    the arg-max kept. float64 ``(n, K)``.

    The others get ``min(s * p_j, conf)`` with the one scale ``s`` per row that makes the row sum
    to 1 (proportional sharing, capped at ``conf`` so no class overtakes the arg-max:
    water-filling, exact via a sort). When the capped others cannot absorb ``1 - conf``
    proportionally (they are capped or 0), the remainder is shared equally by the zero
    entries. ``conf`` is first raised to ``1/K`` (below it no row can keep its arg-max). A tie
    with the arg-max is broken toward it by one ulp.

    ``mask`` (bool ``(n, K)``, optional): masked classes (``-inf`` logits). They stay exactly 0:
    ``K`` above is then the row's number of unmasked classes, and the remainder goes to the
    unmasked zero entries only (``1/K_row`` lets the unmasked others absorb ``1 - conf``).
    """
    p = np.asarray(p, dtype=np.float64)
    n, k = p.shape
    rows = np.arange(n)
    if mask is not None and not mask.any():
        mask = None
    k_row = k if mask is None else np.maximum(k - mask.sum(axis=1), 1)
    c = np.clip(np.asarray(conf, dtype=np.float64), 1.0 / k_row, 1.0)
    others = p.copy()
    others[rows, top] = -1.0
    order = np.argsort(-others, axis=1, kind="stable")[:, : k - 1]  # the K-1 others, largest first
    o = np.take_along_axis(p, order, axis=1)
    tail = np.concatenate([np.cumsum(o[:, ::-1], axis=1)[:, ::-1], np.zeros((n, 1))], axis=1)  # sum o[m:]
    m = np.arange(k)[None, :]
    left = 1.0 - c[:, None] * (1.0 + m)  # mass left for the uncapped entries when m are capped
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(tail > 0, left / np.where(tail > 0, tail, 1.0), np.inf)
        head = np.concatenate([o, np.zeros((n, 1))], axis=1)  # o[m]: the largest uncapped entry
        ok = (tail <= 0) | (head * scale <= c[:, None])
    ok[:, -1] = True
    ok &= left >= -1e-12
    ok[:, -1] = True
    m_star = np.argmax(ok, axis=1)
    s = scale[rows, m_star]
    q_sorted = np.where(np.isfinite(s)[:, None], np.minimum(o * np.where(np.isfinite(s), s, 0.0)[:, None],
                                                             c[:, None]), 0.0)
    capped = np.arange(k - 1)[None, :] < m_star[:, None]
    q_sorted[capped] = np.broadcast_to(c[:, None], capped.shape)[capped]
    no_tail = ~np.isfinite(s)  # only zeros remain uncapped: share the rest equally among them
    if no_tail.any():
        zero_slots = ~capped[no_tail]
        if mask is not None:  # a masked class takes no share
            zero_slots &= ~np.take_along_axis(mask[no_tail], order[no_tail], axis=1)
        n_zero = zero_slots.sum(axis=1)
        fill = np.maximum(left[rows[no_tail], m_star[no_tail]], 0.0) / np.maximum(n_zero, 1)
        block = q_sorted[no_tail]
        block[zero_slots] = np.broadcast_to(fill[:, None], zero_slots.shape)[zero_slots]
        q_sorted[no_tail] = block
    q = np.empty_like(p)
    np.put_along_axis(q, order, q_sorted, axis=1)
    q[rows, top] = c
    rival = q.copy()
    rival[rows, top] = -np.inf
    rival_max = rival.max(axis=1)
    tied = q[rows, top] <= rival_max
    if tied.any():  # a tie at the cap (or rounding): the original arg-max wins by one ulp
        q[rows[tied], top[tied]] = np.nextafter(rival_max[tied], np.inf)
    return q


def predicted_class(probs: np.ndarray) -> np.ndarray:
    """The arg-max that is kept: of the uncalibrated probabilities ``softmax(logits)``, lowest index on
    ties (the rule of :func:`confcal.metrics.accuracy`; logits that differ by less than rounding
    give equal probabilities, so this can differ from the arg-max of the logits themselves)."""
    return np.argmax(probs, axis=1)


def break_ties_toward(q: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Where class ``top`` ties with the row maximum of ``q`` (binned maps give many ties), raise it
    by one ulp so the arg-max stays the original one; rows without such a tie are unchanged.

    ``top`` ties with the maximum exactly when it equals the largest of the row's other entries:
    one maximum over the rows with ``top`` set aside (then put back), not a count of every entry
    equal to the maximum (0.35 -> 0.15 ms on 5,000 x 10)."""
    rows = np.arange(q.shape[0])
    qt = q[rows, top]
    q[rows, top] = -np.inf
    rival = row_max(q)[:, 0]
    q[rows, top] = qt
    tied = qt == rival
    if tied.any():
        q[rows[tied], top[tied]] = np.nextafter(qt[tied], np.inf)
    return q


def _class_list(classes: np.ndarray) -> str:
    shown = ", ".join(str(int(c)) for c in classes[:10])
    return f"[{shown}{', ...' if classes.size > 10 else ''}]" + (f" ({classes.size} classes)" if classes.size > 10 else "")


def check_label_classes(counts: np.ndarray, method: str, *, weighted: bool = False, per_class: bool = False,
                        stacklevel: int = 5) -> None:
    """The one-vs-rest fits' rule for classes missing from the calibration labels.

    ``counts`` ``(n_classes,)``: the number of labels of each class (their weight sums when
    ``weighted``; a class of weight 0 is absent). One-vs-rest fits a map per class on
    ``1[label = k]``; a class with no label has no positive example for its map.

    * Only one class present: ``ValueError``. Every other map is (near) 0, so every row becomes that
      class with probability ~1 whatever its logits: the fit is meaningless (WRN CIFAR-10, 5,000 labels of
      class 3: accuracy 0.911 -> 0.101), not merely poor.
    * Some classes absent: :class:`CalibrationWarning` naming them; their maps are fitted on no
      positive example (binning and isotonic: 0, a row whose maps are all 0 gets ``1/K`` for every
      class; bbq: its prior's value; Platt / beta: a small value), the others as usual.

    ``per_class``: the same rule, worded for a multiclass linear map with per-class parameters
    (``vs``, ``ms``, ``dirichlet``): the NLL fit drives the bias of a class without labels toward
    ``-inf`` (only the penalty holds it), so that class is predicted less or never (LeNet CIFAR-10,
    labels of one class: accuracy 0.522 -> 0.101; labels < 5 only: 0.522 -> 0.330).
    """
    import warnings

    from confcal.calibrators._fit.tsfit import CalibrationWarning

    counts = np.asarray(counts, dtype=np.float64)
    k, n = counts.size, float(counts.sum())
    present = np.flatnonzero(counts > 0)
    total = f"{n:.6g} (weighted)" if weighted else f"{n:.0f}"
    if present.size == 1 and per_class:
        c = int(present[0])
        raise ValueError(f"labels: only class {c} occurs in the {total} calibration labels; {method!r} fits "
                         "per-class parameters by NLL, so the other classes' biases go toward -inf and every row "
                         f"becomes class {c} with probability ~1, whatever its logits; fit on labels of at least "
                         "two classes ('ts', one parameter, keeps the arg-max)")
    if present.size == 1:
        c = int(present[0])
        raise ValueError(f"labels: only class {c} occurs in the {total} calibration labels; {method!r} fits one "
                         f"map per class on 1[label = k], so every other class would get probability 0 (or near it) "
                         f"and every row class {c} with probability ~1, whatever its logits; fit on labels of at least "
                         "two classes (a top-label method such as 'isotonic-top', or 'ts', keeps the arg-max)")
    absent = np.flatnonzero(counts <= 0)
    if absent.size and per_class:
        one = absent.size == 1
        warnings.warn(f"labels: class{'' if one else 'es'} {_class_list(absent)} of {k} "
                      f"do{'es' if one else ''} not occur in the {total} calibration labels; {method!r} fits "
                      "per-class parameters by NLL, which pushes the probability of a class without labels "
                      "toward 0 (only the penalty holds it), so it is predicted less or never; fit on a calibration set with every class, "
                      "or use 'ts' (one parameter, keeps the arg-max)", CalibrationWarning, stacklevel=stacklevel)
    elif absent.size:
        one = absent.size == 1
        warnings.warn(f"labels: class{'' if one else 'es'} {_class_list(absent)} of {k} "
                      f"do{'es' if one else ''} not occur in the {total} calibration labels; {method!r} fits "
                      f"{'its map' if one else 'their maps'} on no positive example (histogram binning and isotonic "
                      "give probability 0, bbq its prior, a logistic map a small value); fit on a calibration set "
                      "with every class, or use a top-label method (e.g. 'isotonic-top') or 'ts'",
                      CalibrationWarning, stacklevel=stacklevel)


def warn_few_top_label_rows(n: int, method: str, *, stacklevel: int = 4) -> None:
    """:class:`CalibrationWarning` when a top-label map (``isotonic-top``, ``histogram-binning-top``,
    ``bbq-top``) is fitted on fewer than :data:`MIN_TOP_LABEL_ROWS` rows (``n``: rows of weight > 0).

    The map's levels estimate the accuracy at each confidence from the rows' right / wrong flags: a
    level from ``m`` rows has a binomial standard error up to ``0.5 / sqrt(m)``, and on a few rows the
    levels are 0 or 1 (1 right row: every test confidence becomes 1.0, NLL 13.2 on LeNet CIFAR-10).
    """
    if n >= MIN_TOP_LABEL_ROWS:
        return
    import warnings

    from confcal.calibrators._fit.tsfit import CalibrationWarning

    rows = "1 calibration row" if n == 1 else f"{n} calibration rows"
    warnings.warn(f"logits: {method!r} fitted on {rows} (fewer than {MIN_TOP_LABEL_ROWS}): its confidence levels "
                  f"are the accuracy of a few right / wrong rows each (standard error up to 0.5/sqrt(rows)), so they "
                  "can be 0 or 1 and make every test confidence that value; use more calibration rows or 'ts' "
                  "(one parameter)", CalibrationWarning, stacklevel=stacklevel + 1)


def check_box_label_values(pos: float, total: float, method: str, *, weighted: bool = False) -> None:
    """Refuse true-positive flags of one value for a binary detection map (``det-platt``, ``det-ts``,
    ``det-beta``, the ``-geo`` maps): ``pos`` the positive count (weight sum when ``weighted``) of
    ``total``.

    With no true positive (or no false positive) the NLL fit drives ``P(true positive | score)``
    to 0 (or 1) for every box whatever its score: KITTI cars, ``det-platt-geo`` on false positives
    only, calibration NLL 0.0000 and held-out NLL 0.22 -> 6.43. Such a fit is meaningless, not
    merely poor: ``ValueError`` naming ``labels``, the count and why.
    """
    if pos > 0 and pos < total:
        return
    what = "0 (false positives: no box matched an object)" if not pos > 0 else "1 (true positives: no false positive)"
    n = f"{total:.6g} (weighted)" if weighted else f"{total:.0f}"
    p = "0" if not pos > 0 else "1"
    raise ValueError(f"labels: all {n} box labels are {what}; {method!r} fits P(true positive | score) on them, "
                     f"so the fit pushes every box's probability toward {p} whatever its score; fit on boxes with both true and "
                     "false positives (e.g. a larger or unfiltered calibration set)")


def _accuracy_report(cal: Calibrator, logits, side) -> None:
    """``accuracy_change`` and ``argmax_changed`` of the fit record: from the arg-maxes the record's
    metrics took (the fit memo's ``"report"``, the fitted array itself) or, without them, from a
    prediction of the validated ``logits``."""
    rec = cal.fit_record_
    before = rec["metrics_before"]["accuracy"]
    after = rec["metrics_after"]["accuracy"]
    rec["accuracy_change"] = float(after - before)
    memo = (cal.__dict__.get("_fit_memo") or {}).get("report")
    if memo is not None:
        # the fit record's own predictions of the fitted array (the same rows, the same fitted maps)
        moved = memo[4] != memo[3]
    else:
        x = cal._validate_logits(logits)
        q = cal._predict_proba(x, **cal._check_side(side, x.shape[0]))
        moved = np.argmax(q, axis=1) != predicted_class(softmax(x))
    rec["argmax_changed"] = float(np.mean(moved))


def _fit_softmax(cal: Calibrator, logits) -> np.ndarray:
    """``softmax(logits)``, taken from the running fit's memo when ``logits`` is the array being fitted
    (:attr:`_ReportingCalibrator._fit_memo`) and computed otherwise."""
    memo = cal.__dict__.get("_fit_memo")
    if memo is not None and memo.get("x") is logits and "softmax" in memo:
        return memo["softmax"]
    return softmax(logits)


def _remember_softmax(cal: Calibrator, logits, p) -> None:
    """During a fit, keep ``softmax(logits)`` (``p``; None: computed here) in the fit memo for the fit
    record's predictions and metrics of the same array (:func:`_fit_softmax`), so that a fit computes
    it once instead of four times. Outside a fit (no memo) nothing is kept."""
    memo = cal.__dict__.get("_fit_memo")
    if memo is not None and "softmax" not in memo:
        memo.update(x=logits, softmax=softmax(logits) if p is None else p)


def _named(check, params, prefix: str):
    """``check(params)`` with errors naming the map's path (``maps[3].edges: ...``)."""
    try:
        return check(params)
    except ValueError as exc:
        head = prefix.split("[")[0].rstrip(".")  # a plain field name first, as the manifest loader expects
        raise ValueError(f"{head}: parameters.{prefix}" + str(exc).replace("<map>", prefix)) from None


class _MapMixin:
    """What a concrete method supplies: the score space and the 1-D fit/apply pair."""

    space: ClassVar[str] = "prob"  # "prob" or "logit"

    @abc.abstractmethod
    def _fit_map(self, scores: np.ndarray, targets: np.ndarray, sample_weight) -> dict[str, Any]:
        """One 1-D map fitted on ``(scores, 0/1 targets)``, as JSON-ready parameters."""

    @abc.abstractmethod
    def _apply_map(self, params: dict[str, Any], scores: np.ndarray) -> np.ndarray:
        """The map of ``params`` applied to 1-D ``scores``."""

    def _check_map(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate one map's parameters from a manifest (subclasses tighten this)."""
        if not isinstance(params, dict):
            raise TypeError(f"expected a dict of map parameters, got {type(params).__name__}")
        return params


class _ReportingCalibrator(Calibrator):
    """Adds ``accuracy_change`` (after - before) and ``argmax_changed`` (fraction of rows whose
    arg-max moved) to the fit record.

    During :meth:`fit` (and only then) ``_fit_memo`` is a dict of values computed once per fit and read
    again by the fit record: ``"report"``, the fitted logits with their calibrated and uncalibrated
    probabilities (:meth:`_fit_metrics`), and what a method's ``_fit`` leaves there for its own
    predictions of the fitted array (``"x"``: that array, ``"softmax"``: its softmax; read by identity
    of the array, so a slice or copy is computed afresh). It is removed when the fit returns or raises,
    so a fitted calibrator (and a sub-calibrator fitted through ``_fit`` directly) holds no data."""

    def fit(self, logits, labels, *, sample_weight=None, progress=False, **side):
        from confcal.calibrators.protocol.base import _materialise

        # sources (the CLI streams its inputs) are read whole once, for the fit and the report
        logits, labels = _materialise(logits, "logits"), _materialise(labels, "labels")
        side = {k: _materialise(v, k) for k, v in side.items()}
        self._fit_memo = {}
        try:
            super().fit(logits, labels, sample_weight=sample_weight, progress=progress, **side)
            _accuracy_report(self, logits, side)
        finally:
            self.__dict__.pop("_fit_memo", None)
        return self

    def _fit_metrics(self, logits, probs, labels) -> tuple[dict, dict]:
        from confcal.calibrators.protocol.manifest import summary_metrics

        p = _fit_softmax(self, logits)
        if not (isinstance(probs, np.ndarray) and probs.dtype == np.float64):
            return summary_metrics(p, labels), summary_metrics(probs, labels)
        # the fit's own softmax and predictions of validated logits, and validated labels: checked
        # once, each arg-max taken once (the metrics' and argmax_changed's)
        memo = self.__dict__.get("_fit_memo")
        known = (memo or {}).get("top")
        top = known[1] if known is not None and known[0] is logits else predicted_class(p)
        pred = np.argmax(probs, axis=1)
        if memo is not None:
            memo["report"] = (logits, probs, p, top, pred)
        return (summary_metrics(p, labels, checked=True, pred=top),
                summary_metrics(probs, labels, checked=True, pred=pred))


class OneVsRestCalibrator(_MapMixin, _ReportingCalibrator):
    """Base of the one-vs-rest methods (see the module docstring)."""

    keeps_argmax: ClassVar[bool] = False

    def _fit_inputs(self, logits, labels, sample_weight, side):
        out = super()._fit_inputs(logits, labels, sample_weight, side)
        x, y, w = out[:3]
        check_label_classes(np.bincount(y, weights=w, minlength=x.shape[1]), self.method, weighted=w is not None)
        return out

    def _scores(self, logits: np.ndarray) -> np.ndarray:
        return _fit_softmax(self, logits) if self.space == "prob" else log_odds(logits)

    def _fit(self, logits, labels, sample_weight=None, **side):
        s = self._scores(logits)
        _remember_softmax(self, logits, s if self.space == "prob" else None)
        k = logits.shape[1]
        memo = self.__dict__.get("_fit_memo")
        cols = [1] if k == 2 else list(range(k))
        fit_all = getattr(self, "_fit_maps", None)
        if fit_all is not None:
            # all K maps at once (a method whose maps vectorise over the columns) and their values at
            # the calibration scores (n, K): the fit record's prediction of this array needs no search
            self.maps_, fitted = fit_all(s, labels, cols, sample_weight)
            if memo is not None:
                memo["columns"] = (logits, fitted)
            return
        self.maps_ = [self._fit_map(s[:, j], (labels == j).astype(np.float64), sample_weight) for j in cols]

    #: rows per block of predict_proba: every row's output depends on that row only, so a long
    #: batch runs in blocks of ~2**21 values (16 MiB per float64 intermediate) and its memory is
    #: the output plus one block's intermediates (1M x 100 logits: ~6 GB of intermediates at once before)
    _block_elements: ClassVar[int] = 2 ** 21

    def _predict_proba(self, logits, **side):
        rows = max(1024, self._block_elements // max(1, logits.shape[1]))
        if logits.shape[0] <= rows:
            return self._predict_block(logits)
        out = np.empty(logits.shape, dtype=np.float64)
        for start in range(0, logits.shape[0], rows):
            out[start:start + rows] = self._predict_block(logits[start:start + rows])
        return out

    def _map_columns(self, scores: np.ndarray) -> np.ndarray:
        """The ``K`` maps applied to their columns of ``scores`` ``(n, K)``, clipped to ``[0, 1]``
        (methods whose maps vectorise over the classes override this)."""
        return np.column_stack([np.clip(self._apply_map(m, scores[:, j]), 0.0, 1.0)
                                for j, m in enumerate(self.maps_)])

    def _predict_block(self, logits):
        s = self._scores(logits)
        memo = self.__dict__.get("_fit_memo") or {}
        known = memo.get("columns")
        if known is not None and known[0] is logits:
            # (n, K): each map's values at its calibration scores, used once (this prediction is the
            # fit record's; the memo does not keep it for another)
            known = memo.pop("columns")[1]
        else:
            known = None
        # masked classes (-inf logits, probability 0) stay exactly 0, as softmax keeps them
        mask = np.isneginf(logits)
        mask = mask if mask.any() else None
        if len(self.maps_) == 1:
            p1 = np.clip(self._apply_map(self.maps_[0], s[:, 1]) if known is None else known[:, 0], 0.0, 1.0)
            if mask is not None:
                p1 = np.where(mask[:, 1], 0.0, np.where(mask[:, 0], 1.0, p1))
            return np.stack([1.0 - p1, p1], axis=1)
        if known is None:
            q = self._map_columns(s)
        else:
            q = np.ascontiguousarray(known, dtype=np.float64)
            np.clip(q, 0.0, 1.0, out=q)
        if mask is not None:
            q[mask] = 0.0
        total = q.sum(axis=1, keepdims=True)
        zero = total[:, 0] <= 0.0
        if zero.any():  # every map 0: uniform over the (unmasked) classes
            if mask is None:
                q[zero] = 1.0
                total[zero] = q.shape[1]
            else:
                q[zero] = ~mask[zero]
                total[zero] = q[zero].sum(axis=1, keepdims=True)
        q /= total
        top = predicted_class(s if self.space == "prob" else _fit_softmax(self, logits))
        if known is not None:  # the fit record's prediction: its metrics read this arg-max again
            memo["top"] = (logits, top)
        return break_ties_toward(q, top)

    def _get_fitted(self):
        return {"maps": self.maps_}

    def _set_fitted(self, params):
        maps = params["maps"]
        if not isinstance(maps, list) or not maps:
            raise ValueError("maps: expected a non-empty list of per-class maps")
        self.maps_ = [_named(self._check_map, m, f"maps[{j}].") for j, m in enumerate(maps)]


class TopLabelCalibrator(_MapMixin, _ReportingCalibrator):
    """Base of the top-label (``-top``) methods (see the module docstring)."""

    keeps_argmax: ClassVar[bool] = True
    #: fewer rows are refused by the fit itself (scaling-binning: 2), so no few-rows warning is given first
    min_fit_rows: ClassVar[int] = 1

    def _fit_inputs(self, logits, labels, sample_weight, side):
        out = super()._fit_inputs(logits, labels, sample_weight, side)
        y, w = out[1], out[2]
        if y.shape[0] >= self.min_fit_rows:
            warn_few_top_label_rows(int(y.shape[0] if w is None else np.count_nonzero(w > 0)), self.method)
        return out

    def _top(self, logits):
        p = _fit_softmax(self, logits)
        top = predicted_class(p)
        if self.space == "prob":
            return p, top, p[np.arange(logits.shape[0]), top]
        return p, top, top_label_log_odds(logits, top)

    def _fit(self, logits, labels, sample_weight=None, **side):
        p, top, s = self._top(logits)
        _remember_softmax(self, logits, p)
        self.map_ = self._fit_map(s, (labels == top).astype(np.float64), sample_weight)

    def _predict_proba(self, logits, **side):
        p, top, s = self._top(logits)
        conf = self._apply_map(self.map_, s)
        return spread_top_label(p, top, conf, np.isneginf(logits))

    def _get_fitted(self):
        return {"map": self.map_}

    def _set_fitted(self, params):
        self.map_ = _named(self._check_map, params["map"], "map.")
