"""Text rendering of a ``--method auto`` cross-validation table (``fit.selection`` of a manifest)."""

from __future__ import annotations

__all__ = ["render_selection"]


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_selection(record: dict) -> str:
    """The table of :func:`confcal.evaluation.selection.select_calibrator`'s record, one line per
    candidate, the chosen one marked ``*``; held-out NLL (nats), Brier, ECE and accuracy change as
    fractions, the paired NLL difference to the reference with its bootstrap interval."""
    noise = record["noise"]
    n_rows = record["n_rows"]
    # the record's input kind in words: "2 rows (classes)" read as if the rows were classes
    of = {"classes": "class vectors", "boxes": "box scores", "multilabel": "multilabel scores"}.get(
        record["input"], str(record["input"]))
    if not any(r["status"] in ("ok", "failed") for r in record["candidates"]):
        # too few rows: no candidate was cross-validated, the reference is fitted as it is (say so, not "5-fold")
        head = (f"auto: no cross-validation on {n_rows} row{'' if n_rows == 1 else 's'} of {of}: "
                f"too few for {record['n_folds']} folds; the reference {record['reference']} is chosen without "
                "comparison")
    else:
        head = (f"auto: {record['n_folds']}-fold cross-validation on {n_rows} rows of {of}; "
                f"NLL difference to {record['reference']} with a {noise['level']:.0%} {noise['method']} interval "
                f"({noise['n_boot']} draws; a candidate must have its upper end below 0)")
    cols = ["", "method", "NLL", "Brier", "ECE", "Δacc", "ΔNLL vs ref [interval]", "fit s", "note"]
    rows = []
    for r in record["candidates"]:
        interval = "-" if r["diff"] is None else f"{r['diff']:+.4f} [{r['diff_lo']:+.4f}, {r['diff_hi']:+.4f}]"
        note = r["reason"] or ""
        if r["status"] == "ok" and not note:
            changed = r.get("argmax_changed")
            if changed:
                note = f"moves {changed:.1%} of arg-maxes"
                if not record["allow_accuracy_change"]:
                    note += " (not allowed)"
            if r["label"] != record["reference"] and (r["diff_hi"] is None or r["diff_hi"] >= 0):
                note = (note + "; " if note else "") + "not better than the reference beyond noise"
        rows.append(["*" if r["label"] == record["chosen"] else "", r["label"], _f(r["nll"], ".4f"),
                     _f(r["brier"], ".4f"), _f(r["ece"], ".4f"),
                     "-" if r["acc_change"] is None else f"{r['acc_change'] * 100:+.2f} pts",
                     interval, _f(r["fit_seconds"], ".2f"), note if r["status"] != "failed" else f"failed: {note}"])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(f"chosen: {record['chosen']} (* above); refitted on every row")
    return "\n".join(lines)
