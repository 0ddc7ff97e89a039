"""``confcal domain-eval``: the domain-generalization protocol of Gong et al. (ICCV 2021).

One model (trained on the source domain) and its outputs on every domain, one
``.npz`` per domain with arrays ``logits`` ``(n, K)``, ``labels`` ``(n,)`` and
``features`` ``(n, d)`` (names changeable with ``--keys``). The source file
must hold held-out source rows (not the training rows): source-only TS is
fitted on them. For every target (default: each non-source domain), every
choice of ``--n-calibration`` calibration domains from the remaining ones is a
split; the command prints a per-split table (like the paper's Table 2), a
per-target summary (Table 1) and a per-method summary (mean ECE, paper-IR,
splits worse than source-only by > 2 points) for each seed of ``--seeds``,
and can write the long CSV.
"""

from __future__ import annotations

import itertools
import warnings

from confcal.cli._shared.common import parse_params
from confcal.cli._shared.notes import note


def register(sub):
    p = sub.add_parser(
        "domain-eval", help="calibration under domain shift: source-only, oracle, set-/cluster-level and source-gated TS",
        description="Run the protocol of Gong et al. (ICCV 2021) on one model's outputs on several domains: "
                    "uncalibrated, source-only TS, target-only oracle TS, set-level TS, cluster-level TS "
                    "(nearest centroid, regression), their ensemble and source-gated TS (per sample between "
                    "source-only TS and the ensemble, by the kNN source probability of its features); "
                    "bootstrap ECE (in percent, mean ± std) and improvement ratio per split, a per-target and a "
                    "per-method summary.")
    p.add_argument("--domain", action="append", required=True, metavar="NAME=PATH",
                   help="a domain's .npz with logits, labels and features (repeat for each domain)")
    p.add_argument("--keys", default="logits,labels,features", metavar="L,Y,F",
                   help="array names in the .npz files (default logits,labels,features)")
    p.add_argument("--source", required=True, help="name of the source domain (its file: held-out rows)")
    p.add_argument("--target", action="append", metavar="NAME",
                   help="target domain (repeatable; default: every non-source domain)")
    p.add_argument("--n-calibration", type=int, default=None,
                   help="calibration domains per split, chosen from the non-source, non-target ones (default 2, "
                        "or 1 where a target leaves only one)")
    p.add_argument("--draws", type=int, default=1000, help="bootstrap draws (default 1000)")
    p.add_argument("--n-samples", type=int, default=1500,
                   help="target samples per bootstrap draw, or all if fewer (default 1500)")
    p.add_argument("--n-bins", type=int, default=15, help="equal-width ECE bins (default 15)")
    p.add_argument("--oracle-fraction", type=float, default=0.2,
                   help="share of the target used to fit the target-only oracle (default 0.2)")
    p.add_argument("--domain-weighting", choices=["sample", "domain"], default="sample",
                   help="weight each calibration sample (default) or each calibration domain equally")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="hyper-parameter of the cluster-level calibrators, e.g. --param n_clusters=8")
    p.add_argument("--gate-param", action="append", metavar="KEY=VALUE",
                   help="hyper-parameter of source-gated TS, e.g. --gate-param n_neighbors=20 "
                        "or --gate-param max_pool_size=null")
    p.add_argument("--seed", type=int, default=0, help="seed of the oracle split and the bootstrap (default 0)")
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="run the protocol once per seed (overrides --seed); the tables are per seed")
    p.add_argument("--csv", metavar="PATH", help="also write one row per (split, method) as CSV (atomically)")
    from confcal.cli._shared.common import add_csv_header_arg

    add_csv_header_arg(p)  # for --domain files given as headed CSV (their --keys are columns)
    p.set_defaults(func=run)


def _load_domains(items, keys) -> dict:
    from confcal.evaluation.domain import DomainData
    from confcal.io import load_array

    names = keys.split(",")
    if len(names) != 3 or not all(names):
        raise ValueError(f"--keys: expected three comma-separated names L,Y,F, got {keys!r}")
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--domain: expected NAME=PATH, got {item!r}")
        if name in out:
            raise ValueError(f"--domain: domain {name!r} given twice")
        arrays = [load_array(f"{path}:{k}", name=f"{name}.{k}") for k in names]
        try:
            out[name] = DomainData(*arrays)
        except ValueError as exc:
            raise ValueError(f"--domain {name}: {exc}") from None
    return out


#: calibration domains per split when --n-calibration is not given (fewer where a target leaves fewer)
DEFAULT_N_CALIBRATION = 2


