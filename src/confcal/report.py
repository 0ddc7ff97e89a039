"""``confcal report``: one self-contained HTML file auditing a calibrator on held-out data.

Contents: reliability diagrams before/after calibration (all samples and each domain),
confidence histograms, the metrics table with bootstrap 95% intervals, the head of an
annotation queue (if given) and the manifest's provenance and fit record. Charts are
matplotlib SVG inlined in the page; the file references nothing outside itself (no
scripts, fonts, images or style sheets from the network), so it opens offline.
"""

from __future__ import annotations

import csv
import html
import io
import json

import numpy as np

from confcal.evaluation.audit import ALL, brier, calibration_audit, gate_metric
from confcal.metrics.bootstrap import bootstrap_indices
from confcal.metrics.calibration import ece
from confcal.metrics.detection import detection_ece

__all__ = ["build_report", "build_multilabel_report", "reliability_svg", "bootstrap_interval", "report_verdict"]

_CSS = """body{font-family:sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222;box-sizing:border-box}
.scroll{max-width:100%;overflow-x:auto}table{border-collapse:collapse;margin:0.5em 0 1.5em}
td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}td{overflow-wrap:anywhere;max-width:22em}
th{background:#eee}td.l,th.l{text-align:left}figure{display:inline-block;margin:0 1em 1em 0;max-width:100%}
figure svg{width:560px;max-width:100%;height:auto}pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}
.bad{color:#b00;font-weight:bold}.verdict{font-size:1.3em;padding:0.5em 1em;border:2px solid}
.pass{color:#060;border-color:#060}.fail{color:#b00;border-color:#b00}.none{color:#555;border-color:#999}"""


def bootstrap_interval(metric, probs, labels, *, n_draws: int = 200, seed: int = 0) -> tuple[float, float]:
    """2.5 and 97.5 percentiles of ``metric(probs[idx], labels[idx])`` over ``n_draws`` resamples
    of all rows with replacement."""
    idx = bootstrap_indices(labels.shape[0], n_draws, None, seed)
    vals = np.array([metric(probs[i], labels[i]) for i in idx])
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return float(lo), float(hi)


def reliability_svg(stages: dict, title: str) -> str:
    """SVG of reliability bars (top) and confidence histograms (bottom), one column per stage.

    ``stages``: ``{name: audit group dict}`` from :func:`calibration_audit` (uses its
    ``reliability`` rows, so box scores and class vectors draw the same way)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(stages)
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 4.6), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    try:
        for j, name in enumerate(names):
            rel = stages[name]["reliability"]
            lo = np.array([b["bin_lo"] for b in rel])
            w = np.array([b["bin_hi"] - b["bin_lo"] for b in rel])
            acc = np.array([b["accuracy"] or 0.0 for b in rel])
            conf = np.array([b["mean_confidence"] or 0.0 for b in rel])
            cnt = np.array([b["count"] for b in rel], dtype=float)
            top, bottom = axes[0, j], axes[1, j]
            top.bar(lo, acc, width=w, align="edge", color="#4c72b0", edgecolor="black", lw=0.5)
            top.bar(lo, np.abs(conf - acc) * (cnt > 0), bottom=np.minimum(conf, acc), width=w, align="edge",
                    color="#dd8452", alpha=0.5)
            if rel and "lower" in rel[0]:  # the per-bin Clopper-Pearson interval of the accuracy, as a band
                from confcal.report_checks import draw_bands

                draw_bands(top, rel)
            top.plot([0, 1], [0, 1], "k--", lw=1)
            top.set_xlim(0, 1)
            top.set_ylim(0, 1)
            g = stages[name]
            key = "d_ece" if "d_ece" in g else "ece"
            # parse_math=False: a '$', '_' or '^' in a method or domain name is text, not mathtext
            # (a lone '$' raised a parse error; '$x_1$' was drawn as a formula)
            top.set_title(f"{name}: {key.upper().replace('_', '-')} {100 * g[key]:.2f}%", fontsize=12,
                          parse_math=False)
            top.set_ylabel("observed frequency" if j == 0 else "")
            bottom.bar(lo, cnt / max(1.0, cnt.sum()), width=w, align="edge", color="#999", edgecolor="black", lw=0.5)
            bottom.set_xlabel("confidence")
        fig.suptitle(title, fontsize=14, parse_math=False)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG lives inside HTML
    return svg.replace("<svg ", '<svg class="chart" role="img" ', 1)


def _number(v):
    """A float (or a number written as text, as in the queue CSV) or None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, np.floating)):
        return float(v)
    if isinstance(v, str) and any(c in v for c in ".eE") and v.strip():
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _cell(v) -> tuple[str, str]:
    """(text, title attribute): floats rounded to 4 significant digits for reading, the full value on hover."""
    x = _number(v)
    if x is not None and not isinstance(v, int) and not (isinstance(v, str) and v.lstrip("-").isdigit()):
        return f"{x:.4g}", f' title="{html.escape(repr(x))}"'
    return html.escape(str(v)), ""


