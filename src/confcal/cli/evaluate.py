"""``confcal evaluate``: calibration metrics, optionally after a saved calibrator, in bounded memory.

The protocol (batches, accumulators, two passes for the exact equal-mass bins) is the evaluate job
(:func:`confcal.evaluation.streamed.evaluate_job`, also run by ``--engine dask``); the document it
prints with ``--json`` is built by :func:`confcal.evaluation.document.evaluation_document` for both
engines (same keys, same values up to summation order).
"""

from __future__ import annotations


from confcal.cli._shared.common import add_logits_args, progress_of, side_sources, source
from confcal.cli._shared.boxfeatures import add_box_features_arg
from confcal.cli._shared.dask import add_engine_args, run_evaluate, wants_dask

__all__ = ["register", "run"]


def register(sub):
    p = sub.add_parser("evaluate", help="print calibration metrics (with or without a calibrator)",
                       description="Accuracy, ECE, NLL and Brier score of the logits (or of 1-D box scores "
                                   "with 0/1 labels: then also D-ECE, and Brier is the binary mean (p - y)^2), "
                                   "and after a calibrator if one is given; overall and per --domains, with the "
                                   "reliability table (each bin with its Clopper-Pearson interval), bounds of the "
                                   "ECE, debiased estimates and calibration tests. With --max-ece the exit status "
                                   "is 3 when the calibrated ECE (D-ECE for box scores) of any domain or of all "
                                   "samples fails --gate-rule against the limit.")
    add_logits_args(p, labels=True)
    p.set_defaults(input_kind=None)  # default: the calibrator's (its manifest), else logits
    p.add_argument("--calibrator", help="manifest written by 'confcal fit'")
    p.add_argument("--n-bins", type=int, default=15, help="bins for ECE/MCE (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--max-ece", type=float, metavar="X",
                   help="CI gate: exit 3 if the ECE (D-ECE for box scores) after the calibrator (or of the raw "
                        "predictions without one) fails --gate-rule against X overall or in any domain")
    add_box_features_arg(p, what="for box scores: also print the geometry D-ECE over confidence x these features "
                                   "(default: the calibrator's box features)")
    from confcal.cli._shared.multilabel import add_multilabel_arg

    add_multilabel_arg(p)
    from confcal.cli._shared.boxfeatures import add_category_ids_arg

    add_category_ids_arg(p)
    from confcal.cli._shared.gate import add_gate_args

    add_gate_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from confcal.cli._shared import audit as _audit

    _audit.check_max_ece(args)
    from confcal.cli._shared.gate import gate_kwargs

    gate_kwargs(args)  # refused before any data is read
    if wants_dask(args):
        return run_evaluate(args)
    from confcal.cli._shared import multilabel as _multilabel

    inputs = _multilabel.multilabel_inputs(args, calibrator_path=args.calibrator)
    if inputs is not None:  # a sigmoid head: per-label metrics
        return _multilabel.run_evaluate(args, inputs)
    from confcal.evaluation.document import evaluation_document
    from confcal.evaluation.streamed import evaluate_stats, warn_if_fitted_on
    from confcal.io import load_calibrator, load_manifest

    xs = source(args, "logits")
    manifest = load_manifest(args.calibrator) if args.calibrator else None
    if xs.ndim == 1 or (xs.ndim == 2 and xs.shape[1] == 1 and not _audit.classifier_manifest(manifest)):
        # 1-D box scores, or a one-logit head ((n, 1): a binary sigmoid logit) alone or with a box map: in
        # memory; (n, 1) with a classifier's manifest is its two-class rows [0, z] (issue 40), read below
        return _audit.run_box_scores(args)
    cal = load_calibrator(manifest, source=args.calibrator) if manifest else None  # loaded once: one warning
    if args.input_kind is None:  # default: the calibrator's (its manifest), else logits
        args.input_kind = cal.input_kind if cal is not None else "logits"
    ys = source(args, "labels")
    from confcal.cli._shared.boxfeatures import refuse_category_ids

    refuse_category_ids(args, f"class vectors {xs.shape}")
    side = side_sources(args)
    if cal is not None:
        from confcal.cli._shared.common import check_class_count

        check_class_count(cal, xs.shape, path=args.calibrator)
    # --domains without a calibrator that takes them: the per-domain table only
    taken = tuple(_audit.taken(cal, side)) if cal is not None else ()
    stats, digest = evaluate_stats(xs, ys, cal=cal, side=side, taken=taken, per_domain="domains" in side,
                                   input_kind=args.input_kind, n_bins=args.n_bins, progress=progress_of(args),
                                   other_width=cal is not None and _text_read(args.logits, cal))
    if cal is not None:
        warn_if_fitted_on(cal, digest, stats.data_sha256_other_width)
    return _audit.finish(evaluation_document(stats, engine="local", max_ece=args.max_ece, manifest=manifest,
                                                   **gate_kwargs(args)), args)


def _text_read(spec, cal) -> bool:
    """Whether the logits now or at fit came from a text file (CSV, read as float64 whatever was written):
    then the evaluation also digests them at the other float width, to recognise the calibration set."""
    from confcal.sources import split_spec

    record = getattr(cal, "fit_record_", None) or {}
    if not record.get("data_sha256"):
        return False
    fitted = ((record.get("provenance") or {}).get("inputs") or {}).get("logits")
    paths = [str(split_spec(s)[0]) for s in ([spec] if isinstance(spec, str) else spec or [])]
    for entry in fitted if isinstance(fitted, list) else [fitted]:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            paths.append(entry["path"])
    return any(p.lower().endswith(".csv") for p in paths)
