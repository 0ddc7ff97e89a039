"""``confcal evaluate``: calibration metrics, optionally after a saved calibrator."""

from __future__ import annotations

import json
import warnings

from confcal._numeric import softmax
from confcal.calibrators.base import _sha256
from confcal.cli._common import add_logits_args, load_logits_labels, load_side, metrics_rows
from confcal.cli._dask import add_engine_args, run_evaluate, wants_dask
from confcal.io import load_calibrator
from confcal.metrics import calibration_summary


def register(sub):
    p = sub.add_parser("evaluate", help="print calibration metrics (with or without a calibrator)",
                       description="Accuracy, ECE (equal-width and equal-mass), MCE, NLL and Brier score "
                                   "of the logits, and after a calibrator if one is given.")
    add_logits_args(p, labels=True)
    p.add_argument("--calibrator", help="manifest written by 'confcal fit'")
    p.add_argument("--n-bins", type=int, default=15, help="bins for ECE/MCE (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if wants_dask(args):
        return run_evaluate(args)
    x, y = load_logits_labels(args)
    side = load_side(args)
    results = {"uncalibrated": calibration_summary(softmax(x), y, n_bins=args.n_bins)}
    if args.calibrator:
        cal = load_calibrator(args.calibrator, n_classes=x.shape[1])
        results[cal.method] = calibration_summary(cal.predict_proba(x, **side), y, n_bins=args.n_bins)
        record = getattr(cal, "fit_record_", None) or {}
        if record.get("data_sha256") == _sha256(x, y, *[side[k] for k in sorted(side)]):
            warnings.warn("these are the arrays the calibrator was fitted on: the calibrated metrics are "
                          "optimistic; evaluate on a held-out test set", UserWarning, stacklevel=2)
    if args.json:
        print(json.dumps({"n_samples": int(x.shape[0]), "n_classes": int(x.shape[1]), "metrics": results},
                         indent=2))
    else:
        print(f"{x.shape[0]} samples, {x.shape[1]} classes")
        print(metrics_rows(results))
    return 0
