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
from confcal.metrics._mergeable import _Mergeable
from confcal.metrics.equal_mass import EqualMassAccumulator  # its own module: the exact equal-mass passes

# EqualMassAccumulator is re-exported for old imports but documented in its own module
__all__ = ["ScoresAccumulator", "BinnedAccumulator", "ClasswiseAccumulator", "SmoothECEAccumulator",
           "SummaryAccumulator", "BoxSummaryAccumulator", "confidence_correct"]


_BLOCK = 1 << 14  # rows per block of update_pairs (measured: 16K beats 64K and 256K)


def confidence_correct(probs, labels):
    """Validated top-label confidence (float64) and correctness (bool) of a batch."""
    from confcal.metrics.calibration import _confidence_correct

    return _confidence_correct(probs, labels)


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

    def __init__(self, n_bins: int = 15, *, equal_mass: bool = True, tests: bool = True):
        from confcal.metrics.calibration_tests import CalibrationTestAccumulator

        self.n_bins = check_n_bins(n_bins)
        self.scores = ScoresAccumulator()
        self.bins = BinnedAccumulator(self.n_bins)
        self.equal_mass = EqualMassAccumulator(self.n_bins) if equal_mass else None
        # calibration tests of the top-label confidence (box scores: of the score), pass 1 only
        self.tests = CalibrationTestAccumulator() if tests else None
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
            if self.tests is not None and not isinstance(self, BoxSummaryAccumulator):
                self.tests._add(conf, correct, owned=True)  # this batch's temporaries
        if self.equal_mass is not None:
            self.equal_mass.update_pairs(conf, correct)
        return self

    def start_next_pass(self):
        self.tests = None  # pass 1 only: later passes neither feed nor carry it (the pairs stay in pass 1's)
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
        if self.tests is not None and o.tests is not None:
            self.tests.merge(o.tests)
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

    def __init__(self, n_bins: int = 15, *, equal_mass: bool = True, tests: bool = True):
        super().__init__(n_bins, equal_mass=equal_mass, tests=tests)
        self.d_bins = BinnedAccumulator(self.n_bins)

    def update(self, probs, labels):
        p = np.asarray(probs, dtype=np.float64)
        if p.ndim != 1:
            raise ValueError(f"probs: expected box scores of shape (n_boxes,), got shape {p.shape}")
        first = self.pass_no == 1
        super().update(p, labels)  # validates (check_probs / check_labels) in pass 1
        if first:
            self.d_bins.update_pairs(p, np.asarray(labels))
            if self.tests is not None:  # the tests of the box score itself, as the D-ECE's bins
                self.tests._add(p, np.asarray(labels))
        return self

    def _merge(self, o):
        super()._merge(o)
        self.d_bins.merge(o.d_bins)

    def result(self) -> dict:
        out = super().result()
        out["d_ece"] = self.d_bins.ece()
        return out
