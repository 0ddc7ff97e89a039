"""The annotation queue: uncertainty from calibrated probabilities, per-tile
aggregation, and a priority queue with per-domain quotas.

Uncertainties (higher = more worth annotating), per box or per sample, from
probabilities ``(n, n_classes)`` (or 1-D positive-class probabilities of a
binary problem, e.g. a calibrated "this box is a true positive" score, read
as the columns ``[1 - p, p]``):

* least confidence ``1 - max_k p_k``;
* margin ``1 - (p_(1) - p_(2))`` (one minus the gap between the two largest);
* entropy ``-sum_k p_k log p_k`` in nats (``0 log 0 = 0``);
* BALD, the mutual information between the label and the model parameters,
  estimated from Monte-Carlo samples ``(n_samples_mc, n, n_classes)`` (MC
  dropout, ensembles): ``H(mean_s p_s) - mean_s H(p_s)`` (Houlsby et al. 2011,
  "Bayesian Active Learning for Classification and Preference Learning";
  Gal, Islam & Ghahramani 2017, "Deep Bayesian Active Learning with Image Data").

Uncalibrated, over-confident scores compress all of these towards 0 and bury
hard tiles; calibrate first (``det-ts``/``det-platt``, per sensor where needed).
"""

from __future__ import annotations

import math

import numpy as np

from confcal._validation import as_numpy, check_domains, check_probs
from confcal._validation import plain

__all__ = ["least_confidence", "margin", "entropy", "bald", "uncertainty", "UNCERTAINTIES",
           "aggregate_by_tile", "AGGREGATIONS", "build_queue", "quota_order", "rank_tiles", "tie_broken_order",
           "TIE_TOLERANCE"]

UNCERTAINTIES = ("least_confidence", "margin", "entropy", "bald")
AGGREGATIONS = ("max", "mean", "sum", "count")


# --------------------------------------------------------------------- uncertainty
def least_confidence(probs) -> np.ndarray:
    """``1 - max_k p_k``, float64 ``(n,)`` in ``[0, 1 - 1/K]``. ``probs``: ``(n, K)`` or 1-D binary."""
    p = check_probs(probs)
    return 1.0 - p.max(axis=1)


def margin(probs) -> np.ndarray:
    """``1 - (p_(1) - p_(2))``, float64 ``(n,)`` in [0, 1]: 1 when the two top classes tie."""
    p = check_probs(probs)
    top2 = -np.partition(-p, 1, axis=1)[:, :2]
    return 1.0 - (top2[:, 0] - top2[:, 1])


def _entropy_rows(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.maximum(-terms.sum(axis=-1), 0.0)


def entropy(probs) -> np.ndarray:
    """Shannon entropy ``-sum_k p_k log p_k`` in nats, float64 ``(n,)`` in ``[0, log K]``."""
    return _entropy_rows(check_probs(probs))


def _check_mc(mc_probs) -> np.ndarray:
    a = as_numpy(mc_probs, "mc_probs")
    if a.ndim == 2:  # (n_samples_mc, n) binary positive-class probabilities
        a = np.stack([1.0 - a.astype(np.float64), a.astype(np.float64)], axis=-1)
    if a.ndim != 3:
        raise ValueError(f"mc_probs: expected shape (n_samples_mc, n, n_classes) or (n_samples_mc, n), "
                         f"got {a.shape}")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"mc_probs: expected at least one MC sample and one item, got shape {a.shape}")
    s, n, k = a.shape
    check_probs(a.reshape(s * n, k), name="mc_probs")
    return a.astype(np.float64)


def bald(mc_probs) -> np.ndarray:
    """BALD (mutual information) from Monte-Carlo samples, float64 ``(n,)`` in ``[0, log K]``.

    ``mc_probs``: ``(n_samples_mc, n, n_classes)``, or ``(n_samples_mc, n)`` binary
    positive-class probabilities. Returns ``H(mean_s p_s) - mean_s H(p_s)`` in
    nats: 0 when all samples agree, large when samples are individually confident
    but disagree. Tiny negative rounding is clipped to 0.
    """
    a = _check_mc(mc_probs)
    mean_p = a.mean(axis=0)
    return np.maximum(_entropy_rows(mean_p) - _entropy_rows(a).mean(axis=0), 0.0)


