"""``confcal fit``: fit a calibrator and write its JSON manifest."""

from __future__ import annotations

import json

from confcal.calibrators import METHODS
from confcal.cli._common import (
    SPEC_HELP,
    add_logits_args,
    load_side,
    metrics_rows,
    parse_params,
    progress_of,
    side_sources,
    source,
)
from confcal.calibrators.base import make_calibrator
from confcal.cli._dask import add_engine_args, run_fit, wants_dask
from confcal.io import check_not_an_input, check_output_path, load_array, save_manifest


def register(sub):
    p = sub.add_parser("fit", help="fit a calibrator on a calibration set and save it as JSON",
                       description="Fit a calibrator on held-out logits and labels; write a JSON manifest "
                                   "and print calibration-set metrics before/after.")
    add_logits_args(p, labels=True)
    p.add_argument("--method", required=True, choices=sorted(METHODS), metavar="METHOD",
                   help="one of: " + ", ".join(sorted(METHODS)))
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="hyper-parameter of the method (repeatable), e.g. --param t_max=1000")
    p.add_argument("--category-ids", metavar="SPEC",
                   help=f"det-ts/det-platt: category id per box (n_boxes,): {SPEC_HELP}")
    p.add_argument("--per-class", action="store_true",
                   help="det-ts/det-platt: one map per category (needs --category-ids)")
    p.add_argument("-o", "--output", required=True, help="manifest path (.json)")
    p.add_argument("--json", action="store_true", help="print the fit record as JSON")
    add_engine_args(p, fit=True)
    p.set_defaults(func=run)


def run(args) -> int:
    params = parse_params(args.param)
    if args.per_class:
        params["per_class"] = True
    if args.input_kind is not None:
        params["input_kind"] = args.input_kind  # a hyper-parameter: the manifest records it for apply
    check_output_path(args.output, suffixes=(".json",), name="--output")
    check_not_an_input(args.output, {"--logits": args.logits, "--labels": args.labels, "--domains": args.domains,
                                     "--features": args.features, "--category-ids": args.category_ids})
    cal = make_calibrator(args.method, params)
    if wants_dask(args):
        cal = run_fit(args, params)
    elif getattr(cal, "takes_box_scores", False):
        side = load_side(args)
        # detection calibrators take 1-D box scores (e.g. matched.npz:score) and validate them themselves
        x, y = load_array(args.logits, name="scores"), load_array(args.labels, name="labels")
        if args.category_ids:
            side["category_ids"] = load_array(args.category_ids, name="category_ids")
        cal.fit(x, y, **side)
    else:
        if args.per_class or args.category_ids:
            raise ValueError(f"--per-class/--category-ids: only for det-ts and det-platt, not {args.method}")
        # sources: fits that are sums over rows (TS) stream them in batches, the others load
        # them whole; fit validates them (input_kind is a hyper-parameter, recorded in the manifest)
        cal.fit(source(args, "logits"), source(args, "labels"), progress=progress_of(args), **side_sources(args))
    save_manifest(cal, args.output)
    rec = cal.fit_record_
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
    else:
        print(f"fitted {args.method} on {rec['n_samples']} samples, {cal.n_classes_} classes -> {args.output}")
        params = cal.to_dict()["parameters"]
        if isinstance(params.get("temperature"), float):
            print(f"temperature T = {params['temperature']:.6g}" + (" (pooled)" if "temperatures" in params else ""))
        for key, value in params.get("temperatures", []) if isinstance(params.get("temperatures"), list) else []:
            print(f"  domain {key!r}: T = {value:.6g}")
        print("calibration-set metrics (optimistic: measured on the data the map was fitted on):")
        print(metrics_rows({"before": rec["metrics_before"], "after": rec["metrics_after"]}))
    return 0
