"""Mergeable metric accumulators: one pass over row batches, any batch order, the one-shot value.

Each accumulator has ``update(...)`` (one batch), ``merge(other)`` (combine two
partial results, e.g. from two workers) and ``result()``. Sums are float64, so a
streamed value equals the one-shot function's up to summation order (~1e-15
relative). Accumulators are small (bins, counts) and pickle.

* :class:`ScoresAccumulator` — accuracy, NLL, Brier score;
* :class:`BinnedAccumulator` — top-label ECE / MCE / reliability table on fixed edges
  (equal-width by default), or D-ECE on ``(confidence, correct)`` pairs;
* :class:`ClasswiseAccumulator` — class-wise ECE (equal-width);
* :class:`SmoothECEAccumulator` — smooth ECE from residual masses on the finest grid;
* :class:`EqualMassAccumulator` — equal-mass ECE / MCE / reliability table, exact, in two
  passes: the first finds the quantile edges (:meth:`EqualMassAccumulator.second_pass`),
  the second sums the bins;
* :class:`SummaryAccumulator` — the set of :func:`confcal.metrics.calibration_summary`.

Examples
--------
>>> import numpy as np
>>> from confcal.metrics import BinnedAccumulator, ece
>>> p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
>>> y = np.array([0, 1, 1, 1])
>>> a = BinnedAccumulator(10).update(p[:2], y[:2])
>>> b = BinnedAccumulator(10).update(p[2:], y[2:])
>>> bool(np.isclose(a.merge(b).ece(), ece(p, y, n_bins=10)))
True
"""

from __future__ import annotations

import numpy as np

from confcal.metrics._binning import assign_bins, binned_gap, check_n_bins, equal_width_bins, is_equal_width

__all__ = ["ScoresAccumulator", "BinnedAccumulator", "ClasswiseAccumulator", "SmoothECEAccumulator",
           "EqualMassAccumulator", "SummaryAccumulator", "confidence_correct"]


_BLOCK = 1 << 14  # rows per block of update_pairs (measured: 16K beats 64K and 256K)


def confidence_correct(probs, labels):
    """Validated top-label confidence (float64) and correctness (bool) of a batch."""
    from confcal.metrics.calibration import _confidence_correct

    return _confidence_correct(probs, labels)


class _Mergeable:
    def merge(self, other):
        if type(other) is not type(self):
            raise TypeError(f"merge: expected a {type(self).__name__}, got {type(other).__name__}")
        self._merge(other)
        return self

    def _check_seen(self, n):
        if n == 0:
            raise ValueError(f"{type(self).__name__}: no samples seen; call update() first")


class ScoresAccumulator(_Mergeable):
    """Accuracy, mean NLL (nats, ``p[y]`` clipped at ``eps``) and Brier score, as
    :func:`~confcal.metrics.accuracy`, :func:`~confcal.metrics.nll`, :func:`~confcal.metrics.brier_score`.

    Examples
    --------
    >>> import numpy as np
    >>> p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]); y = np.array([0, 1, 1])
    >>> acc = ScoresAccumulator().update(p[:1], y[:1]).merge(ScoresAccumulator().update(p[1:], y[1:]))
    >>> {k: round(v, 4) for k, v in acc.result().items()}
    {'accuracy': 0.6667, 'nll': 0.4149, 'brier': 0.2733}
    """

    def __init__(self, eps: float | None = None):
        from confcal.metrics.scores import NLL_EPS

        self.eps = NLL_EPS if eps is None else eps
        self.n = 0
        self.correct = 0
        self.nll_sum = 0.0
        self.brier_sum = 0.0

    def update(self, probs, labels):
        from confcal._validation import as_numpy, check_labels, check_probs

        binary = as_numpy(probs, "probs").ndim == 1
        p = check_probs(probs)
        y = check_labels(labels, p.shape[0], p.shape[1])
        return self._add_validated(p, y, np.argmax(p, axis=1), binary=binary)

    def _add_validated(self, p, y, pred, *, binary):
        py = p[np.arange(p.shape[0]), y]
        self.n += p.shape[0]
        self.correct += int(np.count_nonzero(pred == y))
        self.nll_sum += float(-np.sum(np.log(np.clip(py, self.eps, 1.0))))
        if binary:
            self.brier_sum += float(np.sum((p[:, 1] - y) ** 2))
        else:
            self.brier_sum += float(np.sum(np.sum(p**2, axis=1) - 2.0 * py + 1.0))
        return self

    def update_sums(self, n, correct, nll_sum, brier_sum):
        """Add sums computed elsewhere (e.g. inside a temperature-fit pass)."""
        self.n += int(n)
        self.correct += int(correct)
        self.nll_sum += float(nll_sum)
        self.brier_sum += float(brier_sum)
        return self

    def _merge(self, o):
        self.update_sums(o.n, o.correct, o.nll_sum, o.brier_sum)

    def result(self) -> dict:
        self._check_seen(self.n)
        return {"accuracy": self.correct / self.n, "nll": self.nll_sum / self.n + 0.0,
                "brier": self.brier_sum / self.n}


