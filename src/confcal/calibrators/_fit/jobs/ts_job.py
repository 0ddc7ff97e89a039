"""Temperature scaling, pooled and per domain, as one streamed job of :mod:`confcal.passes`.

Every Newton iteration of :func:`confcal.calibrators._fit.tsfit.fit_temperature` is one pass: each
batch returns the sums of :func:`~confcal.calibrators._fit.tsfit.ts_batch_stats` (weight, NLL and
its first two derivatives in ``log T``) for the pooled fit and for every domain at that
domain's current ``log T`` (all domains in lockstep: one pass serves every group still
moving); the merged sums drive the same safeguarded Newton, so ``T`` equals the in-memory
fit's to ~1e-12 in ``log T`` on any engine. The first pass also validates the rows, counts the
domains and finds the groups; the pooled fit's likely-last float64 pass gathers the fit
record's metrics near its ``T`` (:class:`~confcal.calibrators._fit.tsfit.NearMetrics`), so ``ts``
needs no pass at the final ``T``; ``grouped-ts`` makes one more for the metrics with each row
at its domain's temperature.
"""

from __future__ import annotations

from confcal._digest import digest_part, merge_parts, part_hexdigest
from confcal.calibrators.protocol.group_keys import group_key
import math
import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np

from confcal.calibrators._fit.jobs.ts_batch import _summary, ts_batch_stats
from confcal.calibrators._fit.tsfit import _NEAR_DMAX, _WARM_START_ROWS, CalibrationWarning, _newton_steps, _result, _rowmax, \
    fit_temperature
from confcal.passes import Pass, SpreadBlocks

__all__ = ["temperature_job", "TemperatureJobResult"]

#: the pooled fit's key among the groups
POOLED = None


@dataclass(frozen=True)
class TemperatureJobResult:
    pooled: object  # TemperatureFit
    groups: dict  # {domain: TemperatureFit} (domains with their own fit)
    counts: dict  # {domain: rows}, ids sorted
    fallback: dict  # {domain: reason}
    n_samples: int
    n_classes: int
    data_sha256: str
    metrics_before: dict
    metrics_after: dict


def _plain(v):
    return group_key(v, where="domains")


