"""Distributed ``fit``: full-data Newton passes for temperature scaling, a seeded sample otherwise.

For ``ts`` and ``grouped-ts`` every Newton iteration is one map-reduce: each partition
returns the sufficient sums of :func:`confcal.calibrators._tsfit.ts_batch_stats` (weight,
NLL, first and second derivative in ``log T``) and the sums are merged in a tree. The
iterates and the stopping rule are those of the single-process streaming fit, so ``T``
agrees with it to ~1e-12 in ``log T``. ``grouped-ts`` runs every domain's Newton (and the
pooled one) in lockstep: one pass over the data serves all groups still moving.

Every other method needs its calibration set in memory: it is fitted on a seeded uniform
sample of ``sample_rows`` rows (:func:`confcal.dask._sample.sample_rows`).
"""

from __future__ import annotations

import hashlib
import math
import warnings

import numpy as np

from confcal.dask._data import ParquetDataset, column_matrix, partition_arrays, resolve_columns, row_batches
from confcal.dask._evaluate import OVERALL, _scatter, _tree_reduce
from confcal.dask._fit_box import BOX_METHODS, fit_box

__all__ = ["fit", "FULL_DATA_METHODS"]

#: methods whose distributed fit makes full-data passes (the others fit on a sample)
FULL_DATA_METHODS = ("ts", "grouped-ts", *BOX_METHODS)

_WARM_START_ROWS = 50_000


def _partition_info(part, dspec):
    """Rows, per-domain counts and a digest of one partition (the first, cheap pass)."""
    counts = {}
    if dspec is not None:
        d = column_matrix(part, dspec, name="domains")
        values, n = np.unique(d, return_counts=True)
        counts = {(v.item() if hasattr(v, "item") else v): int(c) for v, c in zip(values, n)}
    return {"rows": len(part), "counts": counts}


def _checked(part, specs, input_kind, first_row, validate: bool):
    from confcal._validation import check_labels, check_logits

    lspec, yspec, dspec = specs
    arrays = partition_arrays(part, {"logits": lspec, "labels": yspec, "domains": dspec})
    x = arrays["logits"]
    if validate or input_kind == "probs" or x.dtype not in (np.float32, np.float64):
        x = check_logits(x, input_kind=input_kind)
    y = arrays["labels"]
    y = check_labels(y, x.shape[0], x.shape[1]) if validate else y.astype(np.int64, copy=False)
    return x, y, arrays["domains"]


def _partition_pass(part, specs, input_kind, first_row, validate, requests, summary=None):
    """``{group: TSPassStats}`` of one partition for every requested ``(t, exact, after, before[, near])``,
    and the drift summary's pass-1 (``summary="first"``) or pass-2 (a ``SummaryPass2``) accumulator."""
    from confcal.dask._summary import SummaryPass1
    from confcal.calibrators._tsfit import ts_batch_stats

    x, y, d = _checked(part, specs, input_kind, first_row, validate)
    out = {}
    digest = None
    if validate:
        h = hashlib.sha256()
        for a in (x, y):
            h.update(str(a.dtype).encode() + str(a.shape).encode())
            h.update(np.ascontiguousarray(a).data)  # the same bytes, no copy
        digest = h.hexdigest()
    if summary == "first":
        summary = SummaryPass1(x.shape[1])
    elif summary is not None:
        summary = summary.fresh()
    for b in row_batches(len(y)):
        xb, yb, db = x[b], y[b], (d[b] if d is not None else None)
        for g, (t, exact, after, before, *near) in requests.items():
            rows = slice(None) if g == OVERALL else db == g
            if g != OVERALL and not rows.any():
                continue
            st = ts_batch_stats(xb[rows], yb[rows], t, exact=exact, metrics=after, before=before,
                                near=near[0] if near else None)
            out[g] = out[g].merge(st) if g in out else st
        if summary is not None:
            summary = summary.update(xb, db)
    return {"stats": out, "digest": [digest] if digest else [], "k": x.shape[1], "summary": summary}


