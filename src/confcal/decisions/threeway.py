"""Three-way decision: accept ``S >= lambda_hi``, reject ``S < lambda_lo``, review the band between.

Each side is a Learn-then-Test family (:mod:`.threshold`): the accept side certifies
``R_accept(lambda_hi) <= alpha_accept`` (default: false discovery, 1 - precision) at level
``delta_accept``, the reject side ``R_reject(lambda_lo) <= alpha_reject`` (default: false omission,
1 - NPV) at level ``delta_reject``. With ``delta_accept + delta_reject = delta`` (Bonferroni's union
bound; default an even split) both certified sets hold *jointly* with probability >= 1 - delta, so
every pair drawn from them is valid. Among the valid pairs with ``lambda_lo <= lambda_hi``, the pair
with the fewest calibration items in the review band ``[lambda_lo, lambda_hi)`` is chosen; ties go to
the fewest calibration errors (false accepts + false rejects), then to the lowest ``lambda_hi``.
"Accept nothing" (``lambda_hi = +inf``) and "reject nothing" (``lambda_lo = -inf``) are always valid.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from confcal.decisions._counts import below_counts, check_grid, check_scores_labels, default_grid
from confcal.decisions.pvalues import check_level
from confcal.decisions.threshold import PROCEDURES, PVALUES, RISKS, certify, check_choice, risk_counts

__all__ = ["SideFit", "ThreeWayFit", "three_way", "three_way_counts"]


@dataclasses.dataclass(frozen=True)
class SideFit:
    """One side of a three-way rule: its risk, level, certified threshold (None: nothing) and counts."""

    risk: str
    alpha: float
    delta: float
    threshold: float | None
    n_min: int
    count: int
    errors: int
    certifiable: bool  # some grid point had a count >= n_min

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ThreeWayFit:
    """A fitted three-way rule on one group (see :func:`three_way`)."""

    accept: SideFit | None
    reject: SideFit | None
    procedure: str
    pvalue: str
    n_samples: int
    n_positive: int
    review_share: float

    @property
    def lambda_hi(self) -> float:
        t = None if self.accept is None else self.accept.threshold
        return np.inf if t is None else t

    @property
    def lambda_lo(self) -> float:
        t = None if self.reject is None else self.reject.threshold
        return -np.inf if t is None else t


def _choose(grid, acc_mask, rej_mask, n_below, pos_below, n, n_pos):
    g = grid.size
    C = np.concatenate([[0], n_below, [n]])  # #{S < lambda} at -inf, grid, +inf
    P = np.concatenate([[0], pos_below, [n_pos]])  # positives below
    his = np.concatenate([np.flatnonzero(acc_mask) + 1, [g + 1]])
    los = np.concatenate([[0], np.flatnonzero(rej_mask) + 1])
    ext = np.concatenate([[-np.inf], grid, [np.inf]])
    lo = los[np.searchsorted(ext[los], ext[his], side="right") - 1]
    review = C[his] - C[lo]
    false_acc = (n - C[his]) - (n_pos - P[his])
    errors = false_acc + P[lo]
    key = np.lexsort((ext[his], errors, review))[0]
    return int(lo[key]), int(his[key]), int(review[key])


def three_way(scores, labels, *, alpha_accept: float | None = 0.05, alpha_reject: float | None = 0.05,
              delta: float = 0.05, delta_split: float | None = None, accept_risk: str = "fdr", reject_risk: str = "for",
              procedure: str = "fixed_sequence", pvalue: str = "binomial", grid=None) -> ThreeWayFit:
    """Fit accept / review / reject thresholds with a joint guarantee (module docstring).

    Parameters
    ----------
    scores : array_like, shape (n_samples,)
        Finite scores.
    labels : array_like of {0, 1}, shape (n_samples,)
        1 = positive.
    alpha_accept, alpha_reject : float in (0, 1) or None
        Risk levels of the two sides; None leaves that side out (nothing accepted / rejected) and
        gives the whole ``delta`` to the other side.
    delta : float in (0, 1)
        Joint failure probability of both sides.
    delta_split : float in (0, 1) or None
        Share of ``delta`` spent on the accept side (the rest on the reject side) when both sides
        are certified; None (default) splits it evenly (0.5). Refused with one side None: that
        side has no share, the other gets all of ``delta``.
    accept_risk : {"fdr", "fpr"}
    reject_risk : {"for", "miss"}
    procedure, pvalue, grid
        As in :func:`.threshold.ltt_threshold` (the same grid serves both sides).

    Returns
    -------
    ThreeWayFit

    Raises
    ------
    ValueError
        One line naming the argument (levels outside (0, 1), both sides None, ``delta_split`` with
        one side None, a risk of the wrong side, bad scores or labels).
    """
    s, y = check_scores_labels(scores, labels)
    g = default_grid(s) if grid is None else check_grid(grid)
    n_below, pos_below = below_counts(s, y, g)
    return three_way_counts(g, n_below, pos_below, s.size, int(y.sum()), alpha_accept=alpha_accept,
                            alpha_reject=alpha_reject, delta=delta, delta_split=delta_split,
                            accept_risk=accept_risk, reject_risk=reject_risk, procedure=procedure,
                            pvalue=pvalue)


def check_three_way_args(alpha_accept, alpha_reject, delta, delta_split, accept_risk, reject_risk, procedure,
                         pvalue):
    """Validated ``(alpha_accept, alpha_reject, delta_accept, delta_reject)``; one-line errors."""
    check_choice(procedure, "procedure", PROCEDURES)
    check_choice(pvalue, "pvalue", PVALUES)
    check_choice(accept_risk, "accept_risk", [r for r, side in RISKS.items() if side == "accept"])
    check_choice(reject_risk, "reject_risk", [r for r, side in RISKS.items() if side == "reject"])
    delta = check_level(delta, "delta")
    if alpha_accept is None and alpha_reject is None:
        raise ValueError("alpha_accept: expected a risk level for at least one side, got None for both")
    aa = None if alpha_accept is None else check_level(alpha_accept, "alpha_accept")
    ar = None if alpha_reject is None else check_level(alpha_reject, "alpha_reject")
    if aa is None or ar is None:
        if delta_split is not None:  # accepted and ignored before: say that nothing is split
            off, other = ("alpha_accept", "reject") if aa is None else ("alpha_reject", "accept")
            raise ValueError(f"delta_split: expected None with {off}=None (one side: the {other} side gets all "
                             f"of delta), got {delta_split!r}")
        return (aa, ar, 0.0, delta) if aa is None else (aa, ar, delta, 0.0)
    split = 0.5 if delta_split is None else check_level(delta_split, "delta_split")
    return aa, ar, delta * split, delta * (1 - split)


def three_way_counts(g, n_below, pos_below, n, n_pos, *, alpha_accept, alpha_reject, delta, delta_split=None,
                     accept_risk="fdr", reject_risk="for", procedure="fixed_sequence",
                     pvalue="binomial") -> ThreeWayFit:
    """:func:`three_way` from the below-counts of a grid (the Mondrian fit reuses one pass)."""
    aa, ar, da, dr = check_three_way_args(alpha_accept, alpha_reject, delta, delta_split, accept_risk,
                                          reject_risk, procedure, pvalue)
    none = np.zeros(g.size, dtype=bool)
    sides = {}
    masks = {}
    for side, risk, a, d in (("accept", accept_risk, aa, da), ("reject", reject_risk, ar, dr)):
        if a is None:
            sides[side], masks[side] = None, none
            continue
        _, mask, n_min = certify(risk, g, n_below, pos_below, n, n_pos, alpha=a, delta=d, procedure=procedure,
                                 pvalue=pvalue)
        masks[side] = mask
        errors, count = risk_counts(risk, n_below, pos_below, n, n_pos)
        sides[side] = (risk, a, d, n_min, bool((count >= n_min).any()), errors, count)
    lo, hi, review = _choose(g, masks["accept"], masks["reject"], n_below, pos_below, n, n_pos)
    out = {}
    for side, j in (("accept", hi), ("reject", lo)):
        if sides[side] is None:
            out[side] = None
            continue
        risk, a, d, n_min, ok, errors, count = sides[side]
        inside = 1 <= j <= g.size
        out[side] = SideFit(risk=risk, alpha=a, delta=d, threshold=float(g[j - 1]) if inside else None,
                            n_min=n_min, count=int(count[j - 1]) if inside else 0,
                            errors=int(errors[j - 1]) if inside else 0, certifiable=ok)
    return ThreeWayFit(accept=out["accept"], reject=out["reject"], procedure=procedure, pvalue=pvalue,
                       n_samples=int(n), n_positive=int(n_pos), review_share=review / n if n else 1.0)
