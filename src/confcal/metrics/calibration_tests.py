"""Hypothesis tests of calibration with p-values; the null hypothesis is "perfectly calibrated":
``P(correct | confidence = c) = c`` (top-label), ``P(y = 1 | score = s) = s`` (box scores, one label
of a multilabel head).

* Spiegelhalter's Z (Spiegelhalter, "Probabilistic prediction in patient management and clinical
  trials", Stat. Med. 5 (1986), eq. 5): ``Z = sum (y - p)(1 - 2p) / sqrt(sum (1 - 2p)^2 p (1 - p))``,
  standard normal under the null. Its sums add over batches, so it is mergeable as is.
* Kolmogorov–Smirnov and Kuiper statistics of the cumulative differences (Arrieta-Ibarra, Gujral,
  Tannenbaum & Tygert, "Metrics of calibration for probabilistic predictions", JMLR 23 (2022),
  sec. 3): sorted by score, ``C_k = (1/n) sum_{j<=k} (y_j - s_j)`` with ``C_0 = 0``, scaled by
  ``sigma = sqrt(sum s (1 - s)) / n``; ``KS = max |C_k| / sigma``, ``Kuiper = (max C_k - min C_k) /
  sigma``; under the null they tend to the maximum absolute value and the range of a standard
  Brownian motion on [0, 1] (:mod:`confcal.metrics.brownian`).

Tied scores: the cumulative differences are read only at the end of each run of equal scores, where
they do not depend on the order of the tied rows. So the statistics are a function of the multiset
of ``(score, outcome)`` pairs (any batch order, any engine); without ties this is the paper's
definition. (MAPIE 1.6 breaks ties by a seeded relative jitter of 1e-8 instead, and leaves ``C_0``
out of the Kuiper range; both only matter with ties, or when every ``C_k`` has the same sign.)

The cumulative tests need the scores in sorted order: :class:`CalibrationTestAccumulator` keeps the
``(score, outcome)`` pairs (9 bytes a row) and sorts them once in :meth:`~CalibrationTestAccumulator.result`,
so the merged result is exact, not an approximation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from confcal.metrics._mergeable import _Mergeable
from confcal.metrics.brownian import max_abs_sf, range_sf
from confcal.metrics.intervals import check_alpha

__all__ = ["TestResult", "spiegelhalter_test", "kolmogorov_smirnov_test", "kuiper_test", "cumulative_differences",
           "calibration_tests", "CalibrationTestAccumulator", "TESTS"]

#: names of the tests, in the order of every table
TESTS = ("spiegelhalter", "kolmogorov_smirnov", "kuiper")
ALTERNATIVES = ("two-sided", "greater")


@dataclass(frozen=True)
class TestResult:
    """One calibration test: ``statistic`` (``inf`` when the scores are all 0 or 1 and some outcome
    disagrees: calibration is then impossible), ``p_value`` in [0, 1] (never NaN), ``n`` rows."""

    __test__ = False  # not a pytest class

    name: str
    statistic: float
    p_value: float
    n: int

    def rejects(self, alpha: float = 0.05) -> bool:
        """Whether the test rejects perfect calibration at level ``alpha`` (``p_value <= alpha``)."""
        return self.p_value <= check_alpha(alpha)

    def as_dict(self) -> dict:
        """``{"statistic", "p_value", "n"}`` for a JSON document (an infinite statistic as None)."""
        return {"statistic": self.statistic if math.isfinite(self.statistic) else None,
                "p_value": self.p_value, "n": self.n}


def _pairs(confidence, correct):
    """Validated ``(scores float64, outcomes float64)`` of one batch."""
    from confcal._validation import as_numpy

    s = as_numpy(confidence, "confidence")
    y = as_numpy(correct, "correct")
    if s.ndim != 1 or s.dtype == bool or s.dtype.kind not in "fiu":
        raise ValueError(f"confidence: expected 1-D numeric scores (n_samples,), got {s.dtype} {s.shape}")
    s = s.astype(np.float64, copy=False)
    if y.shape != s.shape:
        raise ValueError(f"correct: expected shape {s.shape} (as confidence), got {y.shape}")
    bad = ~((s >= 0) & (s <= 1))  # NaN fails the comparison
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"confidence: expected scores in [0, 1], got {float(s[i])!r} at row {i}")
    if y.dtype != bool:
        if y.dtype.kind not in "fiu":
            raise ValueError(f"correct: expected 0/1 outcomes, got dtype {y.dtype}")
        bad = (y != 0) & (y != 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"correct: expected 0/1 outcomes, got {y[i].item()!r} at row {i}")
    return s, y.astype(np.float64, copy=False)


def _spiegelhalter(num: float, den: float, n: int, alternative: str) -> TestResult:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative: expected one of {ALTERNATIVES}, got {alternative!r}")
    if den > 0:
        z = num / math.sqrt(den)
    else:  # every score in {0, 1/2, 1}: the terms of p = 1/2 vanish, those of p in {0, 1} are y - p exactly
        z = 0.0 if num == 0 else math.copysign(math.inf, num)
    q = math.erfc(abs(z) / math.sqrt(2.0))  # two-sided: 2 Q(|z|)
    p = q if alternative == "two-sided" else 0.5 * math.erfc(z / math.sqrt(2.0))
    return TestResult("spiegelhalter", z, min(1.0, p), n)


def spiegelhalter_test(confidence, correct, *, alternative: str = "two-sided") -> TestResult:
    """Spiegelhalter's Z test of calibration.

    ``Z = sum_i (y_i - p_i)(1 - 2 p_i) / sqrt(sum_i (1 - 2 p_i)^2 p_i (1 - p_i))``; under perfect
    calibration ``E[Z] = 0`` and ``Var[Z] = 1``, and ``Z`` is asymptotically standard normal.

    Source: Spiegelhalter, Stat. Med. 5 (1986) 421-433, eq. 5 (the test of the Brier score's
    calibration component).

    Parameters
    ----------
    confidence : array-like of shape (n_samples,)
        Predicted probabilities of the event, in [0, 1] (top-label confidence, a box score, one
        label's probability).
    correct : array-like of shape (n_samples,)
        The outcomes, 0/1 or bool (the prediction was right, the box a true positive, the label on).
    alternative : {"two-sided", "greater"}, default="two-sided"
        ``"two-sided"``: ``p = 2 Q(|Z|)``; ``"greater"``: ``p = Q(Z)`` (MAPIE's
        ``spiegelhalter_p_value``), ``Q`` the standard normal tail.

    Returns
    -------
    TestResult
        ``statistic`` is ``Z``. All scores in ``{0, 1/2, 1}`` give a zero denominator: ``Z = 0``,
        ``p = 1`` when the numerator is 0 too, else ``Z = +-inf``, ``p = 0`` (a score of 0 or 1 that
        is wrong is never calibrated).

    Raises
    ------
    ValueError
        Scores outside [0, 1] or NaN, outcomes not 0/1, shapes differ, unknown ``alternative``, no rows.

    Examples
    --------
    Scores 0.2, 0.7, 0.9 with outcomes 0, 1, 0: the numerator is ``(0 - 0.2)(0.6) + (0.3)(-0.4) +
    (-0.9)(-0.8) = 0.48``, the variance ``0.36 * 0.16 + 0.16 * 0.21 + 0.64 * 0.09 = 0.1488``:

    >>> r = spiegelhalter_test([0.2, 0.7, 0.9], [0, 1, 0])
    >>> round(r.statistic, 4), round(0.48 / 0.1488 ** 0.5, 4), round(r.p_value, 4)
    (1.2443, 1.2443, 0.2134)
    """
    s, y = _pairs(confidence, correct)
    if s.size == 0:
        raise ValueError("confidence: expected at least 1 row, got 0")
    t = 1.0 - 2.0 * s
    return _spiegelhalter(float(np.sum((y - s) * t)), float(np.sum(t * t * s * (1.0 - s))), int(s.size), alternative)


def cumulative_differences(confidence, correct):
    """The cumulative differences of Arrieta-Ibarra et al. (JMLR 2022, sec. 3) at the end of each run of
    tied scores.

    Parameters
    ----------
    confidence : array-like of shape (n_samples,)
        Scores in [0, 1].
    correct : array-like of shape (n_samples,)
        0/1 outcomes.

    Returns
    -------
    scores : ndarray of shape (n_distinct,)
        The distinct scores, increasing.
    c : ndarray of shape (n_distinct,)
        ``C = (1/n) sum_{j: s_j <= score} (y_j - s_j)`` at each.
    sigma : float
        ``sqrt(sum s (1 - s)) / n``, the standard deviation of ``C_n`` under the null.

    Raises
    ------
    ValueError
        As :func:`spiegelhalter_test`.
    """
    s, y = _pairs(confidence, correct)
    if s.size == 0:
        raise ValueError("confidence: expected at least 1 row, got 0")
    return _cumulative(s, y)


def _cumulative(s: np.ndarray, y: np.ndarray):
    """``(distinct scores, C at each, sigma)``, by one argsort (the public, small-data form)."""
    n = s.size
    order = np.argsort(s, kind="stable")
    ss = s[order]
    cs = np.cumsum(y[order] - ss)
    ends = np.flatnonzero(np.append(ss[1:] != ss[:-1], True))  # the last row of each run of equal scores
    sigma = math.sqrt(float(np.sum(s * (1.0 - s)))) / n
    return ss[ends], cs[ends] / n, sigma


def _extremes(s: np.ndarray, y: np.ndarray):
    """``(max C, min C, sigma)`` over the distinct scores, without an argsort (slow on millions of rows).

    The scores of the positive and of the negative rows are sorted apart (value sorts of n rows in all);
    ``C`` at a score ``u`` is ``(k1(u) - S1(k1(u)) - S0(k0(u))) / n``, ``k1``, ``k0`` the numbers of positive
    and negative rows with score ``<= u`` (binary searches: a run of ties is counted whole, so no order
    among tied rows is needed) and ``S1``, ``S0`` the prefix sums of their sorted scores. Every distinct
    score is a score of one of the two sets, so evaluating at both sets' scores visits all of them."""
    n = s.size
    pos = np.asarray(y, dtype=bool)
    s1, s0 = np.sort(s[pos]), np.sort(s[~pos])
    cs1 = np.concatenate([[0.0], np.cumsum(s1)])
    cs0 = np.concatenate([[0.0], np.cumsum(s0)])
    hi, lo = -math.inf, math.inf
    for u in (s1, s0):
        if u.size:
            k1 = np.searchsorted(s1, u, side="right")
            k0 = np.searchsorted(s0, u, side="right")
            c = (k1 - cs1[k1] - cs0[k0]) / n
            hi, lo = max(hi, float(c.max())), min(lo, float(c.min()))
    sigma = math.sqrt(float(np.sum(s * (1.0 - s)))) / n
    return hi, lo, sigma


def _scaled(name: str, spread: float, sigma: float, n: int, sf) -> TestResult:
    if sigma > 0:
        stat = spread / sigma
        return TestResult(name, stat, sf(stat), n)
    # every score 0 or 1: the differences are whole numbers over n, 0 exactly when every outcome agrees
    return TestResult(name, 0.0, 1.0, n) if spread == 0 else TestResult(name, math.inf, 0.0, n)


def _ks(hi, lo, sigma, n) -> TestResult:
    return _scaled("kolmogorov_smirnov", max(abs(hi), abs(lo)), sigma, n, max_abs_sf)


def _kuiper(hi, lo, sigma, n) -> TestResult:
    spread = max(0.0, hi) - min(0.0, lo)  # C_0 = 0 belongs to the path
    return _scaled("kuiper", spread, sigma, n, range_sf)


def kolmogorov_smirnov_test(confidence, correct) -> TestResult:
    """Kolmogorov–Smirnov test of calibration on the cumulative differences.

    ``KS = max_k |C_k| / sigma`` (:func:`cumulative_differences`), p-value ``P(sup |B| > KS)`` for a
    standard Brownian motion on [0, 1] (:func:`confcal.metrics.brownian.max_abs_sf`).

    Source: Arrieta-Ibarra, Gujral, Tannenbaum & Tygert, JMLR 23 (2022), sec. 3 (the ECCE-MAD);
    Tygert, arXiv 2202.00100, eq. 2 (the p-value).

    Parameters
    ----------
    confidence : array-like of shape (n_samples,)
        Scores in [0, 1].
    correct : array-like of shape (n_samples,)
        0/1 outcomes.

    Returns
    -------
    TestResult
        All scores 0 or 1: statistic 0 and p 1 when every outcome matches its score, else ``inf`` and 0.

    Raises
    ------
    ValueError
        As :func:`spiegelhalter_test`.

    Examples
    --------
    Sorted scores 0.2, 0.5, 0.8 with outcomes 0, 1, 1: ``C = (-0.2, 0.3, 0.5) / 3``, ``sigma =
    sqrt(0.16 + 0.25 + 0.16) / 3``, so ``KS = 0.5 / sqrt(0.57)``:

    >>> r = kolmogorov_smirnov_test([0.5, 0.2, 0.8], [1, 0, 1])
    >>> round(r.statistic, 4), round(0.5 / 0.57 ** 0.5, 4)
    (0.6623, 0.6623)
    """
    _, c, sigma = cumulative_differences(confidence, correct)
    return _ks(float(c.max()), float(c.min()), sigma, int(np.size(confidence)))


def kuiper_test(confidence, correct) -> TestResult:
    """Kuiper test of calibration on the cumulative differences.

    ``Kuiper = (max_{0<=k<=n} C_k - min_{0<=k<=n} C_k) / sigma`` with ``C_0 = 0``
    (:func:`cumulative_differences`), p-value ``P(range of B > Kuiper)`` for a standard Brownian motion
    on [0, 1] (:func:`confcal.metrics.brownian.range_sf`).

    Source: Arrieta-Ibarra et al., JMLR 23 (2022), sec. 3 (the ECCE-R); Tygert, arXiv 2202.00100,
    eq. 3 (the p-value, after Feller 1951).

    Parameters
    ----------
    confidence : array-like of shape (n_samples,)
        Scores in [0, 1].
    correct : array-like of shape (n_samples,)
        0/1 outcomes.

    Returns
    -------
    TestResult
        As :func:`kolmogorov_smirnov_test`.

    Raises
    ------
    ValueError
        As :func:`spiegelhalter_test`.

    Examples
    --------
    The :func:`kolmogorov_smirnov_test` example: ``C`` runs from ``-0.2/3`` to ``0.5/3``, so the range
    is ``0.7 / 3`` and ``Kuiper = 0.7 / sqrt(0.57)``:

    >>> r = kuiper_test([0.5, 0.2, 0.8], [1, 0, 1])
    >>> round(r.statistic, 4), round(0.7 / 0.57 ** 0.5, 4)
    (0.9272, 0.9272)
    """
    _, c, sigma = cumulative_differences(confidence, correct)
    return _kuiper(float(c.max()), float(c.min()), sigma, int(np.size(confidence)))


class CalibrationTestAccumulator(_Mergeable):
    """The three calibration tests over row batches: :meth:`update_pairs` (scores and 0/1 outcomes),
    :meth:`update` (top-label confidence of probabilities and labels), :meth:`merge`, :meth:`result`.

    Spiegelhalter's sums are added as they come; the cumulative tests keep every ``(score, outcome)``
    pair (9 bytes a row, ``cumulative=False`` to keep none) and sort them once in :meth:`result`,
    so the merged result is the one-shot result, in any batch order (up to float64 summation order).

    Parameters
    ----------
    cumulative : bool, default=True
        Also the Kolmogorov–Smirnov and Kuiper tests.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> s = rng.uniform(size=1000); y = rng.uniform(size=1000) < s
    >>> acc = CalibrationTestAccumulator().update_pairs(s[:400], y[:400])
    >>> acc = acc.merge(CalibrationTestAccumulator().update_pairs(s[400:], y[400:]))
    >>> bool(np.isclose(acc.result()["kuiper"].p_value, kuiper_test(s, y).p_value, rtol=1e-12))
    True
    """

    def __init__(self, cumulative: bool = True):
        self.cumulative = bool(cumulative)
        self.n = 0
        self.num = 0.0  # sum (y - p)(1 - 2p)
        self.den = 0.0  # sum (1 - 2p)^2 p (1 - p)
        self._scores: list = []
        self._outcomes: list = []

    def update(self, probs, labels):
        from confcal.metrics.calibration import _confidence_correct  # not accumulators: it imports this module

        return self.update_pairs(*_confidence_correct(probs, labels))

    def update_pairs(self, confidence, correct):
        s, y = _pairs(confidence, correct)
        return self._add(s, y)

    def _add(self, s, y, *, owned: bool = False):
        """Add validated scores (float64) and 0/1 outcomes (bool or numbers); ``owned``: ``s`` and a bool
        ``y`` are the caller's temporaries, kept without a copy."""
        t = 1.0 - 2.0 * s
        self.n += int(s.size)
        self.num += float(np.dot(y - s, t))
        self.den += float(np.dot(t * t, s * (1.0 - s)))
        if self.cumulative and s.size:
            keep = np.asarray if owned else np.array
            kept = keep(s, dtype=np.float64), keep(y, dtype=bool)
            for a in kept:
                a.flags.writeable = False  # shared, never written: copies of the accumulator share them
            self._scores.append(kept[0])
            self._outcomes.append(kept[1])
        return self

    def __deepcopy__(self, memo):
        # the kept arrays are read-only, so a copy shares them (an evaluate pass copies its accumulators)
        new = CalibrationTestAccumulator.__new__(CalibrationTestAccumulator)
        new.__dict__.update(self.__dict__)
        new._scores, new._outcomes = list(self._scores), list(self._outcomes)
        return new

    def _merge(self, o):
        if o.cumulative != self.cumulative:
            raise ValueError("merge: one accumulator keeps the cumulative tests and the other does not")
        self.n += o.n
        self.num += o.num
        self.den += o.den
        self._scores.extend(o._scores)
        self._outcomes.extend(o._outcomes)

    def result(self, *, alternative: str = "two-sided") -> dict:
        """``{"spiegelhalter": TestResult, "kolmogorov_smirnov": ..., "kuiper": ...}`` (the last two
        only with ``cumulative=True``); ``alternative`` of Spiegelhalter's test."""
        self._check_seen(self.n)
        out = {"spiegelhalter": _spiegelhalter(self.num, self.den, self.n, alternative)}
        if self.cumulative:
            if len(self._scores) > 1:  # compact once: later calls and pickles carry one array
                self._scores = [np.concatenate(self._scores)]
                self._outcomes = [np.concatenate(self._outcomes)]
                self._scores[0].flags.writeable = self._outcomes[0].flags.writeable = False
            hi, lo, sigma = _extremes(self._scores[0], self._outcomes[0])
            out["kolmogorov_smirnov"] = _ks(hi, lo, sigma, self.n)
            out["kuiper"] = _kuiper(hi, lo, sigma, self.n)
        return out


def calibration_tests(probs, labels, *, alternative: str = "two-sided") -> dict:
    """The three tests on the top-label confidence of ``probs`` against ``labels``.

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities (top label of ``[1 - p, p]``).
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    alternative : {"two-sided", "greater"}, default="two-sided"
        Of Spiegelhalter's test.

    Returns
    -------
    dict of str to TestResult
        Keys :data:`TESTS`.

    Raises
    ------
    ValueError
        Invalid probabilities or labels.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> p = rng.dirichlet(np.ones(3), size=2000)
    >>> y = np.array([rng.choice(3, p=row) for row in p])  # calibrated by construction
    >>> r = calibration_tests(p, y)
    >>> sorted(r), all(0.0 <= t.p_value <= 1.0 for t in r.values())
    (['kolmogorov_smirnov', 'kuiper', 'spiegelhalter'], True)
    """
    return CalibrationTestAccumulator().update(probs, labels).result(alternative=alternative)