def _table(rows: list[dict], cols: list[str]) -> str:
    def td(i, v):
        text, title = _cell(v)
        return f"<td{' class=l' if i == 0 else ''}{title}>{text}</td>"

    head = "".join(f"<th{' class=l' if i == 0 else ''}>{html.escape(c)}</th>" for i, c in enumerate(cols))
    body = "".join("<tr>" + "".join(td(i, r.get(c, "")) for i, c in enumerate(cols)) + "</tr>" for r in rows)
    return f"<div class=scroll><table><tr>{head}</tr>{body}</table></div>"


def report_verdict(audits: dict, max_ece: float | None, *, checks: dict | None = None, gate_rule: str | None = None,
                   gate_test: str | None = None) -> list[dict]:
    """Pass / fail of each group (pooled, then each domain) of the last stage against ``max_ece``,
    by the rule ``confcal evaluate`` gates with (:mod:`confcal.evaluation.gate`):
    ``[{"group", "metric", "value", "limit", "pass", "rule", "ece_lower", "ece_upper", "p_value"}]``;
    empty without a limit. ``checks``: ``{group: calibration block}`` of the last stage (without it,
    the point rule: :func:`confcal.evaluation.audit.ece_violations`)."""
    if max_ece is None:
        return []
    from confcal.evaluation.audit import ece_violations

    a = list(audits.values())[-1]
    key = gate_metric(a)
    if checks is None:
        bad = {g for g, _ in ece_violations(a, max_ece)}
        return [{"group": g, "metric": key, "value": m[key], "limit": float(max_ece), "pass": g not in bad,
                 "rule": "point"} for g, m in a["groups"].items()]
    from confcal.evaluation.gate import check_gate, group_record

    ece_violations(a, max_ece)  # the limit's range check
    rule, _, test = check_gate(gate_rule, checks[next(iter(checks))]["alpha"], gate_test)
    out = []
    for g, m in a["groups"].items():
        r = group_record(m[key], checks[g], float(max_ece), rule, test)
        out.append({"group": g, "metric": key, "value": m[key], "limit": float(max_ece), "pass": not r["fail"],
                    "rule": rule, "alpha": checks[g]["alpha"], "test": test if rule == "test" else None,
                    "ece_lower": r["ece_lower"], "ece_upper": r["ece_upper"], "p_value": r.get("p_value")})
    return out


