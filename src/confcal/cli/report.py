"""``confcal report``: a self-contained HTML audit of a calibrator on held-out data."""

from __future__ import annotations

import sys

from confcal.cli._shared.common import add_logits_args, load_logits_labels, load_side


def register(sub):
    p = sub.add_parser("report", help="write one self-contained HTML calibration report",
                       description="Reliability diagrams before/after the calibrator (all samples and per "
                                   "--domains), confidence histograms, metrics with bootstrap 95 percent intervals, "
                                   "the head of an annotation queue (--queue) and the manifest's provenance, in "
                                   "one HTML file that needs no network. --logits may be 1-D box scores.")
    add_logits_args(p, labels=True)
    p.set_defaults(input_kind=None)  # default: what the calibrator was fitted on (its manifest)
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    p.add_argument("--queue", help="queue CSV written by 'confcal rank' (its head is shown)")
    p.add_argument("--decisions", help="decision manifest of 'confcal decide fit': each group's operating point "
                                       "and its realised precision / NPV / review share on these items")
    p.add_argument("--n-bins", type=int, default=15, help="bins (default 15)")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals (default 200)")
    p.add_argument("--max-ece", type=float, metavar="X", help="the page opens with pass/fail per group against X (calibrated ECE; D-ECE for box "
                        "scores); exit 3 when any fails, as evaluate")
    p.add_argument("-o", "--output", required=True,
                   help="output .html; the numbers at full precision go beside it as the JSON side-file "
                        "(same stem, .numbers.json: report.html -> report.numbers.json)")
    from confcal.cli._shared.boxfeatures import add_box_features_arg

    add_box_features_arg(p, what="for box scores: adds the gap heat map over cx, cy and the gap against the "
                                 "other features (default: the calibrator's box features)")
    from confcal.cli._shared.multilabel import add_multilabel_arg

    add_multilabel_arg(p)
    from confcal.cli._shared.boxfeatures import add_category_ids_arg

    add_category_ids_arg(p)
    from confcal.cli._shared.gate import add_gate_args

    add_gate_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from confcal._numeric import softmax
    from confcal.cli._shared import audit as _audit
    from confcal.io import atomic_write, check_output_path, load_array, load_calibrator, load_manifest
    from confcal.report import build_report

    check_output_path(args.output, suffixes=(".html", ".htm"), name="--output")
    from pathlib import Path

    from confcal.cli._shared.outputs import command_inputs
    from confcal.io import guard_outputs

    # the HTML rounds; this file does not. Not "<stem>.json": -o cal.html beside --calibrator cal.json is
    # what a user types, and the guard would refuse it
    side_file = str(Path(args.output).with_suffix(".numbers.json"))
    guard_outputs({"--output": args.output, "--output (its JSON side-file)": side_file}, command_inputs(args))
    if args.max_ece is not None and not 0.0 <= args.max_ece <= 1.0:  # also refuses nan, as evaluate does
        raise ValueError(f"--max-ece: expected a number in [0, 1], got {args.max_ece!r}")
    from confcal.cli._shared.gate import gate_kwargs

    gate = gate_kwargs(args)  # refused before any data is read
    if args.bootstrap < 1:
        raise ValueError(f"--bootstrap: expected a positive number of resamples, got {args.bootstrap}")
    queue = read_queue(args.queue) if args.queue else None
    from confcal.cli._shared import multilabel as _multilabel

    inputs = _multilabel.multilabel_inputs(args, calibrator_path=args.calibrator)
    if inputs is not None:  # a sigmoid head: per-label metrics
        return _multilabel.run_report(args, inputs)
    side = load_side(args)
    manifest = load_manifest(args.calibrator)
    cal = load_calibrator(manifest, source=args.calibrator)  # loaded once: one warning on a damaged record
    if args.input_kind is None:
        args.input_kind = cal.input_kind
    geo = None
    if load_array(args.logits, name="logits").ndim == 1:
        stages, y = _audit.box_score_predictions(args, cal, side)
        geo = _box_features(args, cal)
    else:
        x, y = load_logits_labels(args)
        from confcal.cli._shared.boxfeatures import refuse_category_ids

        refuse_category_ids(args, f"class vectors {x.shape}")
        from confcal.cli._shared.common import check_class_count

        check_class_count(cal, x.shape, path=args.calibrator)
        cal.set_params(input_kind="logits")  # x holds validated logits (log-probabilities for probs)
        stages = {"uncalibrated": softmax(x), cal.method: cal.predict_proba(x, dtype=np.float64, **_audit.taken(cal, side))}
    verdict, numbers = [], {}
    text = build_report(stages, np.asarray(y), domains=side.get("domains"), manifest=manifest,
                        queue_csv=queue, n_bins=args.n_bins, n_draws=args.bootstrap, max_ece=args.max_ece,
                        box_features=geo, verdict_out=verdict, numbers_out=numbers, **gate)
    if args.decisions:  # the operating points of a decision manifest (confcal.cli._shared.decide)
        from confcal.cli._shared.decide import report_section

        text = report_section(args, text)
    import contextlib
    import json

    from confcal.cli._shared.provenance import file_sha256

    numbers["calibrator_sha256"] = file_sha256(args.calibrator)
    with contextlib.ExitStack() as stack:  # both files or neither
        stack.enter_context(atomic_write(side_file, "w")).write(json.dumps(numbers, indent=2, allow_nan=False)
                                                                 + "\n")
        stack.enter_context(atomic_write(args.output, "w")).write(text)
    print(f"wrote report ({len(text) // 1024} KiB, {text.count('<svg')} charts) -> {args.output} "
          f"(numbers: {side_file})")
    failed = [v for v in verdict if not v["pass"]]
    if failed:  # the same exit status as `confcal evaluate --max-ece`
        from confcal.cli._shared.gate import verdict_line

        v0 = failed[0]
        lim = {"metric": v0["metric"], "max_ece": args.max_ece, "stage": list(stages)[-1], "rule": v0["rule"],
               "alpha": v0["alpha"], "test": v0["test"], "groups": {v["group"]: v for v in verdict},
               "exceeded": {v["group"]: v["value"] for v in failed}}
        print(verdict_line(lim), file=sys.stderr)  # the line of `confcal evaluate`
        return _audit.EXIT_ECE_EXCEEDED
    return 0


def _box_features(args, cal):
    """``{name: values}`` of ``--box-features`` (default: the calibrator's), or None."""
    from confcal.cli._shared.boxfeatures import names_of, read_box_features

    names = names_of(args.box_features) if args.box_features else list(getattr(cal, "feature_names_", []) or [])
    if not names:
        return None
    f = read_box_features(args.logits, names)
    return {k: f[:, j] for j, k in enumerate(names)}


def read_queue(path) -> list[dict]:
    """The rows of a ``confcal rank`` queue CSV; ``ValueError`` naming ``--queue`` and the file when it
    is not one (empty, not UTF-8 text, or without the queue's ``rank`` and ``image_id`` columns)."""
    import csv
    import os

    if not os.path.exists(path):
        raise FileNotFoundError(f"--queue: no such file {str(path)!r}")
    if not os.path.isfile(path):
        raise ValueError(f"--queue: {str(path)!r} is not a regular file; expected the CSV of 'confcal rank'")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"--queue: {str(path)!r} is not a CSV text file ({exc})") from None
    missing = [c for c in ("rank", "image_id") if c not in columns]
    if missing:
        raise ValueError(f"--queue: {str(path)!r} is not a queue written by 'confcal rank' (no column "
                         f"{', '.join(map(repr, missing))}; it has {columns[:8]})")
    return rows
