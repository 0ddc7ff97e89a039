"""Calibration metrics of a whole data set, optionally after a calibrator, in bounded memory.

The protocol behind ``confcal evaluate``, declared once as a job of :mod:`confcal.passes`
(:func:`evaluate_job`) and run by any engine: the rows in batches of a source in this
process (:func:`confcal.evaluation.document.evaluate_sources`), or the partitions of a Dask cluster
(:func:`confcal.dask.evaluate`). Every metric is a mergeable accumulator, overall and per
domain; the equal-mass ECE needs its bin edges first, so the data is read twice (three times
when the edge windows of :class:`confcal.metrics.EqualMassAccumulator` miss), exact, not
estimated. 1-D box scores (probability of a true positive, 0/1 labels) get the metrics of
the audit (:mod:`confcal.evaluation.audit`): D-ECE and the binary Brier score.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np

from confcal._digest import digest_part, merge_parts, part_hexdigest
from confcal.passes import LocalEngine, Pass, run_job
from confcal._validation import plain

__all__ = ["evaluate_stats", "evaluate_job", "EvaluationStats", "ShippedCalibrator", "OVERALL"]

#: key of the all-rows group
OVERALL = "__all__"

_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


class ShippedCalibrator:
    """A fitted calibrator that travels to other processes as its JSON manifest (never a pickle of
    fitted state) and is rebuilt once per process (cached by the manifest's sha256)."""

    def __init__(self, cal=None, text: str | None = None):
        self._cal, self._text = cal, text

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = json.dumps(self._cal.to_dict(), sort_keys=True, allow_nan=False)
        return self._text

    @property
    def method(self) -> str:
        return self._cal.method if self._cal is not None else json.loads(self._text)["method"]

    def get(self):
        if self._cal is None:
            from confcal.io import load_calibrator

            key = hashlib.sha256(self._text.encode()).hexdigest()
            with _CACHE_LOCK:
                cal = _CACHE.get(key)
                if cal is None:
                    cal = _CACHE[key] = load_calibrator(json.loads(self._text))
            self._cal = cal
        return self._cal

    def __reduce__(self):
        return (ShippedCalibrator, (None, self.text))


@dataclass(frozen=True)
class _Context:
    box: bool  # 1-D box scores
    k: int | None  # classes of class vectors
    cal: ShippedCalibrator | None
    input_kind: str
    n_bins: int
    side: tuple  # side inputs handed to the calibrator
    per_domain: bool
    given: tuple = ()  # names of stages whose probabilities the batches carry (column "stage:NAME")
    geometry: int = 0  # box-feature columns of the geometry D-ECE (batch column "geometry"), 0: none
    digest: bool = False  # a mergeable data digest of the rows (logits, labels, domains / features) in pass 1
    other_width: bool = False  # also the digest with the logits at the other float width (see other_width)

    @property
    def stages(self) -> tuple:
        if self.given:
            return self.given
        return ("uncalibrated",) + (("calibrated",) if self.cal is not None else ())


def _accumulator(ctx: _Context):
    from confcal.metrics.accumulators import BoxSummaryAccumulator, SummaryAccumulator

    return (BoxSummaryAccumulator if ctx.box else SummaryAccumulator)(ctx.n_bins)


def _probabilities(ctx: _Context, batch: dict, first: int, wanted, stats: dict):
    """``({stage: probs}, labels, domains, rows as read)`` of one batch, validated."""
    from confcal._validation import check_box_labels, check_domains, check_features, check_labels, check_logits, \
        one_logit_rows

    raw = batch["logits"]
    side = {k: batch[k] for k in ("domains", "features", "category_ids") if k in batch}
    if ctx.given:  # probabilities computed by the caller (box scores in one process: see confcal evaluate)
        y = (check_box_labels(batch["labels"], len(raw), first_row=first) if ctx.box
             else check_labels(batch["labels"], len(raw), ctx.k, first_row=first))
        probs = {w: np.asarray(batch[f"stage:{w}"], dtype=np.float64) for w in wanted}
        x = np.asarray(raw)
    elif ctx.box:
        s = np.asarray(raw)
        if s.dtype == bool or s.dtype.kind not in "fiu" or s.ndim != 1:
            raise ValueError(f"scores: expected 1-D numeric box scores (n_boxes,), got {s.dtype} {s.shape}")
        s = s.astype(np.float64)
        bad = ~np.isfinite(s)
        if bad.any():
            raise ValueError(f"scores: box scores must be finite, got {plain(s[bad][0])} at row {first + int(np.flatnonzero(bad)[0])}")
        y = check_box_labels(batch["labels"], s.shape[0], first_row=first)
        stats["outside"] += int(np.count_nonzero((s < 0) | (s > 1)))
        probs = {}
        if "uncalibrated" in wanted:
            probs["uncalibrated"] = np.clip(s, 0.0, 1.0)  # as the audit: raw scores clipped to [0, 1]
        if ctx.cal is not None and "calibrated" in wanted:
            cal = ctx.cal.get()
            probs["calibrated"] = cal.predict_proba(s, dtype=np.float64, **{k: v for k, v in side.items() if k in ctx.side})[:, 1]
    else:
        x = check_logits(raw, input_kind=ctx.input_kind, first_row=first, whole=False)
        if stats["unit"] is not None:  # pass 1: the probabilities-as-logits rule needs every row
            _unit_flags(np.asarray(raw), stats)
        y = check_labels(batch["labels"], x.shape[0], ctx.k, first_row=first)
        probs = {}
        if "uncalibrated" in wanted and ctx.input_kind == "probs":
            # the given probabilities themselves (validated above), not softmax(log p): a row whose top
            # probability lies on a bin edge stays in its bin, as confcal.metrics.ece(p, y) bins it
            p = np.asarray(raw)
            probs["uncalibrated"] = (one_logit_rows(p, "probs") if p.ndim == 2 and p.shape[1] == 1
                                     else p).astype(np.float64)
        elif "uncalibrated" in wanted:
            from confcal.calibrators.temperature.ts import scaled_softmax_rows

            probs["uncalibrated"] = scaled_softmax_rows(x, 1.0)[0]
        if ctx.cal is not None and "calibrated" in wanted:
            cal = ctx.cal.get()
            probs["calibrated"] = cal._predict_batch(raw, input_kind=ctx.input_kind, first_row=first,
                                                     **{k: v for k, v in side.items() if k in ctx.side})[0]
    d = None
    if "domains" in batch:
        d = check_domains(batch["domains"], y.shape[0])
    if "features" in batch and stats["unit"] is not None:
        check_features(batch["features"], y.shape[0])
    return probs, y, d, (s if ctx.box and not ctx.given else x)


def _unit_flags(x: np.ndarray, stats: dict) -> None:
    """Mergeable facts for the probabilities-as-logits refusal (``check_logits``' rule on all rows):
    every row in [0, 1], every row summing to 1, some entry strictly inside (0, 1)."""
    if not stats["unit"] or x.ndim != 2 or x.dtype.kind != "f":
        stats["unit"] = False
        return
    if not (x.size == 0 or (float(np.min(x)) >= 0 and float(np.max(x)) <= 1)):
        stats["unit"] = False
        return
    tol = 1e-3 if x.dtype == np.float16 else 1e-4
    stats["sums_to_one"] = stats["sums_to_one"] and bool(np.all(np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol))
    stats["inside"] = stats["inside"] or not bool(np.all((x == 0) | (x == 1)))


def _eval_batch(batch: dict, first: int, *, ctx: _Context, start):
    """Accumulators ``{(group, stage): accumulator}`` of one batch (and the pass-1 facts).

    ``start`` is None in pass 1, else ``{key: accumulator}`` of the merged previous pass turned to
    the next one (only the keys that need another pass); each batch fills a copy."""
    pass1 = start is None
    stats = {"accs": {}, "outside": 0, "warnings": {}, "n": 0,
             "unit": (not ctx.box and ctx.input_kind == "logits") if pass1 else None,
             "sums_to_one": True, "inside": False}
    if not pass1:
        stats["unit"] = None
    wanted = set(ctx.stages) if pass1 else {w for _, w in start}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probs, y, d, x = _probabilities(ctx, batch, first, wanted, stats)
    for w in caught:
        stats["warnings"].setdefault((w.category, str(w.message)), None)
    if pass1 and ctx.geometry:  # the features' range: the geometry grid spans it (geometry_ece's default)
        from confcal._validation import check_features

        f = check_features(batch["geometry"], y.shape[0])
        stats["geo_range"] = (f.min(axis=0), f.max(axis=0)) if f.shape[0] else None
    if ctx.digest and pass1:  # mergeable in any order: the same digest on every engine
        stats["digest"] = digest_part(first, _digest_arrays(batch, x, y))
        if ctx.other_width:
            alt = other_width(x)
            stats["alt_ok"] = alt is not None
            stats["digest_alt"] = digest_part(first, _digest_arrays(batch, alt, y)) if alt is not None else None
    stats["n"] = int(y.shape[0])
    rows_of = {OVERALL: slice(None)}
    if d is not None and ctx.per_domain:
        for g in np.unique(d):
            rows_of[g.item() if hasattr(g, "item") else g] = d == g
    for g, rows in rows_of.items():
        for which, p in probs.items():
            key = (g, which)
            if pass1:
                acc = _accumulator(ctx)
            elif key in start:
                acc = copy.deepcopy(start[key])
            else:
                continue  # resolved in an earlier pass
            stats["accs"][key] = acc.update(p[rows], y[rows])
    return stats


#: the batch columns a data digest covers besides the logits and labels (those a fit's digest covers)
_DIGESTED_SIDE = ("domains", "features")


def _digest_arrays(batch, x, y) -> list:
    from confcal._validation import check_domains, check_features

    side = sorted(k for k in batch if k in _DIGESTED_SIDE and batch[k] is not None)
    return [x, y, *(check_domains(batch[k], y.shape[0]) if k == "domains" else check_features(batch[k], y.shape[0])
                    for k in side)]


FITTED_ON_MESSAGE = ("these are the arrays the calibrator was fitted on: the calibrated metrics are "
                     "optimistic; evaluate on a held-out test set")


def other_width(x):
    """``x`` at the other float width, when that holds the same values: float32 -> float64 (always),
    float64 -> float32 when every value is a float32 (a float32 array written to CSV and read back, which
    a text format always reads as float64); None otherwise.

    The data digest covers the dtype (manifests carry it, so its definition stays); this is the second
    digest that recognises the same values read at another width."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x.astype(np.float64)
    if x.dtype != np.float64:
        return None
    y = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        same = np.array_equal(y, x, equal_nan=True)
    return y if same else None


def warn_if_fitted_on(cal, data_sha256: str | None, other_width_sha256: str | None = None) -> None:
    """Warn (``UserWarning``) when ``data_sha256`` is the digest in ``cal``'s fit record: the metrics
    after it are of its own calibration set. One check for every engine and input kind.

    ``other_width_sha256``: the digest of the same rows with the logits at the other float width
    (:func:`other_width`); when it is the fit record's, the warning says that these are the same values
    read at another width (float32 logits written to CSV are read back as float64)."""
    record = getattr(cal, "fit_record_", None) or {}
    fitted = record.get("data_sha256")
    if data_sha256 is not None and fitted == data_sha256:
        warnings.warn(FITTED_ON_MESSAGE, UserWarning, stacklevel=3)
    elif other_width_sha256 is not None and fitted == other_width_sha256:
        warnings.warn(FITTED_ON_MESSAGE + " (the same values: the logits are read here at another float width "
                      "than at fit, e.g. float32 written to CSV and read back as float64, so the data digest "
                      "differs only by its dtype)", UserWarning, stacklevel=3)


def _merge_eval(a: dict, b: dict) -> dict:
    accs = dict(a["accs"])
    for key, acc in b["accs"].items():
        accs[key] = accs[key].merge(acc) if key in accs else acc
    unit = None if a["unit"] is None else (a["unit"] and b["unit"])
    ra, rb = a.get("geo_range"), b.get("geo_range")
    geo = ra if rb is None else rb if ra is None else (np.minimum(ra[0], rb[0]), np.maximum(ra[1], rb[1]))
    return {"geo_range": geo, "accs": accs, "outside": a["outside"] + b["outside"], "warnings": {**a["warnings"], **b["warnings"]},
            "n": a["n"] + b["n"], "unit": unit, "sums_to_one": a["sums_to_one"] and b["sums_to_one"],
            "inside": a["inside"] or b["inside"], "digest": merge_parts(a.get("digest"), b.get("digest")),
            **_merge_alt(a, b)}


def _merge_alt(a: dict, b: dict) -> dict:
    """The other-width digest of both parts, or none when either part has a value that is no float32."""
    if "alt_ok" not in a and "alt_ok" not in b:
        return {}
    ok = a.get("alt_ok", True) and b.get("alt_ok", True)
    return {"alt_ok": ok, "digest_alt": merge_parts(a.get("digest_alt"), b.get("digest_alt")) if ok else None}


@dataclass
class EvaluationStats:
    """The merged statistics of an evaluate job: what :func:`confcal.evaluation.document.evaluation_document`
    turns into the ``evaluate`` document (one builder for every engine).

    ``first`` / ``last``: ``{(group, stage): accumulator}`` after pass 1 (scores, equal-width bins) and
    after the last pass (equal-mass bins); ``group`` is :data:`OVERALL` or a domain id, ``stage`` a key
    of ``names`` (``{stage: shown name}``, in order). ``geometry``: ``{shown name: (count, conf, hits)}``
    cell sums of the geometry D-ECE, or None."""

    n_samples: int
    box: bool
    n_classes: int | None
    n_bins: int
    names: dict
    first: dict
    last: dict
    n_outside: int
    n_passes: int
    geometry: dict | None = None
    geometry_features: tuple = ()
    geometry_bins: tuple = (5, 5)
    #: the data digest of the evaluated rows (:mod:`confcal._digest`, as a fit record's ``data_sha256``),
    #: None unless the job was asked for it
    data_sha256: str | None = None
    #: the same with the logits at the other float width (:func:`other_width`), None unless asked for
    #: and every value holds at that width
    data_sha256_other_width: str | None = None


def _geo_batch(batch: dict, first: int, *, ctx: _Context, edges, n_bins: int):
    from confcal._validation import check_features
    from confcal.metrics.detection_geometry import geometry_cells

    stats = {"outside": 0, "unit": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # issued once from pass 1
        probs, y, _, _ = _probabilities(ctx, batch, first, set(ctx.stages), stats)
    f = check_features(batch["geometry"], y.shape[0])
    return {w: geometry_cells(p, y, f, edges, n_bins) for w, p in probs.items()}


def _merge_geo(a: dict, b: dict) -> dict:
    return {w: tuple(x + z for x, z in zip(a[w], b[w])) for w in a}


def evaluate_job(*, n_classes: int | None, cal=None, input_kind: str = "logits", n_bins: int = 15,
                 side: tuple = (), per_domain: bool = False, digest: bool = False, given: tuple = (),
                 geometry: tuple = (), geometry_bins: tuple = (5, 5), other_width: bool = False):
    """The evaluate job (a generator of :class:`confcal.passes.Pass`; run it with
    :func:`confcal.passes.run_job` on an engine).

    Batches hold ``"logits"`` (class vectors ``(rows, n_classes)``, or 1-D box scores when
    ``n_classes`` is None), ``"labels"`` and optionally ``"domains"`` / ``"features"`` /
    ``"category_ids"``. ``cal``: a fitted calibrator (or :class:`ShippedCalibrator`) whose stage is
    measured too, taking the ``side`` inputs; ``per_domain``: metrics per ``"domains"`` value as well;
    ``digest``: also the data digest of the rows (``EvaluationStats.data_sha256``; merged in any order,
    so every engine gives the fit record's ``data_sha256`` of the same rows); ``other_width``: with
    ``digest``, also the digest with the logits at the other float width
    (``EvaluationStats.data_sha256_other_width``, see :func:`other_width`);
    ``given``: stage names whose probabilities the batches carry as ``"stage:NAME"`` columns (then
    no calibrator is run); ``geometry``: names of the ``"geometry"`` columns (box features) of a
    geometry D-ECE over ``geometry_bins`` = (confidence bins, bins per feature), one more pass.

    Returns an :class:`EvaluationStats` (the merged accumulators);
    :func:`confcal.evaluation.document.evaluation_document` makes the ``evaluate`` document of it.
    Warnings of the calibrator are re-issued once each.

    Raises ``ValueError`` on invalid rows (named by their index in the whole data), no rows, or
    probabilities passed as logits.
    """
    if input_kind not in ("logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    shipped = None if cal is None else (cal if isinstance(cal, ShippedCalibrator) else ShippedCalibrator(cal))
    ctx = _Context(box=n_classes is None, k=n_classes, cal=None if given else shipped, input_kind=input_kind,
                   n_bins=int(n_bins), side=tuple(side), per_domain=bool(per_domain), given=tuple(given),
                   geometry=len(geometry), digest=bool(digest), other_width=bool(other_width))
    first = yield Pass(partial(_eval_batch, ctx=ctx, start=None), _merge_eval, desc="evaluate pass")
    if first is None or first["n"] == 0:
        raise ValueError("logits: expected at least 1 sample, the data has no rows")
    if first["unit"] and first["sums_to_one"] and first["inside"]:
        raise ValueError("logits: every row is in [0, 1] and sums to 1, so these look like "
                         "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                         "to use their log as logits")
    last, n_passes = dict(first["accs"]), 1
    start = {key: copy.deepcopy(a).start_next_pass() for key, a in first["accs"].items() if a.needs_another_pass}
    while start:  # pass 2 (equal-mass bins), and a third when the edge windows miss
        done = yield Pass(partial(_eval_batch, ctx=ctx, start=start), _merge_eval, desc="evaluate pass")
        n_passes += 1
        last.update(done["accs"])
        start = {key: copy.deepcopy(a).start_next_pass() for key, a in done["accs"].items() if a.needs_another_pass}
    for category, message in first["warnings"]:
        warnings.warn(message, category, stacklevel=2)
    if given:
        names = {w: w for w in given}
    else:
        names = {"uncalibrated": "uncalibrated", **({"calibrated": shipped.method} if shipped is not None else {})}
    geo = None
    if ctx.geometry:  # the grid over the features' range (pass 1), as geometry_ece on the whole arrays
        from confcal.metrics.detection_geometry import feature_bin_edges

        lo, hi = first["geo_range"]
        edges = feature_bin_edges(np.zeros((0, ctx.geometry)), geometry_bins[1],
                                  feature_ranges=list(zip(lo.tolist(), hi.tolist())))
        cells = yield Pass(partial(_geo_batch, ctx=ctx, edges=edges, n_bins=int(geometry_bins[0])), _merge_geo,
                           desc="evaluate pass")
        n_passes += 1
        geo = {names[w]: c for w, c in cells.items()}
    return EvaluationStats(n_samples=int(first["n"]), box=ctx.box, n_classes=n_classes, n_bins=ctx.n_bins,
                           names=names, first=first["accs"], last=last, n_outside=int(first["outside"]),
                           n_passes=n_passes, geometry=geo, geometry_features=tuple(geometry),
                           geometry_bins=tuple(int(b) for b in geometry_bins),
                           data_sha256=part_hexdigest(first.get("digest"), 2) if ctx.digest else None,
                           data_sha256_other_width=part_hexdigest(first["digest_alt"], 2)
                           if ctx.digest and ctx.other_width and first.get("alt_ok") else None)


def evaluate_stats(logits, labels, *, cal=None, side=None, taken=None, per_domain: bool = False,
                   input_kind: str = "logits", n_bins: int = 15, batch_rows: int | None = None, progress=False,
                   other_width: bool = False):
    """:func:`evaluate_job` on a :class:`confcal.passes.LocalEngine`: ``(EvaluationStats, digest)``.

    As :func:`confcal.evaluation.document.evaluate_sources` (same arguments and errors); ``taken``: the names of ``side`` handed
    to the calibrator (default all; ``domains`` may be given for ``per_domain`` metrics only); ``other_width``:
    also ``stats.data_sha256_other_width`` (:func:`evaluate_job`).
    """
    from confcal.io import load_calibrator
    from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, open_source

    xs, ys = open_source(logits, name="logits"), open_source(labels, name="labels")
    side = {key: open_source(value, name=key) for key, value in (side or {}).items()}
    if xs.ndim != 2:
        raise ValueError(f"logits: expected shape (n_samples, n_classes), got {xs.shape}")
    n, k = xs.shape[0], max(2, xs.shape[1])  # (n, 1): a one-logit model, its two-class rows [0, z]
    if n == 0:
        raise ValueError(f"logits: expected at least 1 sample, got shape {xs.shape}")
    if cal is not None:
        cal = load_calibrator(cal, n_classes=k) if not hasattr(cal, "_predict_batch") else cal
    rows = batch_rows or batch_rows_for([xs, ys, *side.values()], DEFAULT_BATCH_BYTES // 4)
    engine = LocalEngine({"logits": xs, "labels": ys, **side}, batch_rows=rows, progress=progress)
    stats = run_job(evaluate_job(n_classes=k, cal=cal, input_kind=input_kind, n_bins=n_bins,
                                 side=tuple(side) if taken is None else tuple(taken), per_domain=per_domain,
                                 digest=True, other_width=other_width), engine)
    return stats, stats.data_sha256
