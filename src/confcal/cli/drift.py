"""``confcal drift``: has the data moved away from the calibration data a manifest was fitted on?"""

from __future__ import annotations

import json
import sys
import warnings

from confcal.cli._shared.choices import DEFAULT_ALPHA
from confcal.cli._shared.common import format_table

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
    p.set_defaults(func=run)


#: the fit-record fields a drift check reads (the summary; the input kind says what its quantiles hold)
NEEDS = ("data_summary", "input_kind")


def check(manifest_fit: dict | None, logits, *, input_kind: str, domains=None, alpha: float = DEFAULT_ALPHA):
    from confcal.metrics.drift import drift_check

    summary = (manifest_fit or {}).get("data_summary")
    if summary is None:
        raise ValueError("--calibrator: the manifest holds no fit.data_summary, which `confcal fit` records (a "
                         "manifest written by Calibrator.to_dict() or an older confcal has none): fit it with "
                         "`confcal fit` to check drift")
    return drift_check(summary, logits, input_kind=input_kind, domains=domains, alpha=alpha)


def warn_if_drift(cal, logits, *, input_kind: str = "logits", domains=None) -> None:
    """``apply``'s check: one warning naming the drifting groups (silent without a data summary)."""
    fit = getattr(cal, "fit_record_", None) or {}
    if "data_summary" not in fit or set(NEEDS) & set(getattr(cal, "fit_record_damage_", None) or {}):
        return  # no summary, or a damaged one: the load warning said so (and that the check is skipped)
    from confcal.calibrators.protocol.constraints import check_data_summary

    def said(exc):
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    try:
        check_data_summary(fit["data_summary"], input_kind=fit.get("input_kind"),
                           n_classes=getattr(cal, "n_classes_", None))
    except Exception as exc:  # a damaged fit record never blocks apply: the check is skipped, said once
        warnings.warn(f"drift check skipped: the manifest's fit.data_summary cannot be used ({said(exc)})",
                      UserWarning, stacklevel=2)
        return
    # the summary is sound from here: what goes wrong is of the new data, and is said of --logits (P3-1)
    if len(logits) == 0:
        warnings.warn("drift check skipped: --logits holds no rows (nothing to compare with the calibration "
                      "data)", UserWarning, stacklevel=2)
        return
    try:
        rows = check(fit, logits, input_kind=input_kind, domains=domains)
    except Exception as exc:  # the output is written all the same: the check only warns
        warnings.warn(f"drift check skipped: --logits cannot be compared with the manifest's fit.data_summary "
                      f"({said(exc)})", UserWarning, stacklevel=2)
        return
    bad = [r for r in rows if r["drift"]]
    if bad:
        warnings.warn("the data differs from the calibration data (KS test of the top-label confidence): "
                      + ", ".join(f"{r['domain']} D={r['statistic']:.3f} > {r['threshold']:.3f}" for r in bad)
                      + "; check with 'confcal drift' and consider refitting", UserWarning, stacklevel=2)


def run(args) -> int:
    import numpy as np

    from confcal._validation import check_logits
    from confcal.io import load_array, load_calibrator

    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"--alpha: expected a value in (0, 1), got {args.alpha!r}")
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
    if x.ndim == 2:  # the usual checks: NaN/inf rows, probabilities passed as logits
        x, kind = check_logits(x, input_kind=kind), "logits"
    elif not np.all(np.isfinite(np.asarray(x, dtype=np.float64))):
        bad = int(np.flatnonzero(~np.isfinite(np.asarray(x, dtype=np.float64)))[0])
        raise ValueError(f"logits: score {bad} is not finite ({x[bad]!r})")
    try:
        rows = check(cal.fit_record_, x, input_kind=kind, domains=domains, alpha=args.alpha)
    except ValueError:
        raise
    except Exception as exc:  # a damaged record: one line naming the field and file, no traceback
        raise ValueError(f"calibrator: fit.data_summary of {args.calibrator} is damaged ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); refit to get a drift summary") from None
    if args.json:
        print(json.dumps({"alpha": args.alpha, "tests": rows}, indent=2))
    else:
        print(format_table(rows, ["domain", "n_ref", "n_new", "statistic", "threshold", "drift", "unseen",
                                  *(["class_tv"] if "class_tv" in rows[0] else [])]))
    drifted = [r["domain"] for r in rows if r["drift"]]
    if drifted:
        # with --json stdout is the JSON document alone (the flags are in tests[].drift); the line is for a person
        print(f"drift flagged in: {', '.join(drifted)}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_DRIFT if drifted and args.fail_on_drift else 0
