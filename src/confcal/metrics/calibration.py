"""Binned calibration errors: ECE, MCE, class-wise ECE and the reliability table.

All inputs are probabilities ``(n_samples, n_classes)`` (or 1-D positive-class
probabilities of a binary problem, read as the columns ``[1 - p, p]``) and
integer labels ``(n_samples,)``. Computation is in float64 and O(n) per call
apart from the quantiles of equal-mass binning. Bin edges follow the ``(lo, hi]``
convention of :mod:`confcal.metrics._binning`.
"""

from __future__ import annotations

import numpy as np

from confcal._validation import check_labels, check_probs
from confcal.metrics._binning import bin_sums, binned_gap, check_n_bins

__all__ = ["ece", "mce", "classwise_ece", "reliability_table", "ECEAccumulator"]

def _confidence_correct(probs, labels):
    p = check_probs(probs, keep_dtype=True)  # float32 stays float32: argmax and the gather are exact
    y = check_labels(labels, p.shape[0], p.shape[1])
    pred = np.argmax(p, axis=1)  # ties: lowest index wins, as in accuracy()
    conf = p[np.arange(p.shape[0]), pred].astype(np.float64, copy=False)
    return conf, (pred == y)


def ece(probs, labels, n_bins: int = 15, binning: str = "equal_width", norm: str = "l1",
        *, return_n_bins: bool = False):
    """Top-label expected calibration error (ECE).

    ``ECE = sum_b (n_b / n) |acc(b) - conf(b)|`` over bins of the top-label
    confidence; bins are weighted by their count and empty bins contribute
    nothing.  Bin edges follow the ``(lo, hi]`` convention (the first bin is
    closed at 0).

    Source: Guo et al., "On Calibration of Modern Neural Networks", ICML
    2017, eq. 5; Atarashi et al., arXiv 2506.10572, eq. 4.

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities (numpy or torch); a 1-D input holds the positive-class
        probabilities of a binary problem (read as ``[1 - p, p]``).
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    n_bins : int, default=15
        Number of bins.
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        Edges at ``k / n_bins``, or at confidence quantiles (tied confidences
        share a bin, so fewer effective bins can result: a constant predictor
        gets one bin, never a spurious 0).
    norm : {"l1", "l2", "max"}, default="l1"
        ECE, the root of the count-weighted mean squared gap, or MCE.
    return_n_bins : bool, default=False
        Also return the effective number of (non-empty) bins.

    Returns
    -------
    ece : float
        In ``[0, 1]`` (a fraction, not percent).
    n_bins_used : int
        Only with ``return_n_bins=True``.

    Raises
    ------
    ValueError
        Invalid probabilities or labels (see
        :func:`confcal._validation.check_probs`), unknown ``binning`` or
        ``norm``, ``n_bins < 1``.

    See Also
    --------
    mce, classwise_ece, reliability_table, smooth_ece

    Examples
    --------
    Four predictions in five equal-width bins: confidence 0.9 (right) alone
    in ``(0.8, 1]``, gap 0.1; 0.75 (wrong) and 0.7 (right) in ``(0.6, 0.8]``,
    gap ``|0.725 - 0.5| = 0.225``; 0.55 (right) in ``(0.4, 0.6]``, gap 0.45.
    ``ECE = (0.1 + 2 * 0.225 + 0.45) / 4 = 0.25``:

    >>> import numpy as np
    >>> from confcal.metrics import ece
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> labels = np.array([0, 0, 0, 1])
    >>> round(ece(probs, labels, n_bins=5), 6)
    0.25

    Equal-mass bins put each sample in its own bin here, so the ECE is the
    mean ``|conf - correct|`` = ``(0.1 + 0.75 + 0.45 + 0.3) / 4``:

    >>> value, used = ece(probs, labels, n_bins=5, binning="equal_mass", return_n_bins=True)
    >>> round(value, 6), used
    (0.4, 4)
    """
    sums = _fused_bin_sums(probs, labels, n_bins, binning)
    if sums is not None:
        count = sums[0]
        value = binned_gap(*sums[:3], norm)
        return (value, int(np.count_nonzero(count))) if return_n_bins else value
    conf, correct = _confidence_correct(probs, labels)
    return _ece_from_pairs(conf, correct, n_bins, binning, norm, return_n_bins)


#: rows per block of the fused pass: a float32 block of 10 classes is 1.3 MB, in L2/L3 with its temporaries
_FUSED_ROWS = 1 << 15


