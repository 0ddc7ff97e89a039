"""``confcal fit --method auto``: choose a calibrator by cross-validation (guarded by TS) and write
the chosen method's manifest, with the table in ``fit.selection`` (:mod:`confcal.evaluation.selection`)."""

from __future__ import annotations

import json

#: --param keys of --method auto (the search's settings, not a method's hyper-parameters)
AUTO_PARAMS = ("n_folds", "max_rows", "n_boot", "level", "random_state")


def add_auto_args(p) -> None:
    p.add_argument("--allow-accuracy-change", action="store_true",
                   help="--method auto: also try maps that can move the arg-max (vs, dirichlet, "
                        "platt-multilabel); without it no chosen method changes a held-out prediction")


def _params(items) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in AUTO_PARAMS:
            raise ValueError(f"--param: --method auto takes {', '.join(f'{k}=VALUE' for k in AUTO_PARAMS)}, "
                             f"got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--param: {key}: expected a number, got {value!r}") from None
    from confcal.cli._shared.caps import check_auto_params

    check_auto_params(out)
    return out


def run_auto(args) -> int:
    from confcal.cli._shared.common import load_repeated
    from confcal.cli._shared.provenance import provenance
    from confcal.evaluation.selection import select_calibrator
    from confcal.evaluation.selection_tables import render_selection
    from confcal.io import check_not_an_input, check_output_path, save_manifest
    from confcal.metrics.drift import data_summary

    if getattr(args, "engine", "local") == "dask":
        raise ValueError("--engine: --method auto cross-validates in one process (its search runs on a sample "
                         "of at most max_rows rows); drop --engine dask")
    for opt, attr in (("--features", "features"), ("--per-class", "per_class"), ("--category-ids", "category_ids"),
                      ("--box-features", "box_features"), ("--sample-rows", "sample_rows"),
                      ("--scheduler", "scheduler"), ("--workers", "workers"), ("--seed", "seed")):
        if getattr(args, attr, None):
            raise ValueError(f"{opt}: not used by --method auto (its candidates: see 'Choosing a method' in "
                             "the guide); fit a method by name to use it")
    params = _params(args.param)
    check_output_path(args.output, suffixes=(".json",), name="--output")
    check_not_an_input(args.output, {"--logits": args.logits, "--labels": args.labels, "--domains": args.domains})
    counts = {k: len(getattr(args, k)) for k in ("logits", "labels", "domains") if getattr(args, k, None)}
    if len(set(counts.values())) > 1:
        raise ValueError("--logits/--labels: give every repeated input the same number of times (one file per "
                         f"part), got {counts}")
    x = load_repeated(args, "logits")
    y = load_repeated(args, "labels")
    domains = load_repeated(args, "domains")
    cal = select_calibrator(x, y, domains=domains, input_kind=args.input_kind,
                            allow_accuracy_change=bool(args.allow_accuracy_change), **params)
    cal.fit_record_["provenance"] = provenance(args)
    cal.fit_record_["data_summary"] = data_summary(
        x, input_kind="probs" if args.input_kind == "probs" and x.ndim == 2 else "logits", domains=domains,
        clip_scores=bool(getattr(cal, "clips_scores", False)))  # det-ts chosen with clip_scores: clipped, as it reads
    save_manifest(cal, args.output)
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
        return 0
    rec = cal.fit_record_
    print(render_selection(rec["selection"]))
    n = rec['n_samples']
    print(f"fitted {cal.method} on {n} sample{'' if n == 1 else 's'}, {cal.n_classes_} classes -> {args.output}")
    if domains is not None and "domains" not in (*cal.side_inputs, *cal.optional_side_inputs):
        print(f"note: {cal.method} does not use domain ids: apply it without --domains")
    return 0
