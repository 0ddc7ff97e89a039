"""The drift summary (:func:`confcal.metrics.drift.data_summary`) as a streamed job, exact, from two
passes of mergeable accumulators (:func:`summary_job`, any engine of :mod:`confcal.passes`).

The summary's confidence quantiles are order statistics (``numpy.quantile``,
``method="inverted_cdf"``) of the uncalibrated top-label confidence (the raw score for 1-D
box scores). Pass 1 counts the confidences in ``2**18`` buckets (equal-width on [0, 1] for
class vectors; for box scores, which may be any real number, equal-width in the monotone
map ``x -> (1 + x / (1 + |x|)) / 2``) and the predicted classes; pass 2 keeps the distinct
confidences of only the buckets that hold a wanted order statistic, so each quantile is the
exact value the single-process summary finds, whatever the partitioning. Box scores that a map
clips into ``[0, 1]`` (``clip_scores=True``) are summarised clipped, with ``clip_scores: true`` in the
result, as :func:`confcal.metrics.drift.data_summary` does. Run
:func:`confcal.passes.together` with a fit's job, both passes ride along with its passes.
"""

from __future__ import annotations

import numpy as np

from functools import partial

from confcal.passes import Pass

__all__ = ["SummaryPass1", "SummaryPass2", "inverted_cdf_ranks", "summary_job"]

_BUCKETS = 1 << 18


def inverted_cdf_ranks(n: int, probs: np.ndarray) -> np.ndarray:
    """0-based ranks of the order statistics that ``numpy.quantile(v, probs, method="inverted_cdf")``
    returns for ``n`` values (numpy's rule: ``n p - 1`` when integral, else its ceiling).

    Examples
    --------
    >>> inverted_cdf_ranks(10, np.array([0.05, 0.5, 0.95])).tolist()
    [0, 4, 9]
    """
    v = n * np.asarray(probs, dtype=np.float64) - 1
    prev = np.floor(v)
    return np.clip(np.where(v - prev == 0, prev, prev + 1), 0, n - 1).astype(np.int64)


def _confidence(x: np.ndarray, input_kind: str = "logits", class_counts: bool = False, clip_scores: bool = False):
    """``(confidence, class counts of the arg-max or None)``: the values of
    :func:`confcal.metrics.drift.top_confidence` (bit for bit), the counts only when asked
    (pass 1; no per-row arg-max: ~2x the cost of the confidence itself at 10 classes);
    ``clip_scores``: 1-D box scores clipped into ``[0, 1]`` (ignored for class vectors)."""
    from confcal.metrics.drift import _rows_of, top_probability

    x = _rows_of(x, input_kind, clip_scores)
    if x.ndim == 1:
        return x, None
    conf, counts = top_probability(x, class_counts=True) if class_counts else (top_probability(x), None)
    if conf.size and not (conf.min() >= 0.0 and conf.max() <= 1.0):  # pragma: no cover
        raise ValueError("data_summary: top-label confidences outside [0, 1]")
    return conf, counts


def _buckets(conf: np.ndarray, box: bool = False) -> np.ndarray:
    if box:
        # each step (1 + a, 1 / a, 1 - a, halving) is correctly rounded, so monotone: equal values
        # share a bucket and a larger value never lands in a lower bucket
        with np.errstate(divide="ignore", invalid="ignore"):
            pos = 1.0 - 1.0 / (1.0 + np.abs(conf))
        conf = (1.0 + np.where(conf >= 0, pos, -pos)) * 0.5
    return np.minimum((conf * _BUCKETS).astype(np.int64), _BUCKETS - 1)


def _sparse_counts(keys: np.ndarray):
    # a dense count then its non-empty buckets: ~10x faster than np.unique's sort on 65k rows,
    # which made the summary most of a Dask fit's CPU (0.57 s per 1M rows over its two passes)
    if keys.size < 4096:
        u, c = np.unique(keys, return_counts=True)
        return u, c.astype(np.int64)
    c = np.bincount(keys, minlength=_BUCKETS)
    u = np.flatnonzero(c)
    return u, c[u].astype(np.int64)