def _verdict_html(verdict: list[dict], stage: str) -> str:
    if not verdict:
        return "<p class='verdict none'>No limit given (--max-ece): no verdict</p>"
    failed = [v for v in verdict if not v["pass"]]
    name = verdict[0]["metric"].upper().replace("_", "-")
    from confcal.evaluation.gate import rule_sentence

    v0 = verdict[0]
    head = (f"<p class='verdict {'fail' if failed else 'pass'}'>{'FAIL' if failed else 'PASS'}: "
            f"{len(failed)} of {len(verdict)} groups above {name} &le; {v0['limit']:g} ({html.escape(stage)})</p>"
            f"<p>Decided by <b>--gate-rule {html.escape(v0['rule'])}</b>: "
            + html.escape(rule_sentence(v0["rule"], v0.get("alpha", 0.05), v0.get("test"))) + "</p>")
    cols = ["group", name, "limit", "verdict"]
    rows = [{"group": v["group"], name: v["value"], "limit": v["limit"], "verdict": "pass" if v["pass"] else "FAIL"}
            for v in verdict]
    if "ece_lower" in v0:
        level = f"{1 - v0['alpha']:g}"
        cols[2:2] = [f"{level} interval (simultaneous over bins)"] + (["p-value"] if v0["rule"] == "test" else [])
        for r, v in zip(rows, verdict):
            r[cols[2]] = f"[{v['ece_lower']:.4f}, {v['ece_upper']:.4f}]"
            if v0["rule"] == "test":
                r["p-value"] = f"{v['p_value']:.3g}"
    return head + _table(rows, cols)


#: most bins a report draws and tabulates: its diagrams and per-bin tables grow with the bins (600 rows
#: at 100,000 bins took 505 s, 6.5 GB and wrote 145 MB), and no figure resolves more
REPORT_MAX_BINS = 500


def check_report_bins(n_bins, n_rows: int) -> int:
    """``n_bins`` when a report of ``n_rows`` rows can use it: at most :data:`REPORT_MAX_BINS` and at most
    one bin per row (more bins than rows only adds empty ones). Raises ``ValueError`` naming the limit."""
    limit = max(1, min(REPORT_MAX_BINS, int(n_rows)))
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or not 1 <= n_bins <= limit:
        why = f"{n_rows} rows" if limit < REPORT_MAX_BINS else f"a report draws at most {REPORT_MAX_BINS}"
        raise ValueError(f"n_bins: expected an integer in [1, {limit}] ({why}; one bin per row at most), "
                         f"got {n_bins!r}")
    return int(n_bins)