def _merge_pass(a, b):
    stats = dict(a["stats"])
    for g, st in b["stats"].items():
        stats[g] = stats[g].merge(st) if g in stats else st
    summary = a["summary"].merge(b["summary"]) if a["summary"] is not None else None
    return {"stats": stats, "digest": a["digest"] + b["digest"], "k": a["k"], "summary": summary}


def _warm_start_part(part, specs, input_kind, every, head=None):
    """Every ``every``-th row of the partition, or its first ``head`` rows, validated (only those:
    the full validation is the first Newton pass's)."""
    from confcal._validation import check_labels, check_logits

    lspec, yspec, _ = specs
    if head is not None:  # a Parquet piece: decode only the pages of its first rows
        part = part.head(lspec.columns + yspec.columns, head)
    arrays = partition_arrays(part, {"logits": lspec, "labels": yspec})
    x, y = np.ascontiguousarray(arrays["logits"][::every]), np.ascontiguousarray(arrays["labels"][::every])
    x = check_logits(x, input_kind=input_kind)
    return x, check_labels(y, x.shape[0], x.shape[1])


class _Passes:
    """Runs distributed passes over ``data`` and keeps what the fit record needs."""

    def __init__(self, data, specs, input_kind, offsets):
        self.parts = data.to_delayed()
        self.specs, self.input_kind, self.offsets = specs, input_kind, offsets
        self.n_passes = 0
        self.validated = False
        self.digest = None
        self.before = None  # (ScoresAccumulator, BinnedAccumulator) at T = 1, pooled
        self.after, self.after_t = None, None
        self.near = None  # NearMetrics of the pooled fit's last float64 pass
        self.k = None
        # the drift summary rides along: pass 1 with the first Newton pass, pass 2 with the next
        self.summary_start = None  # the scattered SummaryPass2 after pass 1
        self.data_summary = None

    def run(self, requests: dict) -> dict:
        import dask

        validate = not self.validated
        summary = None if self.data_summary is not None else (
            "first" if self.summary_start is None else self.summary_start)
        tasks = [dask.delayed(_partition_pass)(p, self.specs, self.input_kind, int(self.offsets[i]), validate,
                                               requests, summary) for i, p in enumerate(self.parts)]
        res = _tree_reduce(tasks, _merge_pass).compute()
        self.n_passes += 1
        if summary == "first":
            from confcal.metrics.drift import N_QUANTILES

            self.summary_start = _scatter(res["summary"].second_pass(N_QUANTILES))
        elif summary is not None:
            self.data_summary = res["summary"].result()
            self.summary_start = None
        self.k = res["k"]
        if validate:
            self.validated = True
            self.digest = hashlib.sha256("".join(res["digest"]).encode()).hexdigest()
        pooled = res["stats"].get(OVERALL)
        if pooled is not None:
            if pooled.before is not None and self.before is None:
                self.before = pooled.before
            if pooled.after is not None:
                self.after, self.after_t = pooled.after, pooled.t
            if pooled.near is not None:
                self.near = pooled.near
        return res["stats"]


def _lockstep_newton(start: dict, passes: _Passes, t_bounds, tol, max_iter, exact):
    """One safeguarded Newton per group (the single-process iteration), all groups evaluated in
    the same passes. Returns ``{group: (t, loss, n_iter)}``."""
    from confcal.calibrators._tsfit import _NEAR_DMAX, _newton_steps

    t_min, t_max = t_bounds
    # the pooled fit runs the single-process iteration exactly (same T, no acceptance at an
    # evaluated point): its likely-last float64 pass gathers the metrics near its T (NearMetrics),
    # resolved at the final T without a pass of their own
    steps = {g: _newton_steps(t0, t_min, t_max, tol, max_iter, exact,
                              accept_evaluated=0.0 if g == OVERALL else 1e-10) for g, t0 in start.items()}
    pending = {g: next(gen) for g, gen in steps.items()}
    done = {}
    prev_exact = None
    while pending:
        requests = {g: (t, ex, False, False) for g, (t, ex) in pending.items() if g != OVERALL}
        if OVERALL in pending:
            t, ex = pending[OVERALL]
            likely_last = ex and (not exact or (prev_exact is not None and abs(t - prev_exact) < 1e-3))
            prev_exact = t if ex else prev_exact
            requests[OVERALL] = (t, ex, False, ex and passes.before is None,
                                 _NEAR_DMAX * math.exp(-t) if likely_last else None)
        stats = passes.run(requests)
        moving = {}
        for g, gen in steps.items():
            if g not in pending:
                continue
            try:
                moving[g] = gen.send(stats[g].means())
            except StopIteration as stop:
                t, loss, n_iter, _ = stop.value
                done[g] = (t, loss, n_iter)
        pending = moving
    return done


