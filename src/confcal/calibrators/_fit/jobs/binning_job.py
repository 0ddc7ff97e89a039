"""Histogram binning (one-vs-rest and top-label) on every row, from exact mergeable counts: a job
of :mod:`confcal.passes`.

:func:`confcal.calibrators._fit.univariate.fit_histogram` needs the equal-mass edges of each score
column (order statistics: the inverted-CDF rank ``ceil(i n / n_bins) - 1`` for ``i = 1..n_bins-1``,
and the largest score) and then the count and positives of every bin. Both are found exactly
by passes of counts (Zadrozny & Elkan, ICML 2001, for the map):

* an order statistic by radix selection on the scores' float64 bit patterns (for scores
  ``>= 0`` their order is the order of the values): each pass counts, per wanted rank, the next
  8 bits of the scores that share the prefix found so far (256 counts, merged by adding); once a
  prefix holds at most :data:`COLLECT_AT` scores, the next pass returns them and the rank is read
  off directly;
* then one pass of bin counts and positives (``bincount``, exact in float64 below 2**53 rows);
* then one pass of the fit record's metrics after the map (``accuracy_change``,
  ``argmax_changed``, metrics before and after, as the in-memory fit records).

The counts pass also finds, per quantile, the smallest score above it (merged by minimum), so
the edges are the same midpoints (:func:`confcal.calibrators._fit.univariate.edges_between`) and the bin
values the same ratios as the in-memory fit on the same rows: the parameters are equal, not just close.
The fitted state is written through the estimator's own ``_set_fitted`` (the manifest format of the in-memory fit).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from confcal.calibrators._fit.jobs.linear_job import (
    batch_digest,
    first_pass_checks,
    merge_checks,
    refuse_probabilities,
    validated_batch,
)
from confcal.passes import Pass

__all__ = ["fit_job", "histogram_fit_job", "COLLECT_AT"]

#: a prefix with at most this many scores is read whole in the next pass
COLLECT_AT = 4096
_DIGIT = 8


def fit_job(cal, inputs):
    """The full-data job of ``histogram-binning`` / ``histogram-binning-top`` over batches of
    ``inputs``, or None for other inputs (side inputs: the seeded sample)."""
    if set(inputs) != {"logits", "labels"}:
        return None
    return histogram_fit_job(cal)


def _columns(cal, x: np.ndarray, y: np.ndarray):
    """``(scores (n, C), targets (n, C) float64)``: per class (one-vs-rest; class 1 only for two
    classes) or the top-label confidence and correctness, as the estimator's ``_fit`` reads them."""
    from confcal._numeric import softmax
    from confcal.calibrators._fit.jobs.reduce import predicted_class

    p = softmax(x)
    if cal.keeps_argmax:  # top-label
        top = predicted_class(p)
        return p[np.arange(len(y)), top][:, None], (y == top).astype(np.float64)[:, None]
    k = x.shape[1]
    cols = [1] if k == 2 else list(range(k))
    return p[:, cols], np.stack([(y == j).astype(np.float64) for j in cols], axis=1)


def _keys(scores: np.ndarray) -> np.ndarray:
    s = np.ascontiguousarray(scores, dtype=np.float64) + 0.0  # -0.0 -> +0.0
    return s.view(np.int64)


def _select(keys: np.ndarray, targets: list):
    """For each target ``(column, prefix, depth, collect)``: the 256 counts of the next digit of the
    keys under the prefix, or those keys themselves (``collect``)."""
    out = []
    for col, prefix, depth, collect in targets:
        k = keys[:, col]
        if depth:
            k = k[(k >> (64 - depth)) == prefix]
        if collect:
            out.append(np.sort(k))
        else:
            out.append(np.bincount((k >> (64 - depth - _DIGIT)) & 0xFF, minlength=256).astype(np.int64))
    return out


