"""Text rendering and the CI gate of the calibration audit (``confcal evaluate``); the numbers
come from :func:`confcal.evaluation.audit.calibration_audit`."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.base import _sha256
from confcal.cli._common import format_table, load_logits_labels, load_side
from confcal.evaluation.audit import ALL, calibration_audit, domain_parameters, ece_violations, gate_metric
from confcal.io import load_array, load_calibrator, load_manifest

#: exit status of ``evaluate --max-ece`` when a calibration error is above the limit
EXIT_ECE_EXCEEDED = 3


def taken(cal, side: dict) -> dict:
    """The side inputs ``cal`` takes: ``--domains`` may be given for the per-domain table only (a TS
    manifest audited per domain), and is then not passed to the calibrator."""
    takes = set(getattr(cal, "side_inputs", ())) | set(getattr(cal, "optional_side_inputs", ()))
    # only the domains have a use without the calibrator (the table); any other side input it does not
    # take is passed on, so it is refused in one line rather than silently ignored
    return {k: v for k, v in side.items() if k in takes or k != "domains"}


def box_score_predictions(args, cal, side):
    """``(stages, labels)`` for 1-D box scores: ``{"uncalibrated": clipped scores, method: p(TP)}``."""
    s = load_array(args.logits, name="logits").astype(np.float64)
    if s.ndim == 2 and s.shape[1] == 1:  # a one-logit head
        s = s[:, 0]
    y = load_array(args.labels, name="labels")
    if not np.all(np.isfinite(s)):
        raise ValueError("--logits: box scores must be finite")
    if getattr(args, "score_kind", "probs") == "logits":  # sigmoid logits: p = 1 / (1 + exp(-s))
        # the 2-class softmax of [0, s]: stable at any finite s (no exp overflow)
        stages = {"uncalibrated": softmax(np.stack([np.zeros_like(s), s], axis=1))[:, 1]}
    else:
        n_out = int(np.count_nonzero((s < 0) | (s > 1)))
        if n_out:
            print(f"note: {n_out} of {s.size} box scores lie outside [0, 1]; the uncalibrated metrics use them "
                  "clipped to [0, 1] (for sigmoid logits pass --input-kind logits)", file=sys.stderr)
        stages = {"uncalibrated": np.clip(s, 0.0, 1.0)}
    if cal is not None:
        if not getattr(cal, "takes_box_scores", False):
            raise ValueError(f"--calibrator: {cal.method} calibrates class vectors, but --logits holds 1-D box "
                             "scores; fit det-ts or det-platt")
        cal.set_params(input_kind=args.input_kind)
        if getattr(args, "category_ids", None):
            side = {**side, "category_ids": load_array(args.category_ids, name="category_ids")}
        if getattr(cal, "takes_box_features", False) and "features" not in side:
            from confcal.cli._boxfeatures import read_box_features

            side = {**side, "features": read_box_features(args.logits, cal.feature_names_, option="--logits",
                                                          fitted=True)}
        stages[cal.method] = cal.predict_proba(s, dtype=np.float64, **taken(cal, side))[:, 1]
    return stages, y


def audit_stages(stages: dict, labels, side: dict, n_bins: int) -> dict:
    return {name: calibration_audit(p, labels, domains=side.get("domains"), n_bins=n_bins)
            for name, p in stages.items()}


def add_parameters(audits: dict, manifest: dict | None) -> None:
    """Attach each domain's fitted parameters (from the manifest) to the calibrated stage."""
    if not manifest:
        return
    a = audits.get(manifest["method"])
    if a is None:
        return
    for g, m in a["groups"].items():
        if g != ALL:
            m["parameters"] = domain_parameters(manifest.get("parameters", {}), g)


def render(audits: dict) -> str:
    first = next(iter(audits.values()))
    # box scores: precision of the matched set and D-ECE; class vectors: accuracy and top-label ECE
    cols = ["n", *(["precision", "d_ece"] if first["kind"] == "binary" else ["accuracy", "ece"]), "nll", "brier"]
    rows = []
    for stage, a in audits.items():
        for g, m in a["groups"].items():
            row = {"stage": stage, "domain": g, **{c: m[c] for c in cols}}
            if m.get("parameters"):
                row["parameters"] = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in m["parameters"].items())
            rows.append(row)
    extra = ["parameters"] if any("parameters" in r for r in rows) else []
    out = [format_table(rows, ["stage", "domain", *cols, *extra])]
    for stage, a in audits.items():
        acc = "precision" if a["kind"] == "binary" else "accuracy"
        rel = [{"bin": f"({b['bin_lo']:.3f}, {b['bin_hi']:.3f}]", "count": b["count"],
                "confidence": float("nan") if b["mean_confidence"] is None else b["mean_confidence"],
                acc: float("nan") if b["accuracy"] is None else b["accuracy"]}
               for b in a["groups"][ALL]["reliability"] if b["count"]]
        out.append(f"\nreliability ({stage}, all samples, non-empty bins):")
        out.append(format_table(rel, ["bin", "count", "confidence", acc]))
    return "\n".join(out)


