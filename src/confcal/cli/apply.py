"""``confcal apply``: calibrated probabilities from a saved calibrator, written batch by batch."""

from __future__ import annotations

import warnings

from confcal.cli._shared.common import add_logits_args, load_side, progress_of, side_sources, source, spread_rows
from confcal.cli._shared.dask import add_engine_args, run_apply, wants_dask


def register(sub):
    p = sub.add_parser("apply", help="write calibrated probabilities for new logits",
                       description="Apply a saved calibrator to logits; write (n_samples, n_classes) "
                                   "probabilities atomically, batch by batch (bounded memory).")
    p.add_argument("--calibrator", required=True, help="manifest written by 'confcal fit'")
    add_logits_args(p, labels=False)
    p.set_defaults(input_kind=None)  # default: what the calibrator was fitted on (its manifest)
    p.add_argument("-o", "--output", required=True,
                   help="output .npy, .npz (key 'probs'), .csv or .parquet (column 'probs'); with --engine dask "
                        "a Parquet dataset folder")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="dtype of the written probabilities (default float64; float32 halves the output)")
    p.add_argument("--keep-columns", metavar="COLS",
                   help="comma-separated columns (or keys) of the --logits file copied into a .parquet/.csv "
                        "output before the probabilities, e.g. image_id,box_id")
    from confcal.cli._shared.boxfeatures import add_category_ids_arg

    add_category_ids_arg(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if wants_dask(args):
        return run_apply(args)
    import numpy as np

    from confcal.cli._shared.drift_check import warn_if_drift
    from confcal.passes import spread_ranges, take_ranges
    from confcal.io import (
        OUTPUT_SUFFIXES,
        check_not_an_input,
        check_output_path,
        load_array,
        load_calibrator,
        open_array_writer,
        save_array,
        split_spec,
    )
    from confcal.sources import open_source

    check_output_path(args.output, suffixes=OUTPUT_SUFFIXES, name="--output")
    check_not_an_input(args.output, {"--logits": args.logits, "--calibrator": args.calibrator,
                                     "--domains": args.domains, "--features": args.features,
                                     "--category-ids": getattr(args, "category_ids", None)})
    cal = load_calibrator(args.calibrator)
    if args.input_kind is None:
        args.input_kind = cal.input_kind
    dtype = np.dtype(args.dtype)
    if getattr(cal, "takes_box_scores", False):
        # det-ts / det-platt: 1-D box scores in, (n_boxes, 2) [false, true positive] out
        cal.set_params(input_kind=args.input_kind)
        scores, side = load_array(args.logits, name="scores", csv_header=args.csv_header), load_side(args)
        if getattr(args, "category_ids", None):
            side["category_ids"] = load_array(args.category_ids, name="category_ids", csv_header=args.csv_header)
        if getattr(cal, "takes_box_features", False) and "features" not in side:
            from confcal.cli._shared.boxfeatures import read_box_features

            side["features"] = read_box_features(args.logits, cal.feature_names_, option="--logits", fitted=True)
        probs = cal.predict_proba(scores, **side)
        # the rows of every drift check (confcal.passes.spread_ranges), as the Dask engine reads them
        rows = spread_ranges(len(scores))
        warn_if_drift(cal, take_ranges(scores, rows),
                      domains=take_ranges(side["domains"], rows) if "domains" in side else None)
        save_array(args.output, probs.astype(dtype))
        print(f"wrote {probs.shape[0]} x {probs.shape[1]} calibrated probabilities ({cal.method}) -> {args.output}")
        return 0
    xs = source(args, "logits")
    from confcal.cli._shared.boxfeatures import refuse_category_ids

    refuse_category_ids(args, f"class vectors {xs.shape}")
    from confcal.cli._shared.common import check_class_count

    check_class_count(cal, xs.shape, path=args.calibrator)
    keep = {}
    if args.keep_columns:
        path = split_spec(args.logits)[0]
        for col in args.keep_columns.split(","):
            keep[col] = open_source(f"{path}:{col}", name="--keep-columns", csv_header=args.csv_header)
            if keep[col].ndim != 1 or keep[col].n_rows != xs.n_rows:
                raise ValueError(f"--keep-columns: {col!r} of {path} has shape {keep[col].shape}, expected "
                                 f"({xs.n_rows},)")
    from confcal.calibrators.protocol.stream import iter_predict

    side = side_sources(args)
    # the drift warning is said after the output is written: bad input (e.g. probabilities passed
    # as logits, found after the last batch) gets its one-line error, not a drift warning first
    with warnings.catch_warnings(record=True) as drift:
        warnings.simplefilter("always")
        warn_if_drift(cal, spread_rows(xs), input_kind=args.input_kind,
                      domains=spread_rows(side["domains"]) if "domains" in side else None)
    with open_array_writer(args.output, xs.n_rows, cal.n_classes_, dtype=dtype, keep=keep) as out:
        for _, probs in iter_predict(cal, xs, input_kind=args.input_kind, side=side,
                                     progress=progress_of(args), desc="apply"):
            out.write(probs)
    for w in drift:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    print(f"wrote {xs.n_rows} x {cal.n_classes_} calibrated probabilities ({cal.method}, {dtype.name}) "
          f"-> {args.output}")
    return 0
