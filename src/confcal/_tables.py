"""Plain-text tables for terminal output (the CLI and the demo)."""

from __future__ import annotations

import math

import numpy as np


def format_table(rows: list[dict], columns: list[str], *, floatfmt: str = ".4f") -> str:
    """Plain aligned text table; NaN cells (e.g. the confidence of an empty bin) print as ``-``."""
    def fmt(v):
        if isinstance(v, (float, np.floating)):
            return "-" if math.isnan(v) else format(float(v), floatfmt)
        if isinstance(v, (np.integer,)):
            return str(int(v))
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]  # no rows: the header
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def metrics_rows(named: dict[str, dict]) -> str:
    """Table with one row per metric and one column per named metrics dict."""
    names = list(named)
    keys = list(next(iter(named.values())))
    rows = [{"metric": k, **{n: named[n][k] for n in names}} for k in keys]
    return format_table(rows, ["metric", *names])