def uncertainty(probs=None, by: str = "entropy", *, mc_probs=None) -> np.ndarray:
    """Dispatch on ``by`` (one of :data:`UNCERTAINTIES`). ``bald`` needs ``mc_probs``;
    the others use ``probs`` (or the MC mean when only ``mc_probs`` is given)."""
    if by not in UNCERTAINTIES:
        raise ValueError(f"by: expected one of {UNCERTAINTIES}, got {by!r}")
    if by == "bald":
        if mc_probs is None:
            raise ValueError("mc_probs: by='bald' needs Monte-Carlo samples (n_samples_mc, n, n_classes)")
        return bald(mc_probs)
    if probs is None:
        if mc_probs is None:
            raise ValueError("probs: required")
        probs = _check_mc(mc_probs).mean(axis=0)
    return {"least_confidence": least_confidence, "margin": margin, "entropy": entropy}[by](probs)


# --------------------------------------------------------------------- aggregation
def _ids(x, name):
    a = as_numpy(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected shape (n,), got {a.shape}")
    if a.dtype == object:
        a = a.astype(str)
    return a


def aggregate_by_tile(values, tile_ids, how: str = "max", *, threshold: float | None = None, tiles=None):
    """Aggregate per-box values into one value per tile (image).

    Parameters
    ----------
    values : float ``(n_boxes,)`` (an uncertainty, or a calibrated score)
    tile_ids : ``(n_boxes,)`` ids (int or str)
    how : ``"max"``, ``"mean"``, ``"sum"``, or ``"count"`` (number of boxes with
        ``value >= threshold``; ``threshold`` required)
    tiles : optional ``(n_tiles,)`` ids to report, e.g. including tiles without
        boxes; those get 0 (no box, nothing uncertain) and ``n_boxes = 0``

    Returns
    -------
    ``(tile_ids (n_tiles,), aggregated float64 (n_tiles,), n_boxes int64 (n_tiles,))``;
    tiles in sorted id order unless ``tiles`` is given.
    """
    v = as_numpy(values, "values").astype(np.float64)
    t = _ids(tile_ids, "tile_ids")
    if v.ndim != 1 or v.shape != t.shape:
        raise ValueError(f"values: expected shape {t.shape} (one per box), got {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"values: expected finite values, found NaN/inf at index {int(np.flatnonzero(~np.isfinite(v))[0])}")
    if how not in AGGREGATIONS:
        raise ValueError(f"how: expected one of {AGGREGATIONS}, got {how!r}")
    if how == "count" and threshold is None:
        raise ValueError("threshold: how='count' counts boxes with value >= threshold; give a threshold")
    uniq, inv = np.unique(t, return_inverse=True)
    n_boxes = np.bincount(inv, minlength=uniq.size).astype(np.int64)
    if how == "max":
        agg = np.full(uniq.size, -np.inf)
        np.maximum.at(agg, inv, v)
    elif how == "sum":
        agg = np.bincount(inv, weights=v, minlength=uniq.size)
    elif how == "mean":
        agg = np.bincount(inv, weights=v, minlength=uniq.size) / np.maximum(n_boxes, 1)
    else:
        agg = np.bincount(inv, weights=(v >= threshold).astype(np.float64), minlength=uniq.size)
    if tiles is None:
        return uniq, agg, n_boxes
    want = _ids(tiles, "tiles")
    pos = {k.item() if hasattr(k, "item") else k: i for i, k in enumerate(uniq)}
    wanted = {w.item() if hasattr(w, "item") else w for w in want}
    missing = [k for k in pos if k not in wanted]
    if missing:
        raise ValueError(f"tiles: boxes refer to tiles {missing[:5]} that are not in tiles")
    out_agg = np.zeros(want.size)
    out_n = np.zeros(want.size, dtype=np.int64)
    for i, w in enumerate(want):
        j = pos.get(w.item() if hasattr(w, "item") else w)
        if j is not None:
            out_agg[i], out_n[i] = agg[j], n_boxes[j]
    return want, out_agg, out_n


# ----------------------------------------------------------------------- the queue
def _shares(quota, domains_present) -> dict:
    if quota is None:
        return {}
    if isinstance(quota, str):
        if quota != "equal":
            raise ValueError(f"quota: expected 'equal', a share in (0, 1], or a dict, got {quota!r}")
        return {d: 1.0 / len(domains_present) for d in domains_present}
    if isinstance(quota, dict):
        shares = {k: float(v) for k, v in quota.items()}
    else:
        s = float(quota)
        shares = {d: s for d in domains_present}
    for k, v in shares.items():
        if not (0.0 < v <= 1.0) or math.isnan(v):
            raise ValueError(f"quota: share of domain {k!r} must be in (0, 1], got {v!r}")
    total = sum(v for k, v in shares.items() if k in domains_present)
    if total > 1.0 + 1e-9:
        raise ValueError(f"quota: shares of the domains present sum to {total:.6g} > 1; every prefix of the "
                         "queue cannot hold all of them")
    return shares


def quota_order(priority, domains, quota) -> np.ndarray:
    """Order (indices) of items by falling priority, subject to per-domain quotas.

    ``quota`` is ``"equal"`` (each of the D domains gets share 1/D), one share
    for every domain, or ``{domain: share}``; shares of the domains present
    must sum to at most 1. Guarantee: every prefix of length ``m`` of the order
    holds at least ``min(floor(share_d * m), n_d)`` items of domain ``d`` (``n_d``
    = items it has), so no domain is starved however low its priorities.
    Subject to that, the highest-priority item comes next (ties: lower index).
    Within a domain, items always follow falling priority.

    Method: unit-time scheduling with deadlines. Domain ``d``'s ``j``-th item
    must be placed by position ``ceil(j / share_d)``; sum of shares <= 1 makes
    these deadlines feasible, and at each position the highest-priority head is
    taken only if the remaining deadlines stay feasible (the earliest-deadline
    test: the ``i``-th earliest pending deadline is at least ``i`` positions
    ahead); otherwise the domain with the earliest deadline is served.
    """
    p = as_numpy(priority, "priority").astype(np.float64)
    d = check_domains(domains, p.shape[0])
    n = p.shape[0]
    if quota is None or n == 0:
        return np.argsort(-p, kind="stable")
    keys = [k.item() if hasattr(k, "item") else k for k in np.unique(d)]
    shares = _shares(quota, keys)
    queues = {}
    for k in keys:
        idx = np.flatnonzero(d == k)
        queues[k] = idx[np.argsort(-p[idx], kind="stable")]
    # deadline of the j-th item (1-based) of each domain with a share
    deadlines = {}
    for k in keys:
        s = shares.get(k)
        if s is None:
            deadlines[k] = np.zeros(0, dtype=np.int64)
            continue
        j = np.arange(1, min(queues[k].size, int(math.floor(s * n + 1e-9))) + 1)
        deadlines[k] = np.ceil(j / s - 1e-9).astype(np.int64)
    taken = {k: 0 for k in keys}

    def feasible(pos, extra):
        # pos: number of items placed so far, after a hypothetical pick from `extra`
        pend = [deadlines[k][taken[k] + (k == extra):] for k in keys]
        q = np.sort(np.concatenate(pend)) if pend else np.zeros(0)
        return bool(np.all(q - pos >= np.arange(1, q.size + 1)))

    order = np.empty(n, dtype=np.int64)
    for m in range(n):
        heads = [(-p[queues[k][taken[k]]], queues[k][taken[k]], k) for k in keys if taken[k] < queues[k].size]
        heads.sort()
        pick = None
        for _, _, k in heads:
            if feasible(m + 1, k):
                pick = k
                break
        if pick is None:  # cannot happen when shares sum to <= 1; serve the earliest deadline
            pick = min((deadlines[k][taken[k]], k) for _, _, k in heads if taken[k] < deadlines[k].size)[1]
        order[m] = queues[pick][taken[pick]]
        taken[pick] += 1
    return order


def tie_broken_order(priority, secondary=None, tie_tolerance: float = 0.0) -> np.ndarray:
    """Order of items by falling ``priority`` with near-ties broken by falling ``secondary``.

    Items are put in bands of width ``tie_tolerance * max(priority)`` counted down from the
    largest priority (band 0 holds every item within that distance of the top); bands go in
    order, and within a band the larger ``secondary`` comes first, then the larger priority,
    then the lower index. Binary entropy saturates at ``ln 2`` (any box with p near 1/2
    scores about the same), so without this many tiles tie at the top of the queue.
    ``tie_tolerance = 0`` or no ``secondary``: plain falling priority (stable).

    Examples
    --------
    >>> tie_broken_order(np.array([0.690, 0.693, 0.5]), np.array([3.0, 1.0, 9.0]), 0.01).tolist()
    [0, 1, 2]
    """
    p = np.asarray(priority, dtype=np.float64)
    if secondary is None or tie_tolerance <= 0 or p.size == 0:
        return np.argsort(-p, kind="stable")
    width = float(tie_tolerance) * max(float(p.max()), 0.0)
    if not width > 0:  # all priorities <= 0, or a band narrower than the float range: no ties to break
        return np.argsort(-p, kind="stable")
    with np.errstate(over="ignore"):
        band = np.floor((p.max() - p) / width)
    sec = np.asarray(secondary, dtype=np.float64)
    return np.lexsort((np.arange(p.size), -p, -sec, band))


def build_queue(tile_ids, priority, *, domains=None, quota=None, secondary=None, tie_tolerance: float = 0.0,
                **columns) -> dict:
    """The annotation queue: tiles sorted by falling priority, optionally with per-domain quotas.

    Parameters
    ----------
    tile_ids, priority
        ``(n_tiles,)``
    domains
        ``(n_tiles,)`` domain/sensor id per tile (needed with ``quota``)
    quota
        See :func:`quota_order`; None = pure priority order
    secondary, tie_tolerance
        ``(n_tiles,)`` secondary key and relative band width that break
        near-ties of ``priority`` (see :func:`tie_broken_order`); quotas then act on that order
    **columns
        Further ``(n_tiles,)`` arrays carried along (e.g. ``n_boxes``, ``top_score``)

    Returns
    -------
    dict of ndarray
        Arrays in queue order: ``rank`` (1-based), ``image_id``, ``domain`` (if given), ``priority``
        and the extra columns.
    """
    t = _ids(tile_ids, "tile_ids")
    p = as_numpy(priority, "priority").astype(np.float64)
    if p.shape != t.shape:
        raise ValueError(f"priority: expected shape {t.shape} (one per tile), got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError("priority: expected finite values")
    if quota is not None and domains is None:
        raise ValueError("domains: a per-domain quota needs the domain of every tile")
    base = tie_broken_order(p, secondary, tie_tolerance)
    surrogate = np.empty(t.size)
    surrogate[base] = -np.arange(t.size, dtype=np.float64)  # the tie-broken order as a priority
    order = quota_order(surrogate, domains if domains is not None else np.zeros(t.size, np.int64), quota)
    out = {"rank": np.arange(1, t.size + 1), "image_id": t[order]}
    if domains is not None:
        out["domain"] = check_domains(domains, t.size)[order]
    out["priority"] = p[order]
    for name, col in columns.items():
        c = as_numpy(col, name)
        if c.shape[0] != t.size:
            raise ValueError(f"{name}: expected {t.size} rows (one per tile), got {c.shape[0]}")
        out[name] = c[order]
    return out


#: default relative width of the near-tie bands of the queue (1% of the top priority)
TIE_TOLERANCE = 0.01


def rank_tiles(box_probs, tile_ids, *, by: str = "entropy", aggregate: str = "max", domains=None,
               quota=None, threshold: float | None = None, mc_probs=None, tiles=None,
               tie_tolerance: float = TIE_TOLERANCE) -> dict:
    """Per-box calibrated probabilities -> per-tile priority -> queue.

    ``box_probs``: calibrated ``(n_boxes,)`` P(true positive) or ``(n_boxes, K)``;
    ``tile_ids``/``domains``: ``(n_boxes,)`` (a tile must have one domain).
    ``by``: an uncertainty (:data:`UNCERTAINTIES`); ``aggregate``: :data:`AGGREGATIONS`.
    Returns :func:`build_queue` output with columns ``n_boxes``, ``top_score``
    (the tile's largest calibrated box probability; NaN for a tile without boxes) and
    ``total_uncertainty`` (sum of the tile's box uncertainties), the secondary key: tiles
    whose priorities lie within ``tie_tolerance`` (relative to the top priority, default 1%)
    of each other's band are ordered by it, largest first (:func:`tie_broken_order`).
    """
    u = uncertainty(box_probs, by, mc_probs=mc_probs)
    if box_probs is None:
        top = _check_mc(mc_probs).mean(axis=0).max(axis=1)
    elif as_numpy(box_probs, "box_probs").ndim == 1:
        top = check_probs(box_probs)[:, 1]  # binary: the box's P(true positive)
    else:
        top = check_probs(box_probs).max(axis=1)
    t = _ids(tile_ids, "tile_ids")
    if u.shape != t.shape:
        raise ValueError(f"tile_ids: expected {u.shape[0]} ids (one per box), got {t.shape}")
    tiles_u, prio, n_boxes = aggregate_by_tile(u, t, aggregate, threshold=threshold, tiles=tiles)
    _, top_tile, _ = aggregate_by_tile(top, t, "max", tiles=tiles)
    _, total, _ = aggregate_by_tile(u, t, "sum", tiles=tiles)
    top_tile = np.where(n_boxes > 0, top_tile, np.nan)
    tile_dom = None
    if domains is not None:
        d = check_domains(domains, t.size)
        mapping = {}
        for ti, di in zip(t.tolist(), d.tolist()):
            if mapping.setdefault(ti, di) != di:
                raise ValueError(f"domains: tile {plain(ti)} has boxes of two domains "
                                 f"({plain(mapping[ti])}, {plain(di)})")
        tile_dom = np.asarray([mapping.get(k.item() if hasattr(k, "item") else k, "") for k in tiles_u])
    return build_queue(tiles_u, prio, domains=tile_dom, quota=quota, secondary=total, tie_tolerance=tie_tolerance,
                       n_boxes=n_boxes, top_score=top_tile, total_uncertainty=total)
