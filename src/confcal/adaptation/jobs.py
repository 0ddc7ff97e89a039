"""Prior estimation as streamed jobs of :mod:`confcal.passes`: each EM iteration is one pass.

A pass maps a batch of rows to, for every prior being estimated (the pooled one, keyed ``None``,
and one per domain id), the sums of an EM step (:func:`.estimate.em_step`) for the point estimate
and ``n_boot`` Poisson-bootstrap replicates at once, plus the predicted-class counts; merging adds
them. Memory is one batch of rows and ``(1 + n_boot, n_classes)`` numbers per prior, at any row count.

The bootstrap is the Poisson bootstrap (each row enters replicate ``b`` ``Poisson(1)`` times), with the
weight a function of ``(random_state, global row, b)`` (a SplitMix64 hash), not of the batching, so
every engine and batch size draws the same replicates. Intervals are percentile intervals over the
replicates; they hold the calibration set (source prior, calibrator, confusion matrix) fixed.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from confcal.adaptation.estimate import (bbse_weights, check_em_settings, check_posteriors, check_source_prior,
                                         em_step, em_update)
from confcal.passes import Pass

__all__ = ["poisson_weights", "em_job", "bbse_job", "count_job", "batch_posteriors", "POOLED"]

#: the key of the prior of all rows together
POOLED = None

_M1, _M2, _GAMMA = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
# Poisson(1) CDF at 0..19 (the tail beyond is below 1e-18, past float64's resolution of a uniform)
_POISSON_CDF = np.cumsum([np.exp(-1.0) / np.prod(np.arange(1, k + 1, dtype=np.float64)) for k in range(20)])


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GAMMA
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def poisson_weights(random_state: int, first_row: int, n_rows: int, n_boot: int) -> np.ndarray:
    """Poisson(1) bootstrap weights ``(n_rows, n_boot)`` float64 of global rows
    ``[first_row, first_row + n_rows)``: a function of ``(random_state, row, b)`` only.

    >>> w = poisson_weights(0, 0, 100_000, 2)
    >>> bool(abs(w.mean() - 1) < 0.01), bool(abs(w.var() - 1) < 0.02)
    (True, True)
    >>> bool((poisson_weights(0, 10, 5, 2) == w[10:15]).all())
    True
    """
    rows = np.arange(first_row, first_row + n_rows, dtype=np.uint64)[:, None]
    idx = rows * np.uint64(max(n_boot, 1)) + np.arange(n_boot, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        key = _splitmix(np.uint64(random_state) * _M1 + np.uint64(0x5851F42D4C957F2D))
        u = (_splitmix(idx ^ key) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return np.searchsorted(_POISSON_CDF, u, side="right").astype(np.float64)


def batch_posteriors(batch: dict, first_row: int, *, calibrator=None, input_kind=None, n_classes: int):
    """Calibrated posteriors ``(n, K)`` of one batch: the ``"probs"`` column checked, or the calibrator
    applied to ``"logits"`` (with the side inputs it takes); errors name the global row."""
    if "probs" in batch:
        return check_posteriors(batch["probs"], n_classes, first_row=first_row)
    side = {k: batch[k] for k in ("domains", "features") if k in batch
            and k in (*calibrator.side_inputs, *calibrator.optional_side_inputs)}
    probs, _ = calibrator._predict_batch(batch["logits"], input_kind=input_kind, first_row=first_row, **side)
    return np.asarray(probs, dtype=np.float64)


def _keys(batch: dict, n: int, by_domain: bool):
    """``[(key, row index or slice), ...]``: the pooled prior, then one per domain id in the batch."""
    out = [(POOLED, slice(None))]
    if by_domain:
        from confcal._validation import check_domains

        d = check_domains(batch["domains"], n)
        ids, inverse = np.unique(d, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(ids) + 1))
        out += [(ids[g].item(), order[bounds[g]:bounds[g + 1]]) for g in range(len(ids))]
    return out


def _rows(batch: dict) -> int:
    return len(next(iter(batch.values())))


def _em_map(batch, first, *, posteriors, ratios, n_boot, random_state, by_domain, n_classes, chunk=8192):
    n = _rows(batch)
    ones = np.ones((1 + n_boot, n_classes))
    out = {}
    for lo in range(0, n, chunk):  # a chunk at a time: the posteriors and (rows, 1 + n_boot) temporaries stay small
        p = posteriors({k: v[lo:lo + chunk] for k, v in batch.items()}, first + lo)
        w = np.ones((p.shape[0], 1 + n_boot))
        if n_boot:
            w[:, 1:] = poisson_weights(random_state, first + lo, p.shape[0], n_boot)
        sub = {"domains": batch["domains"][lo:lo + chunk]} if by_domain else {}
        for key, rows in _keys(sub, p.shape[0], by_domain):
            pk, wk = p[rows], w[rows]
            s, ws, ll = em_step(pk, ratios.get(key, ones), wk)
            counts = np.bincount(np.argmax(pk, axis=1), minlength=n_classes).astype(np.float64)
            out[key] = _add(out[key], (s, ws, ll, counts)) if key in out else (s, ws, ll, counts)
    return out


def _add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, v in b.items():
        out[key] = _add(out[key], v) if key in out else v
    return out


def _columns(posterior_column: str, by_domain: bool, extra=()) -> tuple:
    return (posterior_column, *(("domains",) if by_domain else ()), *extra)


def _percentiles(reps: np.ndarray, confidence: float):
    """Percentile interval ``(low, high)`` per class over finite replicate rows (NaN when none)."""
    reps = reps[np.isfinite(reps).all(axis=1)]
    if reps.shape[0] == 0:
        nan = np.full(reps.shape[1], np.nan)
        return nan, nan
    a = (1 - confidence) / 2
    return np.quantile(reps, a, axis=0), np.quantile(reps, 1 - a, axis=0)


def em_job(*, n_classes: int, source_prior, posteriors, posterior_column: str = "logits", by_domain: bool = False,
           smoothing: float = 0.0, tol: float = 1e-7, max_iter: int = 1000, n_boot: int = 0, confidence: float = 0.95,
           random_state: int = 0, extra_columns=()):
    """EM (Saerens et al. 2002) for the pooled prior and, with ``by_domain``, one prior per domain id,
    each with ``n_boot`` bootstrap replicates run alongside; each iteration is one :class:`Pass`.

    ``posteriors(batch, first_row) -> (n, K)`` gives a batch's calibrated source posteriors (picklable,
    e.g. a :func:`functools.partial` of :func:`batch_posteriors`). Every prior stops by the stopping rule of
    :func:`.estimate.em_prior`, each replicate by the same rule; passes continue while one is running,
    and at most ``max_iter`` passes are made.

    Returns ``{key: record}`` (key :data:`POOLED` or a domain id), ``record`` with ``prior``, ``low``,
    ``high`` (``None`` without replicates), ``n_rows``, ``n_iter``, ``converged``, ``log_likelihood`` (mean
    per row) and ``predicted_counts`` (arg-max counts of the source posteriors).
    """
    ps = check_source_prior(source_prior, n_classes)
    smoothing, tol, max_iter = check_em_settings(smoothing, tol, max_iter)
    ratios: dict = {}
    active: dict = {}
    n_iter: dict = {}
    first_counts = None
    for it in range(1, max_iter + 1):
        stats = yield Pass(partial(_em_map, posteriors=posteriors, ratios=dict(ratios), n_boot=n_boot,
                                   random_state=random_state, by_domain=by_domain, n_classes=n_classes),
                           _merge, columns=_columns(posterior_column, by_domain, extra_columns), desc="EM")
        if not stats:
            raise ValueError("logits: expected at least 1 row of unlabelled data, got 0")
        if first_counts is None:
            first_counts = {k: v[3] for k, v in stats.items()}
        for key, (s, ws, ll, _) in stats.items():
            r = ratios.get(key, np.ones((1 + n_boot, n_classes)))
            act = active.get(key, np.ones(1 + n_boot, dtype=bool))
            with np.errstate(invalid="ignore", divide="ignore"):
                new = em_update(r, s, ws, ps, smoothing)  # a replicate without rows: NaN, dropped below
            old = r * ps
            step = np.abs(new - old).sum(axis=1)
            upd = act & np.isfinite(step)
            r = r.copy()
            r[upd] = new[upd] / ps
            act = act & ~(step <= tol) & np.isfinite(step)
            ratios[key], active[key] = r, act
            if act[0] or key not in n_iter:
                n_iter[key] = it
        if not any(a.any() for a in active.values()):
            break
    final = yield Pass(partial(_em_map, posteriors=posteriors, ratios=dict(ratios), n_boot=0,
                               random_state=random_state, by_domain=by_domain, n_classes=n_classes),
                       _merge, columns=_columns(posterior_column, by_domain, extra_columns), desc="EM likelihood")
    out = {}
    for key, r in ratios.items():
        pri = r * ps
        low, high = _percentiles(pri[1:], confidence) if n_boot else (None, None)
        ll = final[key][2][0] / final[key][1][0]
        out[key] = {"prior": pri[0], "low": low, "high": high, "n_rows": int(round(final[key][1][0])),
                    "n_iter": n_iter[key], "converged": not bool(active[key][0]), "log_likelihood": float(ll),
                    "predicted_counts": first_counts[key]}
    return out


def _count_map(batch, first, *, posteriors, n_boot, random_state, by_domain, n_classes, chunk=8192):
    out = {}
    for lo in range(0, _rows(batch), chunk):
        p = posteriors({k: v[lo:lo + chunk] for k, v in batch.items()}, first + lo)
        hot = np.zeros_like(p)
        hot[np.arange(p.shape[0]), np.argmax(p, axis=1)] = 1.0
        w = np.ones((p.shape[0], 1 + n_boot))
        if n_boot:
            w[:, 1:] = poisson_weights(random_state, first + lo, p.shape[0], n_boot)
        sub = {"domains": batch["domains"][lo:lo + chunk]} if by_domain else {}
        for key, rows in _keys(sub, p.shape[0], by_domain):
            c = (w[rows].T @ hot[rows],)  # (1 + n_boot, K) predicted-class counts per replicate
            out[key] = _add(out[key], c) if key in out else c
    return out


def count_job(*, n_classes, posteriors, posterior_column="logits", by_domain=False, n_boot=0, random_state=0,
              extra_columns=()):
    """One pass: ``{key: (1 + n_boot, K)}`` arg-max counts of the calibrated posteriors per prior key
    (row 0 the data, then the bootstrap replicates)."""
    stats = yield Pass(partial(_count_map, posteriors=posteriors, n_boot=n_boot, random_state=random_state,
                               by_domain=by_domain, n_classes=n_classes),
                       _merge, columns=_columns(posterior_column, by_domain, extra_columns), desc="BBSE counts")
    if not stats:
        raise ValueError("logits: expected at least 1 row of unlabelled data, got 0")
    return {k: v[0] for k, v in stats.items()}


def bbse_job(*, confusion, confidence: float = 0.95, **kw):
    """BBSE (Lipton et al. 2018) for the pooled prior and each domain, with a bootstrap interval over the
    target rows (the confusion matrix held fixed): one pass. Records as :func:`em_job`'s (``n_iter`` 1,
    ``converged`` True, ``log_likelihood`` None), plus ``weights``, the unclipped ``C^-1 mu``."""
    c = np.asarray(confusion, dtype=np.float64)
    source = c.sum(axis=0) / c.sum()
    counts = yield from count_job(**kw)
    out = {}
    for key, m in counts.items():
        pri = np.full(m.shape, np.nan)
        w0 = None
        for b in range(m.shape[0]):
            if not m[b].sum() > 0:
                continue
            w = bbse_weights(c, m[b])
            w0 = w if b == 0 else w0
            v = np.clip(w, 0, None) * source
            if v.sum() > 0:
                pri[b] = v / v.sum()
        if not np.isfinite(pri[0]).all():
            raise ValueError(f"domains: every BBSE weight of {'the pooled rows' if key is None else f'domain {key!r}'} "
                             "is <= 0, no prior to renormalise; use EM")
        low, high = _percentiles(pri[1:], confidence) if m.shape[0] > 1 else (None, None)
        out[key] = {"prior": pri[0], "low": low, "high": high, "n_rows": int(round(m[0].sum())), "n_iter": 1,
                    "converged": True, "log_likelihood": None, "predicted_counts": m[0], "weights": w0}
    return out
