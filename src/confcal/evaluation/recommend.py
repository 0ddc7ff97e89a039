"""The ``recommend`` view of a comparison: which method to use, and which ones move accuracy.

Applied to a :class:`~confcal.evaluation.compare.ComparisonResult` (random calibration / test splits),
with the rule of ``--method auto`` (:func:`confcal.calibrators.protocol.selection_record.choose_from_table`)
on test NLL instead of cross-validated NLL:

* the **noise** of a method's NLL difference to the reference (TS) is measured over the splits,
  which are paired (the same rows): ``mean ± t * se`` with ``se = std(ddof=1) / sqrt(n_splits)`` and
  ``t`` the two-sided ``level`` quantile of Student's t with ``n_splits - 1`` degrees of freedom. With
  one split there is no interval, so no verdict "beyond noise" either way: ``diff_lo`` / ``diff_hi`` and
  ``worse_than_reference`` are None, and no method can be shown better than TS, so TS is kept. The splits
  overlap, so this interval is narrower than an independent-sample one would be; it measures the
  split-to-split noise of the comparison, not the sampling noise of a new test set;
* a method is **flagged** when its test accuracy differs from the uncalibrated one on any split
  (the mean change in points is shown, e.g. ``dirichlet +2.2 pts``), and when it is worse than the
  reference beyond noise;
* the **chosen** method is the one of lowest mean test NLL among the reference and the methods
  better than it beyond noise, leaving out those that change accuracy unless allowed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from confcal.calibrators.protocol.selection_record import choose_from_table

__all__ = ["recommend", "render_recommendation"]


def recommend(result, *, reference: str = "ts", allow_accuracy_change: bool = False,
              level: float = 0.90) -> dict[str, Any]:
    """The recommendation of a comparison (see the module docstring).

    Parameters
    ----------
    result : :class:`~confcal.evaluation.compare.ComparisonResult` holding a row labelled ``reference``
    reference : the label of the guard's reference row (temperature scaling)
    allow_accuracy_change : let a method that changes test accuracy be chosen
    level : two-sided level of the interval over the splits (0.90: its upper end is a one-sided 95% bound,
        as in ``--method auto``)

    Returns
    -------
    dict with ``chosen``, ``reference``, ``allow_accuracy_change``, ``level``, ``z`` (the t quantile used;
    None with one split),
    ``n_splits`` and ``rows``: one dict
    per method (``label``, ``nll``, ``nll_se``, ``diff``, ``diff_lo``, ``diff_hi`` in nats (the interval None
    with one split), ``acc_change`` as a
    fraction, ``changes_accuracy``, ``worse_than_reference``, ``status``, ``flags``).

    Raises
    ------
    ValueError
        ``reference`` is not a row of the comparison, or it failed on a split; ``level`` outside ``(0, 1)``.
    """
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    from scipy.stats import t as student_t

    z = float(student_t.ppf(0.5 + level / 2, result.n_splits - 1)) if result.n_splits >= 2 else None
    labels = [r.label for r in result.rows]
    if reference not in labels:
        raise ValueError(f"reference: {reference!r} is not among the compared methods {labels}; add it to the "
                         "methods")
    ref = result[reference]
    if ref.n_ok != len(ref.errors):
        raise ValueError(f"reference: {reference!r} failed on {len(ref.errors) - ref.n_ok} split(s): {ref.error}")
    ref_nll = np.array(ref.values["nll"], dtype=np.float64)
    rows = []
    for r in result.rows:
        if r.method == "uncalibrated":
            continue
        row: dict[str, Any] = {"label": r.label, "method": r.method, "nll": None, "nll_se": None, "diff": None,
                               "diff_lo": None, "diff_hi": None, "acc_change": None, "changes_accuracy": None,
                               "worse_than_reference": None, "flags": []}
        if r.n_ok != len(r.errors):
            row.update(status="failed", nll=r.mean("nll"), flags=[f"failed on {len(r.errors) - r.n_ok} split(s)"])
            rows.append(row)
            continue
        nll = np.array(r.values["nll"], dtype=np.float64)
        d = nll - ref_nll
        se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size >= 2 else 0.0
        mean = float(d.mean())
        acc = np.array(r.values["acc_change"], dtype=np.float64)
        changes = bool(np.any(acc != 0))
        noise = d.size >= 2  # one split: no interval, so no verdict beyond noise
        row.update(status="ok", nll=float(nll.mean()), nll_se=r.se("nll"), diff=mean,
                   diff_lo=mean - z * se if noise else None, diff_hi=mean + z * se if noise else None,
                   acc_change=float(acc.mean()), changes_accuracy=changes, argmax_changed=1.0 if changes else 0.0,
                   worse_than_reference=(r.label != reference and mean - z * se > 0) if noise else None)
        if r.label == reference:
            row.update(diff=0.0, diff_lo=0.0 if noise else None, diff_hi=0.0 if noise else None,
                       worse_than_reference=False)
        if changes:
            row["flags"].append(f"accuracy {100 * acc.mean():+.1f} pts")
        if r.label == reference:
            pass
        elif not noise:
            row["flags"].append(f"{'lower' if mean < 0 else 'not lower'} NLL than {reference} on the one split "
                                "(no interval: not chosen)")
        elif row["worse_than_reference"]:
            row["flags"].append(f"worse than {reference} beyond noise")
        elif not row["diff_hi"] < 0:
            row["flags"].append(f"within noise of {reference}")
        rows.append(row)
    chosen = choose_from_table(rows, reference, allow_accuracy_change)
    for row in rows:
        row.pop("argmax_changed", None)
    return {"chosen": chosen, "reference": reference, "allow_accuracy_change": bool(allow_accuracy_change),
            "level": float(level), "z": z, "n_splits": result.n_splits, "rows": rows}


def render_recommendation(rec: dict[str, Any]) -> str:
    """A text table of :func:`recommend`: the chosen method marked ``*``, flags in the last column."""
    n = rec["n_splits"]
    noise = (f"{rec['level']:.0%}: mean ± {rec['z']:.2f} se over {n} paired splits" if n >= 2
             else "one split: no interval")
    cols = ["", "method", "test NLL", f"ΔNLL vs {rec['reference']} [{noise}]", "Δacc", "flags"]
    cells = []
    for r in rec["rows"]:
        diff = "-" if r["diff"] is None else f"{r['diff']:+.4f}" + (
            "" if r["diff_lo"] is None else f" [{r['diff_lo']:+.4f}, {r['diff_hi']:+.4f}]")
        nll = "-" if r["nll"] is None else f"{r['nll']:.4f}" + ("" if r["nll_se"] is None else f" ± {r['nll_se']:.4f}")
        acc = "-" if r["acc_change"] is None else f"{100 * r['acc_change']:+.2f} pts"
        cells.append(["*" if r["label"] == rec["chosen"] else "", r["label"], nll, diff, acc, "; ".join(r["flags"])])
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["recommendation (lowest test NLL among TS and the methods better than TS beyond noise"
             + ("" if rec["allow_accuracy_change"] else "; methods that change accuracy left out") + "):",
             "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.append(f"chosen: {rec['chosen']}" + ("" if n >= 2 else f" (one split: no method can be shown better "
                                                                 f"than {rec['reference']}; use --splits >= 2)"))
    return "\n".join(lines)
