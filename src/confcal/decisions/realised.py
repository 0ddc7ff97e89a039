"""Realised risk of a fitted rule on labelled test items, per group, with Clopper--Pearson intervals.

For each group: accepted items and their precision, rejected items and their NPV, the review share, and
(for conformal sets) coverage and mean set size. A group *fails* when its realised risk is above the
target beyond its interval: the lower end of the two-sided Clopper--Pearson interval of the false
discovery (false omission) rate is above ``alpha_accept`` (``alpha_reject``), or the upper end of the
coverage interval is below the coverage floor (below). A failure is evidence that the guarantee does not hold here
(the test items are not exchangeable with the calibration slice: another sensor, a drift) -- or one of
the ``delta`` draws the guarantee allows.

Coverage floor. Split conformal guarantees ``1 - alpha`` on average over calibration draws; given the
calibration set, the coverage of a cell (group, class) calibrated on ``n`` items is
``Beta(n + 1 - l, l)`` distributed with ``l = floor((n + 1) alpha)`` (Vovk 2012, "Conditional validity
of inductive conformal predictors"; Angelopoulos & Bates 2021, "A gentle introduction to conformal
prediction", Sec. 3.3 on calibration-conditional coverage). A realised coverage a little below
``1 - alpha`` on a large test batch is therefore expected in a good share of exchangeable splits, and
comparing the Clopper--Pearson interval with ``1 - alpha`` (test noise only) raises false alarms. A row
fails only when the upper end of its interval is below the ``delta``-quantile of that Beta law
(``coverage_floor``); a row mixing ``J`` cells uses ``sum_c w_c q_c(delta / J)`` (``w_c`` the cell's
share of the row's test items; Bonferroni over the cells, so still valid). On exchangeable data a row
is flagged with probability at most ``delta + (1 - confidence) / 2``.
"""

from __future__ import annotations

import numpy as np

from confcal.decisions.conformal import ConformalSets
from confcal.decisions.pvalues import check_level
from confcal.decisions.rule import ACCEPT, POOLED, REJECT, DecisionRule, check_groups

__all__ = ["clopper_pearson", "realised_decisions", "realised_coverage", "coverage_floor", "ALL_GROUPS_LABEL",
           "POOLED_RULE_LABEL"]

#: how tables name the ``"*"`` row of a realised document when there are groups: every item, each under its
#: own group's rule (the pooled rule's thresholds do not apply to it)
ALL_GROUPS_LABEL = "all groups (their own rules)"
#: how ``decide fit`` names the ``"*"`` entry of a manifest with groups: the rule fitted on all items pooled
POOLED_RULE_LABEL = "* (pooled rule)"


