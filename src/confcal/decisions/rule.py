"""Per-group (Mondrian) accept / review / reject rules, each with its own Learn-then-Test guarantee.

A group is a sensor, a domain, a class (the predicted class of a top label, the label of a multilabel
head) or any id per item. Each group's rule is fitted on that group's calibration items only, so its
guarantee is about that group: ``P(R_g(lambda_g) <= alpha) >= 1 - delta`` for every group ``g``
(Mondrian risk control; with ``simultaneous=True`` ``delta`` is divided by the number of groups and the
statement holds for all groups at once).

A group whose side cannot be certified (too few items: fewer than ``n_min`` with no error at all)
is said so (:attr:`DecisionRule.notes`) and that side falls back to **review**: nothing of that group is
accepted (or rejected) without a guarantee. The pooled rule is used instead only when
``pool_small=True`` is asked, and then that group's side records ``"source": "pooled"`` (its guarantee
is the pooled one, not the group's). An id never seen at fit time is reviewed, or pooled under
``pool_small=True``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from confcal.decisions._counts import below_counts, check_grid, check_scores, check_scores_labels, default_grid
from confcal.decisions.threeway import SideFit, ThreeWayFit, check_three_way_args, three_way_counts

__all__ = ["ACCEPT", "REVIEW", "REJECT", "DECISION_NAMES", "DecisionRule", "fit_decisions", "POOLED"]

ACCEPT, REVIEW, REJECT = 1, 0, -1
DECISION_NAMES = {ACCEPT: "accept", REVIEW: "review", REJECT: "reject"}
#: the key of the pooled rule in :attr:`DecisionRule.groups`
POOLED = "*"


def check_groups(groups, n: int, name: str = "groups") -> np.ndarray:
    """Group ids as a 1-D array of str (ids are compared as text, as JSON stores them)."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},) (one id per score), got {g.shape}")
    if g.dtype.kind == "f":
        if not np.all(np.isfinite(g)):
            raise ValueError(f"{name}: expected finite ids, got a NaN or inf at row {int(np.argmin(np.isfinite(g)))}")
        if np.all(g == np.round(g)):
            g = g.astype(np.int64)
    g = g.astype(str)
    empty = np.char.str_len(g) == 0
    if empty.any():  # an id of no group: a missing domain column, or a join that left holes
        raise ValueError(f"{name}: expected a non-empty id for every item, got '' at row {int(np.argmax(empty))}")
    return g


