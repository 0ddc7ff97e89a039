"""``confcal drift``: has the data moved away from the calibration data a manifest was fitted on?"""

from __future__ import annotations

import json
import sys
import warnings

from confcal.cli._shared.choices import DEFAULT_ALPHA
from confcal.cli._shared.common import format_table
from confcal.cli._shared.drift_check import NEEDS, check

#: exit status of ``drift --fail-on-drift`` when drift is flagged
EXIT_DRIFT = 3


def register(sub):
    p = sub.add_parser(
        "drift", help="check new logits/box scores against the calibration data summary in a manifest",
        description="Two-sample Kolmogorov-Smirnov test of the uncalibrated top-label confidence (the raw score "
                    "for 1-D box scores) of new data against the quantiles stored in the manifest "
                    "(fit.data_summary), pooled and per domain. Drift when D > sqrt(-ln(a/2)/2) * "
                    "sqrt((n+m)/(n m)) with a = --alpha / (number of groups tested); the false-alarm rate on "
                    "same-distribution data is at most --alpha (see benchmarks/results/drift.md).")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    p.add_argument("--logits", required=True, metavar="SPEC",
                   help="new logits (n_samples, n_classes) or box scores (n_boxes,): PATH or PATH:KEY")
    p.add_argument("--input-kind", choices=["logits", "probs"],
                   help="'probs' if the file holds probabilities (default: what the calibrator was fitted on)")
    p.add_argument("--domains", metavar="SPEC", help="domain/sensor ids of the new data (n_samples,)")
    from confcal.cli._shared.common import add_csv_header_arg

    add_csv_header_arg(p)
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"family-wise false-alarm level (default {DEFAULT_ALPHA:g})")
    p.add_argument("--fail-on-drift", action="store_true", help=f"exit {EXIT_DRIFT} when drift is flagged")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (as in the other commands; an adapted manifest's prior re-estimation)")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from confcal._validation import check_logits
    from confcal._validation import plain  # (here: building the parser must not import numpy)
    from confcal.io import load_array, load_calibrator

    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"--alpha: expected a value in (0, 1), got {plain(args.alpha)}")
    with warnings.catch_warnings(record=True) as said:  # a damaged record's warning, unless it ends here
        warnings.simplefilter("always")
        cal = load_calibrator(args.calibrator)
    damage = getattr(cal, "fit_record_damage_", None) or {}
    for field in NEEDS:  # a damaged field drift reads: one line naming it and the file
        if field in damage:
            raise ValueError(f"{damage[field]}; drift reads fit.{field}: refit to get a drift summary")
    for w in said:
        warnings.warn(w.message, stacklevel=2)
    domains = load_array(args.domains, name="domains") if args.domains else None
    kind = args.input_kind or ("probs" if getattr(cal, "input_kind", "logits") == "probs" else "logits")
    x = load_array(args.logits, name="logits")
    from confcal.cli._shared.common import check_class_count

    check_class_count(cal, x.shape, path=args.calibrator)  # the one message of every command
    if x.ndim == 2:  # the usual checks: NaN/inf rows, probabilities passed as logits
        x, kind = check_logits(x, input_kind=kind), "logits"
    elif not np.all(np.isfinite(np.asarray(x, dtype=np.float64))):
        bad = int(np.flatnonzero(~np.isfinite(np.asarray(x, dtype=np.float64)))[0])
        raise ValueError(f"logits: score {bad} is not finite ({plain(x[bad])})")
    try:
        rows = check(cal.fit_record_, x, input_kind=kind, domains=domains, alpha=args.alpha)
    except ValueError:
        raise
    except Exception as exc:  # a damaged record: one line naming the field and file, no traceback
        raise ValueError(f"calibrator: fit.data_summary of {args.calibrator} is damaged ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); refit to get a drift summary") from None
    shift = None
    if getattr(cal, "method", None) == "prior-adapted":  # an adapted manifest: the class prior, re-estimated
        from confcal.cli.adapt import label_shift_check

        shift = label_shift_check(cal, args, args.alpha)
    if args.json:
        print(json.dumps({"alpha": args.alpha, "tests": rows, **({"label_shift": shift} if shift else {})}, indent=2))
    else:
        print(format_table(rows, ["domain", "n_ref", "n_new", "statistic", "threshold", "drift", "unseen",
                                  *(["class_tv"] if "class_tv" in rows[0] else [])]))
        if shift:
            print("label shift (class prior of the new data; chi-squared test of predicted-class counts, Lipton et "
                  "al. 2018):")
            print(format_table(shift, ["domain", "n_rows", "shift_l1", "p_value", "label_shift", "largest_changes"]))
    drifted = [r["domain"] for r in rows if r["drift"]]
    drifted += [f"{r['domain']} (label shift)" for r in shift or () if r["label_shift"]]
    if drifted:
        # with --json stdout is the JSON document alone (the flags are in tests[].drift); the line is for a person
        print(f"drift flagged in: {', '.join(drifted)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_DRIFT if drifted and args.fail_on_drift else 0
