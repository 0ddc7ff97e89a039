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
           "EqualMassAccumulator", "SummaryAccumulator", "BoxSummaryAccumulator", "confidence_correct"]


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
# Cells order confidences without sorting them: the key of c at level j is the top bits of the
# float64 1 - c, ``bits(1 - c) >> _SHIFTS[j]``. Level 0 keeps sign, exponent and 7 mantissa bits
# (128 cells per octave of 1 - c, so confidences near 1 are resolved finely); each later level
# splits a cell into 2**16 (last: 2**13) sub-cells, and level 3 is the value itself.
# c1 < c2 implies key(c1) >= key(c2) at every level.
_SHIFTS = (45, 29, 13, 0)
_N_KEYS = (0x3FF0000000000000 >> _SHIFTS[0]) + 1
#: distinct confidences kept exactly (per accumulator) in the cells holding a quantile edge; past
#: this, those cells are counted at the next level instead and one more pass resolves them, so
#: memory stays bounded whatever the number of rows (measured on 1e7 softmax confidences of 10
#: classes: 5-7 % of the rows, 0.5-0.7 M values, lie in the 14 edge cells of level 0)
_KEEP_MAX = 1 << 20


def _bits(conf: np.ndarray) -> np.ndarray:
    return (1.0 - np.ascontiguousarray(conf, dtype=np.float64)).view(np.uint64)


def _keys(conf: np.ndarray) -> np.ndarray:
    return (_bits(conf) >> np.uint64(_SHIFTS[0])).astype(np.intp)


def _quantile_ranks(n: int, n_bins: int) -> np.ndarray:
    """0-based order-statistic ranks of numpy's ``quantile(..., method="inverted_cdf")`` at ``k / n_bins``."""
    v = n * (np.arange(1, n_bins) / n_bins) - 1
    prev = np.floor(v)
    idx = np.where(v == prev, prev, prev + 1)
    return np.clip(idx, 0, n - 1).astype(np.int64)


def _locate(hist_in_order: np.ndarray, ranks: np.ndarray):
    """For counts listed in increasing confidence: the position holding each rank and the rank
    within it."""
    cum = np.cumsum(hist_in_order)
    pos = np.searchsorted(cum, ranks, side="right")
    return pos, ranks - np.where(pos > 0, cum[np.maximum(pos - 1, 0)], 0)


class EqualMassAccumulator(_Mergeable):
    """Equal-mass top-label ECE, exact, in two passes (three at most in practice; see below).

    Pass 1 (this object): ``update`` counts confidences per cell. ``next_pass()`` (alias
    ``second_pass()``) returns the next pass's accumulator; its ``update`` (same batches, any
    order) sums the bins and keeps the distinct confidences of the few cells that hold a
    quantile edge, so the edges are the exact order statistics of :func:`numpy.quantile`
    (``inverted_cdf``), as in :func:`confcal.metrics.ece` with ``binning="equal_mass"``.
    When those cells hold more than ``_KEEP_MAX`` distinct values (past ~1.5e7 rows of
    softmax confidences), they are counted on 2**16 finer sub-cells and only the values in a
    window of sub-cells around each edge, guessed from the values seen so far, are kept; if
    an edge falls outside its window (rows ordered by confidence, say), ``needs_another_pass``
    is True and ``next_pass()`` gives a pass on the sub-cells that hold the edges. Memory is
    bounded by the cells and the cap, not by the number of rows.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import ece
    >>> rng = np.random.default_rng(0)
    >>> p = rng.dirichlet(np.ones(3), size=100); y = rng.integers(0, 3, size=100)
    >>> first = EqualMassAccumulator(5).update(p[:50], y[:50]).update(p[50:], y[50:])
    >>> second = first.second_pass().update(p[50:], y[50:]).update(p[:50], y[:50])
    >>> second.needs_another_pass
    False
    >>> bool(np.isclose(second.ece(), ece(p, y, n_bins=5, binning="equal_mass"), rtol=1e-12))
    True
    """

    needs_another_pass = True

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

    def next_pass(self) -> "_EqualMassPass":
        n = int(self.hist.sum())
        self._check_seen(n)
        ranks = _quantile_ranks(n, self.n_bins) if self.n_bins > 1 else np.empty(0, np.int64)
        order = np.flatnonzero(self.hist[::-1])  # non-empty cells in increasing confidence
        pos, rank_in = _locate(self.hist[::-1][order], ranks)
        keys = (_N_KEYS - 1 - order[pos]).astype(np.uint64)
        return _EqualMassPass(self.n_bins, n, 0, keys, rank_in, self.hist[keys.astype(np.intp)])

    second_pass = next_pass