def splits_for(names: list[str], source: str, targets: list[str] | None, n_calibration: int | None) -> list:
    """Every (source, calibration combination, target) for the chosen targets; ``n_calibration``
    None: :data:`DEFAULT_N_CALIBRATION`, or as many as a target leaves when fewer."""
    from confcal.evaluation.domain import Split

    if source not in names:
        raise ValueError(f"--source: {source!r} is not one of the domains {names}")
    targets = targets or [d for d in names if d != source]
    if not targets:
        raise ValueError(f"--domain: only the source domain {source!r} was given; the protocol needs at least "
                         "one target domain besides it (and --n-calibration calibration domains)")
    for t in targets:
        if t not in names or t == source:
            raise ValueError(f"--target: {t!r} must be one of the non-source domains "
                             f"{[d for d in names if d != source]}")
    out = []
    for t in targets:
        rest = [d for d in names if d not in (source, t)]
        if not rest:
            raise ValueError(f"--domain: target {t!r} leaves no calibration domain: the protocol needs at least "
                             f"three domains (source, target and one or more calibration domains), got "
                             f"{len(names)} ({', '.join(names)})")
        if n_calibration is None:  # the default: 2, or all that is left (said by run)
            n = min(DEFAULT_N_CALIBRATION, len(rest))
            out += [Split(source, cal, t) for cal in itertools.combinations(rest, n)]
            continue
        if not 1 <= n_calibration <= len(rest):
            raise ValueError(f"--n-calibration: expected 1..{len(rest)} (domains other than source and "
                             f"target {t!r}), got {n_calibration}")
        out += [Split(source, cal, t) for cal in itertools.combinations(rest, n_calibration)]
    return out


def run(args) -> int:
    from confcal.evaluation.domain import evaluate_split
    from confcal.evaluation.domain_tables import (
        method_summary_table,
        results_to_rows,
        rows_to_csv,
        split_table,
        target_summary_table,
    )
    from confcal.io import atomic_write, check_output_path, neutralise_csv

    for name in ("draws", "n_samples", "n_bins"):  # before any fit: said at once, not after minutes
        v = getattr(args, name)
        if v < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive integer, got {v}")
    if not 0.0 < args.oracle_fraction < 1.0:  # also refuses nan
        raise ValueError(f"--oracle-fraction: expected a fraction in (0, 1), got {args.oracle_fraction!r}")
    if args.csv:  # before any work: a missing folder is said at once, not after the bootstrap
        check_output_path(args.csv, name="--csv")
    data = _load_domains(args.domain, args.keys)
    splits = splits_for(list(data), args.source, args.target, args.n_calibration)
    if args.n_calibration is None and any(len(sp.calibration) < DEFAULT_N_CALIBRATION for sp in splits):
        import sys

        note(f"note: --n-calibration {DEFAULT_N_CALIBRATION} (the default) is more than the domains left "
              "besides the source and a target; those splits use 1 calibration domain")
    for name in sorted({c for s in splits for c in s.calibration}):
        if data[name].labels.shape[0] < 2:
            warnings.warn(f"calibration domain {name!r} has {data[name].labels.shape[0]} sample: its set-level "
                          "statistics (feature mean, fitted temperature) are noise; give it more rows or leave it "
                          "out", UserWarning, stacklevel=2)
    seeds = list(dict.fromkeys(args.seeds)) if args.seeds else [args.seed]
    cluster_params, gate_params = parse_params(args.param), parse_params(args.gate_param, option="--gate-param")
    results = []
    for seed in seeds:
        for split in splits:
            try:
                results.append(evaluate_split(
                    data[split.source], {c: data[c] for c in split.calibration}, data[split.target], split=split,
                    n_draws=args.draws, n_samples=args.n_samples, n_bins=args.n_bins,
                    oracle_fraction=args.oracle_fraction, random_state=seed, domain_weighting=args.domain_weighting,
                    cluster_params=cluster_params, gate_params=gate_params,
                    tag=f"seed {seed}" if len(seeds) > 1 else ""))
            except ValueError as exc:  # name the domain (and so its file) the library's role word means
                role, sep, rest = str(exc).partition(": ")
                domain = {"target": split.target, "source": split.source}.get(role)
                if not sep or domain is None:
                    raise
                raise ValueError(f"--domain {domain} ({role}): {rest}") from None
    print(f"ECE in % (bootstrap mean ± std over {args.draws} draws of min({args.n_samples}, n) target samples); "
          "IR = improvement ratio, eq. 19 (n/a where the oracle is no better than source-only)\n")
    print("per split:")
    print(split_table(results))
    print("\nper target:")
    print(target_summary_table(results))
    print("\nper method (paper-IR = eq. 19 on the ECEs averaged over splits):")
    print(method_summary_table(results))
    if args.csv:
        with atomic_write(args.csv, "w") as fh:
            fh.write(neutralise_csv(rows_to_csv(results_to_rows(results))))  # domain names are the user's
        print(f"\nrows -> {args.csv}")
    return 0
