"""Renderings of a :class:`~confcal.evaluation.compare.ComparisonResult`: the fixed-width
text table of ``confcal compare`` and the summary CSV (rates as fractions in both, as ``evaluate``
and ``report`` print them). The protocol itself lives in :mod:`confcal.evaluation.compare`.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the renderings read a result; only its type lives in compare
    from confcal.evaluation.compare import ComparisonResult

#: metric key -> (column title, unit). Rates are fractions everywhere (the text table, the CSV and the
#: JSON), as ``evaluate`` and ``report`` print them, so one ECE reads the same in every command.
METRICS: dict[str, tuple[str, str]] = {
    "error": ("error", "fraction"),
    "acc_change": ("Δacc", "fraction"),
    "smece": ("smECE", "fraction"),
    "ece_em": ("emECE", "fraction"),
    "ece_ew": ("ewECE", "fraction"),
    "ece_bc": ("bcECE", "fraction"),
    "ece_lower": ("ECE lo95", "fraction"),
    "kuiper_reject": ("Kuiper rej", "fraction"),
    "nll": ("NLL", "nats"),
    "brier": ("Brier", ""),
    "cal_nll": ("cal NLL", "nats"),
    "fit_seconds": ("fit", "s"),
}

__all__ = ["format_cell", "render_text", "render_csv"]


def format_cell(mean: float | None, se: float | None, *, percent: bool = False, digits: int = 4) -> str:
    """``"12.34 ± 0.56"`` with ``digits`` decimals (``percent`` multiplies by 100); ``"–"`` when undefined."""
    if mean is None:
        return "–"
    scale = 100.0 if percent else 1.0
    s = f"{mean * scale:.{digits}f}"
    return s if se is None else f"{s} ± {se * scale:.{digits}f}"


def _line(cells, widths):
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def render_text(result: ComparisonResult) -> str:
    """A fixed-width table: mean ± standard error, rates as fractions; failed methods marked ``[k/n]`` with a note."""
    # rates are fractions like every other column without a unit: only nats and seconds are named
    head = ["method"] + [f"{METRICS[m][0]}" + (f" ({METRICS[m][1]})" if METRICS[m][1] not in ("", "fraction") else "")
                         for m in result.metrics]
    body = []
    notes = []
    for row in result.rows:
        cells = [row.label]
        for m in result.metrics:
            unit = METRICS[m][1]
            cells.append(format_cell(row.mean(m), row.se(m), digits=2 if unit == "s" else 4))
        if row.n_ok < len(row.errors):
            cells[0] += f" [{row.n_ok}/{len(row.errors)}]"
            notes.append(f"{row.label}: {row.error}")
        body.append(cells)
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    lines = [_line(head, widths), "  ".join("-" * w for w in widths)]
    lines += [_line(r, widths) for r in body]
    split_desc = ("fixed calibration/test sets" if result.fixed_sets else
                  f"{result.n_splits} random splits, seed {result.seed}")
    lines.append(f"({split_desc}; {result.cal_size} calibration / {result.test_size} test samples, "
                 f"{result.n_classes} classes; mean ± standard error; rates as fractions; ECEs with 15 bins)")
    lines += [f"! {n}" for n in notes]
    return "\n".join(lines)


def render_csv(result: ComparisonResult) -> str:
    """The summary as CSV text (rates as fractions, empty cells where undefined)."""
    rows = result.summary()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if v is None else (repr(v) if isinstance(v, float) else v))
                         for k, v in r.items()})
    return buf.getvalue()