def _sorted_ids(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # mixed types: a stable order all the same
        return sorted(keys, key=repr)


def _check_weights(w, first: int) -> np.ndarray:
    w = np.asarray(w)
    if w.dtype == bool or w.dtype.kind not in "fiu":
        raise TypeError(f"sample_weight: expected a float array of shape (n_samples,), got dtype {w.dtype}")
    w = w.astype(np.float64, copy=False)
    if w.ndim != 1:
        raise ValueError(f"sample_weight: expected shape (n_samples,) (one weight per sample), got {w.shape}")
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sample_weight: expected finite weights >= 0, got {float(w[i])!r} at index {first + i}")
    return w


def _ts_batch(batch: dict, first: int, *, input_kind: str, validate: bool, by_domain: bool, requests: dict,
              wildcard=None, n_bins: int = 15, digest=None):
    """``{"stats": {group: TSPassStats}, ...}`` of one batch for every requested group
    ``{group: (t, exact, after, before, near)}``; ``wildcard``: a request for every domain seen.
    ``digest``: a :class:`confcal._digest.DataDigest` updated in row order on the validating pass
    (in-order engines: the digest of the whole arrays), else the batch's mergeable partial digest."""
    from confcal._validation import check_domains, check_labels, check_logits

    x = batch["logits"]
    # float logits need no check of their own: NaN, +inf and all -inf rows make the pass's sums
    # non-finite, and then check_logits names the first bad row (below), at no extra pass
    if input_kind == "probs" or x.dtype not in (np.float32, np.float64) or x.ndim != 2 or x.shape[1] < 2:
        x = check_logits(x, input_kind=input_kind, first_row=first, whole=False)
    y = batch["labels"]
    if validate:
        y = check_labels(y, x.shape[0], x.shape[1], first_row=first)
    else:  # checked on the validating pass; one-hot rows (2-D) become their class index as there
        y = np.argmax(y, axis=1) if np.ndim(y) == 2 else y
        y = y.astype(np.int64, copy=False)
    d = None
    if by_domain:
        d = check_domains(batch["domains"], x.shape[0]) if validate else np.asarray(batch["domains"])
    w = batch.get("sample_weight")
    if w is not None:
        w = _check_weights(w, first) if validate else np.asarray(w, dtype=np.float64)
    out = {"stats": {}, "n": int(x.shape[0]), "k": int(x.shape[1]), "counts": {}, "digest": None,
           "unit": False, "sums_to_one": True, "inside": False}  # unit: checked in the validating pass only
    if validate:
        arrays = (x, y) + (() if d is None else (d,)) + (() if w is None else (w,))  # as Calibrator.fit
        if digest is not None:
            for i, a in enumerate(arrays):
                digest.update(i, a)
        else:
            out["digest"] = digest_part(first, arrays)
        out["unit"] = input_kind == "logits"  # every row in [0, 1]: set from the pooled stats below
    rows_of = {}
    if d is not None:
        ids, codes = np.unique(d, return_inverse=True)
        for j, g in enumerate(ids):
            rows = codes == j
            rows_of[_plain(g)] = rows
            if validate:
                out["counts"][_plain(g)] = int(np.count_nonzero(rows))
    if POOLED in requests:
        t, exact, after, before, near = requests[POOLED]
        out["stats"][POOLED] = ts_batch_stats(x, y, t, sample_weight=w, exact=exact, metrics=after, before=before,
                                              n_bins=n_bins, first_row=first, near=near,
                                              check_unit=validate and out["unit"])
    for g, rows in rows_of.items():
        req = requests.get(g, wildcard)
        if req is not None:
            t, exact, after, before, near = req
            out["stats"][("group", g)] = ts_batch_stats(x[rows], y[rows], t, exact=exact, metrics=after,
                                                        before=before, n_bins=n_bins, near=near, check_unit=False)
    if not all(math.isfinite(v) for st in out["stats"].values() for v in (st.loss, st.grad, st.hess)):
        check_logits(x, input_kind="logits", first_row=first, whole=False)  # names the bad row, if any
    if out["unit"]:  # (the probabilities-as-logits rule of check_logits, over every batch)
        raw = np.asarray(batch["logits"])
        unit = raw.dtype.kind == "f" and (out["stats"][POOLED].unit_rows if POOLED in out["stats"] else
                                          bool(np.min(raw) >= 0) and bool(np.max(raw) <= 1))
        out["unit"] = unit
        if unit:
            tol = 1e-3 if raw.dtype == np.float16 else 1e-4
            out["sums_to_one"] = bool(np.all(np.abs(raw.sum(axis=1, dtype=np.float64) - 1.0) <= tol))
            out["inside"] = not bool(np.all((raw == 0) | (raw == 1)))
    return out


def _merge_ts(a: dict, b: dict) -> dict:
    stats = dict(a["stats"])
    for g, st in b["stats"].items():
        stats[g] = stats[g].merge(st) if g in stats else st
    counts = dict(a["counts"])
    for g, c in b["counts"].items():
        counts[g] = counts.get(g, 0) + c
    return {"stats": stats, "n": a["n"] + b["n"], "k": a["k"], "counts": counts,
            "digest": merge_parts(a["digest"], b["digest"]),
            "unit": a["unit"] and b["unit"], "sums_to_one": a["sums_to_one"] and b["sums_to_one"],
            "inside": a["inside"] or b["inside"]}


def _warm_start(blocks: dict, input_kind: str, t_bounds, t_default: float) -> tuple[float, bool]:
    """log T of a fit on spread-out row blocks (saves full passes; the Newton that follows is
    exact), and whether the rows are float64. Bad rows there are left to the first pass, which
    names them by their index in the whole data."""
    from confcal._validation import check_labels, check_logits

    x = blocks.get("logits")
    exact = x is not None and np.asarray(x).dtype == np.float64
    if x is None or len(x) == 0:
        return t_default, exact
    z = np.asarray(x)
    try:
        if input_kind == "logits" and z.dtype in (np.float32, np.float64) and z.ndim == 2 and z.shape[1] >= 2:
            # check_logits' row tests as one row max (NaN, +inf or an all -inf row make it
            # non-finite), in a fifth of its time
            if not np.isfinite(_rowmax(z)).all():
                return t_default, exact
        else:
            z = check_logits(x, input_kind=input_kind, whole=False)
        y = check_labels(blocks["labels"], z.shape[0], z.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return math.log(fit_temperature(z, y, t_bounds=t_bounds, warn=False).temperature), exact
    except (ValueError, TypeError):
        return t_default, exact


def temperature_job(*, t_bounds, tol: float = 1e-12, max_iter: int = 100, input_kind: str = "logits",
                    by_domain: bool = False, min_samples: int = 1, n_bins: int = 15, weighted: bool = False,
                    digest=None, n_rows: int | None = None):
    """Fit ``T`` (and one per ``"domains"`` value with ``by_domain``) on batches of ``"logits"``
    ``(rows, n_classes)`` and ``"labels"`` (and ``"sample_weight"`` with ``weighted``, pooled fit
    only); a job of :mod:`confcal.passes` (run with :func:`confcal.passes.run_job`). Domains with
    fewer than ``min_samples`` rows use the pooled fit. Returns a :class:`TemperatureJobResult`.

    ``digest``: a :class:`confcal._digest.DataDigest` for an in-order engine (the digest of the
    whole arrays, as :meth:`Calibrator.fit` computes it); without it, the batches' mergeable
    partial digests (:func:`confcal._digest.digest_part`): the same value, whatever the
    batching or partitioning. ``n_rows``: the row count when the engine knows it; up to ``_WARM_START_ROWS``
    rows (or with weights) the fit starts at ``T = 1`` as :func:`fit_temperature` does, else
    from a fit on spread-out row blocks.

    Raises ``ValueError`` on invalid rows (named by their index in the whole data), no rows,
    probabilities passed as logits, or weights that are all 0.
    """
    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    if weighted and by_domain:
        raise ValueError("sample_weight: the grouped temperature job takes no weights")
    t_default = min(max(0.0, math.log(t_min)), math.log(t_max))
    if weighted or (n_rows is not None and n_rows <= _WARM_START_ROWS):
        blocks = yield SpreadBlocks(("logits",), rows=1, n_blocks=1)  # the dtype only
        x = blocks.get("logits")
        t0, exact_input = t_default, x is not None and np.asarray(x).dtype == np.float64
    else:
        blocks = yield SpreadBlocks(("logits", "labels"), rows=_WARM_START_ROWS)
        t0, exact_input = _warm_start(blocks, input_kind, (t_min, t_max), t_default)
    exact0 = exact_input or input_kind == "probs"
    cols = ("logits", "labels") + (("domains",) if by_domain else ()) + (("sample_weight",) if weighted else ())
    state = {"before": None, "after": None, "after_t": None, "near": None, "info": None}

    def one_pass(requests, wildcard=None):
        validate = state["info"] is None
        res = yield Pass(partial(_ts_batch, input_kind=input_kind, validate=validate, by_domain=by_domain,
                                 requests=requests, wildcard=wildcard, n_bins=n_bins,
                                 digest=digest if validate else None), _merge_ts, columns=cols,
                         desc="temperature pass")
        if res is None or res["n"] == 0:
            raise ValueError("logits: expected at least 1 sample, the data has no rows")
        if validate:
            pooled = res["stats"].get(POOLED)
            if weighted and pooled is not None and not pooled.weight > 0:
                raise ValueError("sample_weight: every weight is 0; at least one sample must count")
            if res["unit"] and res["sums_to_one"] and res["inside"]:
                raise ValueError("logits: every row is in [0, 1] and sums to 1, so these look like "
                                 "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                                 "to use their log as logits")
            state["info"] = res
        pooled = res["stats"].get(POOLED)
        if pooled is not None:
            if pooled.before is not None and state["before"] is None:
                state["before"] = pooled.before
            if pooled.after is not None:
                state["after"], state["after_t"] = pooled.after, pooled.t
            if pooled.near is not None:
                state["near"] = pooled.near
        return {(g[1] if isinstance(g, tuple) else g): st for g, st in res["stats"].items()}

    # the pooled fit runs the single-process iteration exactly; its likely-last float64 pass
    # gathers the metrics near its T (NearMetrics), resolved at the final T without a pass
    steps = {POOLED: _newton_steps(t0, t_min, t_max, tol, max_iter, exact0)}
    pending = {POOLED: next(steps[POOLED])}
    done, prev_exact, small, first = {}, None, set(), True
    while pending:
        requests = {g: (t, ex, False, False, None) for g, (t, ex) in pending.items() if g is not POOLED}
        if POOLED in pending:
            t, ex = pending[POOLED]
            likely_last = ex and (not exact_input or (prev_exact is not None and abs(t - prev_exact) < 1e-3))
            prev_exact = t if ex else prev_exact
            # the metrics at T = 1 come with the pass that also gathers the metrics near the final T
            # (one top-label test, no pass of their own), or from a pass at T = 1 itself (its own terms)
            requests[POOLED] = (t, ex, False, ex and state["before"] is None and (likely_last or t == 0.0),
                                _NEAR_DMAX * math.exp(-t) if likely_last else None)
        wildcard = (t0, exact0, False, False, None) if first and by_domain else None
        stats = yield from one_pass(requests, wildcard)
        if first:  # the groups are known: each starts where the pooled fit did, from this pass's sums
            first = False
            counts = state["info"]["counts"]
            small = {g for g, c in counts.items() if c < min_samples}
            for g in counts:
                if g not in small:
                    steps[g] = _newton_steps(t0, t_min, t_max, tol, max_iter, exact0)
                    pending[g] = next(steps[g])
        moving = {}
        for g, request in pending.items():
            try:
                moving[g] = steps[g].send(stats[g].means())
            except StopIteration as stop:
                done[g] = stop.value
        pending = moving
    fits = {}
    for g, (t, loss, n_iter, _) in done.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            fits[g] = _result(t, loss, n_iter, t_min, t_max, True)
        for w in caught:
            prefix = "" if g is POOLED else f"domain {g!r}: "
            warnings.warn(f"{prefix}{w.message}", CalibrationWarning, stacklevel=2)
    pooled = fits.pop(POOLED)
    info = state["info"]
    counts = {g: info["counts"][g] for g in _sorted_ids(info["counts"])}
    groups = {g: fits[g] for g in counts if g in fits}
    fallback = {g: f"fewer than min_samples={min_samples} calibration samples" for g in counts if g in small}
    t_final = math.log(pooled.temperature)
    if not by_domain:
        near = state["near"]
        after = near.resolve(math.exp(-t_final)) if near is not None else None
        if after is not None and state["before"] is not None:
            state["after"], state["after_t"] = after, t_final
        if state["after_t"] != t_final or state["before"] is None:  # T moved too far after the last float64 pass
            stats = yield from one_pass({POOLED: (t_final, True, True, state["before"] is None, None)})
            pooled = type(pooled)(pooled.temperature, stats[POOLED].means()[0], pooled.n_iter, pooled.at_bound)
        after = state["after"]
    else:  # the fit record's "after" has each row at its domain's temperature: one more pass
        requests = {POOLED: (t_final, True, False, state["before"] is None, None)}
        group_t = {g: (math.log(groups.get(g, pooled).temperature), True, True, False, None) for g in counts}
        stats = yield from one_pass({**requests, **group_t})
        after = None
        for g in counts:
            pair = stats[g].after
            if after is None:
                after = pair
            else:
                after[0].merge(pair[0])
                after[1].merge(pair[1])
    sha = (digest.hexdigest() if digest is not None else
           part_hexdigest(info["digest"]))
    return TemperatureJobResult(pooled=pooled, groups=groups, counts=counts, fallback=fallback,
                                n_samples=int(info["n"]), n_classes=int(info["k"]), data_sha256=sha,
                                metrics_before=_summary(state["before"]), metrics_after=_summary(after))
