"""Tables and CSV for the domain-shift protocol (:mod:`confcal.evaluation.domain`).

Rendering only: every figure comes from :class:`~confcal.evaluation.domain.SplitResult`
objects and the aggregations of the protocol module
(:func:`~confcal.evaluation.domain.target_summary`,
:func:`~confcal.evaluation.domain.method_summary`).

* :func:`split_table` -- one row per split, like the paper's Table 2;
* :func:`target_summary_table` -- one row per target, like the paper's Table 1;
* :func:`method_summary_table` -- per method: mean ECE, paper-IR and the splits
  worse than source-only, one column group per seed;
* :func:`results_to_rows` / :func:`rows_to_csv` -- the long CSV form.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Sequence

from confcal.evaluation.domain import (
    BAD_SPLIT_MARGIN,
    METHOD_LABELS,
    METHODS,
    PROPOSED,
    SplitResult,
    method_summary,
    target_summary,
)

__all__ = ["split_table", "target_summary_table", "method_summary_table", "results_to_rows", "rows_to_csv",
           "CSV_COLUMNS"]


def _pct(v: float) -> str:
    return f"{100 * v:.2f}"


def _ir(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def split_table(results: Sequence[SplitResult], *, show_std: bool = True) -> str:
    """Per-split table like the paper's Table 2: one row per split, the bootstrap
    mean ECE (%, ± std) of every method, then the IR of the proposed methods.
    A markdown pipe table (readable as plain text)."""
    header = ["split", *(METHOD_LABELS[m] for m in METHODS), *(f"IR {METHOD_LABELS[m]}" for m in PROPOSED)]
    rows = []
    for r in results:
        cells = [(f"{r.tag} " if r.tag else "") + str(r.split)]
        for m in METHODS:
            mr = r.methods[m]
            cells.append(_pct(mr.ece_mean) + (f" ± {_pct(mr.ece_std)}" if show_std else ""))
        cells += [_ir(r.methods[m].ir) for m in PROPOSED]
        rows.append(cells)
    return _markdown(header, rows)


def target_summary_table(results: Sequence[SplitResult]) -> str:
    """Per-target table like the paper's Table 1: mean ECE (%) per method over the
    splits with that target, then mean per-split IR of the proposed methods."""
    header = ["target", "splits", *(METHOD_LABELS[m] for m in METHODS),
              *(f"IR {METHOD_LABELS[m]}" for m in PROPOSED)]
    rows = []
    for row in target_summary(results):
        name = (f"{row['tag']} " if row["tag"] and row["tag"] != "all" else "") + row["target"]
        if row["tag"] == "all" and row["target"] == "all":
            name = "all"
        rows.append([name, str(row["n_splits"]), *(_pct(row[f"ece_{m}"]) for m in METHODS),
                     *(_ir(row[f"ir_{m}"]) for m in PROPOSED)])
    return _markdown(header, rows)


def method_summary_table(results: Sequence[SplitResult], *, margin: float = BAD_SPLIT_MARGIN) -> str:
    """One row per method; per seed three columns: mean ECE over the splits (%),
    paper-IR (eq. 19 on the averaged ECEs, three decimals) and the number of splits worse than
    source-only by more than ``margin`` (as ``count/n_splits``)."""
    rows = method_summary(results, margin=margin)
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    header = ["method"]
    for s in seeds:
        header += [f"seed {s} mean ECE", f"seed {s} paper-IR",
                   f"seed {s} worse than source-only by > {100 * margin:g} pts"]
    by = {(r["seed"], r["method"]): r for r in rows}
    body = []
    for m in METHODS:
        cells = [METHOD_LABELS[m]]
        for s in seeds:
            r = by[(s, m)]
            # three decimals: the targets sit at the second (0.83)
            paper_ir = "n/a" if r["paper_ir"] is None else f"{r['paper_ir']:.3f}"
            cells += [_pct(r["ece_mean"]), paper_ir, f"{r['n_worse_than_source']}/{r['n_splits']}"]
        body.append(cells)
    return _markdown(header, body)


CSV_COLUMNS = ["tag", "seed", "source", "calibration", "target", "method", "ece_mean", "ece_std", "ece_lo",
               "ece_hi", "ir", "accuracy", "nll", "temperature_mean", "n_calibration", "n_target_eval",
               "n_target_oracle", "n_bootstrap"]


def results_to_rows(results: Sequence[SplitResult]) -> list[dict]:
    """Long form: one dict per (split, method) with :data:`CSV_COLUMNS` keys
    (ECE as fractions; ``calibration`` joined with ``+``)."""
    rows = []
    for r in results:
        for m in METHODS:
            mr = r.methods[m]
            rows.append({
                "tag": r.tag, "seed": r.seed, "source": r.split.source, "calibration": "+".join(r.split.calibration),
                "target": r.split.target, "method": m, "ece_mean": mr.ece_mean, "ece_std": mr.ece_std,
                "ece_lo": mr.ece_lo, "ece_hi": mr.ece_hi, "ir": mr.ir, "accuracy": mr.accuracy,
                "nll": mr.nll, "temperature_mean": mr.temperature_mean, "n_calibration": r.n_calibration,
                "n_target_eval": r.n_target_eval, "n_target_oracle": r.n_target_oracle,
                "n_bootstrap": r.n_bootstrap,
            })
    return rows


def rows_to_csv(rows: Sequence[dict], columns: Sequence[str] = tuple(CSV_COLUMNS)) -> str:
    """CSV text of ``rows`` (``None`` -> empty cell; floats with full precision)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(["" if row.get(c) is None else (repr(row[c]) if isinstance(row[c], float)
                                                  and math.isfinite(row[c]) else row[c])
                    for c in columns])
    return buf.getvalue()