class BinnedAccumulator(_Mergeable):
    """Per-bin count, confidence sum and correct sum on fixed edges (``(lo, hi]``, first bin closed).

    ``edges=None`` gives ``n_bins`` equal-width bins. :meth:`update` takes probabilities and
    labels (top-label confidence); :meth:`update_pairs` takes ``(confidence, correct)``
    directly (detections: D-ECE).

    Examples
    --------
    >>> import numpy as np
    >>> acc = BinnedAccumulator(10).update_pairs(np.array([0.95, 0.65, 0.62]), np.array([1, 1, 0]))
    >>> round(acc.ece(), 4), acc.reliability_table()["count"].tolist()[6:]
    (0.1067, [2, 0, 0, 1])
    """

    def __init__(self, n_bins: int = 15, edges=None):
        self.n_bins = check_n_bins(n_bins)
        self.edges = np.linspace(0.0, 1.0, self.n_bins + 1) if edges is None else np.asarray(edges, np.float64)
        if self.edges.shape != (self.n_bins + 1,):
            raise ValueError(f"edges: expected shape ({self.n_bins + 1},), got {self.edges.shape}")
        self.count = np.zeros(self.n_bins)
        self.conf_sum = np.zeros(self.n_bins)
        self.corr_sum = np.zeros(self.n_bins)

    def update(self, probs, labels):
        return self.update_pairs(*confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct):
        conf = np.asarray(confidence, dtype=np.float64)
        correct = np.asarray(correct)
        if correct.dtype != bool:
            correct = correct.astype(np.float64)
        if conf.ndim != 1 or not is_equal_width(self.edges):
            self._add(assign_bins(conf, self.edges), conf, correct)
            return self
        # equal-width bins: arithmetic index, in blocks that stay in cache with their bincounts
        for a in range(0, conf.shape[0], _BLOCK):
            c = conf[a:a + _BLOCK]
            self._add(equal_width_bins(c, self.n_bins), c, correct[a:a + _BLOCK])
        return self

    def _add(self, idx, conf, correct):
        self.count += np.bincount(idx, minlength=self.n_bins)
        self.conf_sum += np.bincount(idx, weights=conf, minlength=self.n_bins)
        self.corr_sum += np.bincount(idx, weights=correct, minlength=self.n_bins)

    def _merge(self, o):
        if not np.array_equal(o.edges, self.edges):
            raise ValueError("merge: the two accumulators have different bin edges")
        self.count += o.count
        self.conf_sum += o.conf_sum
        self.corr_sum += o.corr_sum

    def ece(self, norm: str = "l1") -> float:
        self._check_seen(self.count.sum())
        return binned_gap(self.count, self.conf_sum, self.corr_sum, norm)

    def mce(self) -> float:
        return self.ece("max")

    def reliability_table(self) -> dict:
        """As :func:`confcal.metrics.reliability_table` (``accuracy`` is the fraction correct per bin)."""
        self._check_seen(self.count.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"bin_lo": self.edges[:-1].copy(), "bin_hi": self.edges[1:].copy(),
                    "mean_confidence": np.where(self.count > 0, self.conf_sum / self.count, np.nan),
                    "accuracy": np.where(self.count > 0, self.corr_sum / self.count, np.nan),
                    "count": self.count.astype(np.int64)}

    def result(self) -> dict:
        return {"ece": self.ece(), "mce": self.mce()}