def _binning_batch(batch: dict, first: int, *, cal, input_kind: str, one_logit: bool, stage: str, targets=(),
                   edges=None, quantile=True):
    from confcal.metrics.accumulators import SummaryAccumulator

    raw, x, y = validated_batch(batch, first, input_kind=input_kind, one_logit=one_logit)
    out = {"n": int(len(y)), "k": int(x.shape[1])}
    if stage == "after":
        from confcal._numeric import softmax
        from confcal.calibrators._fit.jobs.reduce import predicted_class

        q = cal._predict_proba(x)
        out["after"] = SummaryAccumulator(15, equal_mass=False).update(q, y)
        out["moved"] = int(np.count_nonzero(np.argmax(q, axis=1) != predicted_class(softmax(x))))
        return out
    s, t = _columns(cal, x, y)
    if stage == "first":
        from confcal._numeric import softmax

        out.update(first_pass_checks(raw, x, y, first, input_kind))
        out["before"] = SummaryAccumulator(15, equal_mass=False).update(softmax(x), y)
        out["positives"] = t.sum(axis=0)
    if stage == "counts":
        counts, pos, above = [], [], []
        for c, e in enumerate(edges):
            idx = np.searchsorted(e, s[:, c], side="left")
            counts.append(np.bincount(idx, minlength=e.size + 1).astype(np.float64))
            pos.append(np.bincount(idx, weights=t[:, c], minlength=e.size + 1))
            if quantile:  # the smallest score above each quantile (edges_between moves the edge halfway to it)
                srt = np.append(np.sort(s[:, c]), np.inf)
                above.append(srt[np.searchsorted(srt[:-1], e, side="right")])
            else:
                above.append(np.full(e.size, np.inf))
        out["counts"], out["pos"], out["above"] = counts, pos, above
        return out
    out["select"] = _select(_keys(s), list(targets))
    return out


def _merge_binning(a: dict, b: dict) -> dict:
    out = {"n": a["n"] + b["n"], "k": a["k"]}
    if "after" in a:
        out["after"] = a["after"].merge(b["after"])
        out["moved"] = a["moved"] + b["moved"]
    if "before" in a:
        out.update(merge_checks(a, b))
        out["before"] = a["before"].merge(b["before"])
        out["positives"] = a["positives"] + b["positives"]
    if "counts" in a:
        out["counts"] = [u + v for u, v in zip(a["counts"], b["counts"])]
        out["pos"] = [u + v for u, v in zip(a["pos"], b["pos"])]
        out["above"] = [np.minimum(u, v) for u, v in zip(a["above"], b["above"])]
    return out


def _merge_select(a: dict, b: dict, collect: tuple) -> dict:
    out = _merge_binning({k: v for k, v in a.items() if k != "select"}, {k: v for k, v in b.items() if k != "select"})
    out["select"] = [np.sort(np.concatenate([u, v])) if c else u + v for u, v, c in zip(a["select"], b["select"],
                                                                                           collect)]
    return out


def _edge_ranks(n: int, n_bins: int) -> np.ndarray:
    """0-based ranks of the edges of :func:`confcal.calibrators._fit.univariate.equal_mass_edges`
    (unweighted: the first index whose cumulative count ``1..n`` reaches ``i n / n_bins``)."""
    t = np.arange(1, n_bins) * float(n) / n_bins
    return np.clip(np.ceil(t).astype(np.int64) - 1, 0, n - 1)


def _ranks(n: int, n_bins: int) -> np.ndarray:
    """The wanted order statistics: the edges' ranks and the largest score's."""
    return np.unique(np.concatenate([_edge_ranks(n, n_bins), [n - 1]]))