def _merge_sparse(a, b):
    keys = np.concatenate([a[0], b[0]])
    weights = np.concatenate([a[1], b[1]])
    if keys.size >= 4096:  # dense sums, no sort (counts stay exact in float64 below 2**53)
        c = np.bincount(keys, weights=weights, minlength=_BUCKETS)
        u = np.flatnonzero(c)
        return u, c[u].astype(np.int64)
    u, inv = np.unique(keys, return_inverse=True)
    return u, np.bincount(inv, weights=weights, minlength=u.size).astype(np.int64)


class SummaryPass1:
    """Pass 1: bucket counts of the confidence (pooled and per domain) and predicted-class counts.

    ``groups`` maps a group key (``None`` = all rows, else a domain) to sparse bucket counts
    ``(bucket ids, counts)``; ``clip_scores``: 1-D box scores are summarised clipped into ``[0, 1]``
    (ignored for class vectors, as in :func:`confcal.metrics.drift.data_summary`)."""

    def __init__(self, n_classes: int | None, input_kind: str = "logits", clip_scores: bool = False):
        self.box = n_classes is None  # 1-D box scores: no classes
        self.n_classes = None if self.box else int(n_classes)
        self.input_kind = input_kind
        self.clip_scores = bool(clip_scores) and self.box
        self.class_counts = np.zeros(0 if self.box else self.n_classes, dtype=np.int64)
        self.n = 0
        self.groups: dict = {}

    def update(self, x: np.ndarray, domains=None) -> "SummaryPass1":
        if len(x) == 0:
            return self
        conf, counts = _confidence(x, self.input_kind, class_counts=not self.box, clip_scores=self.clip_scores)
        self.n += conf.size
        if counts is not None:
            self.class_counts += counts
        keys = _buckets(conf, self.box)
        self._add(None, keys)
        if domains is not None:
            for g in np.unique(domains):
                self._add(g.item() if hasattr(g, "item") else g, keys[domains == g])
        return self

    def _add(self, group, keys):
        counts = _sparse_counts(keys)
        self.groups[group] = _merge_sparse(self.groups[group], counts) if group in self.groups else counts

    def merge(self, other: "SummaryPass1") -> "SummaryPass1":
        """A new accumulator of both (the inputs stay as they were: a retried task may reuse them)."""
        if (self.box, self.clip_scores) != (other.box, other.clip_scores):
            raise ValueError("data_summary: merging summaries of box scores and class vectors, or clipped and "
                             "unclipped box scores")
        out = SummaryPass1(self.n_classes, self.input_kind, self.clip_scores)
        out.class_counts = self.class_counts + other.class_counts
        out.n = self.n + other.n
        out.groups = dict(self.groups)
        for g, counts in other.groups.items():
            out.groups[g] = _merge_sparse(out.groups[g], counts) if g in out.groups else counts
        return out

    def second_pass(self, n_quantiles: int) -> "SummaryPass2":
        return SummaryPass2(self, n_quantiles)


