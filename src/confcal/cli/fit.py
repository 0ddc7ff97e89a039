"""``confcal fit``: fit a calibrator and write its JSON manifest."""

from __future__ import annotations

import json
import warnings

from confcal.catalog import method_names
from confcal.cli._shared.common import (
    SPEC_HELP,
    add_logits_args,
    metrics_rows,
    parse_params,
    progress_of,
    side_sources,
    source,
    spread_rows,
)
from confcal.cli._shared.boxfeatures import add_box_features_arg, read_box_features
from confcal.cli._shared.dask import add_engine_args, run_fit, wants_dask


def register(sub):
    p = sub.add_parser("fit", help="fit a calibrator on a calibration set and save it as JSON",
                       description="Fit a calibrator on held-out logits and labels; write a JSON manifest "
                                   "and print calibration-set metrics before/after.")
    add_logits_args(p, labels=True, repeatable=True)
    # names from the light catalogue: listing them imports no calibrator
    p.add_argument("--method", required=True, choices=["auto", *method_names()], metavar="METHOD",
                   help="'auto' (cross-validated choice, guarded by ts: see 'Choosing a method') or one of: "
                        + ", ".join(method_names()))
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="hyper-parameter of the method (repeatable), e.g. --param t_max=1000")
    p.add_argument("--category-ids", metavar="SPEC", action="append",
                   help=f"det-ts/det-platt/det-beta and the geometry maps: category id per box (n_boxes,): {SPEC_HELP}")
    p.add_argument("--per-class", action="store_true",
                   help="det-ts/det-platt/det-beta and the geometry maps: one map per category (needs --category-ids)")
    p.add_argument("-o", "--output", required=True, help="manifest path (.json)")
    p.add_argument("--json", action="store_true",
                   help="print the manifest written to -o (method, parameters and fit record) as JSON "
                        "instead of the summary")
    p.add_argument("--dataset-version", metavar="VERSION",
                   help="version/tag of the calibration dataset (non-empty), stored in the manifest's "
                        "fit.provenance")
    add_box_features_arg(p, what="for det-platt-geo / det-beta-geo / det-hist-geo (recorded in the manifest)")
    add_engine_args(p, fit=True)
    from confcal.cli._shared.auto_fit import add_auto_args

    add_auto_args(p)
    p.set_defaults(func=run)


def _check_per_class(method: str) -> None:
    """``--per-class`` names itself (not ``--param per_class``) when the method fits no map per category."""
    from confcal.calibrators.protocol.registry import METHODS

    def takes(name):
        try:
            return "per_class" in METHODS[name]().get_params()
        except (TypeError, ValueError):  # a method that needs arguments to be made: not one of these
            return False

    if method in METHODS and not takes(method):
        takers = sorted(m for m in METHODS if takes(m))
        raise ValueError(f"--per-class: only for the methods with one map per category ({', '.join(takers)}), "
                         f"got --method {method}")


