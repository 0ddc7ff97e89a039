"""The report's "Decisions" section: each group's operating point (thresholds, the guarantee, realised
precision / NPV / review share with Clopper--Pearson intervals) as HTML, from a decision manifest and
:func:`confcal.decisions.realised.realised_decisions` (or ``realised_coverage``) on the report's data."""

from __future__ import annotations

import html

__all__ = ["decisions_section", "insert_section"]


def _num(v, nd=4):
    return "&ndash;" if v is None else f"{v:.{nd}f}"


def _ci(d):
    if d["value"] is None:
        return "&ndash;"
    return f"{d['value']:.4f} [{d['low']:.4f}, {d['high']:.4f}] <small>n={d['n']}</small>"


def decisions_section(manifest: dict, realised: dict) -> str:
    """HTML of the operating point per group.

    Parameters
    ----------
    manifest : dict
        A validated decision manifest (:func:`confcal.decisions.load_decision_manifest` accepted it).
    realised : dict
        :func:`confcal.decisions.realised.realised_decisions` or ``realised_coverage`` on the report's items.
    """
    out = ["<h2>Decisions</h2>", f"<p>{html.escape(manifest['guarantee']['statement'])}.</p>"]
    if manifest["kind"] == "conformal":
        out.append("<table><tr><th>group</th><th>n</th><th>coverage [95% CP]</th><th>floor</th>"
                   "<th>mean set size</th><th>verdict</th></tr>")
        for g, r in realised["groups"].items():
            name = "all items" if g == "*" and len(realised["groups"]) > 1 else g
            out.append(f"<tr><td>{html.escape(name)}</td><td>{r['n']}</td><td>{_ci(r['coverage'])}</td>"
                       f"<td>{_num(r.get('coverage_floor'))}</td><td>{_num(r['mean_set_size'], 3)}</td><td>{'fail' if r['failed'] else 'ok'}</td></tr>")
        out.append("</table>")
        out.append(f"<p>floor: the {realised.get('delta', 0.01):g}-quantile of split conformal's coverage given "
                   "its calibration set (a verdict fails only below it).</p>")
        return "\n".join(out)
    out.append("<table><tr><th>group</th><th>n (calibration)</th><th>&lambda;<sub>lo</sub></th>"
               "<th>&lambda;<sub>hi</sub></th><th>n (here)</th><th>precision [95% CP]</th><th>NPV [95% CP]</th>"
               "<th>review share</th><th>verdict</th></tr>")
    from confcal.decisions.realised import ALL_GROUPS_LABEL

    grouped = len(realised["groups"]) > 1
    for g, r in realised["groups"].items():
        fit = manifest["groups"].get(g)
        name = g
        if g == "*" and grouped:  # every item under its own group's rule: no single threshold applies
            fit, name = None, ALL_GROUPS_LABEL
            lo = hi = None
            n_cal = manifest["groups"]["*"]["n_samples"]
        elif fit is None:  # a group unseen at fit: its items were reviewed (or pooled)
            lo = hi = None
            n_cal = "unseen"
        else:
            ap = fit.get("applied") or fit
            lo, hi, n_cal = ap["lambda_lo"], ap["lambda_hi"], fit["n_samples"]
        verdict = "fail: " + ", ".join(r["failed"]) if r["failed"] else "ok"
        src = (fit or {}).get("sources", {})
        lo_t = _num(lo) + (" (pooled)" if src.get("reject") == "pooled" and lo is not None else "")
        hi_t = _num(hi) + (" (pooled)" if src.get("accept") == "pooled" and hi is not None else "")
        out.append(f"<tr><td>{html.escape(name)}</td><td>{n_cal}</td><td>{lo_t}</td><td>{hi_t}</td>"
                   f"<td>{r['n']}</td><td>{_ci(r['precision'])}</td><td>{_ci(r['npv'])}</td>"
                   f"<td>{_ci(r['review'])}</td><td>{verdict}</td></tr>")
    out.append("</table>")
    if manifest["notes"]:
        out.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in manifest["notes"]) + "</ul>")
    return "\n".join(out)


def insert_section(page: str, section: str) -> str:
    """``page`` with ``section`` before its closing ``</body>``."""
    head, sep, tail = page.rpartition("</body>")
    return head + section + "\n" + sep + tail if sep else page + section
