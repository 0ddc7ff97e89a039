"""``confcal adapt``: correct a fitted calibrator for a new class mix (label shift), from unlabelled logits."""

from __future__ import annotations

import json
from argparse import SUPPRESS

from confcal.cli._shared.common import SPEC_HELP, add_csv_header_arg, format_table, progress_of, source


#: the EM-only options of ``confcal adapt`` and their defaults (the parser leaves them out unless given)
EM_DEFAULTS = {"smoothing": 0.0, "tol": 1e-7, "max_iter": 1000, "source_prior": "calibrated"}


def register(sub):
    p = sub.add_parser(
        "adapt", help="estimate the class prior of unlabelled data (EM / BBSE) and write an adapted manifest",
        description="Label-shift adaptation: estimate the target class prior of unlabelled logits, pooled and per "
                    "--domains id, by EM on the calibrated probabilities (Saerens et al. 2002) or BBSE (Lipton et "
                    "al. 2018), each with a Poisson-bootstrap interval and a chi-squared test of 'no label shift'; "
                    "write a manifest whose probabilities are reweighted by pi_t / pi_s ('confcal apply' uses it). "
                    "The source prior and confusion matrix come from the calibration set (--calibration-logits / "
                    "--calibration-labels, the rows the calibrator was fitted on). The unlabelled rows are read "
                    "in batches, one pass per EM iteration (bounded memory).")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    p.add_argument("--calibration-logits", required=True, metavar="SPEC",
                   help=f"the calibration set's logits (n_samples, n_classes): {SPEC_HELP}")
    p.add_argument("--calibration-labels", required=True, metavar="SPEC",
                   help=f"the calibration set's integer labels (n_samples,): {SPEC_HELP}")
    p.add_argument("--calibration-domains", metavar="SPEC",
                   help="the calibration set's domain ids, for a calibrator that takes --domains (grouped-ts)")
    p.add_argument("--logits", required=True, metavar="SPEC", help=f"unlabelled target logits: {SPEC_HELP}")
    p.add_argument("--domains", metavar="SPEC",
                   help=f"domain/sensor ids of the unlabelled rows (the ids of grouped-ts): one prior each; {SPEC_HELP}")
    p.add_argument("--input-kind", choices=["logits", "probs"], default=None,
                   help="'probs' if the files hold probabilities (default: what the calibrator was fitted on)")
    add_csv_header_arg(p)
    p.add_argument("--method", choices=["em", "bbse"], default="em", help="prior estimator (default em)")
    # EM-only options are absent from the namespace unless given (SUPPRESS): with --method bbse they are
    # refused instead of ignored (defaults: EM_DEFAULTS)
    p.add_argument("--smoothing", type=float, default=SUPPRESS,
                   help="EM: Dirichlet pseudo-count per class (default 0, maximum likelihood)")
    p.add_argument("--tol", type=float, default=SUPPRESS,
                   help="EM stops after the first step with ||pi_new - pi||_1 <= TOL (default 1e-7)")
    p.add_argument("--max-iter", type=int, default=SUPPRESS, help="EM: at most this many iterations (default 1000)")
    p.add_argument("--source-prior", choices=["calibrated", "labels"], default=SUPPRESS,
                   help="EM's source prior: the calibration set's mean calibrated probability (default) or its "
                        "label frequencies (BBSE always uses the label frequencies)")
    p.add_argument("--n-boot", type=int, default=200, help="bootstrap replicates per prior (default 200; 0: none)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap weights (default 0)")
    p.add_argument("-o", "--output", required=True, help="adapted manifest path (.json)")
    p.add_argument("--json", action="store_true", help="print the priors as JSON instead of the table")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def prior_rows(ad, *, alpha: float | None = None) -> list[dict]:
    """One row per estimated prior (pooled first): rows, the L1 shift from the source prior, its
    bootstrap upper end, the chi-squared test of no label shift (flagged at ``alpha`` / number of groups)."""
    import numpy as np

    ps = ad.source_prior_
    groups = len(ad.priors_)
    rows = []
    for key, rec in ad.priors_.items():
        prior = np.asarray(rec["prior"])
        row = {"domain": "(pooled)" if key is None else str(key), "n_rows": rec["n_rows"],
               "shift_l1": float(np.abs(prior - ps).sum()), "p_value": rec["test"]["p_value"],
               "n_iter": rec["n_iter"], "converged": rec["converged"]}
        top = np.argsort(-np.abs(prior - ps))[:3]
        row["largest_changes"] = ", ".join(f"{int(j)}: {ps[j]:.3f}->{prior[j]:.3f}" for j in top)
        if alpha is not None:
            row["label_shift"] = bool(rec["test"]["p_value"] < alpha / groups)
        rows.append(row)
    return rows


def risk_notes(ad, rows, alpha: float = 0.05, moved: float = 0.2) -> list[str]:
    """Summary lines that make the risk of the adapted manifest visible: a calibration set with fewer than
    ``MIN_ROWS_PER_CLASS`` rows in some class, and priors moved although the chi-squared test finds no
    evidence of label shift (p-value >= ``alpha``) by more than ``moved`` in L1: there the move is as likely noise
    as shift. 0.2: above the median L1 move of EM under no shift with 20 rows per class (0.096, 10 classes,
    benchmarks/results/adapt_small_calibration.md); LeNet CIFAR-10 with 5000 calibration rows and an iid target
    moved by 0.12 (NLL 1.300 -> 1.308), with 1 row per class by 0.71 (NLL 1.300 -> 1.542)."""
    from confcal.adaptation.settings import MIN_ROWS_PER_CLASS

    notes = []
    small = int(ad.label_counts_.min())
    if small < MIN_ROWS_PER_CLASS:
        notes.append(f"RISK: the calibration set has {small} labelled row(s) in its smallest class (fewer than "
                     f"{MIN_ROWS_PER_CLASS}): the source prior is too noisy for adaptation; check the adapted "
                     "manifest on labelled target rows before use, or keep the unadapted calibrator")
    for r in rows:
        if r["p_value"] >= alpha and r["shift_l1"] > moved:
            notes.append(f"RISK: {r['domain']}: no evidence of label shift (p-value {r['p_value']:.2f} >= {alpha}) yet "
                         f"the prior moved by L1 {r['shift_l1']:.2f}; the move may be noise: prefer the unadapted "
                         "calibrator unless labelled target rows confirm it")
    return notes