class ClasswiseAccumulator(_Mergeable):
    """Class-wise ECE on equal-width bins, as :func:`confcal.metrics.classwise_ece`.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import classwise_ece
    >>> p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]); y = np.array([0, 1, 1])
    >>> acc = ClasswiseAccumulator(2, 5).update(p[:2], y[:2]).update(p[2:], y[2:])
    >>> bool(np.isclose(acc.result(), classwise_ece(p, y, 5)))
    True
    """

    def __init__(self, n_classes: int, n_bins: int = 15):
        self.n_classes, self.n_bins = int(n_classes), check_n_bins(n_bins)
        self.edges = np.linspace(0.0, 1.0, self.n_bins + 1)
        shape = (self.n_classes, self.n_bins)
        self.count, self.conf_sum, self.corr_sum = np.zeros(shape), np.zeros(shape), np.zeros(shape)

    def update(self, probs, labels):
        from confcal._validation import check_labels, check_probs

        p = check_probs(probs)
        if p.shape[1] != self.n_classes:
            raise ValueError(f"probs: expected {self.n_classes} classes, got shape {p.shape}")
        y = check_labels(labels, p.shape[0], p.shape[1])
        flat = (assign_bins(p, self.edges) + self.n_bins * np.arange(self.n_classes)).ravel()
        size = self.n_classes * self.n_bins
        hit = (y[:, None] == np.arange(self.n_classes)).ravel().astype(np.float64)
        self.count += np.bincount(flat, minlength=size).reshape(self.count.shape)
        self.conf_sum += np.bincount(flat, weights=p.ravel(), minlength=size).reshape(self.count.shape)
        self.corr_sum += np.bincount(flat, weights=hit, minlength=size).reshape(self.count.shape)
        return self

    def _merge(self, o):
        self.count += o.count
        self.conf_sum += o.conf_sum
        self.corr_sum += o.corr_sum

    def result(self, *, return_per_class: bool = False):
        self._check_seen(self.count[0].sum())
        per = np.array([binned_gap(self.count[k], self.conf_sum[k], self.corr_sum[k], "l1")
                        for k in range(self.n_classes)])
        value = float(per.mean())
        return (value, per) if return_per_class else value


class SmoothECEAccumulator(_Mergeable):
    """Smooth ECE (Błasiok & Nakkiran 2024) from the residual masses on the finest grid.

    Residuals are spread by linear interpolation onto the finest grid used by
    :func:`confcal.metrics.smooth_ece`; every coarser grid (a power-of-two divisor)
    is obtained exactly from it, because a coarse hat function is linear between
    fine grid points. :func:`confcal.metrics.smooth_ece` itself goes through this class.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import smooth_ece
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=200); y = rng.integers(0, 3, size=200)
    >>> acc = SmoothECEAccumulator().update(p[:80], y[:80]).update(p[80:], y[80:])
    >>> bool(np.isclose(acc.result(), smooth_ece(p, y), rtol=1e-12))
    True
    """

    def __init__(self):
        from confcal.metrics.smooth_ece import _MAX_GRID

        self.m = _MAX_GRID
        self.masses = np.zeros(self.m + 1)
        self.n = 0

    def update(self, probs, labels):
        return self.update_pairs(*confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct):
        from confcal.metrics.smooth_ece import _grid_masses

        f = np.asarray(confidence, dtype=np.float64)
        self.masses += _grid_masses(f, f - np.asarray(correct, dtype=np.float64), self.m)
        self.n += f.shape[0]
        return self

    def _merge(self, o):
        self.masses += o.masses
        self.n += o.n

    def result(self, *, sigma: float | None = None, return_sigma: bool = False):
        from confcal.metrics.smooth_ece import _smooth_ece_masses

        self._check_seen(self.n)
        value, s = _smooth_ece_masses(self.masses, self.n, sigma)
        value = min(max(value, 0.0), 1.0)
        return (value, s) if return_sigma else value


# ----------------------------------------------------------------------------- equal mass
# Buckets order confidences without sorting them: the key of c is the top bits of the float64
# 1 - c (sign, exponent and 7 mantissa bits: 128 buckets per octave of 1 - c, so confidences
# near 1 are resolved finely). c1 < c2 implies key(c1) >= key(c2).
_SHIFT = 45
_N_KEYS = (0x3FF0000000000000 >> _SHIFT) + 1


def _keys(conf: np.ndarray) -> np.ndarray:
    return ((1.0 - conf).view(np.uint64) >> np.uint64(_SHIFT)).astype(np.intp)


def _quantile_ranks(n: int, n_bins: int) -> np.ndarray:
    """0-based order-statistic ranks of numpy's ``quantile(..., method="inverted_cdf")`` at ``k / n_bins``."""
    v = n * (np.arange(1, n_bins) / n_bins) - 1
    prev = np.floor(v)
    idx = np.where(v == prev, prev, prev + 1)
    return np.clip(idx, 0, n - 1).astype(np.int64)