def _fused_bin_sums(probs, labels, n_bins, binning):
    """Per-bin ``(count, conf_sum, corr_sum, edges)`` of the top-label confidence in one pass over
    ``probs`` block by block (validation, arg-max, gather, bin index and bincounts of a block while
    it is in cache), or ``None`` where that path does not apply (1-D, equal-mass, small or non-float
    input: the caller takes the whole-array path).

    Same validation as :func:`~confcal._validation.check_probs` (an invalid block re-runs it on the
    whole array, so the error names the first bad row) and the same bin rule; the per-bin sums are
    float64 sums of the same values, added block by block (they may differ from one bincount in
    the last bits)."""
    from confcal._validation import as_numpy

    if binning != "equal_width":
        return None
    p = as_numpy(probs, "probs")
    if p.ndim != 2 or p.dtype not in (np.float32, np.float64) or p.shape[0] <= _FUSED_ROWS or p.shape[1] < 2:
        return None
    n_bins = check_n_bins(n_bins)
    n, k = p.shape
    y = check_labels(labels, n, k)
    from confcal.metrics._binning import _linspace, equal_width_bins

    count = np.zeros(n_bins)
    conf_sum = np.zeros(n_bins)
    corr_sum = np.zeros(n_bins)
    ones = np.ones(k, dtype=p.dtype)
    for a in range(0, n, _FUSED_ROWS):
        b = p[a:a + _FUSED_ROWS]
        if k <= _COLUMN_MAX_CLASSES:
            ok, pred, conf = _top_by_columns(b)
        else:
            lo, hi = b.min(), b.max()  # NaN fails the comparison, as in check_probs
            ok = lo >= 0 and hi <= 1 and not (np.abs(b @ ones - 1.0) > 1e-3).any()
            pred = np.argmax(b, axis=1)  # ties: lowest index wins, as in _confidence_correct
            conf = b[np.arange(b.shape[0]), pred]
        if not ok:
            # the reference rule on every row so far: raises naming the first bad row (rows before
            # this block passed); a row sum at the tolerance's edge, rounded otherwise here, goes on
            check_probs(p[:a + len(b)])
        conf = conf.astype(np.float64)
        idx = equal_width_bins(conf, n_bins)
        count += np.bincount(idx, minlength=n_bins)
        conf_sum += np.bincount(idx, weights=conf, minlength=n_bins)
        corr_sum += np.bincount(idx[pred == y[a:a + _FUSED_ROWS]], minlength=n_bins)
    return count, conf_sum, corr_sum, _linspace(n_bins).copy()


#: up to this many classes the fused pass reduces a block column by column (see _top_by_columns)
_COLUMN_MAX_CLASSES = 32


def _top_by_columns(b):
    """``(valid, arg-max, max)`` of the rows of a block ``(rows, K)``, small ``K``.

    Row-wise reductions over a handful of classes run one short inner loop per row (numpy's
    ``argmax(axis=1)`` and ``max(axis=1)`` cost most of the ECE with 10 classes, with or without its
    SIMD paths); on the transposed block ``(K, rows)`` every step is one long element-wise pass.
    The arg-max keeps the lowest index on ties, as ``argmax`` does; validity is check_probs' rule
    (values in [0, 1], NaN failing it, row sums within 1e-3 of 1)."""
    bt = np.ascontiguousarray(b.T)
    top = np.maximum.reduce(bt, axis=0)
    ok = bool(bt.min() >= 0 and top.max() <= 1) and not (np.abs(np.add.reduce(bt, axis=0) - 1.0) > 1e-3).any()
    pred = np.full(bt.shape[1], bt.shape[0] - 1, dtype=np.intp)
    for j in range(bt.shape[0] - 2, -1, -1):  # descending: the lowest tied index is written last
        pred[bt[j] == top] = j
    return ok, pred, top


def _ece_from_pairs(conf, correct, n_bins, binning, norm, return_n_bins=False):
    count, conf_sum, corr_sum, _ = bin_sums(conf, correct, check_n_bins(n_bins), binning)
    value = binned_gap(count, conf_sum, corr_sum, norm)
    return (value, int(np.count_nonzero(count))) if return_n_bins else value


def mce(probs, labels, n_bins: int = 15, binning: str = "equal_width") -> float:
    """Maximum calibration error (MCE): the largest ``|acc(b) - conf(b)|`` over non-empty bins.

    Source: Guo et al., ICML 2017, eq. 6.  Same inputs and bin convention
    as :func:`ece` (``norm="max"``).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    n_bins : int, default=15
        Number of bins.
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        As in :func:`ece`.

    Returns
    -------
    float
        In ``[0, 1]``.

    Raises
    ------
    ValueError
        As :func:`ece`.

    Examples
    --------
    The bins of the :func:`ece` example have gaps 0.45, 0.225 and 0.1:

    >>> import numpy as np
    >>> from confcal.metrics import mce
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> round(mce(probs, [0, 0, 0, 1], n_bins=5), 6)
    0.45
    """
    return ece(probs, labels, n_bins=n_bins, binning=binning, norm="max")


