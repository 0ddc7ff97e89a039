"""``--engine dask`` for ``fit``, ``apply`` and ``evaluate``: the same jobs on a Dask cluster.

Every column comes from one Parquet dataset (a file, a folder or a glob; any fsspec URL),
named as ``DATASET:COLUMNS`` (``data/:logits``, ``s3://bucket/run/*.parquet:logit_*``).
"""

from __future__ import annotations

import sys


DEFAULT_SAMPLE_ROWS = 200_000


def add_engine_args(p, *, fit: bool = False) -> None:
    g = p.add_argument_group("distributed engine (needs the dask extra)")
    g.add_argument("--engine", choices=["local", "dask"], default="local",
                   help="'dask': run on a Dask cluster; every input is DATASET:COLUMNS of one Parquet dataset "
                        "(file, folder, glob or fsspec URL)")
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="an existing Dask scheduler")
    g.add_argument("--workers", type=int, metavar="N",
                   help="start a local cluster of N worker processes (default 2) when no --scheduler is given")
    if fit:
        g.add_argument("--sample-rows", type=int, default=None, metavar="N",
                       help="methods that are not full-data sums are fitted on a seeded uniform sample of N rows "
                            f"(default {DEFAULT_SAMPLE_ROWS}; only with --engine dask)")
        g.add_argument("--seed", type=int, default=None, help="seed of that sample (default 0; only with --engine dask)")


def wants_dask(args) -> bool:
    """True for ``--engine dask``; refuses the cluster options without it."""
    if getattr(args, "engine", "local") == "dask":
        return True
    for opt in ("scheduler", "workers", "sample_rows", "seed"):
        if getattr(args, opt, None) is not None:
            raise ValueError(f"--{opt.replace('_', '-')}: only with --engine dask")
    return False


def _split(spec: str, option: str) -> tuple[str, str]:
    head, sep, key = spec.rpartition(":")
    if not sep or not head or not key or key.startswith("//"):
        raise ValueError(f"{option}: with --engine dask give DATASET:COLUMNS (e.g. data.parquet:logits), got {spec!r}")
    return head, key


def _dataset(args, options: list[str]):
    """The one dataset path of the given options and their column specs."""
    cols, paths = {}, {}
    for opt in options:
        spec = getattr(args, opt.lstrip("-").replace("-", "_"), None)
        if isinstance(spec, list):  # a repeatable option of the single-process fit
            if len(spec) > 1:
                raise ValueError(f"{opt}: --engine dask reads one dataset (a folder or glob holds many files), "
                                 f"got {len(spec)} specs")
            spec = spec[0]
        if spec:
            paths[opt], cols[opt] = _split(spec, opt)
    if len(set(paths.values())) > 1:
        raise ValueError(f"{', '.join(paths)}: with --engine dask every column comes from one dataset, "
                         f"got {sorted(set(paths.values()))}")
    return next(iter(paths.values())), cols


def _check_not_inside(output: str, dataset: str) -> None:
    """Refuse an output dataset that is the input dataset or lies inside it (it replaces the folder)."""
    import os

    out, src = os.path.realpath(output), os.path.realpath(dataset.split("*")[0].rstrip("/") or ".")
    if out == src or out.startswith(src + os.sep) or src.startswith(out + os.sep):
        raise ValueError(f"--output: {output!r} is the input dataset {dataset!r} or inside it; writing it would "
                         "destroy the input, so choose another output folder")


def _client(args):
    from confcal.dask._cluster import cluster_client

    return cluster_client(args.scheduler, workers=args.workers)


def _open(path):
    from confcal.dask import read_parquet

    try:
        return read_parquet(path)
    except (FileNotFoundError, OSError) as exc:
        raise FileNotFoundError(f"--logits: cannot read the Parquet dataset {path!r} ({exc})") from None


def _calibrator(args):
    """The manifest's calibrator, with ``--input-kind`` (when given) overriding the recorded one."""
    from confcal.io import load_calibrator

    if not args.calibrator:
        return None
    cal = load_calibrator(args.calibrator)
    if getattr(args, "input_kind", None) is not None and args.input_kind != cal.input_kind:
        cal.set_params(input_kind=args.input_kind)
    return cal


def _check_class_count(cal, frame, spec: str, path: str) -> None:
    """The single-process refusal of a calibrator fitted on another class count, before any pass: the
    width of a column group is known from the schema (a list column's only from its rows: the engine's
    own check, after its first block, covers it)."""
    from confcal.cli._shared.common import check_class_count
    from confcal.dask import resolve_columns

    if cal is None:
        return
    cols = resolve_columns(frame, spec, name="logits")
    if not cols.list_column:
        check_class_count(cal, (None, len(cols.columns)) if cols.group else (None,), path=path)