def build_report(stages: dict, labels, *, domains=None, manifest: dict | None = None, queue_csv=None,
                 queue_head: int = 20, n_bins: int = 15, n_draws: int = 200, max_ece: float | None = None,
                 title: str = "confcal calibration report", box_features: dict | None = None,
                 verdict_out: list | None = None, numbers_out: dict | None = None, gate_rule: str | None = None,
                 alpha: float | None = None, gate_test: str | None = None) -> str:
    """The report as an HTML string.

    Parameters
    ----------
    stages : ``{name: probabilities}``, e.g. ``{"uncalibrated": p0, "det-ts": p1}``; each
        ``(n_samples, n_classes)`` or ``(n_boxes,)`` box scores (all of one kind)
    labels : int ``(n_samples,)``
    domains : ``(n_samples,)`` ids, optional (one diagram and table rows per domain)
    manifest : the calibrator's manifest dict, optional (its ``fit.provenance`` and fit record are shown)
    queue_csv : path of a ``confcal rank`` queue, or its rows as dicts, optional (the first ``queue_head``
        rows are shown)
    n_draws : bootstrap resamples for the 95% intervals of ECE/D-ECE and Brier
    max_ece : optional limit; the page opens with pass / fail per group (:func:`report_verdict`)
    gate_rule, alpha, gate_test : the gate rule of that verdict, the level of the intervals and tests
        (:mod:`confcal.evaluation.gate`; None: its defaults)
    verdict_out : optional list, extended with that verdict
    numbers_out : optional dict, filled with the page's numbers at full precision (the HTML rounds them):
        ``verdict``, ``metrics`` (one row per stage and group, with the bootstrap intervals as
        ``[lo, hi]``), ``n_bins``, ``n_draws``, ``max_ece`` and ``metric`` (the gated metric's name)
    box_features : ``{name: (n_boxes,) values}``, optional, box scores only: adds the geometry section
        (:func:`confcal.report_geometry.geometry_section`: heat map over ``cx, cy``, gap against the others)

    Returns
    -------
    str, a complete HTML document.
    """
    labels = np.asarray(labels)
    n_bins = check_report_bins(n_bins, labels.shape[0])  # before any work: the bins scale the page
    audits = {k: calibration_audit(p, labels, domains=domains, n_bins=n_bins) for k, p in stages.items()}
    from confcal.report_checks import stage_checks

    checks = stage_checks(stages, labels, audits, domains=domains, n_bins=n_bins, alpha=alpha)
    verdict = report_verdict(audits, max_ece, checks=checks[list(audits)[-1]], gate_rule=gate_rule,
                             gate_test=gate_test)
    if verdict_out is not None:  # the CLI's exit status reads the same verdict the page shows
        verdict_out.extend(verdict)
    first = next(iter(audits.values()))
    key = gate_metric(first)
    binary = first["kind"] == "binary"
    acc = "precision" if binary else "accuracy"  # box scores: precision of the matched set
    groups = {ALL: np.arange(labels.shape[0])}
    if domains is not None:
        d = np.asarray(domains).astype(str)
        groups.update({str(g): np.flatnonzero(d == g) for g in np.unique(d)})
    e_fn = (lambda p, y: detection_ece(p, y, n_bins)) if binary else (lambda p, y: ece(p, y, n_bins=n_bins))
    rows, exact = [], []
    for stage, a in audits.items():
        p = np.asarray(stages[stage], dtype=np.float64)
        for g, idx in groups.items():
            m = a["groups"][g]
            lo, hi = bootstrap_interval(e_fn, p[idx], labels[idx], n_draws=n_draws)
            blo, bhi = bootstrap_interval(brier, p[idx], labels[idx], n_draws=n_draws, seed=1)
            flag = max_ece is not None and stage == list(audits)[-1] and any(
                v["group"] == g and not v["pass"] for v in verdict)
            rows.append({"stage": stage, "domain": g, "n": m["n"], acc: m[acc],
                         key: f"{m[key]:.4f} [{lo:.4f}, {hi:.4f}]" + (" (above limit)" if flag else ""),
                         "nll": m["nll"], "brier": f"{m['brier']:.4f} [{blo:.4f}, {bhi:.4f}]"})
            exact.append({"stage": stage, "domain": g, "n": int(m["n"]), acc: float(m[acc]), key: float(m[key]),
                          f"{key}_interval": [float(lo), float(hi)], "nll": float(m["nll"]),
                          "brier": float(m["brier"]), "brier_interval": [float(blo), float(bhi)]})
    if numbers_out is not None:
        numbers_out.update({"metric": key, "max_ece": max_ece, "n_bins": int(n_bins), "n_draws": int(n_draws),
                            "verdict": verdict, "metrics": exact, "calibration": checks})
    from confcal.report_checks import checks_html, with_bands

    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>{labels.shape[0]} {'boxes (box scores)' if binary else 'samples'}; {n_bins} equal-width bins; "
             f"95% bootstrap intervals from {n_draws} resamples. "
             + (f"Limit {key} &le; {max_ece:g}." if max_ece is not None else "") + "</p>",
             "<h2>Verdict</h2>", _verdict_html(verdict, list(audits)[-1]),
             "<h2>Metrics</h2>", _table(rows, ["stage", "domain", "n", acc, key, "nll", "brier"]),
             checks_html(checks, key, _table),
             "<h2>Reliability diagrams and confidence histograms</h2>"]
    for g in groups:
        svg = reliability_svg({s: with_bands(a["groups"][g], checks[s][g]) for s, a in audits.items()},
                              "all samples" if g == ALL else f"domain {g}")
        parts.append(f"<figure>{svg}<figcaption>{html.escape('all samples' if g == ALL else 'domain ' + g)}"
                     "</figcaption></figure>")
    if box_features and binary:
        from confcal.report_geometry import geometry_section

        parts.append(geometry_section(stages, labels, box_features))
    if queue_csv is not None:
        if isinstance(queue_csv, list):  # rows already read (and checked) by the caller
            q = queue_csv
        else:
            with open(queue_csv, newline="", encoding="utf-8-sig") as fh:
                q = list(csv.DictReader(fh))
        parts.append(f"<h2>Annotation queue (first {min(queue_head, len(q))} of {len(q)} tiles)</h2>")
        parts.append(_table(q[:queue_head], list(q[0]) if q else []))
    if manifest is not None:
        fit = dict(manifest.get("fit") or {})
        prov = fit.pop("provenance", None)
        fit.pop("data_summary", None)  # quantiles: long and not for reading
        parts.append(f"<h2>Calibrator</h2><p>method <b>{html.escape(str(manifest.get('method')))}</b></p>")
        # folded: the record is for an audit trail, not for the first read
        parts.append("<details><summary>Provenance</summary><pre>" + html.escape(json.dumps(prov, indent=2))
                     + "</pre></details>")
        parts.append("<details><summary>Fit record and parameters</summary><pre>"
                     + html.escape(json.dumps({"fit": fit, "hyperparameters": manifest.get("hyperparameters"),
                                               "parameters": manifest.get("parameters")}, indent=2))
                     + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _provenance_html(manifest: dict) -> list[str]:
    fit = dict(manifest.get("fit") or {})
    prov = fit.pop("provenance", None)
    fit.pop("data_summary", None)
    return [f"<h2>Calibrator</h2><p>method <b>{html.escape(str(manifest.get('method')))}</b></p>",
            "<details><summary>Provenance</summary><pre>" + html.escape(json.dumps(prov, indent=2)) + "</pre></details>",
            "<details><summary>Fit record and parameters</summary><pre>"
            + html.escape(json.dumps({"fit": fit, "hyperparameters": manifest.get("hyperparameters"),
                                      "parameters": manifest.get("parameters")}, indent=2)) + "</pre></details>"]


def build_multilabel_report(stages: dict, labels, *, manifest: dict | None = None, n_bins: int = 15,
                            n_draws: int = 200, max_ece: float | None = None, max_diagrams: int = 8,
                            title: str = "confcal calibration report (sigmoid head)",
                            verdict_out: list | None = None, numbers_out: dict | None = None,
                            gate_rule: str | None = None, alpha: float | None = None, gate_test: str | None = None) -> str:
    """The report of a sigmoid head (multi-hot labels) as an HTML string.

    ``stages``: ``{name: (n_samples, n_labels) label probabilities}``; ``labels`` multi-hot
    ``(n_samples, n_labels)``. ``numbers_out`` (optional dict) is filled with the page's numbers at
    full precision, as :func:`build_report` fills it: ``metric`` (``"ece"``), ``max_ece``, ``n_bins``,
    ``n_draws``, ``verdict`` and ``metrics`` (one row per stage and label, ``label`` ``"(mean)"`` for the
    mean over labels with ``ece_interval`` and ``brier_interval`` as ``[lo, hi]``).
    Sections: the verdict (each label's and the mean ECE of the last stage
    against ``max_ece``; ``verdict_out`` is extended with it), per-label ECE / binary NLL / Brier
    with the mean over labels (its 95% bootstrap interval over ``n_draws`` resamples of the rows),
    reliability diagrams of all labels pooled and of the first ``max_diagrams`` labels, and the
    manifest's provenance. Metrics: :func:`confcal.metrics.multilabel.multilabel_metrics`.
    """
    from confcal.metrics.multilabel import check_multihot, multilabel_metrics

    first = np.asarray(next(iter(stages.values())))
    y = check_multihot(labels, first.shape[0], first.shape[1])
    n, n_labels = y.shape
    n_bins = check_report_bins(n_bins, n)
    from confcal.evaluation.gate import check_gate
    from confcal.evaluation.multilabel import multilabel_violations

    gate_rule, alpha, gate_test = check_gate(gate_rule, alpha, gate_test)
    results = {k: multilabel_metrics(p, y, n_bins=n_bins, checks=True, alpha=alpha) for k, p in stages.items()}
    last = list(results)[-1]
    verdict = []
    if max_ece is not None:
        m = results[last]
        groups = [(f"label {j}", r["ece"]) for j, r in enumerate(m["per_label"])] + [("mean", m["mean"]["ece"])]
        bad = {g for g, _ in multilabel_violations(m, float(max_ece), gate_rule=gate_rule, gate_test=gate_test)}
        verdict = [{"group": g, "metric": "ece", "value": v, "limit": float(max_ece), "pass": g not in bad,
                    "rule": gate_rule, "alpha": alpha, "test": gate_test if gate_rule == "test" else None}
                   for g, v in groups]
    if verdict_out is not None:
        verdict_out.extend(verdict)

    def mean_of(key):
        return lambda p, yy: multilabel_metrics(p, yy, n_bins=n_bins)["mean"][key]

    rows, exact = [], []
    for stage, m in results.items():
        p = np.asarray(stages[stage], dtype=np.float64)
        for j, r in enumerate(m["per_label"]):
            rows.append({"stage": stage, "label": str(j), "prevalence": r["prevalence"], "ece": r["ece"],
                         "nll": r["nll"], "brier": r["brier"]})
            exact.append({"stage": stage, "label": str(j), "prevalence": float(r["prevalence"]),
                          "ece": float(r["ece"]), "nll": float(r["nll"]), "brier": float(r["brier"])})
        lo, hi = bootstrap_interval(mean_of("ece"), p, y, n_draws=n_draws)
        blo, bhi = bootstrap_interval(mean_of("brier"), p, y, n_draws=n_draws, seed=1)
        rows.append({"stage": stage, "label": "(mean)", "prevalence": "",
                     "ece": f"{m['mean']['ece']:.4f} [{lo:.4f}, {hi:.4f}]", "nll": m["mean"]["nll"],
                     "brier": f"{m['mean']['brier']:.4f} [{blo:.4f}, {bhi:.4f}]"})
        exact.append({"stage": stage, "label": "(mean)", "ece": float(m["mean"]["ece"]),
                      "ece_interval": [float(lo), float(hi)], "nll": float(m["mean"]["nll"]),
                      "brier": float(m["mean"]["brier"]), "brier_interval": [float(blo), float(bhi)]})
    if numbers_out is not None:
        numbers_out.update({"metric": "ece", "max_ece": max_ece, "n_bins": int(n_bins), "n_draws": int(n_draws),
                            "verdict": verdict, "metrics": exact})
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>{n} samples, {n_labels} labels, each label a binary problem (rows do not sum to 1); "
             f"ECE over {n_bins} equal-width bins of each label's probability; 95% bootstrap intervals of the "
             f"means from {n_draws} resamples of the rows."
             + (f" Limit ECE &le; {max_ece:g} per label and on average." if max_ece is not None else "") + "</p>",
             "<h2>Verdict</h2>", _verdict_html(verdict, last),
             "<h2>Per-label metrics</h2>", _table(rows, ["stage", "label", "prevalence", "ece", "nll", "brier"]),
             "<h2>Reliability diagrams</h2>"]
    views = [("all labels pooled", slice(None))] + [(f"label {j}", j) for j in range(min(n_labels, max_diagrams))]
    for name, cols in views:
        audits = {s: calibration_audit(np.asarray(p, dtype=np.float64)[:, cols].reshape(-1),
                                       y[:, cols].reshape(-1), n_bins=n_bins)["groups"][ALL]
                  for s, p in stages.items()}
        parts.append(f"<figure>{reliability_svg(audits, name)}<figcaption>{html.escape(name)}</figcaption></figure>")
    if n_labels > max_diagrams:
        parts.append(f"<p>Diagrams of the first {max_diagrams} of {n_labels} labels; the table has them all.</p>")
    if manifest is not None:
        parts += _provenance_html(manifest)
    parts.append("</body></html>")
    return "\n".join(parts)