class _EqualMassPass(_Mergeable):
    """A pass that knows, at ``level``, the cell holding each quantile rank (``rank_keys``), the
    rank within it (``rank_in``) and the cell's row count (``cell_count``, to detect other data).

    It keeps the distinct confidences of those cells (values mode). Past ``_KEEP_MAX`` values it
    counts the cells' rows on the next level's sub-cells instead (``sub``) and, from the values
    seen so far, guesses for each rank a window of sub-cells that should hold it (``win``,
    inclusive sub-cell indices, larger index = lower confidence): values inside a window are
    still kept, rows outside it go to the bin sums (their side of every edge is known if the
    edge lies in its window). At the end the exact sub-cell of each rank is known from ``sub``:
    if every one lies in its window, the edges are exact from the kept values and this pass is
    the last; otherwise (data ordered by confidence, say) ``next_pass()`` refines.
    """

    def __init__(self, n_bins, n, level, rank_keys, rank_in, cell_count):
        self.n_bins, self.n, self.level = n_bins, n, level
        self.rank_keys, self.rank_in, self.cell_count = rank_keys, rank_in, cell_count
        self.shift = np.uint64(_SHIFTS[level])
        self.cells = np.unique(rank_keys)  # ascending key = decreasing confidence
        self.sorted_rank_keys = np.sort(rank_keys)
        self.rank_cell = np.searchsorted(self.cells, rank_keys)
        # bins below a cell: the ranks in cells of lower confidence (larger key)
        self.base_bin = rank_keys.size - np.searchsorted(self.sorted_rank_keys, self.cells, side="right")
        self.count, self.conf_sum, self.corr_sum = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
        self.kept = []  # [(values, counts, correct sums)] of rows in the edge cells (or windows)
        self.n_kept = 0  # values in self.kept (an upper bound on the distinct ones)
        self.sub = None  # (cells, 2**sub_bits) row counts at the next level, once kept values overflow
        self.win = None  # (ranks, 2) sub-cell window of each rank, with self.sub
        last = level + 1 >= len(_SHIFTS)
        self.sub_bits = 0 if last else _SHIFTS[level] - _SHIFTS[level + 1]

    @property
    def needs_another_pass(self) -> bool:
        return self.sub is not None and self._rank_subs() is None

    def update(self, probs, labels):
        return self.update_pairs(*confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct):
        conf = np.ascontiguousarray(confidence, dtype=np.float64)
        corr = np.asarray(correct, dtype=np.float64)
        bits = _bits(conf)
        key = bits >> self.shift
        pos = np.minimum(np.searchsorted(self.cells, key), self.cells.size - 1)
        edge = self.cells[pos] == key if self.cells.size else np.zeros(key.shape, bool)
        if edge.any():
            if self.sub is None:
                self._keep(conf[edge], corr[edge])
            else:
                self._fold(conf[edge], np.ones(int(edge.sum())), corr[edge], pos[edge])
            keep = ~edge
            conf, corr, key = conf[keep], corr[keep], key[keep]
        # a row outside the edge cells lies strictly between two edges: its bin is the number of
        # edges of lower confidence (= larger key)
        self._add_sums(self.sorted_rank_keys.size - np.searchsorted(self.sorted_rank_keys, key, side="right"),
                       conf, np.ones(conf.size), corr)
        return self

    def _add_sums(self, b, conf, counts, corr):
        self.count += np.bincount(b, weights=counts, minlength=self.n_bins)
        self.conf_sum += np.bincount(b, weights=conf * counts, minlength=self.n_bins)
        self.corr_sum += np.bincount(b, weights=corr, minlength=self.n_bins)

    def _keep(self, conf, corr):
        v, inv = np.unique(conf, return_inverse=True)
        self.kept.append((v, np.bincount(inv, minlength=v.size).astype(np.float64),
                          np.bincount(inv, weights=corr, minlength=v.size)))
        self.n_kept += v.size
        if len(self.kept) > 64 or self.n_kept > _KEEP_MAX:
            self.kept = [self._compact()]
            self.n_kept = self.kept[0][0].size
            if self.n_kept > _KEEP_MAX and self.sub_bits:
                if self.sub is None:
                    self._to_sub()
                else:  # the windows hold too many values: count only, the next pass resolves
                    self.win[:, 0], self.win[:, 1] = 1, 0
                    self.kept, self.n_kept = [], 0

    def _sub_of(self, vals):
        bits = _bits(vals)
        mask = np.uint64((1 << self.sub_bits) - 1)
        return (np.searchsorted(self.cells, bits >> self.shift),
                ((bits >> np.uint64(_SHIFTS[self.level + 1])) & mask).astype(np.intp))

    def _to_sub(self, win=None):
        """Too many distinct values: count them on the next level's sub-cells, guess each rank's
        window from them (or take ``win``) and keep only the values inside the windows."""
        vals, counts, corr = self._compact()
        self.kept, self.n_kept = [], 0
        self.sub = np.zeros((self.cells.size, 1 << self.sub_bits))
        self.win = self._guess_windows(vals, counts) if win is None else win.copy()
        self._fold(vals, counts, corr)

    def _guess_windows(self, vals, counts):
        """For each rank, the sub-cells of the values around its quantile among the values seen
        (+-6 standard deviations of a sample quantile, in rows), open-ended at the sample's ends."""
        cell, sub = self._sub_of(vals)
        win = np.empty((self.rank_keys.size, 2), np.intp)
        top = (1 << self.sub_bits) - 1
        for r, (c, r_in, n_cell) in enumerate(zip(self.rank_cell, self.rank_in, self.cell_count)):
            in_cell = cell == c
            v_sub, cum = sub[in_cell], np.cumsum(counts[in_cell])  # values ascending = confidence ascending
            m = cum[-1] if cum.size else 0.0
            f = min(1.0, r_in / max(1.0, float(n_cell)))
            p, d = f * m, 6.0 * np.sqrt(m * f * (1.0 - f)) + 8.0
            lo, hi = p - d, p + d
            # sub-cell of lower confidence = larger index: the window runs from hi's to lo's
            win[r, 0] = 0 if hi >= m - 1 else v_sub[np.searchsorted(cum, hi, side="right")]
            win[r, 1] = top if lo <= 0 else v_sub[np.searchsorted(cum, lo, side="right")]
        return win

    def _fold(self, vals, counts, corr, cell=None, *, counted=False):
        """Rows (or distinct values with counts) of the edge cells, in window mode: counted on the
        sub-cells (unless ``counted`` already); kept if inside a window of their cell, else summed
        into their bin."""
        if cell is None:
            cell, sub = self._sub_of(vals)
        else:
            sub = self._sub_of(vals)[1]
        if not counted:
            self.sub += np.bincount(cell * self.sub.shape[1] + sub, weights=counts,
                                    minlength=self.sub.size).reshape(self.sub.shape)
        above = np.zeros(vals.size, np.intp)  # ranks of the same cell whose window is all below
        inside = np.zeros(vals.size, bool)
        order = np.argsort(cell, kind="stable")
        bounds = np.searchsorted(cell[order], np.arange(self.cells.size + 1))
        for c, (a, b) in zip(self.rank_cell, self.win):
            rows = order[bounds[c]:bounds[c + 1]]
            s_r = sub[rows]
            above[rows] += a > s_r
            inside[rows] |= (a <= s_r) & (s_r <= b)
        if inside.any():
            self.kept.append((vals[inside], counts[inside], corr[inside]))
            self.n_kept += int(inside.sum())
        out = ~inside
        self._add_sums(self.base_bin[cell[out]] + above[out], vals[out], counts[out], corr[out])
        if len(self.kept) > 64 or self.n_kept > _KEEP_MAX:
            self._keep(np.empty(0), np.empty(0))  # compacts (and gives up the windows if still too many)

    def _rank_subs(self):
        """The exact sub-cell of each rank and its rank within that sub-cell, if every one lies
        in its window; else None."""
        subs = []
        top = self.sub.shape[1] - 1
        for r, (c, r_in) in enumerate(zip(self.rank_cell, self.rank_in)):
            pos, _ = _locate(self.sub[c][::-1], np.array([r_in]))
            s_r = top - int(pos[0])
            a, b = self.win[r]
            if not a <= s_r <= b:
                return None
            subs.append(s_r)
        return subs

    def _compact(self):
        """The kept values, distinct and ascending, with their row counts and correct sums."""
        if not self.kept:
            return np.empty(0), np.empty(0), np.empty(0)
        v = np.concatenate([k[0] for k in self.kept])
        u, inv = np.unique(v, return_inverse=True)
        c = np.bincount(inv, weights=np.concatenate([k[1] for k in self.kept]), minlength=u.size)
        a = np.bincount(inv, weights=np.concatenate([k[2] for k in self.kept]), minlength=u.size)
        return u, c, a

    def _merge(self, o):
        if not (o.level == self.level and np.array_equal(o.rank_keys, self.rank_keys)
                and np.array_equal(o.rank_in, self.rank_in)):
            raise ValueError("merge: equal-mass pass accumulators from different previous passes")
        self.count += o.count
        self.conf_sum += o.conf_sum
        self.corr_sum += o.corr_sum
        if self.sub is None and o.sub is not None:
            self._to_sub(win=o.win)
        if self.sub is None:
            self.kept = [self._compact(), o._compact()]
            self.n_kept = self.kept[0][0].size + self.kept[1][0].size
            if self.n_kept > _KEEP_MAX:
                self._keep(np.empty(0), np.empty(0))  # compacts, and goes to sub-cells if still too many
            return
        if o.sub is not None:
            # windows shrink to their intersection; kept values now outside go to the bin sums
            # (a row outside the larger window lies on the same side of the edge)
            win = np.stack([np.maximum(self.win[:, 0], o.win[:, 0]), np.minimum(self.win[:, 1], o.win[:, 1])], 1)
            if not np.array_equal(win, self.win):
                vals, counts, corr = self._compact()
                self.kept, self.n_kept, self.win = [], 0, win
                self._fold(vals, counts, corr, counted=True)
            self.sub += o.sub
            self._fold(*o._compact(), counted=True)
        else:
            self._fold(*o._compact())

    def next_pass(self) -> "_EqualMassPass":
        """The pass on the sub-cells holding the edges (only when ``needs_another_pass``)."""
        if not self.needs_another_pass:
            raise ValueError("equal-mass: this pass already resolved the edges; no further pass is needed")
        cell = self.rank_cell
        in_cell = self.sub[cell]  # (ranks, 2**sub_bits), sub-cells in decreasing confidence
        if not np.array_equal(in_cell.sum(axis=1), self.cell_count):
            raise ValueError("equal-mass pass saw other data than the previous pass")
        keys, rank_in, count = [], [], []
        for row, r in zip(in_cell, self.rank_in):
            pos, r_in = _locate(row[::-1], np.array([r]))
            sub = row.size - 1 - int(pos[0])
            keys.append(np.uint64(sub))
            rank_in.append(int(r_in[0]))
            count.append(row[sub])
        keys = (self.rank_keys << np.uint64(self.sub_bits)) | np.asarray(keys, np.uint64)
        return _EqualMassPass(self.n_bins, self.n, self.level + 1, keys, np.asarray(rank_in, np.int64),
                              np.asarray(count))

    second_pass = next_pass

    def edges(self) -> np.ndarray:
        if self.needs_another_pass:
            raise ValueError("equal-mass: the edges need another pass (needs_another_pass is True)")
        vals, counts, _ = self._compact()
        inner = []
        if self.sub is None:
            vkeys = _bits(vals) >> self.shift
            for key, r, n_cell in zip(self.rank_keys, self.rank_in, self.cell_count):
                in_cell = vkeys == key
                v, c = vals[in_cell], counts[in_cell]
                if c.sum() != n_cell:
                    raise ValueError("equal-mass second pass saw other data than the first pass")
                inner.append(v[np.searchsorted(np.cumsum(c), r, side="right")])
        else:
            cell, sub = self._sub_of(vals)
            if not np.array_equal(self.sub[self.rank_cell].sum(axis=1), self.cell_count):
                raise ValueError("equal-mass pass saw other data than the previous pass")
            for c, r_in, (a, b) in zip(self.rank_cell, self.rank_in, self.win):
                below = self.sub[c, b + 1:].sum()  # rows of this cell at lower confidence than the window
                in_win = (cell == c) & (sub >= a) & (sub <= b)
                v, k = vals[in_win], counts[in_win]
                if k.sum() != self.sub[c, a:b + 1].sum():
                    raise ValueError("equal-mass pass saw other data than the previous pass")
                inner.append(v[np.searchsorted(np.cumsum(k), r_in - below, side="right")])
        return np.concatenate([[0.0], np.asarray(inner, np.float64), [1.0]])

    def bin_sums(self):
        edges = self.edges()
        count, conf_sum, corr_sum = self.count.copy(), self.conf_sum.copy(), self.corr_sum.copy()
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
        if count.sum() != self.n:
            raise ValueError("equal-mass second pass saw other data than the first pass")
        return binned_gap(count, conf_sum, corr_sum, norm)

    def mce(self) -> float:
        return self.ece("max")

    def result(self) -> dict:
        return {"ece": self.ece(), "mce": self.mce()}


