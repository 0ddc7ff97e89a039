"""``confcal compare``: fit several calibrators on repeated calibration/test splits, one table."""

from __future__ import annotations

import sys

from confcal.cli._shared.common import SPEC_HELP, add_logits_args
from confcal.cli._shared.notes import note

#: calibration rows per split when --cal-size is not given (half the rows when there are not more)
DEFAULT_CAL_SIZE = 5000
#: fewer test rows per split than this get a warning: 15-bin ECEs and NLL differences over the splits
#: are then mostly noise (one row per bin on average at 15 bins is 15 rows; 100 gives ~7 per bin)
MIN_TEST_ROWS = 100


def warn_small_test_set(n_test: int, n_rows: int, cal_size: int, *, fixed: bool, what: str = "rows") -> None:
    """Warn, naming the sizes, when a split leaves fewer than :data:`MIN_TEST_ROWS` test rows."""
    import warnings

    if n_test >= MIN_TEST_ROWS:
        return
    if fixed:
        warnings.warn(f"--test-logits: the fixed test set has {n_test} {what} (fewer than {MIN_TEST_ROWS}): its "
                      "metrics and the comparison are mostly noise", stacklevel=2)
    else:
        warnings.warn(f"--cal-size: {cal_size} of {n_rows} {what} calibrate, leaving {n_test} test {what if n_test != 1 else what[:-1]} per split "
                      f"(fewer than {MIN_TEST_ROWS}): the test metrics and the comparison are mostly noise; lower "
                      f"--cal-size", stacklevel=2)


