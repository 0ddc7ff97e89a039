"""The fit record of a manifest (``fit``): every field, its type and range, checked on load.

A damaged field is named in one warning and never blocks ``apply`` (:func:`damaged_fit_fields`);
``fit.data_summary`` is what ``drift`` and ``apply``'s drift check read (:func:`check_data_summary`).
The spec types are those of :mod:`confcal.calibrators.protocol.constraints`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from confcal.calibrators.protocol.constraints import (AnyJSON, Bool, Choice, Fields, Int, ListOf, Nullable, Opt, Real,
                                                      Spec, Text, _Ctx, _join)

__all__ = ["FIT_RECORD", "DATA_SUMMARY", "damaged_fit_fields", "check_fit_record", "check_data_summary",
           "summary_holds_probabilities"]


# ------------------------------------------------------------------ the fit record
@dataclass(frozen=True)
class _NonEmpty(Spec):
    """A non-empty list of ``item`` (quantiles: an empty list has no distribution to test against)."""

    item: Spec

    def check(self, value, path, ctx):
        ListOf(self.item).check(value, path, ctx)
        if not value:
            ctx.fail(path, "a non-empty list", got="[]")
        return value


class _Sorted(_NonEmpty):
    """A non-empty, non-decreasing list of ``item``: quantiles out of order describe no distribution, and the
    KS test of drift would read them as one without a word."""

    def check(self, value, path, ctx):
        super().check(value, path, ctx)
        bad = next((i for i in range(1, len(value)) if value[i] < value[i - 1]), None)
        if bad is not None:
            ctx.fail(f"{path}[{bad}]", f"quantiles in non-decreasing order (>= {value[bad - 1]!r}, the entry before)",
                     got=repr(value[bad]))
        return value


_QUANTILES = _Sorted(Real())
#: ``fit.data_summary`` (confcal.metrics.drift.data_summary), as drift and apply read it
DATA_SUMMARY = Fields({
    "statistic": Choice("ks_top_confidence"),
    "n": Int(ge=1, le=2 ** 53),
    "confidence_quantiles": _QUANTILES,
    "class_frequencies": Opt(_NonEmpty(Real(ge=0, le=1))),
    "domains": Opt(AnyJSON()),  # {domain: {"n", "confidence_quantiles"}}: checked in check_data_summary
    "feature_means": Opt(_NonEmpty(Real())),
    # box scores clipped into [0, 1] before summarising (a map with clip_scores=True reads them so)
    "clip_scores": Opt(Bool()),
})


@dataclass(frozen=True)
class _Hex(Spec):
    """A lowercase hexadecimal digest of ``n`` digits (sha256: 64)."""

    n: int = 64

    def check(self, value, path, ctx):
        if not (isinstance(value, str) and len(value) == self.n and all(c in "0123456789abcdef" for c in value)):
            ctx.fail(path, f"a sha256 digest ({self.n} hex digits)", value)
        return value


@dataclass(frozen=True)
class _IsoTime(Spec):
    """An ISO 8601 time stamp with its UTC offset (``2026-12-03T06:34:11+00:00``)."""

    def check(self, value, path, ctx):
        import datetime as _dt

        try:
            ok = isinstance(value, str) and _dt.datetime.fromisoformat(value).tzinfo is not None
        except ValueError:
            ok = False
        if not ok:
            ctx.fail(path, "an ISO 8601 time with a UTC offset", value)
        return value


@dataclass(frozen=True)
class _DictOf(Spec):
    """A JSON object whose values all satisfy ``value`` (any keys)."""

    value: Spec

    def check(self, value, path, ctx):
        if not isinstance(value, dict):
            ctx.fail(path, "a JSON object (dict)", value)
        for k, v in value.items():
            self.value.check(v, _join(path, str(k)), ctx)
        return value


@dataclass(frozen=True)
class _OneOrList(Spec):
    """``item``, or a non-empty list of ``item`` (a repeated option)."""

    item: Spec

    def check(self, value, path, ctx):
        if isinstance(value, list):
            _NonEmpty(self.item).check(value, path, ctx)
        else:
            self.item.check(value, path, ctx)
        return value


#: rows and counts: at most 2**53 (exact in a float64 and in JSON readers)
_COUNT = Int(ge=1, le=2 ** 53)
_SHARE = Real(ge=0, le=1)
#: calibration-set metrics of the fit record (manifest.summary_metrics, the box-score metrics of
#: _boxfit/detection): each in its own range; the NLL may be large (extreme logits) but is finite
_METRICS = Fields({"accuracy": Opt(_SHARE), "ece": Opt(_SHARE), "d_ece": Opt(_SHARE), "precision": Opt(_SHARE),
                   "mean_confidence": Opt(_SHARE), "nll": Opt(Real(ge=0, max_abs=math.inf)),
                   "brier": Opt(Real(ge=0, le=2))})
_LABEL_METRICS = Fields({"prevalence": _SHARE, "ece": _SHARE, "nll": Real(ge=0, max_abs=math.inf),
                         "brier": Real(ge=0, le=1)})
#: one input file of fit.provenance.inputs (confcal.cli._shared.provenance.provenance)
_INPUT = Fields({"path": Text(), "key": Nullable(Text()), "sha256": Nullable(_Hex()),
                 "columns": Opt(_NonEmpty(Text()))})

#: ``fit`` (confcal.calibrators.protocol.manifest.fit_record, plus what ``confcal fit`` and the Dask engine add):
#: every field, its type and range; unknown keys are refused. Checked on load; a damaged field is named
#: in one warning and never blocks apply (check_fit_record, damaged_fit_fields)
class _CVSearchRule:
    """The cross-validation record agrees with itself: the grid strongest first and each point once
    (as :func:`reg_grid_pairs` searches it), one held-out NLL (or null) per point, ``best`` the first
    lowest scored point, and the chosen ``reg_lambda`` / ``reg_mu`` that point, or the refined pair
    when it scored lower."""

    names = ("grid", "mean_nll", "best", "refined", "refined_nll", "reg_lambda", "reg_mu")

    def check(self, obj: dict, path: str, ctx) -> None:
        grid, scores, best = obj["grid"], obj["mean_nll"], obj["best"]
        pairs = [tuple(g) for g in grid]
        if pairs != sorted(set(pairs), reverse=True):
            ctx.fail(_join(path, "grid"), "[lambda, mu] pairs strongest first (by lambda, then mu), each once", grid)
        if len(scores) != len(grid):
            ctx.fail(_join(path, "mean_nll"), f"one entry per grid point ({len(grid)})", got=f"{len(scores)} entries")
        scored = [v for v in scores if v is not None]
        if best >= len(grid) or scores[best] is None or scores.index(min(scored)) != best:
            ctx.fail(_join(path, "best"), f"the index of the first lowest mean_nll in [0, {len(grid) - 1}]", best)
        refined, refined_nll = obj["refined"], obj["refined_nll"]
        if refined is None and refined_nll is not None:  # (refined with a null refined_nll: not finite)
            ctx.fail(_join(path, "refined_nll"), "null when refined is null", refined_nll)
        won = refined is not None and refined_nll is not None and refined_nll < scores[best]
        chosen = list(refined) if won else list(grid[best])
        for name, want, have in zip(("reg_lambda", "reg_mu"), chosen, (obj["reg_lambda"], obj["reg_mu"])):
            if have != want:
                ctx.fail(_join(path, name), f"{want!r}, from the chosen pair {chosen} (grid[best], or refined when "
                         f"its refined_nll is lower)", have)


FIT_RECORD = Fields({
    "n_samples": _COUNT,
    "data_sha256": _Hex(),
    "input_kind": Nullable(Choice("logits", "probs", "scores")),
    "metrics_before": _METRICS,
    "metrics_after": _METRICS,
    "library_version": Text(),
    "utc_time": _IsoTime(),
    "sample_weight": Opt(Bool()),
    # string class labels of the fit, sorted (classes_; column j is classes[j]); absent for integer labels
    "classes": Opt(_NonEmpty(Text())),
    "n_left_out": Opt(Int(ge=0, le=2 ** 53)),
    "n_passes": Opt(Int(ge=1, le=10 ** 6)),
    "accuracy_change": Opt(Real(ge=-1, le=1)),
    "argmax_changed": Opt(_SHARE),
    "per_label_metrics": Opt(Fields({"before": _NonEmpty(_LABEL_METRICS), "after": _NonEmpty(_LABEL_METRICS)})),
    "provenance": Opt(Fields({"inputs": _DictOf(_OneOrList(_INPUT)), "command": Text(),
                              "dataset_version": Opt(Text()), "matching": Opt(AnyJSON())})),
    "data_summary": Opt(AnyJSON()),  # checked by check_data_summary (its quantiles' range depends on input_kind)
    "engine": Opt(Choice("dask")),
    "fitted_on": Opt(Choice("all rows", "sample")),
    "sample": Opt(Fields({"rows": _COUNT, "seed": Int(ge=0, le=2 ** 32 - 1)})),
    # ms / dirichlet with reg='cv': the search, as cv_results_ holds it (None: a grid point not scored)
    "cross_validation": Opt(Fields({
        "grid": _NonEmpty(ListOf(Real(ge=0), length=2)),
        "mean_nll": ListOf(Nullable(Real(ge=0))),
        "best": Int(ge=0),
        "n_folds": Int(ge=2, le=2 ** 53),
        "refined": Nullable(ListOf(Real(ge=0), length=2)),
        "refined_nll": Nullable(Real(ge=0)),
        "reg_lambda": Real(ge=0),
        "reg_mu": Real(ge=0),
    }, rules=(_CVSearchRule(),))),    # --method auto: the cross-validation table and the choice (checked by selection_record, which the
    # manifest loader calls)
    "selection": Opt(AnyJSON()),
})


def damaged_fit_fields(record, *, where: str = "manifest", n_classes=None) -> dict[str, str]:
    """``{field: message}`` of every damaged field of a fit record (``{}``: none), ``field`` the top-level
    key (``"n_samples"``, ``"data_summary"``, an unknown key), ``message`` one line naming the field path,
    what was expected and what was found. Every field of :data:`FIT_RECORD` is checked on its own, so one
    damaged field does not hide another."""
    ctx = _Ctx(where)
    if not isinstance(record, dict):
        try:
            ctx.fail("fit", "a JSON object (dict)", record)
        except ValueError as exc:
            return {"": str(exc)}
    out = {}
    for key in record:
        if key not in FIT_RECORD.fields:
            out[str(key)] = (f"{where}: {_join('fit', str(key))}: expected no such key "
                             f"(known: {', '.join(sorted(FIT_RECORD.fields))}), got an unknown key")
    for key, spec in FIT_RECORD.fields.items():
        try:
            if key not in record:
                if not isinstance(spec, Opt):
                    ctx.fail(_join("fit", key), "this key to be present", got="nothing (missing)")
                continue
            (spec.spec if isinstance(spec, Opt) else spec).check(record[key], _join("fit", key), ctx)
            if key == "data_summary":
                kind = record.get("input_kind")
                check_data_summary(record[key], where=where, n_classes=n_classes,
                                   input_kind=kind if kind in ("logits", "probs", "scores") else None)
            if key == "classes":
                names = record[key]
                if n_classes is not None and len(names) != n_classes:
                    ctx.fail(_join("fit", key), f"{n_classes} class labels (one per column)", got=f"{len(names)}")
                if any(a >= b for a, b in zip(names, names[1:])):
                    ctx.fail(_join("fit", key), "distinct labels in sorted order", names[:6])
        except ValueError as exc:
            out[key] = str(exc)
    return out


def check_fit_record(record, *, where: str = "manifest") -> None:
    """Check a manifest's ``fit`` block (the fit record) field by field against :data:`FIT_RECORD`.

    Raises
    ------
    ValueError
        One line naming the first damaged field, e.g.
        ``manifest: fit.n_samples: expected an integer >= 1 ..., got -5``.
    """
    bad = damaged_fit_fields(record, where=where)
    if bad:
        raise ValueError(next(iter(bad.values())))


#: quantiles of a softmax top-label confidence (class-vector input): probabilities
_PROB_QUANTILES = _Sorted(Real(ge=0, le=1))


def summary_holds_probabilities(summary, input_kind) -> bool:
    """Whether a data summary's quantiles are probabilities (``[0, 1]``), by what the fit read.

    Class vectors ``(n, K)`` (the summary holds ``class_frequencies``, which only 2-D input writes):
    always, whatever ``input_kind`` (``"logits"`` or ``"probs"``), since the quantiles are of the softmax
    top-label confidence. Box scores ``(n,)``: when the summary says ``clip_scores`` (they were clipped
    into ``[0, 1]``, as ``det-ts`` / ``det-beta`` with ``clip_scores=True`` read them) or with
    ``input_kind="probs"``; with ``"logits"`` (raw detector logit scores, ``det-platt``'s default),
    ``"scores"`` (older records) or none, any finite value.
    """
    if isinstance(summary, dict) and ("class_frequencies" in summary or summary.get("clip_scores") is True):
        return True
    return input_kind == "probs"


def check_data_summary(summary, *, where: str = "manifest", input_kind=None, n_classes=None) -> None:
    """Check a fit record's ``data_summary`` field by field before a drift check reads it.

    ``input_kind`` is the fit record's ``fit.input_kind``: the quantiles must lie in ``[0, 1]`` when
    :func:`summary_holds_probabilities` says they are probabilities, and be finite otherwise.
    ``n_classes`` (the manifest's, None: unchecked): ``class_frequencies`` holds one frequency per
    class, summing to 1.

    Raises
    ------
    ValueError
        One line naming the field, e.g. ``manifest: fit.data_summary.n: expected an integer >= 1, got 0``
        or ``manifest: fit.data_summary.confidence_quantiles[3]: expected a finite number in [0, 1] ..., got 1.5``.
    """
    ctx = _Ctx(where)
    DATA_SUMMARY.check(summary, "fit.data_summary", ctx)
    quantiles = _PROB_QUANTILES if summary_holds_probabilities(summary, input_kind) else _QUANTILES
    quantiles.check(summary["confidence_quantiles"], "fit.data_summary.confidence_quantiles", ctx)
    freq = summary.get("class_frequencies")
    if freq is not None and summary.get("clip_scores") is True:
        ctx.fail("fit.data_summary.clip_scores", "no such key in a summary of class vectors (it holds "
                 "class_frequencies; only 1-D box scores are clipped)", got="true")
    if freq is not None and n_classes is not None:
        if len(freq) != n_classes:
            ctx.fail("fit.data_summary.class_frequencies", f"{n_classes} frequencies (one per class, as "
                     f"n_classes)", got=f"{len(freq)}")
        if abs(math.fsum(freq) - 1.0) > 1e-9 * max(n_classes, 1) + 1e-12:
            ctx.fail("fit.data_summary.class_frequencies", "frequencies summing to 1",
                     got=f"a sum of {math.fsum(freq)!r}")
    domains = summary.get("domains")
    if domains is not None:
        if not isinstance(domains, dict):
            ctx.fail("fit.data_summary.domains", "a JSON object {domain: summary}", domains)
        part = Fields({"n": Int(ge=1, le=2 ** 53), "confidence_quantiles": quantiles})
        for key, value in domains.items():
            part.check(value, f"fit.data_summary.domains.{key}", ctx)