class EqualMassAccumulator(_Mergeable):
    """Equal-mass top-label ECE, exact, in two passes (D-ECE too, through :meth:`update_pairs`).

    Pass 1 (this object): ``update`` counts confidences per bucket. ``second_pass()``
    returns the pass-2 accumulator; its ``update`` (same batches, any order) sums the
    bins and keeps the distinct confidences of the few buckets that hold a quantile edge,
    so the edges are the exact order statistics of :func:`numpy.quantile`
    (``inverted_cdf``), as in :func:`confcal.metrics.ece` with ``binning="equal_mass"``.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import ece
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=100); y = rng.integers(0, 3, size=100)
    >>> first = EqualMassAccumulator(5).update(p[:50], y[:50]).update(p[50:], y[50:])
    >>> second = first.second_pass().update(p[50:], y[50:]).update(p[:50], y[:50])
    >>> bool(np.isclose(second.ece(), ece(p, y, n_bins=5, binning="equal_mass"), rtol=1e-12))
    True
    """

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(n_bins)
        self.hist = np.zeros(_N_KEYS, dtype=np.int64)

    def update(self, probs, labels):
        return self.update_pairs(*confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct=None):
        keys = _keys(np.asarray(confidence, dtype=np.float64))
        if keys.size < 4096:
            np.add.at(self.hist, keys, 1)
        else:
            self.hist += np.bincount(keys, minlength=_N_KEYS)
        return self

    def _merge(self, o):
        self.hist += o.hist

    def second_pass(self) -> "_EqualMassPass2":
        n = int(self.hist.sum())
        self._check_seen(n)
        return _EqualMassPass2(self.n_bins, self.hist.copy())


class _EqualMassPass2(_Mergeable):
    def __init__(self, n_bins, hist):
        self.n_bins, self.hist = n_bins, hist
        n = int(hist.sum())
        # buckets in increasing confidence = decreasing key
        order = np.flatnonzero(hist[::-1])
        cum = np.cumsum(hist[::-1][order])
        ranks = _quantile_ranks(n, n_bins) if n_bins > 1 else np.empty(0, np.int64)
        pos = np.searchsorted(cum, ranks, side="right")  # bucket (in that order) holding each rank
        self.edge_keys = (_N_KEYS - 1 - order[pos]).astype(np.intp)
        self.rank_in_bucket = ranks - np.where(pos > 0, cum[np.maximum(pos - 1, 0)], 0)
        self.is_edge = np.zeros(_N_KEYS, dtype=bool)
        self.is_edge[self.edge_keys] = True
        self.count = np.zeros(_N_KEYS)
        self.conf_sum = np.zeros(_N_KEYS)
        self.corr_sum = np.zeros(_N_KEYS)
        self.kept = []  # [(values, counts, correct sums)] from buckets holding an edge

    def update(self, probs, labels):
        return self.update_pairs(*confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct):
        conf = np.asarray(confidence, dtype=np.float64)
        corr = np.asarray(correct, dtype=np.float64)
        keys = _keys(conf)
        edge = self.is_edge[keys]
        if edge.any():
            v, inv = np.unique(conf[edge], return_inverse=True)
            self.kept.append((v, np.bincount(inv, minlength=v.size).astype(np.float64),
                              np.bincount(inv, weights=corr[edge], minlength=v.size)))
            if len(self.kept) > 64:
                self.kept = [self._compact()]
            keep = ~edge
            conf, corr, keys = conf[keep], corr[keep], keys[keep]
        if keys.size < 4096:
            np.add.at(self.count, keys, 1.0)
            np.add.at(self.conf_sum, keys, conf)
            np.add.at(self.corr_sum, keys, corr)
        else:
            self.count += np.bincount(keys, minlength=_N_KEYS)
            self.conf_sum += np.bincount(keys, weights=conf, minlength=_N_KEYS)
            self.corr_sum += np.bincount(keys, weights=corr, minlength=_N_KEYS)
        return self

    def _compact(self):
        if not self.kept:
            return np.empty(0), np.empty(0), np.empty(0)
        v = np.concatenate([k[0] for k in self.kept])
        u, inv = np.unique(v, return_inverse=True)
        c = np.bincount(inv, weights=np.concatenate([k[1] for k in self.kept]), minlength=u.size)
        a = np.bincount(inv, weights=np.concatenate([k[2] for k in self.kept]), minlength=u.size)
        return u, c, a

    def _merge(self, o):
        if not np.array_equal(o.hist, self.hist):
            raise ValueError("merge: second-pass accumulators from different first passes")
        self.count += o.count
        self.conf_sum += o.conf_sum
        self.corr_sum += o.corr_sum
        self.kept = [self._compact(), o._compact()]

    def edges(self) -> np.ndarray:
        vals, counts, _ = self._compact()
        inner = []
        for key, r in zip(self.edge_keys, self.rank_in_bucket):
            in_bucket = _keys(vals) == key
            v, c = vals[in_bucket], counts[in_bucket]
            if c.sum() != self.hist[key]:
                raise ValueError("equal-mass second pass saw other data than the first pass")
            inner.append(v[np.searchsorted(np.cumsum(c), r, side="right")])
        return np.concatenate([[0.0], np.asarray(inner, np.float64), [1.0]])

    def bin_sums(self):
        edges = self.edges()
        n_bins = self.n_bins
        count, conf_sum, corr_sum = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
        # a bucket without an edge lies wholly between two edges: its bin is the number of
        # edge buckets of lower confidence (= larger key)
        keys = np.flatnonzero(self.count)
        b = np.searchsorted(np.sort(-self.edge_keys), -keys, side="left")
        np.add.at(count, b, self.count[keys])
        np.add.at(conf_sum, b, self.conf_sum[keys])
        np.add.at(corr_sum, b, self.corr_sum[keys])
        vals, counts, corr = self._compact()
        if vals.size:
            idx = assign_bins(vals, edges)
            np.add.at(count, idx, counts)
            np.add.at(conf_sum, idx, vals * counts)
            np.add.at(corr_sum, idx, corr)
        return count, conf_sum, corr_sum, edges

    def ece(self, norm: str = "l1") -> float:
        count, conf_sum, corr_sum, _ = self.bin_sums()
        self._check_seen(count.sum())
        return binned_gap(count, conf_sum, corr_sum, norm)

    def mce(self) -> float:
        return self.ece("max")

    def result(self) -> dict:
        return {"ece": self.ece(), "mce": self.mce()}