def histogram_fit_job(cal, *, collect_at: int = COLLECT_AT):
    """Fit ``cal`` (``histogram-binning`` or ``histogram-binning-top``) on batches of ``"logits"`` and
    ``"labels"``; a job of :mod:`confcal.passes`. Sets the fitted state, ``n_classes_`` and the fit
    record; returns the number of passes.

    Raises ``ValueError`` on invalid rows (named by their index in the whole data), probabilities
    passed as logits, or ``n_bins < 1``.
    """
    from confcal.calibrators._fit.univariate import _bin_means, edges_between

    from confcal.calibrators._fit.histogram import check_uniform_bins

    cal._check_hyperparameters()
    n_bins = int(cal.n_bins)
    check_uniform_bins(n_bins, getattr(cal, "strategy", "quantile"))
    input_kind = cal._input_kind()
    one_logit = bool(getattr(cal, "one_logit_head", True))
    common = dict(cal=cal, input_kind=input_kind, one_logit=one_logit)
    cols = ("logits", "labels")
    st = yield Pass(partial(_binning_batch, stage="first", targets=(), **common), _merge_binning, columns=cols,
                    desc=f"fit {cal.method}")
    if st is None or st["n"] == 0:
        raise ValueError("logits: expected at least 1 sample, got 0 rows")
    refuse_probabilities(st)
    n, k, before, positives, digest = st["n"], st["k"], st["before"].result(), st["positives"], batch_digest(st)
    n_cols = 1 if cal.keeps_argmax else (1 if k == 2 else k)
    if cal.keeps_argmax:  # top-label: the in-memory fit's warning on few rows
        from confcal.calibrators._fit.jobs.reduce import warn_few_top_label_rows

        warn_few_top_label_rows(int(n), cal.method, stacklevel=1)
    if not cal.keeps_argmax:  # one-vs-rest: the in-memory fit's rule for classes missing from the labels
        from confcal.calibrators._fit.jobs.reduce import check_label_classes

        pos = np.asarray(positives, dtype=np.float64)
        check_label_classes(np.array([n - pos[0], pos[0]]) if k == 2 else pos, cal.method)
    if getattr(cal, "strategy", "quantile") == "uniform":
        return (yield from _uniform_job(cal, common, n=n, k=k, n_cols=n_cols, before=before, digest=digest))
    ranks = _ranks(n, n_bins)
    # per (column, rank): [prefix, depth, rank within the prefix, collect?, value]
    state = {(c, int(r)): [0, 0, int(r), n <= collect_at, None] for c in range(n_cols) for r in ranks}
    n_passes = 1
    while any(v[4] is None for v in state.values()):
        groups = sorted({(c, v[0], v[1], v[3]) for (c, _), v in state.items() if v[4] is None})
        collect = tuple(g[3] for g in groups)
        res = yield Pass(partial(_binning_batch, stage="select", targets=tuple(groups), **common),
                         partial(_merge_select, collect=collect), columns=cols, desc=f"fit {cal.method}")
        n_passes += 1
        got = dict(zip(groups, res["select"]))
        for (c, _), v in state.items():
            if v[4] is not None:
                continue
            found = got[(c, v[0], v[1], v[3])]
            if v[3]:
                v[4] = int(found[v[2]])
                continue
            cum = np.cumsum(found)
            d = int(np.searchsorted(cum, v[2], side="right"))
            v[2] -= int(cum[d - 1]) if d else 0
            v[0], v[1] = (v[0] << _DIGIT) | d, v[1] + _DIGIT
            if v[1] == 64:
                v[4] = v[0]
            else:
                v[3] = int(found[d]) <= collect_at
    value = {key: np.array([v[4]], dtype=np.int64).view(np.float64)[0] for key, v in state.items()}
    idx = _edge_ranks(n, n_bins)
    edges = []
    for c in range(n_cols):
        e = np.unique(np.array([value[(c, int(r))] for r in idx], dtype=np.float64))
        edges.append(e[e < value[(c, n - 1)]])
    st = yield Pass(partial(_binning_batch, stage="counts", edges=tuple(edges), **common), _merge_binning,
                    columns=cols, desc=f"fit {cal.method}")
    n_passes += 1
    maps = [{"edges": edges_between(e, up).tolist(), "values": _bin_means(cnt, pos, float(positives[c] / n)).tolist()}
            for c, (e, cnt, pos, up) in enumerate(zip(edges, st["counts"], st["pos"], st["above"]))]
    n_passes += yield from _finish_job(cal, common, maps, n=n, k=k, before=before, digest=digest)
    return n_passes


def _uniform_job(cal, common, *, n, k, n_cols, before, digest):
    """``strategy="uniform"``: the edges are known, so one pass of counts and one of the fit record."""
    from confcal.calibrators._fit.histogram import uniform_bin_values, uniform_edges

    n_bins = int(cal.n_bins)
    e = uniform_edges(n_bins)
    st = yield Pass(partial(_binning_batch, stage="counts", edges=(e,) * n_cols, quantile=False, **common),
                    _merge_binning, columns=("logits", "labels"), desc=f"fit {cal.method}")
    maps = [{"edges": e.tolist(), "values": uniform_bin_values(cnt, pos, n_bins).tolist()}
            for cnt, pos in zip(st["counts"], st["pos"])]
    return 2 + (yield from _finish_job(cal, common, maps, n=n, k=k, before=before, digest=digest))


def _finish_job(cal, common, maps, *, n, k, before, digest):
    """Set the fitted maps, then one pass of the fit record's metrics after the map; returns 1 (the pass)."""
    input_kind = common["input_kind"]
    cal._set_fitted({"map": maps[0]} if cal.keeps_argmax else {"maps": maps})
    cal.n_classes_ = int(k)
    st = yield Pass(partial(_binning_batch, stage="after", **common), _merge_binning, columns=("logits", "labels"),
                    desc=f"fit {cal.method}")
    after = st["after"].result()
    keys = ("accuracy", "ece", "nll", "brier")
    cal.fit_record_ = {**cal._fit_record(n_samples=n, data_sha256=digest, input_kind=input_kind,
                                         metrics_before={q: before[q] for q in keys},
                                         metrics_after={q: after[q] for q in keys}),
                       "accuracy_change": float(after["accuracy"] - before["accuracy"]),
                       "argmax_changed": float(st["moved"] / n)}
    return 1
