"""``confcal evaluate``: calibration metrics, optionally after a saved calibrator."""

from __future__ import annotations

from confcal.cli import _audit
from confcal.cli._common import add_logits_args


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
    p.set_defaults(func=run)


def run(args) -> int:
    # the audit (per-domain table, reliability table, box scores, --max-ece) holds the data in memory
    return _audit.run_audit(args)