class SummaryPass2:
    """Pass 2: the distinct confidences (with counts) of the buckets holding a wanted order statistic."""

    def __init__(self, first: SummaryPass1, n_quantiles: int):
        self.first = first
        self.plan = {}  # group -> (bucket of each rank, rank within that bucket)
        for g, (buckets, counts) in first.groups.items():
            n = int(counts.sum())
            k = min(int(n_quantiles), n)
            ranks = inverted_cdf_ranks(n, (np.arange(k) + 0.5) / k)
            cum = np.cumsum(counts)
            pos = np.searchsorted(cum, ranks, side="right")
            before = np.where(pos > 0, cum[np.maximum(pos - 1, 0)], 0)
            self.plan[g] = (buckets[pos], ranks - before)
        self.kept: dict = {}  # group -> (sorted distinct values, counts)

    def update(self, x: np.ndarray, domains=None) -> "SummaryPass2":
        if len(x) == 0:
            return self
        conf, _ = _confidence(x, self.first.input_kind, clip_scores=self.first.clip_scores)
        keys = _buckets(conf, self.first.box)
        self._keep(None, conf, keys)
        if domains is not None:
            for g in np.unique(domains):
                rows = domains == g
                self._keep(g.item() if hasattr(g, "item") else g, conf[rows], keys[rows])
        return self

    def _keep(self, group, conf, keys):
        if group not in self.plan:
            raise ValueError(f"data_summary: group {group!r} was not seen in the first pass")
        wanted = np.isin(keys, self.plan[group][0])
        v, c = np.unique(conf[wanted], return_counts=True)
        self.kept[group] = _merge_values(self.kept[group], (v, c)) if group in self.kept else (v, c)

    def fresh(self) -> "SummaryPass2":
        """An empty pass-2 accumulator with the same plan (one per partition)."""
        out = SummaryPass2.__new__(SummaryPass2)
        out.first, out.plan, out.kept = self.first, self.plan, {}
        return out

    def merge(self, other: "SummaryPass2") -> "SummaryPass2":
        """A new accumulator of both (the inputs stay as they were)."""
        out = self.fresh()
        out.kept = dict(self.kept)
        for g, vc in other.kept.items():
            out.kept[g] = _merge_values(out.kept[g], vc) if g in out.kept else vc
        return out

    def quantiles(self, group=None) -> list[float]:
        buckets, in_bucket = self.plan[group]
        values, counts = self.kept.get(group, (np.empty(0), np.empty(0, np.int64)))
        keys = _buckets(values, self.first.box)
        out = []
        for b, r in zip(buckets, in_bucket):
            rows = keys == b
            v, c = values[rows], counts[rows]
            out.append(float(v[np.searchsorted(np.cumsum(c), r, side="right")]))
        return out

    def result(self) -> dict:
        """The ``data_summary`` dict (pooled quantiles, class frequencies, per-domain quantiles)."""
        n = int(self.first.n)
        out = {"statistic": "ks_top_confidence", "n": n, "confidence_quantiles": self.quantiles(None)}
        if self.first.clip_scores:
            out["clip_scores"] = True  # drift_check clips the new scores the same way
        if not self.first.box:
            out["class_frequencies"] = (self.first.class_counts / n).tolist()
        domains = [g for g in self.first.groups if g is not None]
        if domains:
            out["domains"] = {str(g): {"n": int(self.first.groups[g][1].sum()),
                                       "confidence_quantiles": self.quantiles(g)}
                              for g in sorted(domains, key=str)}
        return out


def _merge_values(a, b):
    v = np.concatenate([a[0], b[0]])
    u, inv = np.unique(v, return_inverse=True)
    return u, np.bincount(inv, weights=np.concatenate([a[1], b[1]]), minlength=u.size).astype(np.int64)


def _pass1(batch: dict, first: int, *, input_kind: str, by_domain: bool, clip_scores: bool = False):
    x = np.asarray(batch["logits"])
    # (n, 1): a sigmoid head, 2 classes
    acc = SummaryPass1(None if x.ndim == 1 else max(2, x.shape[1]), input_kind, clip_scores)
    return acc.update(x, np.asarray(batch["domains"]) if by_domain else None)


def _pass2(batch: dict, first: int, *, start: SummaryPass2, by_domain: bool):
    return start.fresh().update(np.asarray(batch["logits"]), np.asarray(batch["domains"]) if by_domain else None)


def _merge(a, b):
    return a.merge(b)


def summary_job(*, input_kind: str = "logits", by_domain: bool = False, n_quantiles: int | None = None,
                clip_scores: bool = False):
    """The drift summary of the ``"logits"`` column (class vectors, or 1-D box scores) as a job of
    :mod:`confcal.passes`: two passes, the result :func:`confcal.metrics.drift.data_summary` gives
    on all rows at once (pooled, and per ``"domains"`` value with ``by_domain``). ``input_kind``
    and ``clip_scores`` as there (``"probs"``: class-vector rows are probabilities; ``clip_scores``:
    1-D box scores summarised as ``clip(scores, 0, 1)``, what a ``det-ts`` / ``det-beta`` map with
    ``clip_scores=True`` reads, and the summary says ``clip_scores: true``). Rows are those validated by
    the job it runs with (:func:`confcal.passes.together`)."""
    from confcal.metrics.drift import N_QUANTILES

    cols = ("logits", "domains") if by_domain else ("logits",)
    first = yield Pass(partial(_pass1, input_kind=input_kind, by_domain=by_domain, clip_scores=bool(clip_scores)),
                       _merge, columns=cols, desc="drift summary pass")
    start = first.second_pass(N_QUANTILES if n_quantiles is None else n_quantiles)
    second = yield Pass(partial(_pass2, start=start, by_domain=by_domain), _merge, columns=cols, desc="drift summary pass")
    return second.result()
