"""Sigmoid heads (multi-hot labels) in ``evaluate``, ``report`` and ``compare``: per-label ECE,
binary NLL and Brier and their mean (:mod:`confcal.evaluation.multilabel`).

A command takes this path with ``--multilabel``, when its calibrator is a sigmoid-head method
(``ts-multilabel``, ``platt-multilabel``), or when ``--labels`` is 2-D of the logits' shape with a
row that is not one-hot (one-hot 2-D labels stay a softmax head's class labels).
"""

from __future__ import annotations

import json
import sys
from confcal.cli._shared.notes import note

__all__ = ["add_multilabel_arg", "multilabel_inputs", "run_evaluate", "run_report", "run_compare"]


def add_multilabel_arg(p) -> None:
    p.add_argument("--multilabel", action="store_true",
                   help="sigmoid head: --logits (n_samples, n_labels) with multi-hot --labels of the same shape; "
                        "per-label ECE, binary NLL and Brier and their mean (chosen without the flag when the "
                        "labels are multi-hot or the calibrator is ts-multilabel / platt-multilabel)")


def multilabel_inputs(args, *, calibrator_path=None):
    """``(logits, labels, manifest)`` when this call is a sigmoid head's, else None (nothing is
    read twice: the softmax path reads its own inputs)."""
    from confcal.io import load_array

    header = getattr(args, "csv_header", "first")
    flagged, manifest = flagged_multilabel(args, calibrator_path=calibrator_path)
    if not flagged and not getattr(args, "labels", None):
        return None
    if not flagged:  # the shape from the file's header: 1-D labels (the usual case) are never loaded here
        from confcal.cli._shared.common import source

        if source(args, "labels").ndim != 2:
            return None
    labels = load_array(args.labels, name="labels", csv_header=header)
    logits = load_array(args.logits, name="logits", csv_header=header)
    return (logits, labels, manifest) if check_multilabel_shapes(logits, labels, flagged) else None


def flagged_multilabel(args, *, calibrator_path=None):
    """``(True when the call says it is a sigmoid head's, manifest or None)``: ``--multilabel``, or a
    ``*-multilabel`` calibrator (both engines ask this)."""
    from confcal.io import load_manifest

    manifest = load_manifest(calibrator_path) if calibrator_path else None
    flagged = bool(getattr(args, "multilabel", False))
    if manifest is not None and str(manifest.get("method", "")).endswith("-multilabel"):
        flagged = True
    return flagged, manifest


def check_multilabel_shapes(logits, labels, flagged: bool) -> bool:
    """True when ``labels`` make this a sigmoid head's evaluation (``flagged``, or 2-D labels with a
    row that is not one-hot); ``ValueError`` naming ``--labels`` when they are not multi-hot of the
    logits' shape then (both engines ask this)."""
    import numpy as np

    from confcal.evaluation.multilabel import is_multilabel

    if not is_multilabel(np.shape(logits), labels, force=flagged):
        return False
    if np.ndim(logits) != 2 or np.shape(labels) != np.shape(logits):
        raise ValueError(f"--labels: a sigmoid head needs multi-hot labels of the logits' shape "
                         f"{tuple(np.shape(logits))} (n_samples, n_labels), got {tuple(np.shape(labels))}")
    return True


def _stages(args, logits, manifest):
    from confcal.evaluation.multilabel import multilabel_stages
    from confcal.io import load_calibrator

    cal = None
    if manifest is not None:
        cal = load_calibrator(manifest, n_classes=logits.shape[1], source=getattr(args, "calibrator", None))
        if not getattr(cal, "multilabel", False):
            raise ValueError(f"--calibrator: {cal.method} calibrates softmax heads, but --labels are multi-hot "
                             "(n_samples, n_labels); fit ts-multilabel or platt-multilabel")
    kind = args.input_kind or (cal.input_kind if cal is not None else "logits")
    return multilabel_stages(logits, cal, input_kind=kind)


def _max_ece(args):
    v = getattr(args, "max_ece", None)
    if v is not None and not 0.0 <= v <= 1.0:  # also refuses nan
        raise ValueError(f"--max-ece: expected a number in [0, 1], got {v!r}")
    return v