def _warm_start(data, specs, input_kind, n_rows, t_bounds):
    """log T of a fit on about 50,000 rows (saves full passes; the Newton that follows is exact),
    and whether finding them took a full pass. A Parquet dataset gives the first rows of 8 pieces
    spread over it (as the single-process fit reads 8 spread-out blocks: no full pass); a Dask
    DataFrame every k-th row of every partition (a full pass)."""
    import dask

    from confcal.calibrators._tsfit import fit_temperature

    if isinstance(data, ParquetDataset):
        pieces = [data.pieces[i] for i in np.unique(np.linspace(0, data.npartitions - 1, 8).astype(int))]
        per = -(-_WARM_START_ROWS // len(pieces))
        tasks = [dask.delayed(_warm_start_part)(p, specs, input_kind, 1, per) for p in pieces]
        full_pass = False
    else:
        every = max(1, n_rows // _WARM_START_ROWS)
        tasks = [dask.delayed(_warm_start_part)(p, specs, input_kind, every) for p in data.to_delayed()]
        full_pass = True
    parts = dask.compute(*tasks)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return math.log(fit_temperature(x, y, t_bounds=t_bounds, warn=False).temperature), full_pass


def _summary(pair) -> dict:
    scores, bins = pair
    r = scores.result()
    return {"accuracy": r["accuracy"], "ece": bins.ece(), "nll": r["nll"], "brier": r["brier"]}


def _manifest(cal, parameters: dict, n_classes: int, record: dict) -> dict:
    from confcal.calibrators.base import MANIFEST_FORMAT, MANIFEST_VERSION

    return {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, "method": cal.method,
            "hyperparameters": cal.get_params(), "parameters": parameters, "n_classes": int(n_classes),
            "fit": record}


def _fit_temperatures(method, cal, data, specs, input_kind, *, tol=1e-12, max_iter=100):
    import dask

    from confcal.calibrators._tsfit import CalibrationWarning, _result
    from confcal.calibrators.base import _library_version
    import datetime as _dt

    from confcal.calibrators import calibrator_from_dict

    counted = not (isinstance(data, ParquetDataset) and specs[2] is None)
    if counted:  # a pass for the rows (Dask DataFrame) or the per-domain counts
        info = dask.compute(*[dask.delayed(_partition_info)(p, specs[2]) for p in data.to_delayed()])
    else:  # rows from the Parquet footers
        info = [{"rows": len(p), "counts": {}} for p in data.pieces]
    rows = np.array([i["rows"] for i in info], dtype=np.int64)
    n = int(rows.sum())
    if n == 0:
        raise ValueError("logits: expected at least 1 sample, the data has no rows")
    counts: dict = {}
    for i in info:
        for g, c in i["counts"].items():
            counts[g] = counts.get(g, 0) + c
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])
    t_bounds = (float(cal.t_min), float(cal.t_max))
    passes = _Passes(data, specs, input_kind, offsets)
    t0, warm_pass = _warm_start(data, specs, input_kind, n, t_bounds) if n > _WARM_START_ROWS else \
        (min(max(0.0, math.log(t_bounds[0])), math.log(t_bounds[1])), False)
    groups = {OVERALL: t0}
    min_samples = int(getattr(cal, "min_samples", 1))
    small = sorted((g for g, c in counts.items() if c < min_samples), key=str)
    groups.update({g: t0 for g in counts if g not in small})
    done = _lockstep_newton(groups, passes, t_bounds, tol, max_iter, exact=False)
    fits = {}
    for g, (t, loss, n_iter) in done.items():
        with warnings.catch_warnings():
            if g != OVERALL:
                warnings.simplefilter("ignore")
            fits[g] = _result(t, loss, n_iter, t_bounds[0], t_bounds[1], True, stacklevel=4)
    pooled = fits[OVERALL]
    t_final = math.log(pooled.temperature)
    after = passes.near.resolve(math.exp(-t_final)) if passes.near is not None else None
    if after is not None and passes.before is not None:
        passes.after, passes.after_t = after, t_final
    if passes.after_t != t_final or passes.before is None:  # T moved too far after the last float64 pass
        st = passes.run({OVERALL: (t_final, True, True, passes.before is None)})[OVERALL]
        pooled = type(pooled)(pooled.temperature, st.means()[0], pooled.n_iter, pooled.at_bound)
    while passes.data_summary is None:  # the fit converged before the summary's second pass
        passes.run({})
    record = {
        "n_samples": n, "data_sha256": passes.digest, "input_kind": input_kind,
        "metrics_before": _summary(passes.before),
        "metrics_after": _summary(passes.after) if method == "ts" else None,  # grouped: set below
        "library_version": _library_version(),
        "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "data_summary": passes.data_summary,
        "engine": "dask", "n_passes": passes.n_passes + int(counted) + int(warm_pass),
    }
    def ts_params(f):
        return {"temperature": f.temperature, "nll": f.nll, "n_iter": f.n_iter, "at_bound": f.at_bound}

    if method == "ts":
        params = ts_params(pooled)
    else:  # the layout of GroupedCalibrator(TemperatureScaling): small domains use the pooled fit
        if small:
            warnings.warn(f"domains {small} have fewer than min_samples={min_samples} calibration samples; "
                          "they use the pooled temperature", CalibrationWarning, stacklevel=3)
        keys = sorted(counts, key=str)
        params = {"pooled": ts_params(pooled),
                  "groups": [[g, ts_params(fits[g])] for g in keys if g in fits],
                  "group_counts": [[g, int(counts[g])] for g in keys],
                  "fallback_groups": small}
    manifest = _manifest(cal, params, passes.k, record)
    if method != "ts":  # the fit record's "after" is that of the per-domain temperatures: one more pass
        manifest["fit"]["metrics_after"] = _metrics_after(data, specs, input_kind, manifest)
        manifest["fit"]["n_passes"] += 1
    return calibrator_from_dict(manifest), manifest["fit"]["n_passes"]