def register(sub):
    p = sub.add_parser(
        "compare", help="compare calibrators over random calibration/test splits",
        description="For each split, fit every method on the calibration part and score it on the test "
                    "part: error rate, smooth ECE, equal-mass and equal-width ECE (15 bins), bcECE (the "
                    "bias-corrected equal-width ECE), ECE lo95 (its one-sided 95% lower bound), Kuiper rej (1 "
                    "when the Kuiper test rejects perfect calibration at 0.05: its mean is a rejection rate), "
                    "NLL and Brier score, as mean ± standard error over splits (rates as fractions, as evaluate "
                    "and report print them). A method that "
                    "fails is reported in the table; the others still run. With --test-logits/"
                    "--test-labels the whole --logits set calibrates and the test set is fixed.")
    add_logits_args(p, labels=True, side=False)
    p.add_argument("--methods", metavar="NAMES",
                   help="comma-separated method names, e.g. ts,pb,ts+pb (see 'confcal fit --help'); required "
                        "unless --recommend")
    from confcal.cli._shared.recommend import add_recommend_args

    add_recommend_args(p)
    p.add_argument("--splits", type=int, default=10, help="number of random splits (default 10)")
    p.add_argument("--cal-size", type=int, default=None,
                   help=f"calibration samples per split; the rest is the test set (default {DEFAULT_CAL_SIZE}, "
                        f"or half the rows when there are not more than that; a warning when fewer than "
                        f"{MIN_TEST_ROWS} test rows are left)")
    p.add_argument("--seed", type=int, default=0, help="seed of the splits (default 0)")
    p.add_argument("--test-logits", metavar="SPEC", help=f"fixed test set logits: {SPEC_HELP}")
    p.add_argument("--test-labels", metavar="SPEC", help=f"fixed test set labels: {SPEC_HELP}")
    p.add_argument("--features", metavar="SPEC",
                   help=f"features (n_samples, n_features), split with the logits, for methods that take them "
                        f"(fc, cluster/domain methods): {SPEC_HELP}")
    p.add_argument("--domains", metavar="SPEC",
                   help=f"domain ids (n_samples,), split with the logits, for grouped/domain methods: {SPEC_HELP}")
    p.add_argument("--test-features", metavar="SPEC", help=f"features of the fixed test set: {SPEC_HELP}")
    p.add_argument("--test-domains", metavar="SPEC", help=f"domain ids of the fixed test set: {SPEC_HELP}")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run the splits in N worker processes (results identical to --jobs 1; default 1)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print JSON (summary and per-split values; rates as fractions) instead of a table")
    out.add_argument("--csv", metavar="PATH", help="also write the summary as CSV to PATH (atomically)")
    p.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    from confcal.cli._shared.boxfeatures import add_box_features_arg

    add_box_features_arg(p, what="for 1-D box scores: given to det-platt-geo / det-beta-geo / det-hist-geo and "
                                 "used for the geometry D-ECE column")
    from confcal.cli._shared.multilabel import add_multilabel_arg

    add_multilabel_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from confcal.evaluation.compare import compare_methods
    from confcal.io import atomic_write, load_array

    from confcal.io import check_output_path

    if args.csv:  # before any work: a missing folder is said at once, not after the fits
        check_output_path(args.csv, name="--csv")
    if (args.test_logits is None) != (args.test_labels is None):
        raise ValueError("--test-logits, --test-labels: give both for a fixed test set, or neither")
    methods = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    if not methods and args.methods is not None:
        raise ValueError(f"--methods: expected comma-separated method names, got {args.methods!r}")
    if not methods and not args.recommend:
        raise ValueError("--methods: expected comma-separated method names (or --recommend to compare the "
                         "candidates of --method auto)")
    fixed = {}
    if args.test_logits is not None:
        fixed = {"test_logits": load_array(args.test_logits, name="test_logits"),
                 "test_labels": load_array(args.test_labels, name="test_labels")}
    if args.jobs < 1:
        raise ValueError(f"--jobs: expected an integer >= 1, got {args.jobs}")
    from confcal.cli._shared import multilabel as _multilabel

    cal_size_default = args.cal_size is None
    if cal_size_default:
        args.cal_size = DEFAULT_CAL_SIZE
    inputs = _multilabel.multilabel_inputs(args)
    if inputs is not None:  # a sigmoid head: per-label metrics
        if args.recommend:
            raise ValueError("--recommend: for class vectors (n_samples, n_classes); for a multi-label head use "
                             "'confcal fit --method auto', which prints its cross-validation table")
        return _multilabel.run_compare(args, inputs, methods)
    scores = load_array(args.logits, name="logits")
    from confcal.cli._shared.recommend import default_methods, print_recommendation

    methods = default_methods(args, scores, methods)
    if scores.ndim == 1:
        return _run_boxes(args, scores, methods)
    if cal_size_default and not fixed and scores.shape[0] < 2:
        # half of one row is no split: say so, not a --cal-size the user never gave
        raise ValueError(f"--logits: compare splits the rows into calibration and test halves; needs at least 2 "
                         f"rows, got {scores.shape[0]}")
    if cal_size_default and not fixed and args.cal_size >= scores.shape[0]:
        # the default, not the user's number: half the rows (as for box scores); an explicit size >= n is refused
        args.cal_size = scores.shape[0] // 2
        note(f"note: --cal-size default {DEFAULT_CAL_SIZE} >= {scores.shape[0]} rows; calibrating on half "
              f"({args.cal_size})")
    side = {}
    for key in ("features", "domains", "test_features", "test_domains"):
        spec = getattr(args, key)
        if spec is not None:
            side[key] = load_array(spec, name=key)
    if fixed:
        warn_small_test_set(int(fixed["test_labels"].shape[0]), scores.shape[0], args.cal_size, fixed=True)
    elif 0 < args.cal_size < scores.shape[0]:  # other sizes: compare_methods refuses them, naming the range
        warn_small_test_set(scores.shape[0] - args.cal_size, scores.shape[0], args.cal_size, fixed=False)
    result = compare_methods(
        scores, load_array(args.labels, name="labels"), methods,
        n_splits=args.splits, cal_size=args.cal_size, random_state=args.seed, input_kind=args.input_kind or "logits",
        jobs=args.jobs, progress=args.progress, **fixed, **side)
    if args.recommend and not args.csv:
        print_recommendation(args, result)
        return 0
    if args.json:
        print(result.to_json(indent=2))
        return 0
    if args.csv:
        from confcal.io import neutralise_csv

        with atomic_write(args.csv, "w") as fh:
            fh.write(neutralise_csv(result.to_csv()))  # method names are typed by the user
    if args.recommend:
        print_recommendation(args, result)
    else:
        print(result.to_text())
    if args.csv:
        print(f"summary -> {args.csv}")
    return 0


def _run_boxes(args, scores, methods) -> int:
    """1-D box scores: :func:`confcal.evaluation.compare_boxes.compare_box_methods` (D-ECE and geometry D-ECE)."""
    import json
    import sys

    from confcal.cli._shared.boxfeatures import names_of, read_box_features
    from confcal.evaluation.compare_boxes import compare_box_methods, format_box_comparison
    from confcal.io import load_array

    if args.test_logits is not None or args.csv:
        raise ValueError("--test-logits/--csv: not for 1-D box scores (random splits of the boxes only)")
    n = scores.shape[0]
    cal_size = args.cal_size
    if n < 2:
        raise ValueError(f"--logits: compare splits the boxes into calibration and test halves; needs at least 2 "
                         f"boxes, got {n}")
    if cal_size >= n:
        cal_size = n // 2
        note(f"note: --cal-size {args.cal_size} >= {n} boxes; calibrating on half ({cal_size})")
    if cal_size >= 1:
        warn_small_test_set(n - cal_size, n, cal_size, fixed=False, what="boxes")
    features = None
    if args.box_features:
        features = read_box_features(args.logits, names_of(args.box_features))
    result = compare_box_methods(scores, load_array(args.labels, name="labels"), methods, features=features,
                                 feature_names=args.box_features, n_splits=args.splits, cal_size=cal_size,
                                 random_state=args.seed)
    print(json.dumps(result, indent=2) if args.json else format_box_comparison(result))
    return 0
