"""Box-score fits (``det-ts`` / ``det-platt``) as a streamed job of :mod:`confcal.passes`.

One job for every engine (the row batches of sources in this process, the partitions of a
Dask cluster): each batch of raw columns (``"logits"`` holds the 1-D scores, ``"labels"``,
optionally ``"domains"``, ``"category_ids"``, ``"sample_weight"``) becomes a
:class:`BoxChunk` (the calibrator validates it and computes the map's 1-D feature ``u``:
the clipped logit of a probability score, or the raw score); the job makes these passes:

1. counts: rows, weight and positives per group (fallback rules, Platt targets, start),
   and the data digest;
2. one per Newton iteration: the per-group sums of
   :func:`~confcal.calibrators._fit.logistic.binary_batch_stats` for the pooled fit and every
   group in lockstep, fed to :func:`~confcal.calibrators._fit.logistic.newton_steps`;
3. the fit record's metrics before and after (pooled).

The grouping rules are those of :func:`confcal.calibrators.grouping.fit_groups` (small or
one-label groups and groups whose rows all weigh 0 use the pooled map), so the result
equals the in-memory fit to rounding.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial
from confcal._digest import digest_part, merge_parts, part_hexdigest

import numpy as np

from confcal.calibrators._fit.tsfit import CalibrationWarning
from confcal.passes import Pass

__all__ = ["BoxChunk", "box_fit_job"]


@dataclass
class BoxChunk:
    """Validated rows of one chunk: feature ``u`` float64 ``(n,)``, labels 0/1 ``(n,)``, weights
    ``(n,)`` or None, group keys (a list of tuples, or None when ungrouped), and how many
    probability scores were exactly 0 or 1 (saturated)."""

    u: np.ndarray
    y: np.ndarray
    w: np.ndarray | None = None
    keys: list | None = None
    saturated: int = 0
    digest_arrays: list | None = None  # the validated columns, in digest order (pass 1)


def chunk_info(chunk: BoxChunk) -> dict:
    """Counts of one chunk: ``{"n", "mass", "pos", "saturated", "groups": {key: [rows, mass, pos mass,
    pos rows]}}`` (group entries count rows of weight > 0 only)."""
    y = chunk.y
    w = np.ones(y.shape[0]) if chunk.w is None else chunk.w
    groups = {}
    if chunk.keys is not None:
        for i, key in enumerate(chunk.keys):
            if w[i] > 0:
                e = groups.setdefault(key, [0, 0.0, 0.0, 0])
                e[0] += 1
                e[1] += float(w[i])
                e[2] += float(w[i]) * float(y[i])
                e[3] += int(y[i])
    return {"n": int(y.shape[0]), "mass": float(w.sum()), "pos": float(np.dot(w, y)), "groups": groups,
            "saturated": int(chunk.saturated)}


def merge_info(a: dict, b: dict) -> dict:
    groups = {k: list(v) for k, v in a["groups"].items()}
    for k, v in b["groups"].items():
        e = groups.setdefault(k, [0, 0.0, 0.0, 0])
        for j in range(4):
            e[j] += v[j]
    return {"n": a["n"] + b["n"], "mass": a["mass"] + b["mass"], "pos": a["pos"] + b["pos"], "groups": groups,
            "saturated": a["saturated"] + b["saturated"]}


def chunk_stats(chunk: BoxChunk, keys: list, slope, bias, t_pos, t_neg):
    """Summed ``(loss, grad, hess)`` of one chunk: index 0 the pooled fit, ``1 + j`` the group ``keys[j]``."""
    from confcal.calibrators._fit.logistic import binary_batch_stats

    loss, grad, hess = binary_batch_stats(chunk.u, chunk.y, slope[:1], bias[:1], t_pos[:1], t_neg[:1],
                                          sample_weight=chunk.w)
    if keys:
        lookup = {k: j for j, k in enumerate(keys)}
        g = np.array([lookup.get(k, -1) for k in chunk.keys], dtype=np.int64)
        m = g >= 0
        lg, gg, hg = binary_batch_stats(chunk.u[m], chunk.y[m], slope[1:], bias[1:], t_pos[1:], t_neg[1:],
                                        group=g[m], sample_weight=None if chunk.w is None else chunk.w[m])
        loss, grad, hess = (np.concatenate([a, b]) for a, b in ((loss, lg), (grad, gg), (hess, hg)))
    return loss, grad, hess


def add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def chunk_metrics(chunk: BoxChunk, cal) -> dict:
    """Sums behind the fit record's pooled metrics, before (raw scores) and after (``cal``)."""
    from confcal.metrics.accumulators import BinnedAccumulator

    u, y = chunk.u, chunk.y
    x = np.stack([np.zeros_like(u), u], axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unseen groups were reported by the fit
        probs = {"before": cal._raw_proba(u)[:, 1], "after": cal._predict_proba(x, **_side(chunk, cal))[:, 1]}
    out = {}
    for which, p in probs.items():
        q = np.clip(np.where(y == 1, p, 1.0 - p), 1e-12, 1.0)
        out[which] = (np.array([u.shape[0], y.sum(), p.sum(), -np.log(q).sum(), ((p - y) ** 2).sum()]),
                      BinnedAccumulator(15).update_pairs(p, y))
    return out


def _side(chunk: BoxChunk, cal) -> dict:
    """The chunk's keys back as the side inputs of ``cal._predict_proba``."""
    if chunk.keys is None:
        return {}
    cols = list(zip(*chunk.keys)) if chunk.keys else [[] for _ in range(int(cal.per_class) + int(cal.by_domain_))]
    side, j = {}, 0
    if cal.per_class:
        side["category_ids"] = np.asarray(cols[j], dtype=np.int64)
        j += 1
    if cal.by_domain_:
        side["domains"] = np.asarray(cols[j], dtype=object)
    return side


def merge_metrics(a: dict, b: dict) -> dict:
    return {k: (a[k][0] + b[k][0], a[k][1].merge(b[k][1])) for k in a}


def _sorted(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=repr)


def _on_batch(batch: dict, first: int, *, cal, fn):
    return fn(cal._box_chunk(batch, first))


def _info_batch(batch: dict, first: int, *, cal, digest=None):
    """Pass 1: the counts of :func:`chunk_info` and the digest (``digest``: a
    :class:`confcal._digest.DataDigest` updated in row order, for in-order engines; else this
    batch's sha256, merged in row order)."""
    chunk = cal._box_chunk(batch, first)
    info = chunk_info(chunk)
    arrays = chunk.digest_arrays
    if digest is not None:
        for i, a in enumerate(arrays):
            digest.update(i, a)
        info["digest"] = None
    else:
        info["digest"] = digest_part(first, [np.asarray(a) for a in arrays])
    return info


def _merge_info_digest(a: dict, b: dict) -> dict:
    out = merge_info(a, b)
    out["digest"] = merge_parts(a["digest"], b["digest"])
    return out


def box_fit_job(cal, *, by_domain: bool, grouped: bool, digest=None, max_iter: int = 200, stacklevel: int = 2):
    """Fit ``cal`` (``det-ts`` or ``det-platt`` on 1-D scores) by passes over its batches; a job of
    :mod:`confcal.passes` (engines send back the merged results).

    Sets the fitted attributes (as :meth:`_set_fitted` does) and ``fit_record_`` (counts, metrics
    and ``data_sha256``; the caller adds its own entries). ``grouped``: the batches carry group keys
    (``per_class`` and/or ``by_domain``). ``digest``: a :class:`confcal._digest.DataDigest` for an
    in-order engine (the digest of the whole arrays), else the batches' mergeable partial digests
    (the same value).
    Returns the number of passes made.

    Raises ``ValueError`` when there are no rows or every weight is 0.
    """
    from confcal.calibrators._fit.logistic import binary_ts_params, newton_steps, platt_params

    desc = f"{cal.method} pass"
    cal.by_domain_ = bool(by_domain)  # read by the group keys of every batch
    n_passes = 1
    info = yield Pass(partial(_info_batch, cal=cal, digest=digest), _merge_info_digest, desc=desc)
    if info is None or info["n"] == 0:
        raise ValueError("scores: expected at least one box, got 0")
    if not info["mass"] > 0:
        raise ValueError("sample_weight: every weight is 0; at least one sample must count")
    from confcal.calibrators._fit.jobs.reduce import check_box_label_values

    check_box_label_values(info["pos"], info["mass"], cal.method, weighted=info["mass"] != info["n"])
    if info["saturated"]:
        warnings.warn(f"scores: {info['saturated']} of {info['n']} probability scores are exactly 0 or 1 "
                      "(saturated: their logit is lost and clipped to the dtype's epsilon); pass the detector's "
                      "raw logits with input_kind='logits' if you have them", CalibrationWarning,
                      stacklevel=stacklevel + 1)
    data_sha256 = (digest.hexdigest() if digest is not None else
                   part_hexdigest(info["digest"]))
    groups = info["groups"]
    weighted = any(e[1] != e[0] for e in groups.values())
    min_samples = cal.min_samples
    fallback: dict = {}
    for key in _sorted(groups):
        rows, mass, _, pos_rows = groups[key]
        if mass < min_samples:
            fallback[key] = f"fewer than min_samples={min_samples} calibration samples"
        elif pos_rows in (0, rows):
            fallback[key] = "one label only"
    keys = [k for k in _sorted(groups) if k not in fallback]
    total = np.array([info["mass"]] + [groups[k][1] for k in keys])
    pos = np.array([info["pos"]] + [groups[k][2] for k in keys])

    if cal.method == "det-ts":
        bounds, fit_bias, targets = (1.0 / cal.t_max, 1.0 / cal.t_min), bool(cal.bias), "hard"
    else:
        bounds = (0.0, math.inf) if cal.increasing else (-math.inf, math.inf)
        fit_bias, targets = True, "platt" if cal.platt_targets else "hard"
    steps = newton_steps(total, pos, slope_bounds=bounds, fit_bias=fit_bias, targets=targets, max_iter=max_iter,
                         stacklevel=stacklevel + 1)
    request = next(steps)
    while True:
        slope, bias, t_pos, t_neg = (np.array(v, dtype=np.float64) for v in request)
        fn = partial(chunk_stats, keys=keys, slope=slope, bias=bias, t_pos=t_pos, t_neg=t_neg)
        sums = yield Pass(partial(_on_batch, cal=cal, fn=fn), add, desc=desc)
        n_passes += 1
        try:
            request = steps.send(sums)
        except StopIteration as stop:
            fits = stop.value
            break

    def params(res, level):
        if cal.method == "det-ts":
            return binary_ts_params(res, cal.t_min, cal.t_max, stacklevel=level + 2)
        return platt_params(res, cal.increasing, stacklevel=level + 1)

    pooled = params(fits[0], stacklevel + 1)
    fitted = {}
    for key, res in zip(keys, fits[1:]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            fitted[key] = params(res, stacklevel + 1)
        for w in caught:
            warnings.warn(f"group {key!r}: {w.message}", CalibrationWarning, stacklevel=stacklevel + 1)
    reasons: dict = {}
    for key, why in fallback.items():
        reasons.setdefault(why, []).append(key)
    for why, ks in reasons.items():
        sizes = [groups[k][1] if weighted and not float(groups[k][1]).is_integer() else int(groups[k][1])
                 for k in ks]
        warnings.warn(f"groups {ks} have {why} (sizes {sizes}); they use the pooled map", CalibrationWarning,
                      stacklevel=stacklevel + 1)
    cal.kind_ = "binary"
    cal.by_domain_ = bool(by_domain)
    cal.pooled_ = pooled
    cal.groups_ = fitted if grouped else {}
    cal.group_counts_ = {k: int(groups[k][0]) for k in _sorted(groups)} if grouped else {}
    cal.fallback_groups_ = list(fallback) if grouped else []
    cal.n_classes_ = 2
    acc = yield Pass(partial(_on_batch, cal=cal, fn=partial(chunk_metrics, cal=cal)), merge_metrics, desc=desc)
    n_passes += 1
    record = {"n_samples": info["n"], "n_left_out": 0, "data_sha256": data_sha256}
    for which, (sums, bins) in acc.items():
        m, n_pos, p_sum, nll_sum, brier_sum = sums
        record[f"metrics_{which}"] = {"precision": float(n_pos / m), "mean_confidence": float(p_sum / m),
                                      "d_ece": bins.ece(), "nll": float(nll_sum / m) + 0.0,
                                      "brier": float(brier_sum / m)}
    cal.fit_record_ = record
    return n_passes