def gate(audits: dict, max_ece: float | None) -> int:
    """0, or :data:`EXIT_ECE_EXCEEDED` after saying which groups of the last stage exceed ``max_ece``."""
    if max_ece is None:
        return 0
    stage, a = list(audits.items())[-1]
    bad = ece_violations(a, max_ece)
    if not bad:
        return 0
    which = ", ".join(f"{g} {v:.4f}" for g, v in bad)
    print(f"confcal: {gate_metric(a)} above --max-ece {max_ece:g} ({stage}): {which}", file=sys.stderr)
    return EXIT_ECE_EXCEEDED


def run_audit(args) -> int:
    """``confcal evaluate`` in memory: the audit of the raw and calibrated predictions."""
    if args.max_ece is not None and not 0.0 <= args.max_ece <= 1.0:  # also refuses nan
        raise ValueError(f"--max-ece: expected a number in [0, 1], got {args.max_ece!r}")
    side = load_side(args)
    manifest = load_manifest(args.calibrator) if args.calibrator else None
    given = getattr(args, "input_kind", None)
    if given is None:  # default: what the calibrator was fitted on
        args.input_kind = load_calibrator(manifest).input_kind if manifest else "logits"
    raw = load_array(args.logits, name="logits")
    if raw.ndim == 1 or (raw.ndim == 2 and raw.shape[1] == 1):
        # 1-D box scores (probabilities of a true positive) with 0/1 labels; or a one-logit head (a binary
        # sigmoid logit, (n,) with --input-kind logits or (n, 1)): its probability is sigmoid(logit)
        one_logit = raw.ndim == 2
        args.score_kind = "logits" if given == "logits" or (one_logit and given != "probs") else "probs"
        cal = load_calibrator(manifest) if manifest else None
        stages, y = box_score_predictions(args, cal, side)
        x = stages["uncalibrated"][:, None]
    else:
        x, y = load_logits_labels(args)
        stages = {"uncalibrated": softmax(x)}
        cal = None
        if manifest:
            cal = load_calibrator(manifest, n_classes=x.shape[1])
            cal.set_params(input_kind="logits")  # x holds validated logits (log-probabilities for probs)
            stages[cal.method] = cal.predict_proba(x, dtype=np.float64, **taken(cal, side))
    if cal is not None:
        record = getattr(cal, "fit_record_", None) or {}
        if record.get("data_sha256") == _sha256(x if x.shape[1] > 1 else load_array(args.logits, name="logits"),
                                                y, *[side[k] for k in sorted(side)]):
            warnings.warn("these are the arrays the calibrator was fitted on: the calibrated metrics are "
                          "optimistic; evaluate on a held-out test set", UserWarning, stacklevel=2)
    audits = audit_stages(stages, y, side, args.n_bins)
    add_parameters(audits, manifest)
    geometry = geometry_section(args, stages, y, cal) if x.shape[1] == 1 else None
    if args.json:
        metrics = {k: {m: v for m, v in a["groups"]["(all)"].items() if m != "reliability"}
                   for k, a in audits.items()}
        print(json.dumps({"n_samples": int(y.shape[0]), "n_classes": 2 if x.shape[1] == 1 else int(x.shape[1]),
                          "metrics": metrics, "audit": audits,
                          **({"geometry_d_ece": geometry} if geometry else {})}, indent=2))
    else:
        print(f"{y.shape[0]} boxes (1-D box scores; precision = share of true positives, D-ECE = detection "
              "ECE, NLL and Brier binary)" if x.shape[1] == 1 else f"{y.shape[0]} samples, {x.shape[1]} classes")
        print(render(audits))
        if geometry:
            print(render_geometry(geometry))
    return gate(audits, args.max_ece)


def geometry_section(args, stages: dict, y, cal) -> dict | None:
    """Geometry D-ECE of every stage over ``--box-features`` (default: the calibrator's features), or None."""
    names = getattr(args, "box_features", None)
    if names:
        from confcal.cli._boxfeatures import names_of

        names = names_of(names)
    elif cal is not None and getattr(cal, "takes_box_features", False):
        names = list(cal.feature_names_)
    if not names:
        return None
    from confcal.cli._boxfeatures import read_box_features
    from confcal.metrics.detection_geometry import geometry_ece

    f = read_box_features(args.logits, names)
    nb, nf = 5, 5  # the confidence x feature grid: 5 bins each (cells fill up on thousands of boxes)
    return {"features": names, "n_bins": nb, "n_feature_bins": nf,
            "stages": {k: geometry_ece(p, y, f, n_bins=nb, n_feature_bins=nf) for k, p in stages.items()}}


def render_geometry(g: dict) -> str:
    rows = [{"stage": k, "geometry_d_ece": v} for k, v in g["stages"].items()]
    return (f"\ngeometry D-ECE (confidence x {', '.join(g['features'])}; {g['n_bins']} x {g['n_feature_bins']} "
            "equal-width bins per feature, over the data's range):\n" + format_table(rows, ["stage", "geometry_d_ece"]))
