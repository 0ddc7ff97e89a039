"""``confcal evaluate``: calibration metrics, optionally after a saved calibrator."""

from __future__ import annotations

import json
import warnings

from confcal._numeric import softmax
from confcal.calibrators.base import _sha256
from confcal.cli import _audit
from confcal.cli._common import add_logits_args, load_logits_labels, load_side
from confcal.io import load_array, load_calibrator, load_manifest


def register(sub):
    p = sub.add_parser("evaluate", help="print calibration metrics (with or without a calibrator)",
                       description="Accuracy, ECE, NLL and Brier score of the logits (or of 1-D box scores "
                                   "with 0/1 labels: then also D-ECE, and Brier is the binary mean (p - y)^2), "
                                   "and after a calibrator if one is given; overall and per --domains, with the "
                                   "reliability table. With --max-ece the exit status is 3 when the calibrated "
                                   "ECE (D-ECE for box scores) of any domain or of all samples exceeds the limit.")
    add_logits_args(p, labels=True)
    p.add_argument("--calibrator", help="manifest written by 'confcal fit'")
    p.add_argument("--n-bins", type=int, default=15, help="bins for ECE/MCE (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--max-ece", type=float, metavar="X",
                   help="CI gate: exit 3 if the ECE (D-ECE for box scores) after the calibrator (or of the raw "
                        "predictions without one) exceeds X overall or in any domain")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.max_ece is not None and not 0.0 <= args.max_ece <= 1.0:  # also refuses nan
        raise ValueError(f"--max-ece: expected a number in [0, 1], got {args.max_ece!r}")
    side = load_side(args)
    manifest = load_manifest(args.calibrator) if args.calibrator else None
    if load_array(args.logits, name="logits").ndim == 1:  # box scores (n_boxes,) with 0/1 labels
        cal = load_calibrator(manifest) if manifest else None
        stages, y = _audit.box_score_predictions(args, cal, side)
        x = stages["uncalibrated"][:, None]
    else:
        x, y = load_logits_labels(args)
        stages = {"uncalibrated": softmax(x)}
        cal = None
        if manifest:
            cal = load_calibrator(manifest, n_classes=x.shape[1])
            stages[cal.method] = cal.predict_proba(x, **side)
    if cal is not None:
        record = getattr(cal, "fit_record_", None) or {}
        if record.get("data_sha256") == _sha256(x if x.shape[1] > 1 else load_array(args.logits, name="logits"),
                                                y, *[side[k] for k in sorted(side)]):
            warnings.warn("these are the arrays the calibrator was fitted on: the calibrated metrics are "
                          "optimistic; evaluate on a held-out test set", UserWarning, stacklevel=2)
    audits = _audit.audit_stages(stages, y, side, args.n_bins)
    _audit.add_parameters(audits, manifest)
    if args.json:
        metrics = {k: {m: v for m, v in a["groups"]["(all)"].items() if m != "reliability"}
                   for k, a in audits.items()}
        print(json.dumps({"n_samples": int(y.shape[0]), "n_classes": 2 if x.shape[1] == 1 else int(x.shape[1]),
                          "metrics": metrics, "audit": audits}, indent=2))
    else:
        print(f"{y.shape[0]} samples, {2 if x.shape[1] == 1 else x.shape[1]} classes"
              + (" (box scores)" if x.shape[1] == 1 else ""))
        print(_audit.render(audits))
    return _audit.gate(audits, args.max_ece)