class SummaryAccumulator(_Mergeable):
    """The metrics of :func:`confcal.metrics.calibration_summary` (single pass unless equal-mass is asked).

    With ``equal_mass=True`` feed the same batches twice: first to :meth:`update`, then,
    after :meth:`start_second_pass`, to :meth:`update` again (only the equal-mass bins use it).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import calibration_summary
    >>> p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]]); y = np.array([0, 1, 1, 1])
    >>> acc = SummaryAccumulator(5).update(p, y)
    >>> acc = acc.start_second_pass().update(p, y)
    >>> ref = calibration_summary(p, y, n_bins=5)
    >>> all(bool(np.isclose(acc.result()[k], ref[k])) for k in ref)
    True
    """

    def __init__(self, n_bins: int = 15, *, equal_mass: bool = True):
        self.n_bins = check_n_bins(n_bins)
        self.scores = ScoresAccumulator()
        self.bins = BinnedAccumulator(self.n_bins)
        self.equal_mass = EqualMassAccumulator(self.n_bins) if equal_mass else None
        self.pass_no = 1

    @property
    def needs_second_pass(self) -> bool:
        return self.equal_mass is not None and self.pass_no == 1

    def update(self, probs, labels):
        from confcal._validation import check_labels, check_probs

        p = check_probs(probs)
        y = check_labels(labels, p.shape[0], p.shape[1])
        # validated once here; the parts below take the validated arrays as they are
        pred = np.argmax(p, axis=1)
        conf = p[np.arange(p.shape[0]), pred]
        correct = pred == y
        if self.pass_no == 1:
            self.scores._add_validated(p, y, pred, binary=np.ndim(probs) == 1)
            self.bins.update_pairs(conf, correct)
        if self.equal_mass is not None:
            self.equal_mass.update_pairs(conf, correct)
        return self

    def start_second_pass(self):
        if self.needs_second_pass:
            self.equal_mass = self.equal_mass.second_pass()
            self.pass_no = 2
        return self

    def _merge(self, o):
        if o.pass_no != self.pass_no:
            raise ValueError("merge: summaries at different passes")
        self.scores.merge(o.scores)
        self.bins.merge(o.bins)
        if self.equal_mass is not None:
            self.equal_mass.merge(o.equal_mass)

    def result(self) -> dict:
        s = self.scores.result()
        out = {"accuracy": s["accuracy"], "ece": self.bins.ece()}
        if self.equal_mass is not None:
            if self.needs_second_pass:
                raise ValueError("SummaryAccumulator: equal-mass ECE needs a second pass; call "
                                 "start_second_pass() and feed the batches again")
            out["ece_equal_mass"] = self.equal_mass.ece()
        out.update({"mce": self.bins.mce(), "nll": s["nll"], "brier": s["brier"]})
        return out
