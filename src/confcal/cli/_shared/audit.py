"""Text rendering and the CI gate of ``confcal evaluate`` (both engines); the numbers come from the
evaluate document (:mod:`confcal.evaluation.document`), built from the evaluate job's statistics."""

from __future__ import annotations

import json
import sys

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.base import _sha256
from confcal.cli._shared.common import format_table, load_side
from confcal.evaluation.document import ALL
from confcal.io import load_array, load_calibrator, load_manifest
from confcal.cli._shared.notes import note

#: exit status of ``evaluate --max-ece`` when a calibration error is above the limit
EXIT_ECE_EXCEEDED = 3


def taken(cal, side: dict) -> dict:
    """The side inputs ``cal`` takes: ``--domains`` may be given for the per-domain table only (a TS
    manifest audited per domain), and is then not passed to the calibrator."""
    takes = set(getattr(cal, "side_inputs", ())) | set(getattr(cal, "optional_side_inputs", ()))
    # only the domains have a use without the calibrator (the table); any other side input it does not
    # take is passed on, so it is refused in one line rather than silently ignored
    return {k: v for k, v in side.items() if k in takes or k != "domains"}


def classifier_manifest(manifest) -> bool:
    """True when ``manifest`` is a fitted classifier map (not a box-score map): a one-logit model's
    ``(n, 1)`` logits are then its two-class rows ``[0, z]``, as ``fit`` and ``apply`` read them."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("method"), str):
        return False
    from confcal.calibrators import METHODS

    try:
        cls = METHODS[manifest["method"]]
    except (KeyError, ValueError, ImportError):
        return False  # an unknown method: the loader's own error comes later
    return not getattr(cls, "takes_box_scores", False) and not manifest["method"].endswith("-multilabel")


def box_score_predictions(args, cal, side, *, note_outside: bool = True):
    """``(stages, labels)`` for 1-D box scores: ``{"uncalibrated": clipped scores, method: p(TP)}``;
    ``note_outside``: say on stderr how many scores lie outside [0, 1]."""
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
        if n_out and note_outside:
            note(f"note: {n_out} of {s.size} box scores lie outside [0, 1]; the uncalibrated metrics use them "
                  "clipped to [0, 1] (for sigmoid logits pass --input-kind logits)")
        stages = {"uncalibrated": np.clip(s, 0.0, 1.0)}
    if cal is not None:
        if not getattr(cal, "takes_box_scores", False):
            from confcal.cli._shared.common import check_class_count

            check_class_count(cal, np.shape(s), path=getattr(args, "calibrator", None))
            raise ValueError(f"--calibrator: {cal.method} calibrates class vectors, but --logits holds 1-D box "
                             "scores; fit det-ts or det-platt")
        cal.set_params(input_kind=args.input_kind)
        if getattr(args, "category_ids", None):
            side = {**side, "category_ids": load_array(args.category_ids, name="category_ids")}
        if getattr(cal, "takes_box_features", False) and "features" not in side:
            from confcal.cli._shared.boxfeatures import read_box_features

            side = {**side, "features": read_box_features(args.logits, cal.feature_names_, option="--logits",
                                                          fitted=True)}
        stages[cal.method] = cal.predict_proba(s, dtype=np.float64, **taken(cal, side))[:, 1]
    return stages, y


def render(doc: dict) -> str:
    """The text tables of an evaluate document (:mod:`confcal.evaluation.document`), either engine."""
    binary = doc["kind"] == "binary"
    # box scores: precision of the matched set and D-ECE; class vectors: accuracy and top-label ECE
    cols = ["n", *(["precision", "d_ece"] if binary else ["accuracy", "ece"]), "nll", "brier"]
    groups = [(ALL, doc["n_samples"], doc["metrics"], None)] + [
        (g, r["n_samples"], r["metrics"], r["parameters"]) for g, r in doc["per_domain"].items()]
    last = list(doc["metrics"])[-1]
    rows = []
    for stage in doc["metrics"]:
        for g, n, metrics, params in groups:
            row = {"stage": stage, "domain": g, "n": n, **{c: metrics[stage][c] for c in cols[1:]}}
            if params and stage == last and stage != "uncalibrated":
                row["parameters"] = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in params.items())
            rows.append(row)
    extra = ["parameters"] if any("parameters" in r for r in rows) else []
    out = [format_table(rows, ["stage", "domain", *cols, *extra])]
    frac = "precision" if binary else "accuracy"
    for stage, bins in doc["reliability"].items():
        rel = [{"bin": f"({b['bin_lo']:.3f}, {b['bin_hi']:.3f}]", "count": b["count"],
                "confidence": b["mean_confidence"], frac: b[frac], "lower": b["lower"], "upper": b["upper"]}
               for b in bins if b["count"]]
        alpha = doc["calibration"][stage]["alpha"]
        out.append(f"\nreliability ({stage}, all samples, non-empty bins; {frac} with its Clopper-Pearson "
                   f"{1 - alpha:g} interval):")
        out.append(format_table(rel, ["bin", "count", "confidence", frac, "lower", "upper"]))
    from confcal.cli._shared.gate import render_checks

    out.append(render_checks(doc))
    g = doc["geometry_d_ece"]
    if g:
        rows = [{"stage": k, "geometry_d_ece": v, "lower": g["bounds"][k][0], "upper": g["bounds"][k][1]}
                for k, v in g["stages"].items()]
        out.append(f"\ngeometry D-ECE (confidence x {', '.join(g['features'])}; {g['n_bins']} x "
                   f"{g['n_feature_bins']} equal-width bins per feature, over the data's range):\n"
                   + format_table(rows, ["stage", "geometry_d_ece", "lower", "upper"]))
    return "\n".join(out)


def finish(doc: dict, args) -> int:
    """Print the document (``--json``: as is; else the tables) and return the exit status of its
    ``limits`` (:data:`EXIT_ECE_EXCEEDED` after naming the groups above the limit): both engines."""
    if doc["n_outside"]:
        note(f"note: {doc['n_outside']} of {doc['n_samples']} box scores lie outside [0, 1]; the uncalibrated "
              "metrics use them clipped to [0, 1] (for sigmoid logits pass --input-kind logits)")
    if args.json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        if doc["kind"] == "binary":
            print(f"{doc['n_samples']} boxes (1-D box scores; precision = share of true positives, D-ECE = "
                  "detection ECE, NLL and Brier binary)")
        else:
            print(f"{doc['n_samples']} samples, {doc['n_classes']} classes")
        print(render(doc))
    lim = doc["limits"]
    if lim is None or lim["verdict"] == "pass":
        return 0
    from confcal.cli._shared.gate import verdict_line

    print(verdict_line(lim), file=sys.stderr)
    return EXIT_ECE_EXCEEDED


def check_max_ece(args) -> None:
    if args.max_ece is not None and not 0.0 <= args.max_ece <= 1.0:  # also refuses nan
        raise ValueError(f"--max-ece: expected a number in [0, 1], got {args.max_ece!r}")


def run_box_scores(args) -> int:
    """``confcal evaluate`` of 1-D box scores (or a one-logit head) in this process: the stages are
    computed in memory, their metrics by the evaluate job (the one the Dask engine runs)."""
    from confcal.evaluation.document import evaluation_document
    from confcal.evaluation.streamed import evaluate_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    side = load_side(args)
    manifest = load_manifest(args.calibrator) if args.calibrator else None
    given = getattr(args, "input_kind", None)
    cal = load_calibrator(manifest, source=args.calibrator) if manifest else None  # loaded once: one warning
    if given is None:  # default: what the calibrator was fitted on
        args.input_kind = cal.input_kind if cal is not None else "logits"
    raw = load_array(args.logits, name="logits")
    # 1-D box scores (probabilities of a true positive) with 0/1 labels; or a one-logit head (a binary
    # sigmoid logit, (n,) with --input-kind logits or (n, 1)): its probability is sigmoid(logit)
    one_logit = raw.ndim == 2
    args.score_kind = "logits" if given == "logits" or (one_logit and given != "probs") else "probs"
    stages, y = box_score_predictions(args, cal, side, note_outside=False)  # finish() notes scores outside [0, 1]
    s = np.asarray(raw, dtype=np.float64).reshape(-1)
    n_outside = 0 if args.score_kind == "logits" else int(np.count_nonzero((s < 0) | (s > 1)))
    if cal is not None:
        from confcal.evaluation.streamed import warn_if_fitted_on

        digested = dict(side)
        if getattr(cal, "takes_box_features", False) and "features" not in digested:
            # a geometry map was fitted on its box features: its fit digest covers them (as the Dask job's)
            from confcal.cli._shared.boxfeatures import read_box_features

            digested["features"] = read_box_features(args.logits, cal.feature_names_, option="--logits")
        rest = [digested[k] for k in sorted(digested)]
        from confcal.evaluation.streamed import other_width

        alt = other_width(raw)  # the same scores read at another float width (CSV: float64), in memory here
        warn_if_fitted_on(cal, _sha256(raw, y, *rest), None if alt is None else _sha256(alt, y, *rest))
    names = geometry_names(args, cal)
    sources = {"logits": s, "labels": y, **{f"stage:{w}": p for w, p in stages.items()}}
    if "domains" in side:
        sources["domains"] = side["domains"]
    if names:
        from confcal.cli._shared.boxfeatures import read_box_features

        sources["geometry"] = read_box_features(args.logits, names)
    engine = LocalEngine({k: open_source(v, name=k) for k, v in sources.items()}, reference="logits")
    stats = run_job(evaluate_job(n_classes=None, given=tuple(stages), n_bins=args.n_bins,
                                 per_domain="domains" in side, geometry=tuple(names or ())), engine)
    stats.n_outside = n_outside
    from confcal.cli._shared.gate import gate_kwargs

    return finish(evaluation_document(stats, engine="local", max_ece=args.max_ece, manifest=manifest,
                                      **gate_kwargs(args)), args)


def geometry_names(args, cal) -> list | None:
    """The box features of the geometry D-ECE: ``--box-features``, else the calibrator's, else None."""
    names = getattr(args, "box_features", None)
    if names:
        from confcal.cli._shared.boxfeatures import names_of

        return list(names_of(names))
    if cal is not None and getattr(cal, "takes_box_features", False):
        return list(cal.feature_names_)
    return None
