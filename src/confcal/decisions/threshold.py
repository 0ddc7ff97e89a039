"""One threshold with a risk guarantee: Learn-then-Test over a grid of score cutoffs.

The rule "positive iff score >= lambda" has four risks (labels: 1 = positive, e.g. a true-positive
box or a correct top label), each a conditional proportion so its errors given the count are
binomial (:mod:`.pvalues`):

============  ==============================================  ====================  ========
risk          definition                                      errors / count        side
============  ==============================================  ====================  ========
``fdr``       false discovery: 1 - precision                  negatives >= lambda   accept
              ``P(Y = 0 | S >= lambda)``                      / items >= lambda
``fpr``       false-positive rate ``P(S >= lambda | Y=0)``    negatives >= lambda   accept
                                                              / negatives
``miss``      miss rate: 1 - recall ``P(S < lambda | Y=1)``   positives < lambda    reject
                                                              / positives
``for``       false omission: 1 - NPV                         positives < lambda    reject
              ``P(Y = 1 | S < lambda)``                       / items < lambda
============  ==============================================  ====================  ========

Accept-side risks certify the items *at or above* lambda (accept them); the smallest certified
lambda is chosen. Reject-side risks certify the items *below* lambda (reject them); the largest
certified lambda is chosen. Guarantee (LTT Theorem 1): ``P(R(lambda_hat) <= alpha) >= 1 - delta``
over the draw of an exchangeable (i.i.d.) calibration set.

Fixed-sequence order: accept side from the highest grid point down, reject side from the lowest up.
For ``fdr`` / ``for`` the count (accepted / rejected items) shrinks toward the start of that order, and a
single sequence started where the count first reaches ``n_min`` stops at the first error there: with 97%
precision among the top 60 items, precision >= 0.95 cannot be certified on 60 items, and the sequence
never reaches the 500 items that could. ``procedure="fixed_sequence"`` therefore runs ``J`` sequences
(LTT Sec. 4: fixed-sequence testing with several starting points, Bonferroni over the starts), each at
level ``delta / J``, started where the count first reaches ``n_min * 2^j`` (``j = 0 .. J - 1``, up to the
largest count; ``n_min`` at level ``delta / J``); the certified set is their union. The starts depend on
the scores only, never on the labels. ``"fixed_sequence_single"`` is the one sequence from ``n_min``;
``fpr`` / ``miss`` (a fixed count) always use one sequence. Before the first start a p-value is at least
``(1 - alpha)^count > delta``: a test there could only stop the sequence.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from confcal.decisions._counts import below_counts, check_grid, check_scores_labels, default_grid
from confcal.decisions.fwer import fixed_sequence, holm
from confcal.decisions.pvalues import binomial_pvalue, check_level, hoeffding_bentkus_pvalue

__all__ = ["RISKS", "PROCEDURES", "PVALUES", "ThresholdFit", "ltt_threshold", "risk_counts", "min_count",
           "certify"]

#: risk name -> side ("accept": certifies S >= lambda, "reject": certifies S < lambda)
RISKS = {"fdr": "accept", "fpr": "accept", "miss": "reject", "for": "reject"}
PROCEDURES = ("fixed_sequence", "fixed_sequence_single", "holm")
PVALUES = ("binomial", "hoeffding_bentkus")


def check_choice(value, name: str, choices) -> str:
    """``value`` if it is one of ``choices``, else a one-line ``ValueError`` naming ``name``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value


def risk_counts(risk: str, n_below: np.ndarray, pos_below: np.ndarray, n: int, n_pos: int):
    """``(errors, count)`` of ``risk`` at every grid threshold from the below-counts."""
    if risk == "fdr":
        count = n - n_below
        return count - (n_pos - pos_below), count
    if risk == "fpr":
        return (n - n_below) - (n_pos - pos_below), np.full_like(n_below, n - n_pos)
    if risk == "miss":
        return pos_below, np.full_like(n_below, n_pos)
    return pos_below, n_below  # "for"


def min_count(alpha: float, delta: float) -> int:
    """The smallest count that can certify ``R <= alpha`` at level ``delta``: ``(1 - alpha)^m <= delta``
    (every item correct, binomial or Hoeffding--Bentkus p-value)."""
    return int(math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-12))


@dataclasses.dataclass(frozen=True)
class ThresholdFit:
    """A certified threshold and how it was obtained (what :func:`ltt_threshold` returns).

    ``threshold`` is None when no grid point is certified (accept side: accept nothing; reject side:
    reject nothing). ``n_min`` is the smallest count (accepted items for ``fdr``, rejected items for
    ``for``, negatives for ``fpr``, positives for ``miss``) that could certify with no error."""

    risk: str
    side: str
    alpha: float
    delta: float
    procedure: str
    pvalue: str
    threshold: float | None
    n_samples: int
    n_positive: int
    n_min: int
    grid: np.ndarray = dataclasses.field(repr=False)
    pvalues: np.ndarray = dataclasses.field(repr=False)
    certified: np.ndarray = dataclasses.field(repr=False)
    errors: int = 0
    count: int = 0

    @property
    def risk_hat(self) -> float | None:
        """Empirical risk at the chosen threshold on the calibration set (None if nothing certified)."""
        return None if self.threshold is None or self.count == 0 else self.errors / self.count