@dataclasses.dataclass
class DecisionRule:
    """Fitted per-group three-way rules (what :func:`fit_decisions` returns).

    Attributes
    ----------
    groups : dict of str -> ThreeWayFit
        Each group's rule; :data:`POOLED` holds the rule fitted on all items.
    sources : dict of str -> dict
        ``{"accept": "group" | "pooled" | "none", "reject": ...}`` per group: where the applied
        threshold comes from ("none": not certified, that side is reviewed).
    notes : list of str
        One line per group side that could not be certified, with the smallest count that could.
    settings : dict
        ``alpha_accept, alpha_reject, delta, delta_split, accept_risk, reject_risk, procedure, pvalue,
        simultaneous, pool_small`` as fitted.
    """

    groups: dict
    sources: dict
    notes: list
    settings: dict
    grid_kind: str = "default"

    def thresholds(self, group: str) -> tuple[float, float]:
        """``(lambda_lo, lambda_hi)`` applied to ``group`` (an unseen id: review, or pooled)."""
        pooled = self.groups.get(POOLED)
        if group == POOLED:
            return pooled.lambda_lo, pooled.lambda_hi
        key = group if group in self.groups else None
        if key is None:
            if self.settings.get("pool_small") and pooled is not None:
                return pooled.lambda_lo, pooled.lambda_hi
            return -np.inf, np.inf
        src = self.sources[key]
        lo = _side_threshold(self.groups[key], pooled, "reject", src["reject"])
        hi = _side_threshold(self.groups[key], pooled, "accept", src["accept"])
        return lo, hi

    def decide(self, scores, groups=None) -> np.ndarray:
        """Decisions for new items: int8 ``(n_samples,)`` with 1 = accept, 0 = review, -1 = reject.

        Parameters
        ----------
        scores : array_like, shape (n_samples,)
            Finite scores on the same scale as at fit (raw, or the same calibrator's output).
        groups : array_like, shape (n_samples,), optional
            Group ids; required when the rule was fitted per group.
        """
        s = check_scores(scores)
        lo, hi = self._per_item(s.size, groups)
        out = np.zeros(s.size, dtype=np.int8)
        out[s >= hi] = ACCEPT
        out[s < lo] = REJECT
        return out

    def review_priority(self, scores, groups=None) -> np.ndarray:
        """Distance of each item to the middle of its group's review band, in score units; NaN outside
        the band. Smaller = more uncertain (the annotation queue reviews those first)."""
        s = check_scores(scores)
        lo, hi = self._per_item(s.size, groups)
        lo_f = np.where(np.isfinite(lo), lo, np.minimum(s.min(), 0.0))
        hi_f = np.where(np.isfinite(hi), hi, np.maximum(s.max(), 1.0))
        inside = (s >= lo) & (s < hi)
        return np.where(inside, np.abs(s - (lo_f + hi_f) / 2) / np.maximum(hi_f - lo_f, 1e-300), np.nan)

    def _per_item(self, n, groups):
        grouped = set(self.groups) - {POOLED}
        if groups is None:
            if grouped:
                raise ValueError(f"groups: the rule was fitted per group ({len(grouped)} groups): pass the group "
                                 "id of every item")
            lo, hi = self.groups[POOLED].lambda_lo, self.groups[POOLED].lambda_hi
            return np.full(n, lo), np.full(n, hi)
        g = check_groups(groups, n)
        uniq, inv = np.unique(g, return_inverse=True)
        pairs = np.array([self.thresholds(str(u)) for u in uniq], dtype=np.float64).reshape(-1, 2)
        return pairs[inv, 0], pairs[inv, 1]


def _side_threshold(fit: ThreeWayFit, pooled: ThreeWayFit | None, side: str, source: str) -> float:
    far = np.inf if side == "accept" else -np.inf
    use = pooled if source == "pooled" else fit
    if source == "none" or use is None:
        return far
    return use.lambda_hi if side == "accept" else use.lambda_lo


def _note(group: str, side: SideFit, n: int, word: str) -> str:
    what = {"fdr": "precision", "fpr": "false-positive rate", "miss": "miss rate", "for": "NPV"}[side.risk]
    target = f">= {1 - side.alpha:g}" if side.risk in ("fdr", "for") else f"<= {side.alpha:g}"
    unit = {"fdr": "accepted items", "for": "rejected items", "fpr": "negatives", "miss": "positives"}[side.risk]
    if not side.certifiable:  # too small: no threshold has enough items for any p-value <= delta
        return (f"group {group!r} (n={n}): {what} {target} at delta={side.delta:g} cannot be certified: it needs "
                f"at least {side.n_min} {unit} with no error; {word}")
    return (f"group {group!r} (n={n}): {what} {target} at delta={side.delta:g} was not certified at any threshold "
            f"(too many errors among the {unit} for this n; fixed-sequence testing stops at the first p-value above "
            f"delta); {word}")