def _metrics_after(data, specs, input_kind, manifest) -> dict:
    import json

    import dask

    from confcal.dask._evaluate import _partition_accumulators

    lspec, yspec, dspec = specs
    calibrator = json.dumps(manifest, sort_keys=True, allow_nan=False)
    parts = [dask.delayed(_partition_accumulators)(p, (lspec, yspec, dspec, None), calibrator, input_kind, 15, None,
                                                   groups=False)
             for p in data.to_delayed()]
    acc = _tree_reduce(parts).compute()[(OVERALL, "calibrated")]  # internal key, before renaming
    return {**{k: v for k, v in acc.scores.result().items() if k == "accuracy"}, "ece": acc.bins.ece(),
            "nll": acc.scores.result()["nll"], "brier": acc.scores.result()["brier"]}


def fit(method: str, data, *, logits: str = "logits", labels: str = "label", domains: str | None = None,
        features: str | None = None, params: dict | None = None, input_kind: str | None = None,
        sample_rows: int = 200_000, seed: int = 0, return_how: bool = False):
    """Fit a calibrator on a Dask DataFrame.

    ``ts`` and ``grouped-ts`` make full-data Newton passes on the cluster (one map-reduce of
    the sufficient sums per iteration; all domains of ``grouped-ts`` in the same passes) and
    give the temperature of the single-process fit to ~1e-12 in ``log T``. Every other method
    is fitted in this process on a seeded uniform sample of ``sample_rows`` rows (all rows
    when there are fewer).

    Parameters
    ----------
    method : str
        A name of :data:`confcal.calibrators.METHODS`.
    data : ParquetDataset or dask.dataframe.DataFrame
        :func:`confcal.dask.read_parquet` of a Parquet dataset (each task reads its piece with
        pyarrow), or any Dask DataFrame.
    logits, labels, domains, features : str
        Column specs (see :func:`confcal.dask.apply`).
    params : dict, optional
        Hyper-parameters of the method.
    input_kind : {"logits", "probs"} or None
        What the ``logits`` column holds (a hyper-parameter, recorded in the manifest;
        ``params["input_kind"]`` wins when both are given); None: the method's default.
    sample_rows : int
        Size of the in-memory sample for methods that are not full-data sums.
    seed : int
        Seed of that sample.
    return_how : bool
        Also return a one-line description of how it was fitted (passes or sample size).

    Returns
    -------
    Calibrator
        Fitted; its fit record has ``engine: "dask"``, the drift ``data_summary`` (of all rows,
        exact, for full-data fits; of the sample otherwise) and, for full-data fits, ``n_passes``
        (full passes over the data, including a row count or a warm start that needed one).
        ``data_sha256`` is a digest of the per-partition digests (not comparable with a
        single-process fit's).

    Raises
    ------
    ValueError
        Unknown method or columns, invalid values in any partition.
    """
    from confcal.calibrators.base import make_calibrator

    if input_kind not in (None, "logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    # None: the method's own default (det-ts: probability scores, like its single-process fit)
    cal = make_calibrator(method, {**({} if input_kind is None else {"input_kind": input_kind}), **(params or {})})
    input_kind = cal.input_kind
    lspec = resolve_columns(data, logits, name="logits")
    yspec = resolve_columns(data, labels, name="labels")
    dspec = resolve_columns(data, domains, name="domains") if domains else None
    fspec = resolve_columns(data, features, name="features") if features else None
    if method in BOX_METHODS and fspec is None and not cal.per_class:  # det-ts / det-platt: confcal.dask._fit_box
        fitted, n_passes = fit_box(method, cal, data, (lspec, yspec, dspec))
        how = f"{method} fitted on all rows in {n_passes} passes over the data"
    elif method in ("ts", "grouped-ts"):
        if method == "grouped-ts" and dspec is None:
            raise ValueError("--domains: grouped-ts needs a domain column")
        if fspec is not None or (method == "ts" and dspec is not None):
            raise ValueError(f"{method} takes no {'features' if fspec is not None else 'domains'}")
        fitted, n_passes = _fit_temperatures(method, cal, data, (lspec, yspec, dspec), input_kind)
        how = f"{method} fitted on all rows in {n_passes} passes over the data"
    else:
        from confcal.dask._sample import sample_rows as draw

        frame = draw(data, sample_rows, seed=seed)
        x = column_matrix(frame, lspec, name="logits")
        y = column_matrix(frame, yspec, name="labels")
        side = {}
        if dspec is not None:
            side["domains"] = column_matrix(frame, dspec, name="domains")
        if fspec is not None:
            side["features"] = column_matrix(frame, fspec, name="features")
        fitted = cal.fit(x, y, **side)
        from confcal.metrics.drift import data_summary

        # the drift reference is the sample itself (its n is the sample's, so the KS threshold is honest)
        summary = data_summary(x, input_kind="probs" if input_kind == "probs" and x.ndim == 2 else "logits",
                               domains=side.get("domains"), features=side.get("features"))
        fitted.fit_record_ = {**(fitted.fit_record_ or {}), "engine": "dask", "data_summary": summary,
                              "sample": {"rows": int(len(frame)), "seed": int(seed)}}
        how = (f"{method} is not a full-data sum: fitted in memory on a seeded sample of {len(frame):,} rows "
               f"(seed {seed}; --sample-rows to change)")
    return (fitted, how) if return_how else fitted
