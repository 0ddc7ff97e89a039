"""``confcal evaluate``: calibration metrics, optionally after a saved calibrator, in bounded memory.

The logits are read in batches; every metric is a mergeable accumulator. The equal-mass ECE
needs its bin edges first, so the data is read twice (exact, not estimated).
"""

from __future__ import annotations

import json
import warnings

import numpy as np

from confcal._digest import DataDigest
from confcal._progress import progress_bar
from confcal._validation import check_domains, check_features, check_labels, check_logits
from confcal.cli import _audit
from confcal.cli._common import add_logits_args, metrics_rows, progress_of, side_sources, source
from confcal.cli._dask import add_engine_args, run_evaluate, wants_dask
from confcal.io import load_calibrator
from confcal.metrics import SummaryAccumulator
from confcal.sources import DEFAULT_BATCH_BYTES, batch_rows_for, iter_aligned


def register(sub):
    p = sub.add_parser("evaluate", help="print calibration metrics (with or without a calibrator)",
                       description="Accuracy, ECE, NLL and Brier score of the logits (or of 1-D box scores "
                                   "with 0/1 labels: then also D-ECE, and Brier is the binary mean (p - y)^2), "
                                   "and after a calibrator if one is given; overall and per --domains, with the "
                                   "reliability table. With --max-ece the exit status is 3 when the calibrated "
                                   "ECE (D-ECE for box scores) of any domain or of all samples exceeds the limit.")
    add_logits_args(p, labels=True)
    p.set_defaults(input_kind=None)  # default: the calibrator's (its manifest), else logits
    p.add_argument("--calibrator", help="manifest written by 'confcal fit'")
    p.add_argument("--n-bins", type=int, default=15, help="bins for ECE/MCE (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--max-ece", type=float, metavar="X",
                   help="CI gate: exit 3 if the ECE (D-ECE for box scores) after the calibrator (or of the raw "
                        "predictions without one) exceeds X overall or in any domain")
    add_engine_args(p)
    p.set_defaults(func=run)


def _uncalibrated(x: np.ndarray) -> np.ndarray:
    from confcal.calibrators.temperature import scaled_softmax_rows

    return scaled_softmax_rows(x, 1.0)[0]


def evaluate_sources(xs, ys, *, cal=None, side=None, input_kind="logits", n_bins=15, progress=False):
    """``({name: metrics}, data digest)`` over aligned sources, two passes, bounded memory."""
    side = side or {}
    if xs.ndim != 2:
        raise ValueError(f"logits: expected shape (n_samples, n_classes), got {xs.shape}")
    n, k = xs.shape
    if cal is not None:
        cal = load_calibrator(cal, n_classes=k) if not hasattr(cal, "_predict_batch") else cal
    accs = {"uncalibrated": SummaryAccumulator(n_bins)}
    if cal is not None:
        accs[cal.method] = SummaryAccumulator(n_bins)
    digest = DataDigest(2 + len(side))
    # a quarter of the default batch: each batch of logits becomes two float64 probability arrays
    # plus the metric temporaries, several times its own size
    rows = batch_rows_for([xs, ys, *side.values()], DEFAULT_BATCH_BYTES // 4)
    unit = input_kind == "logits"
    seen = {}
    for pass_no in (1, 2):
        with progress_bar(n, f"evaluate pass {pass_no}/2", progress) as bar:
            for first, b in iter_aligned({"logits": xs, "labels": ys, **side}, rows):
                raw = b.pop("logits")
                x = check_logits(raw, input_kind=input_kind, first_row=first, whole=False)
                y = check_labels(b.pop("labels"), x.shape[0], k, first_row=first)
                if pass_no == 1:
                    unit = unit and bool(np.min(x) >= 0) and bool(np.max(x) <= 1)
                    digest.update(0, x)
                    digest.update(1, y)
                    for i, key in enumerate(sorted(b)):
                        digest.update(2 + i, check_domains(b[key], x.shape[0]) if key == "domains"
                                      else check_features(b[key], x.shape[0]))
                accs["uncalibrated"].update(_uncalibrated(x), y)
                if cal is not None:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        probs, _ = cal._predict_batch(raw, input_kind=input_kind, first_row=first, **b)
                    for w in caught:
                        seen.setdefault(str(w.message), w)
                    accs[cal.method].update(probs, y)
                bar.update(x.shape[0])
        if pass_no == 1 and unit:
            from confcal.calibrators._stream import refuse_probabilities

            refuse_probabilities(xs, rows)
        for acc in accs.values():
            acc.start_second_pass()
    for w in seen.values():
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return {name: acc.result() for name, acc in accs.items()}, digest.hexdigest()


def run(args) -> int:
    if wants_dask(args):
        return run_evaluate(args)
    if args.max_ece is not None or args.domains or source(args, "logits").ndim == 1:
        # the audit (box scores, per-domain table, --max-ece gate) holds the data in memory
        return _audit.run_audit(args)
    if args.input_kind is None:  # default: the calibrator's (its manifest), else logits
        args.input_kind = load_calibrator(args.calibrator).input_kind if args.calibrator else "logits"
    xs, ys = source(args, "logits"), source(args, "labels")
    side = side_sources(args)
    cal = load_calibrator(args.calibrator, n_classes=xs.shape[1] if xs.ndim == 2 else None) \
        if args.calibrator else None
    results, digest = evaluate_sources(xs, ys, cal=cal, side=side, input_kind=args.input_kind,
                                       n_bins=args.n_bins, progress=progress_of(args))
    if cal is not None:
        record = getattr(cal, "fit_record_", None) or {}
        if record.get("data_sha256") == digest:
            warnings.warn("these are the arrays the calibrator was fitted on: the calibrated metrics are "
                          "optimistic; evaluate on a held-out test set", UserWarning, stacklevel=2)
    n, k = xs.shape
    if args.json:
        print(json.dumps({"n_samples": int(n), "n_classes": int(k), "metrics": results}, indent=2))
    else:
        print(f"{n} samples, {k} classes")
        print(metrics_rows(results))
    return 0
