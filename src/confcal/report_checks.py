"""The report's calibration checks: per-bin bands on the reliability diagram and the table of
bounds, debiased estimates and test p-values (numbers from :mod:`confcal.evaluation.gate`)."""

from __future__ import annotations


import numpy as np

__all__ = ["stage_checks", "with_bands", "draw_bands", "checks_html"]


def stage_checks(stages: dict, labels, audits: dict, *, domains=None, n_bins: int = 15, alpha=None) -> dict:
    """``{stage: {group: block}}`` (:func:`confcal.evaluation.gate.array_checks`) for the groups of the audits."""
    from confcal.evaluation.audit import ALL
    from confcal.evaluation.gate import check_gate

    _, alpha, _ = check_gate(None, alpha, None)
    y = np.asarray(labels)
    rows = {ALL: np.arange(y.shape[0])}
    if domains is not None:
        d = np.asarray(domains).astype(str)
        rows.update({str(g): np.flatnonzero(d == g) for g in np.unique(d)})
    from confcal.evaluation.gate import array_checks

    out = {}
    for stage, a in audits.items():
        p = np.asarray(stages[stage], dtype=np.float64)
        out[stage] = {g: array_checks(p[rows[g]], y[rows[g]], n_bins=n_bins, alpha=alpha) for g in a["groups"]}
    return out


def with_bands(group: dict, block: dict) -> dict:
    """An audit group whose reliability rows carry the block's per-bin ``lower`` / ``upper``."""
    rel = [{**r, "lower": lo, "upper": hi}
           for r, lo, hi in zip(group["reliability"], block["bins"]["lower"], block["bins"]["upper"])]
    return {**group, "reliability": rel}


def draw_bands(ax, rel: list) -> None:
    """Each non-empty bin's interval as a vertical band at its centre (matplotlib axes ``ax``)."""
    keep = [r for r in rel if r["count"] and r["lower"] is not None]
    if not keep:
        return
    mid = np.array([(r["bin_lo"] + r["bin_hi"]) / 2 for r in keep])
    lo = np.array([r["lower"] for r in keep])
    hi = np.array([r["upper"] for r in keep])
    width = 0.35 * min(r["bin_hi"] - r["bin_lo"] for r in keep)
    ax.bar(mid, hi - lo, bottom=lo, width=width, color="#222", alpha=0.35, label="interval")


def checks_html(checks: dict, key: str, table) -> str:
    """The section: per stage and group, the bounds of ``key`` (ECE or D-ECE), the debiased estimates
    and the three tests' p-values (``table``: the report's table writer)."""
    alpha = next(iter(next(iter(checks.values())).values()))["alpha"]
    name = key.upper().replace("_", "-")
    rows = []
    for stage, groups in checks.items():
        for g, b in groups.items():
            rows.append({"stage": stage, "domain": g,
                         f"{name} {1 - alpha:g} bounds": f"[{b['ece_lower']:.4f}, {b['ece_upper']:.4f}]",
                         "bias-corrected": b["ece_bias_corrected"], "debiased l2": b["l2_ce_debiased"],
                         **{f"p {k}": f"{t['p_value']:.3g}" for k, t in b["tests"].items()}})
    cols = ["stage", "domain", f"{name} {1 - alpha:g} bounds", "bias-corrected", "debiased l2",
            "p spiegelhalter", "p kolmogorov_smirnov", "p kuiper"]
    intro = (f"<h2>Calibration checks</h2><p>Bounds: simultaneous {1 - alpha:g} over the bins (Clopper-Pearson "
             "per bin, Bonferroni). Bias-corrected ECE and debiased l2 error: Kumar, Liang &amp; Ma (NeurIPS 2019). "
             "p-values of perfect calibration: Spiegelhalter (1986), Kolmogorov-Smirnov and Kuiper on cumulative "
             "differences (Arrieta-Ibarra et al., JMLR 2022). The reliability diagrams show each bin's "
             f"{1 - alpha:g} Clopper-Pearson interval as a grey band.</p>")
    return intro + table(rows, cols)