def _gate(results: dict, max_ece, args=None) -> int:
    from confcal.cli._shared.audit import EXIT_ECE_EXCEEDED
    from confcal.cli._shared.gate import gate_kwargs
    from confcal.evaluation.multilabel import multilabel_violations

    if max_ece is None:
        return 0
    stage, m = list(results.items())[-1]
    gate = gate_kwargs(args)
    bad = multilabel_violations(m, max_ece, gate_rule=gate["gate_rule"], gate_test=gate["gate_test"])
    if not bad:
        return 0
    print(f"confcal: per-label ECE above --max-ece {max_ece:g} ({stage}; --gate-rule {gate['gate_rule']}): "
          + ", ".join(f"{g} {v:.4f}" for g, v in bad), file=sys.stderr)
    return EXIT_ECE_EXCEEDED


def run_evaluate(args, inputs, *, engine: str = "local") -> int:
    """``confcal evaluate`` of a sigmoid head: the per-label table of every stage (or JSON); ``engine``
    (``"local"`` / ``"dask"``: which one read the rows) is recorded in the JSON document."""
    from confcal.evaluation.multilabel import evaluate_multilabel, format_multilabel

    logits, labels, manifest = inputs
    max_ece = _max_ece(args)
    from confcal.cli._shared.gate import gate_kwargs

    results = evaluate_multilabel(_stages(args, logits, manifest), labels, n_bins=args.n_bins,
                                  alpha=gate_kwargs(args)["alpha"])
    n, n_labels = logits.shape
    if args.json:
        # engine: the facts of the run, as in the class-vector document (evaluation.document)
        print(json.dumps({"n_samples": int(n), "n_labels": int(n_labels), "multilabel": True,
                          "metrics": results, "engine": {"name": engine, "n_passes": 1}}, indent=2))
    else:
        print(f"{n} samples, {n_labels} labels (sigmoid head: per-label ECE over {args.n_bins} equal-width bins, "
              "binary NLL and Brier; (mean) = the average over labels)")
        print(format_multilabel(results))
    return _gate(results, max_ece, args)


def _gate_kwargs(args) -> dict:
    from confcal.cli._shared.gate import gate_kwargs

    return gate_kwargs(args)


def run_report(args, inputs) -> int:
    from confcal.io import atomic_write
    from confcal.report import build_multilabel_report

    import contextlib
    from pathlib import Path

    from confcal.cli._shared.provenance import file_sha256

    logits, labels, manifest = inputs
    max_ece = _max_ece(args)
    stages = _stages(args, logits, manifest)
    verdict, numbers = [], {}
    text = build_multilabel_report(stages, labels, manifest=manifest, n_bins=args.n_bins, n_draws=args.bootstrap,
                                   max_ece=max_ece, verdict_out=verdict, numbers_out=numbers,
                                   **_gate_kwargs(args))
    # the same side-file as the class-vector report (report.run has guarded both paths)
    side_file = str(Path(args.output).with_suffix(".numbers.json"))
    if getattr(args, "calibrator", None):
        numbers["calibrator_sha256"] = file_sha256(args.calibrator)
    with contextlib.ExitStack() as stack:  # both files or neither
        stack.enter_context(atomic_write(side_file, "w")).write(json.dumps(numbers, indent=2, allow_nan=False)
                                                                 + "\n")
        stack.enter_context(atomic_write(args.output, "w")).write(text)
    print(f"wrote report ({len(text) // 1024} KiB, {text.count('<svg')} charts) -> {args.output} "
          f"(numbers: {side_file})")
    failed = [v for v in verdict if not v["pass"]]
    if failed:
        from confcal.cli._shared.audit import EXIT_ECE_EXCEEDED

        print(f"confcal: per-label ECE above --max-ece {max_ece:g} (--gate-rule {failed[0]['rule']}): "
              + ", ".join(f"{v['group']} {v['value']:.4f}" for v in failed), file=sys.stderr)
        return EXIT_ECE_EXCEEDED
    return 0


def run_compare(args, inputs, methods) -> int:
    from confcal.evaluation.multilabel import compare_multilabel_methods, format_multilabel_comparison

    logits, labels, _ = inputs
    if args.test_logits is not None or args.csv:
        raise ValueError("--test-logits/--csv: not for multi-hot labels (random splits of the rows only)")
    n = logits.shape[0]
    cal_size = args.cal_size
    if cal_size >= n:
        cal_size = n // 2
        note(f"note: --cal-size {args.cal_size} >= {n} rows; calibrating on half ({cal_size})")
    result = compare_multilabel_methods(logits, labels, methods, n_splits=args.splits, cal_size=cal_size,
                                        random_state=args.seed, input_kind=args.input_kind or "logits")
    print(json.dumps(result, indent=2) if args.json else format_multilabel_comparison(result))
    return 0