def clopper_pearson(k, n, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Clopper--Pearson interval of a binomial proportion ``k / n`` (exact, by the beta
    quantiles); ``(None, None)`` when ``n == 0``."""
    from scipy.stats import beta

    confidence = check_level(confidence, "confidence")
    if n == 0:
        return None, None
    a = 1 - confidence
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def _share(k, n, confidence):
    lo, hi = clopper_pearson(k, n, confidence)
    return {"k": int(k), "n": int(n), "value": None if n == 0 else k / n, "low": lo, "high": hi}


def realised_decisions(rule: DecisionRule, scores, labels, groups=None, *, confidence: float = 0.95) -> dict:
    """Per-group realised precision (accepted), NPV (rejected) and review share of ``rule`` on test items.

    Parameters
    ----------
    rule : DecisionRule
    scores : array_like, shape (n_samples,)
    labels : array_like of {0, 1}, shape (n_samples,)
    groups : array_like, shape (n_samples,), optional
    confidence : float in (0, 1)
        Level of the Clopper--Pearson intervals.

    Returns
    -------
    dict
        ``{"groups": {id: {...}}, "failed": [ids], "confidence": c}``; each group holds ``n``,
        ``precision``, ``npv``, ``review`` (``{k, n, value, low, high}``), ``false_discovery`` and
        ``false_omission`` with their targets, and ``failed``. With groups, the ``"*"`` row counts all
        items, each decided by its own group's rule (not the pooled rule): see :data:`ALL_GROUPS_LABEL`.
    """
    from confcal.decisions._counts import check_scores_labels

    s, y = check_scores_labels(scores, labels)
    d = rule.decide(s, groups)
    ids = np.full(s.size, POOLED) if groups is None else check_groups(groups, s.size)
    st = rule.settings
    out, failed = {}, []
    names = [POOLED] + ([] if groups is None else sorted(set(ids.tolist())))
    for name in names:
        m = np.ones(s.size, dtype=bool) if name == POOLED else ids == name
        acc, rej = m & (d == ACCEPT), m & (d == REJECT)
        n_acc, tp = int(acc.sum()), int((acc & y).sum())
        n_rej, tn = int(rej.sum()), int((rej & ~y).sum())
        row = {"n": int(m.sum()), "precision": _share(tp, n_acc, confidence), "npv": _share(tn, n_rej, confidence),
               "review": _share(int((m & (d == 0)).sum()), int(m.sum()), confidence),
               "false_discovery": _share(n_acc - tp, n_acc, confidence),
               "false_omission": _share(n_rej - tn, n_rej, confidence)}
        bad = []
        if st.get("alpha_accept") is not None and st.get("accept_risk") == "fdr" and n_acc:
            if row["false_discovery"]["low"] > st["alpha_accept"]:
                bad.append("precision")
        if st.get("alpha_reject") is not None and st.get("reject_risk") == "for" and n_rej:
            if row["false_omission"]["low"] > st["alpha_reject"]:
                bad.append("npv")
        row["failed"] = bad
        if bad:
            failed.append(name)
        out[name] = row
    return {"groups": out, "failed": failed, "confidence": confidence}


def coverage_floor(n: int, alpha: float, delta: float) -> float:
    """The ``delta``-quantile of the coverage of split-conformal sets calibrated on ``n`` items, given the
    calibration set: ``Beta(n + 1 - l, l)`` with ``l = floor((n + 1) alpha)`` (module docstring); 1.0
    when ``l == 0`` (the set is every class)."""
    import math
    from fractions import Fraction

    from scipy.stats import beta

    l_ = math.floor((n + 1) * Fraction(float(alpha)))
    return 1.0 if l_ <= 0 else float(beta.ppf(delta, n + 1 - l_, l_))


def realised_coverage(sets: ConformalSets, probs, labels, groups=None, *, confidence: float = 0.95,
                      delta: float = 0.01) -> dict:
    """Per-group realised coverage and mean set size of conformal ``sets`` on test items (see
    :func:`realised_decisions` for the layout; ``coverage``, ``coverage_floor`` and ``mean_set_size`` per
    row). Rows: ``"*"`` (all items), each group (Mondrian), and for class-conditional sets each true class
    (``"class k"``, or ``"<group>/class k"`` when Mondrian). A row fails when the upper end of its
    Clopper--Pearson interval is below its ``coverage_floor`` at ``delta`` (module docstring)."""
    confidence, delta = check_level(confidence, "confidence"), check_level(delta, "delta")
    pred = sets.predict(probs, groups)
    y = np.asarray(labels)
    if y.shape != (pred.shape[0],) or y.dtype.kind not in "iu" or (y.size and (y.min() < 0 or y.max() >= pred.shape[1])):
        raise ValueError(f"labels: expected int classes in [0, {pred.shape[1]}) of shape ({pred.shape[0]},)")
    hit = pred[np.arange(y.size), y]
    ids = np.full(y.size, POOLED) if groups is None else np.asarray(groups).astype(str)
    cell_g = ids if sets.mondrian else np.full(y.size, POOLED)
    cell_c = y if sets.class_conditional else np.full(y.size, -1)
    rows = [(POOLED, np.ones(y.size, dtype=bool))]
    rows += [(name, ids == name) for name in ([] if groups is None else sorted(set(ids.tolist())))]
    if sets.class_conditional:
        for g in (sorted(set(cell_g.tolist())) if sets.mondrian else [POOLED]):
            for k in sorted(set(y[cell_g == g].tolist())):
                rows.append((f"class {k}" if g == POOLED else f"{g}/class {k}", (cell_g == g) & (y == k)))
    out, failed = {}, []
    for name, m in rows:
        row = {"n": int(m.sum()), "coverage": _share(int(hit[m].sum()), int(m.sum()), confidence),
               "mean_set_size": float(pred[m].sum(1).mean()) if m.any() else None,
               "coverage_floor": _floor(sets, cell_g[m], cell_c[m], delta)}
        row["failed"] = ["coverage"] if m.any() and row["coverage"]["high"] < row["coverage_floor"] else []
        if row["failed"]:
            failed.append(name)
        out[name] = row
    return {"groups": out, "failed": failed, "confidence": confidence, "delta": delta}


def _floor(sets: ConformalSets, g, c, delta) -> float | None:
    """``sum_c w_c q_c(delta / J)`` over the ``J`` calibration cells of a row's items."""
    if g.size == 0:
        return None
    cells, counts = np.unique(np.stack([g.astype(str), c.astype(str)], axis=1), axis=0, return_counts=True)
    total = 0.0
    for (gi, ci), w in zip(cells, counts):
        n_cal = sets.counts.get((str(gi), int(ci)), 0)
        total += w / g.size * coverage_floor(n_cal, sets.alpha, delta / len(cells))
    return min(total, 1.0)
