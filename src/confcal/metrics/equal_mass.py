"""Equal-mass (quantile-binned) top-label ECE, exact, in mergeable passes (:class:`EqualMassAccumulator`).

Pass 1 counts confidences in cells ordered by the bits of ``1 - c``; each later pass refines
only the cells holding a quantile edge, so the edges (numpy's ``quantile(...,
method="inverted_cdf")``) and bin sums are exact whatever the batch order or partitioning.
"""

from __future__ import annotations

import numpy as np

from confcal.metrics._binning import assign_bins, binned_gap, check_n_bins
from confcal.metrics._mergeable import _Mergeable

__all__ = ["EqualMassAccumulator"]


def confidence_correct(probs, labels):
    """Validated top-label confidence (float64) and correctness (bool) of a batch."""
    from confcal.metrics.calibration import _confidence_correct

    return _confidence_correct(probs, labels)


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
