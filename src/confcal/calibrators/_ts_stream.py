"""Temperature fits over row batches of sources in this process: pooled (:func:`fit_temperature_stream`)
and per domain in lockstep (:func:`fit_grouped_temperature_stream`)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from confcal.calibrators._ts_batch import StreamedTemperatureFit, TSPassStats, _metric_pair, _summary, ts_batch_stats
from confcal.calibrators._tsfit import (
    _NEAR_DMAX,
    _SMALL_ELEMS,
    _WARM_START_ROWS,
    DEFAULT_T_BOUNDS,
    CalibrationWarning,
    TemperatureFit,
    _newton,
    _newton_steps,
    _one_thread,
    _result,
    fit_temperature,
)

__all__ = ["fit_temperature_stream", "fit_grouped_temperature_stream", "StreamedGroupedFit"]


def fit_temperature_stream(logits, labels, *, sample_weight=None, t_bounds=DEFAULT_T_BOUNDS, tol: float = 1e-12,
                           max_iter: int = 100, warn: bool = True, input_kind: str = "logits",
                           metrics: bool = True, n_bins: int = 15, batch_rows: int | None = None,
                           batch_bytes: int | None = None, progress=False) -> StreamedTemperatureFit:
    """:func:`fit_temperature` over row batches of a source: bounded memory, same ``T``.

    Each Newton iteration is one pass summing :func:`ts_batch_stats` over the batches;
    inputs are validated batch by batch on the first pass (same messages as
    :func:`confcal._validation.check_logits` / ``check_labels``, rows named by their index
    in the whole data). With ``metrics=True`` the summary metrics before (``T = 1``) and
    after come from the float64 passes of the fit itself, not from extra passes.

    Parameters
    ----------
    logits, labels, sample_weight : sources, specs (``"val.parquet:logit_*"``) or arrays;
        aligned row by row (:func:`confcal.sources.open_source`)
    t_bounds, tol, max_iter, warn : as :func:`fit_temperature`
    input_kind : ``"logits"`` or ``"probs"`` (their log is used, per batch)
    batch_rows / batch_bytes : batch size (default ~64 MB of rows)
    progress : tqdm bars on stderr per pass (``None``: when stderr is a terminal)

    Returns a :class:`StreamedTemperatureFit`.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(500, 4)) * 3; y = rng.integers(0, 4, size=500)
    >>> res = fit_temperature_stream(z, y, batch_rows=64)
    >>> bool(abs(np.log(res.fit.temperature / fit_temperature(z, y).temperature)) < 1e-9)
    True
    >>> sorted(res.metrics_after)
    ['accuracy', 'brier', 'ece', 'nll']
    """
    from confcal._digest import DataDigest
    from confcal._progress import progress_bar
    from confcal._validation import check_labels, check_logits
    from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, check_aligned, iter_aligned, open_source

    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    xs = open_source(logits, name="logits")
    ys = open_source(labels, name="labels")
    ws = None if sample_weight is None else open_source(sample_weight, name="sample_weight")
    if xs.ndim != 2:
        check_logits(xs.read(0, 1) if xs.n_rows else xs.to_numpy())  # the usual shape message
        raise ValueError(f"logits: expected shape (n_samples, n_classes), got {xs.shape}")
    n, k = xs.shape
    if n == 0:
        raise ValueError(f"logits: expected at least 1 sample, got shape {xs.shape}")
    if k < 2:
        raise ValueError(f"logits: expected n_classes >= 2, got shape {xs.shape}")
    if ws is not None and (ws.dtype == bool or ws.dtype.kind not in "fiu"):
        raise TypeError(f"sample_weight: expected a float array of shape ({n},), got dtype {ws.dtype}")
    sources = {"logits": xs, "labels": ys, "sample_weight": ws}
    check_aligned(sources)  # before the warm start reads row blocks: the message counts whole sources
    rows = batch_rows or batch_rows_for([xs, ys], batch_bytes or DEFAULT_BATCH_BYTES)
    work_dtype = np.float64 if xs.dtype == np.float64 or input_kind == "probs" else np.float32
    state = {"pass": 0, "validated": False, "before": None, "after": None, "after_t": None, "near": None,
             "prev_exact_t": None}
    digest = DataDigest(2 if ws is None else 3)  # as Calibrator.fit: logits, labels[, weights]

    def batches():
        validate = not state["validated"]
        for first, b in iter_aligned(sources, rows):
            x = b["logits"]
            if input_kind == "probs" or x.dtype not in (np.float32, np.float64) or x.ndim != 2:
                x = check_logits(x, input_kind=input_kind, first_row=first, whole=False)
            # float logits: NaN, +inf and all -inf rows make the pass's sums non-finite, and
            # one_pass then names the first bad row (check_logits on that batch), at no extra cost
            y = check_labels(b["labels"], x.shape[0], k, first_row=first)
            w = b["sample_weight"]
            if validate and w is not None:
                w = np.asarray(w, dtype=np.float64)
                if w.ndim != 1:
                    raise ValueError(f"sample_weight: expected shape ({n},) (one weight per sample), got "
                                     f"{(n, *w.shape[1:])}")
                bad = ~np.isfinite(w) | (w < 0)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise ValueError(f"sample_weight: expected finite weights >= 0, got {w[i]!r} at index {first + i}")
            if validate:
                digest.update(0, x)
                digest.update(1, y)
                if w is not None:
                    digest.update(2, w)
            yield first, x, y, w

    def one_pass(t, exact, with_metrics, near=None):
        state["pass"] += 1
        want_before = (with_metrics or near is not None) and exact and state["before"] is None
        check_unit = not state["validated"]
        total = TSPassStats(t=t)
        with progress_bar(n, f"temperature pass {state['pass']}", progress) as bar:
            for first, x, y, w in batches():
                st = ts_batch_stats(x, y, t, sample_weight=w, exact=exact, metrics=with_metrics and exact,
                                    before=want_before, n_bins=n_bins, first_row=first, check_unit=check_unit,
                                    near=near)
                if not all(math.isfinite(v) for v in (st.loss, st.grad, st.hess)):
                    check_logits(x, first_row=first, whole=False)  # names the bad row, if any
                total.merge(st)
                bar.update(x.shape[0])
        if not state["validated"]:
            state["validated"] = True
            if not total.weight > 0:
                raise ValueError("sample_weight: every weight is 0; at least one sample must count")
            if total.unit_rows and input_kind == "logits":
                _refuse_probabilities(xs, rows)
        if want_before:
            state["before"] = total.before
        if total.after is not None:
            state["after"], state["after_t"] = total.after, t
        state["near"] = total.near
        return total

    def dt_stats(t, exact):
        # the first float64 pass after float32 ones (which ran until the step was below 1e-5) is
        # usually the last, as is a float64 pass close to the previous one (Newton converges
        # quadratically): such a pass also gathers the metrics before (T = 1) and near its T,
        # resolved at the final T
        prev, state["prev_exact_t"] = state["prev_exact_t"], t if exact else state["prev_exact_t"]
        likely_last = exact and (not exact_input or (prev is not None and abs(t - prev) < 1e-3))
        near = _NEAR_DMAX * math.exp(-t) if metrics and likely_last else None
        return one_pass(t, exact, False, near).means()

    exact = exact_input = work_dtype == np.float64
    t = min(max(0.0, math.log(t_min)), math.log(t_max))
    if n > _WARM_START_ROWS and sample_weight is None:
        # a fit on spread-out row blocks lands near the optimum and saves full passes
        per = _WARM_START_ROWS // 8
        starts = np.linspace(0, n - per, 8).astype(np.int64)
        sub_x = np.concatenate([check_logits(xs.read(a, a + per), input_kind=input_kind, first_row=int(a),
                                             whole=False) for a in starts])
        sub_y = np.concatenate([check_labels(ys.read(a, a + per), per, k, first_row=int(a)) for a in starts])
        sub = fit_temperature(sub_x, sub_y, t_bounds=(t_min, t_max), warn=False)
        t = math.log(sub.temperature)
    with _one_thread(n * k <= _SMALL_ELEMS):
        # the same iteration as fit_temperature, so the same T (no verifying pass at the end)
        t, loss, n_iter, evaluated = _newton(dt_stats, t, t_min, t_max, tol, max_iter, exact)
        fit = _result(t, loss, n_iter, t_min, t_max, warn, stacklevel=3)
        t_final = t if not fit.at_bound else math.log(fit.temperature)
        if metrics:
            near = state["near"]
            after = near.resolve(math.exp(-t_final)) if near is not None else None
            if after is None or state["before"] is None:  # T moved too far after the last float64 pass
                one_pass(t_final, True, True)
            else:
                state["after"], state["after_t"] = after, t_final
    return StreamedTemperatureFit(
        fit=fit, n_samples=int(n), n_classes=int(k), data_sha256=digest.hexdigest(),
        metrics_before=_summary(state["before"]) if metrics else None,
        metrics_after=_summary(state["after"]) if metrics else None, n_passes=state["pass"])


def _refuse_probabilities(xs, rows) -> None:
    """Every row is in [0, 1]; if every row also sums to 1 and some entry is strictly inside
    (0, 1), these are probabilities, not logits (the rule of ``check_logits``)."""
    inside = False
    for first in range(0, xs.n_rows, rows):
        x = xs.read(first, first + rows)
        tol = 1e-3 if x.dtype == np.float16 else 1e-4
        if not np.all(np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol):
            return
        inside = inside or not np.all((x == 0) | (x == 1))
    if inside:
        raise ValueError("logits: every row is in [0, 1] and sums to 1, so these look like "
                         "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                         "to use their log as logits")


# ----------------------------------------------------------------------------- grouped, streamed

@dataclass(frozen=True)
class StreamedGroupedFit:
    """Result of :func:`fit_grouped_temperature_stream`."""

    pooled: TemperatureFit
    groups: dict  # {domain id: TemperatureFit} for the domains with their own fit
    counts: dict  # {domain id: n calibration samples}, ids sorted
    fallback: dict  # {domain id: reason} for the domains that use the pooled fit
    n_samples: int
    n_classes: int
    data_sha256: str
    metrics_before: dict | None
    metrics_after: dict | None
    n_passes: int


def _plain_id(v):
    return v.item() if hasattr(v, "item") else v


def fit_grouped_temperature_stream(logits, labels, domains, *, t_bounds=DEFAULT_T_BOUNDS, min_samples: int = 1,
                                   tol: float = 1e-12, max_iter: int = 100, input_kind: str = "logits",
                                   metrics: bool = True, n_bins: int = 15, batch_rows: int | None = None,
                                   batch_bytes: int | None = None, progress=False) -> StreamedGroupedFit:
    """A pooled temperature and one per domain, every Newton iteration sharing the passes over a source.

    The multiclass analogue of :func:`ts_batch_stats` per group: each pass reads a batch once,
    sorts its rows by domain and sums each group's statistics at that group's current ``log T``
    (and the pooled ones at the pooled ``log T``); each group runs the Newton iteration of
    :func:`fit_temperature` (:func:`_newton_steps`), so the temperatures equal the in-memory
    per-domain fits. Domains with fewer than ``min_samples`` rows use the pooled fit. With
    ``metrics``, one more pass gathers the summary metrics at ``T = 1`` and with each row at its
    domain's temperature (the fit record of ``grouped-ts``).

    Parameters
    ----------
    logits, labels, domains : aligned sources, specs or arrays; ``domains`` holds str or int ids
    t_bounds, tol, max_iter : as :func:`fit_temperature` (every group)
    min_samples : domains with fewer rows fall back to the pooled temperature
    input_kind, n_bins, batch_rows, batch_bytes, progress : as :func:`fit_temperature_stream`

    Returns a :class:`StreamedGroupedFit`; raises ``ValueError`` on invalid inputs (rows named
    by their index in the whole data).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, size=600); d = rng.integers(0, 2, size=600)
    >>> z = (1 + 3 * d)[:, None] * (rng.normal(size=(600, 3)) + np.eye(3)[y])
    >>> res = fit_grouped_temperature_stream(z, y, d, batch_rows=50)
    >>> {k: round(f.temperature, 3) for k, f in res.groups.items()}, res.counts
    ({0: 1.09, 1: 3.981}, {0: 290, 1: 310})
    >>> bool(abs(res.groups[1].temperature / fit_temperature(z[d == 1], y[d == 1]).temperature - 1) < 1e-9)
    True
    """
    from confcal._digest import DataDigest
    from confcal._progress import progress_bar
    from confcal._validation import check_domains, check_labels, check_logits
    from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, check_aligned, iter_aligned, open_source

    t_min, t_max = (float(b) for b in t_bounds)
    if not (0 < t_min < t_max and math.isfinite(t_max)):
        raise ValueError(f"t_bounds: expected 0 < T_min < T_max < inf, got {t_bounds!r}")
    xs, ys = open_source(logits, name="logits"), open_source(labels, name="labels")
    ds = open_source(domains, name="domains")
    if xs.ndim != 2 or xs.shape[0] == 0 or xs.shape[1] < 2:
        raise ValueError(f"logits: expected shape (n_samples, n_classes) with n_samples >= 1 and "
                         f"n_classes >= 2, got {xs.shape}")
    n, k = xs.shape
    sources = {"logits": xs, "labels": ys, "domains": ds}
    check_aligned(sources)  # before the warm start reads row blocks: the message counts whole sources
    rows = batch_rows or batch_rows_for(list(sources.values()), batch_bytes or DEFAULT_BATCH_BYTES)
    exact0 = xs.dtype == np.float64 or input_kind == "probs"
    state = {"pass": 0, "validated": False}
    digest = DataDigest(3)  # as Calibrator.fit: logits, labels, domains
    counts: dict = {}

    def batches(desc):
        validate = not state["validated"]
        unit = True
        state["pass"] += 1
        with progress_bar(n, f"{desc} {state['pass']}", progress) as bar:
            for first, b in iter_aligned(sources, rows):
                x = b["logits"]
                if validate or input_kind == "probs" or x.dtype not in (np.float32, np.float64):
                    x = check_logits(x, input_kind=input_kind, first_row=first, whole=False)
                    unit = unit and bool(np.min(x) >= 0) and bool(np.max(x) <= 1)
                y = check_labels(b["labels"], x.shape[0], k, first_row=first)
                d = check_domains(b["domains"], x.shape[0]) if validate else b["domains"]
                ids, codes = np.unique(d, return_inverse=True)
                ids = [_plain_id(v) for v in ids]
                order = np.argsort(codes, kind="stable")
                bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(ids)))])
                if validate:
                    digest.update(0, x)
                    digest.update(1, y)
                    digest.update(2, d)
                    for g, key in enumerate(ids):
                        counts[key] = counts.get(key, 0) + int(bounds[g + 1] - bounds[g])
                yield x, y, ids, order, bounds
                bar.update(x.shape[0])
        if validate:
            state["validated"] = True
            if unit and input_kind == "logits":
                _refuse_probabilities(xs, rows)

    def newton_pass(requests):
        """``{group: (t, exact)}`` -> ``{group: TSPassStats}`` (group None: the pooled fit)."""
        totals = {g: TSPassStats(t=t) for g, (t, _) in requests.items()}
        for x, y, ids, order, bounds in batches("grouped temperature pass"):
            if None in requests:
                t, exact = requests[None]
                totals[None].merge(ts_batch_stats(x, y, t, exact=exact, check_unit=False))
            xo, yo = None, None
            for g, key in enumerate(ids):
                if key not in requests and state["validated"]:
                    continue
                if xo is None:
                    xo, yo = x[order], y[order]
                lo, hi = bounds[g], bounds[g + 1]
                t, exact = requests.get(key, requests.get(None))  # a group first seen starts at the pooled t
                st = ts_batch_stats(xo[lo:hi], yo[lo:hi], t, exact=exact, check_unit=False)
                totals.setdefault(key, TSPassStats(t=t)).merge(st)
        return totals

    # every group and the pooled fit start from the same point (a fit on spread-out row blocks)
    t0 = min(max(0.0, math.log(t_min)), math.log(t_max))
    if n > _WARM_START_ROWS:
        per = _WARM_START_ROWS // 8
        starts = np.linspace(0, n - per, 8).astype(np.int64)
        sub_x = np.concatenate([check_logits(xs.read(a, a + per), input_kind=input_kind, first_row=int(a),
                                             whole=False) for a in starts])
        sub_y = np.concatenate([check_labels(ys.read(a, a + per), per, k, first_row=int(a)) for a in starts])
        t0 = math.log(fit_temperature(sub_x, sub_y, t_bounds=(t_min, t_max), warn=False).temperature)
    steps = {None: _newton_steps(t0, t_min, t_max, tol, max_iter, exact0)}
    pending = {None: next(steps[None])}
    done = {}
    small = set()
    with _one_thread(n * k <= _SMALL_ELEMS):
        while pending:
            stats = newton_pass(pending)
            if len(steps) == 1:  # the first pass found the groups: each starts where the pooled fit did
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
            prefix = "" if g is None else f"domain {g!r}: "
            warnings.warn(f"{prefix}{w.message}", CalibrationWarning, stacklevel=3)
    pooled = fits.pop(None)
    counts = {key: counts[key] for key in _sorted_ids(counts)}
    fits = {key: fits[key] for key in counts if key in fits}
    fallback = {g: f"fewer than min_samples={min_samples} calibration samples" for g in counts if g in small}
    before = after = None
    if metrics:
        before, after = _metric_pair(n_bins), _metric_pair(n_bins)
        for x, y, ids, order, bounds in batches("grouped temperature metrics pass"):
            xo, yo = x[order], y[order]
            for g, key in enumerate(ids):
                lo, hi = bounds[g], bounds[g + 1]
                t = math.log(fits.get(key, pooled).temperature)
                st = ts_batch_stats(xo[lo:hi], yo[lo:hi], t, metrics=True, before=True, n_bins=n_bins,
                                    check_unit=False)
                for mine, theirs in ((before, st.before), (after, st.after)):
                    mine[0].merge(theirs[0])
                    mine[1].merge(theirs[1])
    return StreamedGroupedFit(pooled=pooled, groups=fits, counts=counts, fallback=fallback, n_samples=int(n),
                              n_classes=int(k), data_sha256=digest.hexdigest(),
                              metrics_before=_summary(before) if metrics else None,
                              metrics_after=_summary(after) if metrics else None, n_passes=state["pass"])


def _sorted_ids(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # mixed types: a stable order all the same
        return sorted(keys, key=repr)