class SummaryAccumulator(_Mergeable):
    """The metrics of :func:`confcal.metrics.calibration_summary` (single pass unless equal-mass is asked).

    With ``equal_mass=True`` feed the same batches again while :attr:`needs_another_pass`:
    after :meth:`start_next_pass` (alias ``start_second_pass``), to :meth:`update` again (only
    the equal-mass bins use it; the rows were validated in pass 1). That is two passes, three
    when the edge windows miss (see :class:`EqualMassAccumulator`).

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
    def needs_another_pass(self) -> bool:
        return self.equal_mass is not None and self.equal_mass.needs_another_pass

    needs_second_pass = needs_another_pass

    def update(self, probs, labels):
        from confcal._validation import check_labels, check_probs

        if self.pass_no > 1 and isinstance(probs, np.ndarray) and probs.ndim == 2 and probs.dtype == np.float64:
            p = probs  # the same rows passed check_probs in pass 1 (the row counts are checked at the end)
            y = np.asarray(labels)
        else:
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

    def start_next_pass(self):
        if self.needs_another_pass:
            self.equal_mass = self.equal_mass.next_pass()
            self.pass_no += 1
        return self

    start_second_pass = start_next_pass

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
            if self.needs_another_pass:
                raise ValueError("SummaryAccumulator: equal-mass ECE needs another pass; call "
                                 "start_next_pass() and feed the batches again")
            out["ece_equal_mass"] = self.equal_mass.ece()
        out.update({"mce": self.bins.mce(), "nll": s["nll"], "brier": s["brier"]})
        return out


class BoxSummaryAccumulator(SummaryAccumulator):
    """:class:`SummaryAccumulator` of 1-D box scores (probability of a true positive, 0/1 labels)
    plus the detection ECE ``d_ece`` (Kueppers et al., CVPR-W 2020, eq. 3 on the confidence:
    :func:`confcal.metrics.detection_ece`), the metrics of ``confcal evaluate`` on box scores.

    The Brier score is then the binary ``mean (p - y)^2`` and ``ece`` the top-label ECE of
    ``[1 - p, p]`` (:mod:`confcal.evaluation.audit`).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import detection_ece
    >>> p = np.array([0.9, 0.2, 0.6, 0.7]); y = np.array([1, 0, 0, 1])
    >>> acc = BoxSummaryAccumulator(5).update(p[:2], y[:2]).merge(BoxSummaryAccumulator(5).update(p[2:], y[2:]))
    >>> acc = acc.start_next_pass().update(p, y)
    >>> bool(np.isclose(acc.result()["d_ece"], detection_ece(p, y, 5)))
    True
    """

    def __init__(self, n_bins: int = 15, *, equal_mass: bool = True):
        super().__init__(n_bins, equal_mass=equal_mass)
        self.d_bins = BinnedAccumulator(self.n_bins)

    def update(self, probs, labels):
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim != 1:
            raise ValueError(f"probs: expected box scores of shape (n_boxes,), got shape {p.shape}")
        first = self.pass_no == 1
        super().update(p, labels)  # validates (check_probs / check_labels) in pass 1
        if first:
            self.d_bins.update_pairs(p, np.asarray(labels))
        return self

    def _merge(self, o):
        super()._merge(o)
        self.d_bins.merge(o.d_bins)

    def result(self) -> dict:
        out = super().result()
        out["d_ece"] = self.d_bins.ece()
        return out