def adapted(args, cal):
    """``PriorAdapted`` over ``cal``, its source statistics from the calibration set of ``args``."""
    from confcal.adaptation import PriorAdapted
    from confcal.io import load_array

    kind = args.input_kind or cal.input_kind
    if kind != cal.input_kind:
        cal.set_params(input_kind=kind)
    x = load_array(args.calibration_logits, name="calibration_logits", csv_header=args.csv_header)
    from confcal.cli._shared.common import check_class_count

    check_class_count(cal, x.shape, option="--calibration-logits", path=args.calibrator)
    y = load_array(args.calibration_labels, name="calibration_labels", csv_header=args.csv_header)
    d = None
    if args.calibration_domains:
        if "domains" not in (*cal.side_inputs, *cal.optional_side_inputs):
            raise ValueError(f"calibration_domains: the calibrator ({cal.method}) takes no domain ids; leave it out")
        d = load_array(args.calibration_domains, name="calibration_domains", csv_header=args.csv_header)
    try:
        return PriorAdapted.from_fitted(cal, x, y, domains=d, estimator=args.method, smoothing=args.smoothing,
                                        tol=args.tol, max_iter=args.max_iter, source_prior=args.source_prior,
                                        n_boot=args.n_boot, confidence=args.confidence, random_state=args.seed)
    except (ValueError, TypeError) as exc:  # the library names its arguments; here: the calibration set's options
        text = str(exc)
        for lib, opt in (("labels: ", "calibration_labels: "), ("logits: ", "calibration_logits: "),
                         ("domains: ", "calibration_domains: ")):
            if text.startswith(lib):
                raise type(exc)(opt + text[len(lib):]) from None
        raise


def run(args) -> int:
    from confcal.io import check_not_an_input, check_output_path, load_calibrator, save_manifest

    check_output_path(args.output, suffixes=(".json",), name="--output")
    given = [k for k in EM_DEFAULTS if hasattr(args, k)]
    if args.method != "em" and given:
        raise ValueError(f"--{given[0].replace('_', '-')}: applies to --method em only, got --method {args.method}"
                         + (" (BBSE's source prior is the label frequencies)" if given[0] == "source_prior" else ""))
    for k, v in EM_DEFAULTS.items():
        if not hasattr(args, k):
            setattr(args, k, v)
    check_not_an_input(args.output, {"--calibrator": args.calibrator, "--logits": args.logits,
                                     "--domains": args.domains, "--calibration-logits": args.calibration_logits,
                                     "--calibration-labels": args.calibration_labels})
    cal = load_calibrator(args.calibrator)
    if getattr(cal, "method", None) == "prior-adapted":
        cal = cal.base_  # adapting an adapted manifest again: start from its base
    ad = adapted(args, cal)
    xs = source(args, "logits")
    from confcal.cli._shared.common import check_class_count

    check_class_count(cal, xs.shape, path=args.calibrator)
    if xs.ndim != 2:  # a two-class calibrator's one-logit scores: adaptation reweights class vectors
        raise ValueError(f"--logits: expected class vectors (n_samples, {ad.n_classes_}), got shape {xs.shape}")
    ad.adapt(xs, domains=source(args, "domains"), progress=progress_of(args))
    save_manifest(ad, args.output)
    rows = prior_rows(ad)
    if args.json:
        print(json.dumps({"source_prior": ad.source_prior_.tolist(), "estimator": args.method,
                          "risks": risk_notes(ad, rows),
                          "priors": [{**r, "prior": ad.priors_[k]["prior"].tolist(),
                                      "low": None if ad.priors_[k]["low"] is None else ad.priors_[k]["low"].tolist(),
                                      "high": None if ad.priors_[k]["high"] is None else ad.priors_[k]["high"].tolist()}
                                     for r, k in zip(rows, ad.priors_)]}, indent=2))
    else:
        print(format_table(rows, ["domain", "n_rows", "shift_l1", "p_value", "n_iter", "converged", "largest_changes"]))
        print(f"wrote adapted manifest ({args.method}, {len(ad.priors_) - 1} domain(s), base {cal.method}) -> "
              f"{args.output}")
        for line in risk_notes(ad, rows):
            print(line)
    return 0


def label_shift_check(cal, args, alpha: float):
    """``drift``'s label-shift rows for an adapted manifest: the prior of the new data re-estimated with the
    manifest's estimator and source statistics, pooled and per domain, with the test of no label shift."""
    from confcal.adaptation import PriorAdapted

    params = {k: v for k, v in cal.get_params(deep=False).items() if k != "base"}
    fresh = PriorAdapted(base=cal.base_.method, **params)
    fresh.base_, fresh.n_classes_ = cal.base_, cal.n_classes_
    fresh.label_counts_, fresh.confusion_, fresh.mean_probs_ = cal.label_counts_, cal.confusion_, cal.mean_probs_
    fresh.priors_, fresh.adaptation_ = {}, None
    fresh.adapt(source(args, "logits"), domains=source(args, "domains"), progress=progress_of(args))
    return prior_rows(fresh, alpha=alpha)