def classwise_ece(probs, labels, n_bins: int = 15, binning: str = "equal_width",
                  *, return_per_class: bool = False):
    """Class-wise ECE: the mean over classes ``k`` of the ECE of ``p[:, k]`` against ``labels == k``.

    Every sample counts in every class's bins.

    Source: Kull et al., "Beyond temperature scaling: Obtaining
    well-calibrated multiclass probabilities with Dirichlet calibration",
    NeurIPS 2019, sec. 3 (classwise-ECE).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    n_bins : int, default=15
        Number of bins per class.
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        As in :func:`ece`.
    return_per_class : bool, default=False
        Also return the ECE of each class.

    Returns
    -------
    classwise_ece : float
        In ``[0, 1]``.
    per_class : ndarray of shape (n_classes,)
        Only with ``return_per_class=True``.

    Raises
    ------
    ValueError
        As :func:`ece`.

    Examples
    --------
    Class 0 of the :func:`ece` example: ``p = [0.9, 0.25, 0.55, 0.3]``
    against ``[1, 1, 1, 0]`` has gaps 0.1 (one sample), 0.225 (two) and
    0.45 (one), so 0.25; class 1 mirrors it:

    >>> import numpy as np
    >>> from confcal.metrics import classwise_ece
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> value, per_class = classwise_ece(probs, [0, 0, 0, 1], n_bins=5, return_per_class=True)
    >>> round(value, 6), per_class.round(6).tolist()
    (0.25, [0.25, 0.25])
    """
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    per_class = np.array([
        _ece_from_pairs(p[:, k], y == k, n_bins, binning, "l1") for k in range(p.shape[1])
    ])
    value = float(per_class.mean())
    return (value, per_class) if return_per_class else value


def reliability_table(probs, labels, n_bins: int = 10, binning: str = "equal_width") -> dict:
    """Per-bin statistics of the top-label confidence for a reliability diagram.

    Source: the reliability diagram of Guo et al., ICML 2017, sec. 2
    (DeGroot & Fienberg 1983).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    n_bins : int, default=10
        Number of bins (always that many rows, empty ones included).
    binning : {"equal_width", "equal_mass"}, default="equal_width"
        As in :func:`ece`.

    Returns
    -------
    dict of str to ndarray of shape (n_bins,)
        ``bin_lo``, ``bin_hi`` (edges, ``(lo, hi]`` with the first bin closed
        at 0), ``mean_confidence`` and ``accuracy`` (float64, NaN for empty
        bins) and ``count`` (int64).

    Raises
    ------
    ValueError
        As :func:`ece`.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import reliability_table
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> table = reliability_table(probs, [0, 0, 0, 1], n_bins=5)
    >>> table["count"].tolist()
    [0, 0, 1, 2, 1]
    >>> table["mean_confidence"].round(3).tolist(), table["accuracy"].tolist()
    ([nan, nan, 0.55, 0.725, 0.9], [nan, nan, 1.0, 0.5, 1.0])
    """
    sums = _fused_bin_sums(probs, labels, n_bins, binning)
    if sums is None:
        conf, correct = _confidence_correct(probs, labels)
        sums = bin_sums(conf, correct, check_n_bins(n_bins), binning)
    count, conf_sum, corr_sum, edges = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(count > 0, conf_sum / count, np.nan)
        acc = np.where(count > 0, corr_sum / count, np.nan)
    return {
        "bin_lo": edges[:-1].copy(),
        "bin_hi": edges[1:].copy(),
        "mean_confidence": mean_conf,
        "accuracy": acc,
        "count": count.astype(np.int64),
    }


class ECEAccumulator:
    """Streaming equal-width top-label ECE: feed batches with :meth:`update`, read :meth:`ece`.

    Gives exactly the pooled :func:`ece` (equal-width bins are
    data-independent, so per-bin sums add up).  Equal-mass bins need all
    confidences and are not offered.  Memory is O(n_bins).

    Source: the ECE of Guo et al., ICML 2017, eq. 5.

    Parameters
    ----------
    n_bins : int, default=15
        Number of equal-width bins.

    Attributes
    ----------
    count, conf_sum, corr_sum : ndarray of shape (n_bins,)
        Per-bin sample count, sum of confidences and number correct so far.

    Raises
    ------
    ValueError
        ``n_bins < 1``; :meth:`update` with invalid probabilities or labels;
        :meth:`ece` before any sample.

    Examples
    --------
    Two batches give the ECE of the pooled data (0.25 in the :func:`ece`
    example):

    >>> import numpy as np
    >>> from confcal.metrics import ECEAccumulator
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> labels = np.array([0, 0, 0, 1])
    >>> acc = ECEAccumulator(n_bins=5)
    >>> acc = acc.update(probs[:2], labels[:2]).update(probs[2:], labels[2:])
    >>> round(acc.ece(), 6), int(acc.count.sum())
    (0.25, 4)
    """

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(n_bins)
        self.count = np.zeros(self.n_bins)
        self.conf_sum = np.zeros(self.n_bins)
        self.corr_sum = np.zeros(self.n_bins)

    def update(self, probs, labels) -> "ECEAccumulator":
        """Add a batch (``probs`` ``(n, n_classes)`` or ``(n,)``, ``labels`` ``(n,)``); returns ``self``."""
        conf, correct = _confidence_correct(probs, labels)
        c, s, a, _ = bin_sums(conf, correct, self.n_bins, "equal_width")
        self.count += c
        self.conf_sum += s
        self.corr_sum += a
        return self

    def ece(self, norm: str = "l1") -> float:
        """ECE of everything seen so far (``norm`` as in :func:`ece`)."""
        if self.count.sum() == 0:
            raise ValueError("ECEAccumulator: no samples seen; call update() first")
        return binned_gap(self.count, self.conf_sum, self.corr_sum, norm)