def run_apply(args) -> int:
    from confcal.dask import apply
    from confcal.dask._cluster import write_parquet

    path, cols = _dataset(args, ["--logits", "--domains", "--features", "--category-ids"])
    _check_not_inside(args.output, path)
    keep = [c for c in (getattr(args, "keep_columns", None) or "").split(",") if c]
    dtype = getattr(args, "dtype", None) or "float64"
    with _client(args):
        frame = _open(path)
        cal = _calibrator(args)
        _check_class_count(cal, frame, cols["--logits"], args.calibrator)
        lazy = apply(cal, frame, logits=cols["--logits"], domains=cols.get("--domains"),
                     features=cols.get("--features"), keep_columns=keep, dtype=dtype,
                     category_ids=cols.get("--category-ids"))
        write_parquet(lazy, args.output)
        n = frame.npartitions
        _warn_if_drift(cal, frame, cols)
    print(f"wrote calibrated probabilities ({dtype}) of {n} partitions -> {args.output}")
    return 0


def _warn_if_drift(cal, frame, cols) -> None:
    """``apply``'s drift check on the rows the single-process apply checks (the same global rows,
    :func:`confcal.passes.spread_ranges`), said after the output is written, as there."""
    from confcal.cli._shared.drift_check import warn_if_drift
    from confcal.dask import spread_rows

    if "data_summary" not in (getattr(cal, "fit_record_", None) or {}):
        return  # nothing to check against: no pass over the data
    rows = spread_rows(frame, logits=cols["--logits"], domains=cols.get("--domains"))
    # box scores: their raw scores, as the single-process apply checks them
    kind = "logits" if getattr(cal, "takes_box_scores", False) else cal.input_kind
    warn_if_drift(cal, rows["logits"], input_kind=kind, domains=rows.get("domains"))


def _multilabel_inputs(frame, cols, flagged: bool, manifest):
    """``(logits, labels, manifest)`` when this ``evaluate`` is a sigmoid head's (the rule of
    :func:`confcal.cli._shared.multilabel.multilabel_inputs`: ``flagged`` by ``--multilabel`` or a
    ``*-multilabel`` calibrator, or 2-D labels with a row that is not one-hot), gathered from the cluster into this
    process as the single process loads them (every row in memory); else None, reading nothing
    for 1-D labels."""
    from confcal.cli._shared.multilabel import check_multilabel_shapes
    from confcal.dask import read_rows, resolve_columns

    spec = resolve_columns(frame, cols["--labels"], name="labels")
    if not flagged and not (spec.list_column or spec.group):
        return None  # 1-D labels: the usual evaluate
    rows = read_rows(frame, {"logits": cols["--logits"], "labels": cols["--labels"]})
    if not check_multilabel_shapes(rows["logits"], rows["labels"], flagged):
        return None
    return rows["logits"], rows["labels"], manifest


def run_evaluate(args) -> int:
    from confcal.cli._shared import audit as _audit
    from confcal.cli._shared.gate import gate_kwargs
    from confcal.dask import evaluate

    path, cols = _dataset(args, ["--logits", "--labels", "--domains", "--features"])
    if "--labels" not in cols:
        raise ValueError("--labels: required")
    from confcal.cli._shared.multilabel import flagged_multilabel

    flagged = flagged_multilabel(args, calibrator_path=args.calibrator)  # a bad manifest: before any cluster
    with _client(args):
        frame = _open(path)
        inputs = _multilabel_inputs(frame, cols, *flagged)
        if inputs is not None:  # a sigmoid head: the single-process per-label evaluation of the same rows
            from confcal.cli._shared import multilabel as _multilabel

            return _multilabel.run_evaluate(args, inputs, engine="dask")
        cal = _calibrator(args)
        _check_class_count(cal, frame, cols["--logits"], args.calibrator)
        features = cols.get("--features")
        names = _audit.geometry_names(args, cal)
        if features is None and getattr(cal, "takes_box_features", False):
            # geometry maps: their box features by name from the --logits dataset, as in one process
            features = ",".join(cal.feature_names_)
        # --input-kind default: the calibrator's (its manifest), else logits, as in one process
        doc = evaluate(frame, logits=cols["--logits"], labels=cols["--labels"],
                       domains=cols.get("--domains"), features=features, calibrator=cal,
                       input_kind=args.input_kind, n_bins=args.n_bins,
                       geometry=",".join(names) if names else None, max_ece=args.max_ece, **gate_kwargs(args))
    return _audit.finish(doc, args)  # the same document, text and exit status as in one process


def run_fit(args, params: dict):
    """Fit on the cluster; returns the fitted calibrator (the caller writes and prints it)."""
    from confcal.dask import fit

    path, cols = _dataset(args, ["--logits", "--labels", "--domains", "--features", "--category-ids"])
    if "--labels" not in cols:
        raise ValueError("--labels: required")
    features = cols.get("--features")
    if getattr(args, "box_features", None) and features is None:
        # the geometry columns, read by name from the --logits dataset (as the single-process fit does)
        features = args.box_features
    with _client(args):
        cal, how = fit(args.method, _open(path), logits=cols["--logits"], labels=cols["--labels"],
                       domains=cols.get("--domains"), features=features, params=params,
                       input_kind=args.input_kind,
                       sample_rows=DEFAULT_SAMPLE_ROWS if args.sample_rows is None else args.sample_rows,
                       random_state=0 if args.seed is None else args.seed,
                       return_how=True, category_ids=cols.get("--category-ids"))
    print(f"dask engine: {how}", file=sys.stderr)
    return cal