def _pvalues(errors, count, alpha, kind):
    if kind == "binomial":
        return binomial_pvalue(errors, count, alpha)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(count > 0, errors / np.maximum(count, 1), 0.0)
    return hoeffding_bentkus_pvalue(r, count, alpha)


def certify(risk: str, grid, n_below, pos_below, n: int, n_pos: int, *, alpha: float, delta: float,
            procedure: str, pvalue: str) -> tuple[np.ndarray, np.ndarray, int]:
    """``(pvalues, certified mask, n_min)`` over ``grid`` from its below-counts (no validation)."""
    side = RISKS[risk]
    errors, count = risk_counts(risk, n_below, pos_below, n, n_pos)
    p = _pvalues(errors, count, alpha, pvalue)
    if procedure == "holm":
        return p, holm(p, delta), min_count(alpha, delta / grid.size)
    order = np.arange(grid.size)[::-1] if side == "accept" else np.arange(grid.size)
    co, po = count[order], p[order]
    single = procedure == "fixed_sequence_single" or risk in ("fpr", "miss")
    j_starts = 1 if single else n_starts(alpha, delta, int(co.max(initial=0)))
    n_min = min_count(alpha, delta / j_starts)
    cert = np.zeros(grid.size, dtype=bool)
    for j in range(j_starts):
        enough = np.flatnonzero(co >= n_min * 2**j)
        if enough.size == 0:
            break
        cert |= fixed_sequence(po, delta / j_starts, start=int(enough[0]))
    mask = np.zeros(grid.size, dtype=bool)
    mask[order] = cert
    return p, mask, n_min


def n_starts(alpha: float, delta: float, largest_count: int, cap: int = 20) -> int:
    """Number ``J`` of fixed-sequence starts: ``n_min * 2^j <= largest_count`` for ``j < J``, where
    ``n_min`` is :func:`min_count` at level ``delta / J`` (solved by iteration; at most ``cap``)."""
    j = 1
    while j < cap:
        n0 = min_count(alpha, delta / j)
        need = int(math.floor(math.log2(largest_count / n0))) + 1 if largest_count >= n0 else 1
        if need <= j:
            break
        j = min(need, cap)
    return j


def ltt_threshold(scores, labels, *, risk: str = "fdr", alpha: float = 0.05, delta: float = 0.05,
                  procedure: str = "fixed_sequence", pvalue: str = "binomial", grid=None) -> ThresholdFit:
    """Learn-then-Test threshold: the most permissive grid cutoff whose risk is certified at ``alpha``.

    Parameters
    ----------
    scores : array_like, shape (n_samples,)
        Finite scores (raw detector scores, a calibrator's confidence, one label's probability).
    labels : array_like of {0, 1} or bool, shape (n_samples,)
        1 = positive (true-positive box, correct top label, label present).
    risk : {"fdr", "fpr", "miss", "for"}
        See the module table; ``fdr`` / ``fpr`` certify acceptance of ``S >= lambda``, ``miss`` /
        ``for`` rejection of ``S < lambda``.
    alpha : float in (0, 1)
        Risk level (e.g. 0.05 for precision >= 0.95).
    delta : float in (0, 1)
        Failure probability: ``P(R(lambda_hat) <= alpha) >= 1 - delta`` over the calibration draw
        (LTT, Theorem 1).
    procedure : {"fixed_sequence", "fixed_sequence_single", "holm"}
        FWER procedure over the grid (:mod:`.fwer`; the starts: module docstring).
    pvalue : {"binomial", "hoeffding_bentkus"}
        Exact binomial tail (valid here: every risk is a proportion of a random count) or the
        general Hoeffding--Bentkus bound (:mod:`.pvalues`).
    grid : array_like, optional
        Candidate thresholds; default :func:`._counts.default_grid` (fixed for scores in [0, 1]).

    Returns
    -------
    ThresholdFit

    Raises
    ------
    ValueError
        One line naming the argument: ``alpha`` / ``delta`` outside (0, 1), an unknown ``risk``,
        ``procedure`` or ``pvalue``, non-finite scores, labels that are not 0/1 or of another length.
    """
    check_choice(risk, "risk", RISKS)
    check_choice(procedure, "procedure", PROCEDURES)
    check_choice(pvalue, "pvalue", PVALUES)
    alpha, delta = check_level(alpha, "alpha"), check_level(delta, "delta")
    s, y = check_scores_labels(scores, labels)
    g = default_grid(s) if grid is None else check_grid(grid)
    n, n_pos = s.size, int(y.sum())
    n_below, pos_below = below_counts(s, y, g)
    p, mask, n_min = certify(risk, g, n_below, pos_below, n, n_pos, alpha=alpha, delta=delta,
                             procedure=procedure, pvalue=pvalue)
    side = RISKS[risk]
    errors, count = risk_counts(risk, n_below, pos_below, n, n_pos)
    if mask.any():
        j = int(np.flatnonzero(mask)[0] if side == "accept" else np.flatnonzero(mask)[-1])
        thr, e, c = float(g[j]), int(errors[j]), int(count[j])
    else:
        thr, e, c = None, 0, 0
    return ThresholdFit(risk=risk, side=side, alpha=alpha, delta=delta, procedure=procedure, pvalue=pvalue,
                        threshold=thr, n_samples=n, n_positive=n_pos, n_min=n_min, grid=g, pvalues=p,
                        certified=mask, errors=e, count=c)