def fit_decisions(scores, labels, groups=None, *, alpha_accept: float | None = 0.05,
                  alpha_reject: float | None = 0.05, delta: float = 0.05, delta_split: float | None = None,
                  accept_risk: str = "fdr", reject_risk: str = "for", procedure: str = "fixed_sequence",
                  pvalue: str = "binomial", grid=None, simultaneous: bool = False,
                  pool_small: bool = False) -> DecisionRule:
    """Fit accept / review / reject rules per group with Learn-then-Test (module docstring).

    Parameters
    ----------
    scores : array_like, shape (n_samples,)
        Finite scores: raw detector scores, a calibrator's top-label confidence, one label's probability.
    labels : array_like of {0, 1}, shape (n_samples,)
        1 = positive (true-positive box, correct top label, label present).
    groups : array_like, shape (n_samples,), optional
        Sensor / domain / class id per item; None fits one pooled rule.
    alpha_accept, alpha_reject, delta, delta_split, accept_risk, reject_risk, procedure, pvalue, grid
        As in :func:`.threeway.three_way` (``delta_split`` None: 0.5 with both sides, refused with
        one side None); one grid for all groups.
    simultaneous : bool
        Divide ``delta`` by the number of groups (Bonferroni) so all groups hold at once.
    pool_small : bool
        Let a group side that cannot be certified use the pooled threshold (recorded as "pooled").

    Returns
    -------
    DecisionRule

    Raises
    ------
    ValueError
        One line naming the argument: bad levels or choices, ``delta_split`` with one side None,
        non-finite scores, labels not 0/1, a group id array of another length.

    Notes
    -----
    A group (or the whole set) with one label value is a valid calibration set: with no error among
    ``m`` accepted items the accept side's p-value is ``(1 - alpha)^m``, so enough error-free positives
    certify the accept side. The side that such a group cannot certify (reject for only positives,
    accept for only negatives) gets a note and review (or the pooled threshold under ``pool_small``).
    """
    check_three_way_args(alpha_accept, alpha_reject, delta, delta_split, accept_risk, reject_risk, procedure,
                         pvalue)
    s, y = check_scores_labels(scores, labels)
    g_grid = default_grid(s) if grid is None else check_grid(grid)
    settings = dict(alpha_accept=alpha_accept, alpha_reject=alpha_reject, delta=float(delta),
                    delta_split=(None if alpha_accept is None or alpha_reject is None
                                 else 0.5 if delta_split is None else float(delta_split)), accept_risk=accept_risk, reject_risk=reject_risk,
                    procedure=procedure, pvalue=pvalue, simultaneous=bool(simultaneous), pool_small=bool(pool_small))
    ids = None if groups is None else check_groups(groups, s.size)
    uniq = [] if ids is None else sorted(set(ids.tolist()))
    d_group = float(delta) / (len(uniq) if simultaneous and uniq else 1)
    kw = dict(alpha_accept=alpha_accept, alpha_reject=alpha_reject, delta_split=delta_split,
              accept_risk=accept_risk, reject_risk=reject_risk, procedure=procedure, pvalue=pvalue)
    fits = {POOLED: three_way_counts(g_grid, *below_counts(s, y, g_grid), s.size, int(y.sum()), delta=float(delta),
                                     **kw)}
    sources = {POOLED: {"accept": _source(fits[POOLED].accept), "reject": _source(fits[POOLED].reject)}}
    notes = []
    if ids is not None:
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.searchsorted(sorted_ids, uniq, side="left")
        ends = np.searchsorted(sorted_ids, uniq, side="right")
        for u, a, b in zip(uniq, starts, ends):
            idx = order[a:b]
            sg, yg = s[idx], y[idx]
            one = _one_label_class(yg)
            fit = three_way_counts(g_grid, *below_counts(sg, yg, g_grid), sg.size, int(yg.sum()), delta=d_group,
                                   **kw)
            fits[u] = fit
            src = {}
            for side in ("accept", "reject"):
                sf = getattr(fit, side)
                src[side] = _source(sf)
                if sf is not None and sf.threshold is None:
                    word = "pooled threshold used (pool_small)" if pool_small else "falls back to review"
                    src[side] = "pooled" if pool_small else "none"
                    if one:
                        notes.append(f"group {u!r} (n={sg.size}): {one}: the {side} side cannot be certified; "
                                     f"{word}")
                    else:
                        notes.append(_note(u, sf, sg.size, word))
            sources[u] = src
    return DecisionRule(groups=fits, sources=sources, notes=notes, settings=settings,
                        grid_kind="default" if grid is None else "given")


def _source(side: SideFit | None) -> str:
    return "none" if side is None or side.threshold is None else "group"


def _one_label_class(y: np.ndarray) -> str:
    """'' or which one label value ``y`` holds ("only positives" / "only negatives")."""
    if y.all() or not y.any():
        return "only positives" if y.all() else "only negatives"
    return ""
