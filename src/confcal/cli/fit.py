"""``confcal fit``: fit a calibrator and write its JSON manifest."""

from __future__ import annotations

import json

from confcal.calibrators import METHODS
from confcal.cli._common import add_logits_args, load_logits_labels, load_side, metrics_rows, parse_params
from confcal.io import save_manifest


def register(sub):
    p = sub.add_parser("fit", help="fit a calibrator on a calibration set and save it as JSON",
                       description="Fit a calibrator on held-out logits and labels; write a JSON manifest "
                                   "and print calibration-set metrics before/after.")
    add_logits_args(p, labels=True)
    p.add_argument("--method", required=True, choices=sorted(METHODS), metavar="METHOD",
                   help="one of: " + ", ".join(sorted(METHODS)))
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="hyper-parameter of the method (repeatable), e.g. --param t_max=1000")
    p.add_argument("-o", "--output", required=True, help="manifest path (.json)")
    p.add_argument("--json", action="store_true", help="print the fit record as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    cal = METHODS[args.method](**parse_params(args.param))
    x, y = load_logits_labels(args)
    cal.fit(x, y, **load_side(args))
    save_manifest(cal, args.output)
    rec = cal.fit_record_
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
    else:
        print(f"fitted {args.method} on {rec['n_samples']} samples, {cal.n_classes_} classes -> {args.output}")
        params = cal.to_dict()["parameters"]
        if "temperature" in params:
            print(f"temperature T = {params['temperature']:.6g}")
        print("calibration-set metrics (optimistic: measured on the data the map was fitted on):")
        print(metrics_rows({"before": rec["metrics_before"], "after": rec["metrics_after"]}))
    return 0