def run(args) -> int:
    from confcal.calibrators.protocol.registry import make_calibrator
    from confcal.cli._shared.provenance import provenance
    from confcal.io import check_not_an_input, check_output_path, save_manifest
    from confcal.metrics.drift import data_summary

    if args.dataset_version is not None and not args.dataset_version.strip():
        # as every other string option (--domain-name, --box-features, --methods): an empty value is refused,
        # not dropped from the fit record while the command line records it
        raise ValueError(f"--dataset-version: expected a non-empty version or tag such as v1.2 or 2024-06-01, "
                         f"got {args.dataset_version!r}")
    if args.method == "auto":
        from confcal.cli._shared.auto_fit import run_auto

        return run_auto(args)
    if args.allow_accuracy_change:
        raise ValueError("--allow-accuracy-change: only with --method auto")
    params = parse_params(args.param, args.method)
    if args.per_class:
        _check_per_class(args.method)
        params["per_class"] = True
    if args.input_kind is not None:
        params["input_kind"] = args.input_kind  # a hyper-parameter: the manifest records it for apply
    check_output_path(args.output, suffixes=(".json",), name="--output")
    check_not_an_input(args.output, {"--logits": args.logits, "--labels": args.labels, "--domains": args.domains,
                                     "--features": args.features, "--category-ids": args.category_ids})
    from confcal.calibrators.protocol.registry import METHODS

    geo = getattr(METHODS[args.method], "takes_box_features", False) if args.method in METHODS else False
    if getattr(args, "box_features", None):
        if not geo:
            raise ValueError(f"--box-features: only for the geometry-dependent box methods (det-platt-geo, "
                             f"det-beta-geo, det-hist-geo), not {args.method}")
        params["box_features"] = args.box_features
    elif geo and not args.features:
        raise ValueError(f"--box-features: {args.method} calibrates box scores on box geometry; name the features "
                         "of the --logits file, e.g. --box-features cx,cy,w,h or --box-features range")
    cal = make_calibrator(args.method, params)
    cal._check_hyperparameters()  # before any data is read (the error path names --param: cli._errors)
    counts = {k: len(getattr(args, k)) for k in ("logits", "labels", "domains", "features", "category_ids")
              if getattr(args, k, None)}
    if len(set(counts.values())) > 1:
        raise ValueError("--logits/--labels: give every repeated input the same number of times (one file per "
                         f"part), got {counts}")
    if wants_dask(args):
        cal = run_fit(args, params)
        # the Dask fit records its own drift summary (of all rows for full-data fits, else of the sample)
        x = side = None
    elif getattr(cal, "takes_box_scores", False):
        # detection calibrators take 1-D box scores (e.g. matched.npz:score) and validate them themselves;
        # det-ts/det-platt stream them in row batches, det-beta (and class vectors) load them whole
        xs, side = source(args, "logits", "scores"), side_sources(args)
        if getattr(args, "box_features", None):
            from confcal.sources import open_source

            side["features"] = open_source(read_box_features(args.logits, args.box_features.split(",")),
                                           name="features")
        if args.category_ids:
            side["category_ids"] = source(args, "category_ids")
        cal.fit(xs, source(args, "labels"), progress=progress_of(args), **side)
        x, side = spread_rows(xs), {k: spread_rows(v) for k, v in side.items()}
    else:
        if args.per_class or args.category_ids:
            raise ValueError(f"--per-class/--category-ids: only for the box-score methods (det-*), not {args.method}")
        # sources: fits that are sums over rows (TS) stream them in batches, the others load
        # them whole; fit validates them (input_kind is a hyper-parameter, recorded in the manifest)
        xs, side = source(args, "logits"), side_sources(args)
        cal.fit(xs, source(args, "labels"), progress=progress_of(args), **side)
        x, side = spread_rows(xs), {k: spread_rows(v) for k, v in side.items()}
    cal.fit_record_["provenance"] = provenance(args)
    if x is not None:
        cal.fit_record_["data_summary"] = data_summary(
            x, input_kind="probs" if args.input_kind == "probs" and x.ndim == 2 else "logits",
            domains=side.get("domains"), features=side.get("features"),
            clip_scores=bool(getattr(cal, "clips_scores", False)))  # the scores as the map reads them
    save_manifest(cal, args.output)
    rec = cal.fit_record_
    before, after = rec.get("metrics_before", {}), rec.get("metrics_after", {})
    if "d_ece" in after and after["d_ece"] > before.get("d_ece", float("inf")):
        warnings.warn(f"{args.method} raised the calibration-set D-ECE from {before['d_ece']:.4f} to "
                      f"{after['d_ece']:.4f} (it minimises NLL, and its map family cannot follow these scores); "
                      "compare det-ts/det-platt on held-out data before using it", UserWarning, stacklevel=2)
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
    else:
        n = rec['n_samples']
        print(f"fitted {args.method} on {n} sample{'' if n == 1 else 's'}, {cal.n_classes_} classes -> {args.output}")
        params = cal.to_dict()["parameters"]
        if isinstance(params.get("temperature"), float):
            print(f"temperature T = {params['temperature']:.6g}" + (" (pooled)" if "temperatures" in params else ""))
        for key, value in params.get("temperatures", []) if isinstance(params.get("temperatures"), list) else []:
            print(f"  domain {key!r}: T = {value:.6g}")
        print("calibration-set metrics (optimistic: measured on the data the map was fitted on):")
        print(metrics_rows({"before": rec["metrics_before"], "after": rec["metrics_after"]}))
    return 0
