"""Calibration under domain shift on real multi-domain data (Gong et al., ICCV 2021, Tables 1-2).

For each dataset (``office_caltech10_surf``, ``digits``; 4 domains each) and
each source domain:

1. split the source rows at random (seeded) into 60% training and 40% held-out;
2. train a one-hidden-layer ReLU MLP (torch, Adam, cross-entropy, seeded) on
   the training rows;
3. compute logits and penultimate (hidden-layer) activations for the held-out
   source rows and for every row of the three other domains.

Then every (source, 2 calibration domains, target) split — 12 per dataset — runs
the protocol of :func:`confcal.evaluation.domain.evaluate_split`: uncalibrated,
source-only TS (fit on the held-out source rows), target-only oracle TS (fit on
20% of the target, every method evaluated on the other 80%), set-level TS,
cluster-level TS (nearest centroid and regression), their ensemble, and
source-gated TS (per test sample between source-only TS and the ensemble, by the
kNN source probability of its features); bootstrap ECE (15 equal-width bins) over
``--draws`` draws of ``min(1500, n)`` target samples. Everything runs once per
seed of ``--seeds`` (the seed drives the source split, the MLP, the oracle split
and the bootstrap).

Input preprocessing: SURF histograms are L1-normalised per row, then
z-scored with a scaler fitted on the source training rows (the data README's
advice); digits are used as given (16x16 pixels in [0, 1]).

Writes ``benchmarks/results/domain_generalization.md`` and ``.csv``.

Usage:  python benchmarks/domain_generalization.py [--draws 1000] [--hidden 128] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.evaluation.domain import (
    BAD_SPLIT_MARGIN,
    PROPOSED,
    DomainData,
    all_splits,
    evaluate_split,
    method_summary,
)
from confcal.evaluation.domain_tables import (
    method_summary_table,
    results_to_rows,
    rows_to_csv,
    split_table,
    target_summary_table,
)
from confcal.io import atomic_write

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "domains"
RESULTS = REPO / "benchmarks" / "results"
DATASETS = {
    "office_caltech10_surf": ["amazon", "caltech10", "dslr", "webcam"],
    "digits": ["mnist", "usps", "semeion", "optdigits"],
}


def load_domain(dataset: str, name: str):
    with np.load(DATA / dataset / f"{name}.npz") as z:
        return z["features"].astype(np.float64), z["labels"].astype(np.int64)


def preprocess(dataset: str, x: np.ndarray) -> np.ndarray:
    if dataset == "office_caltech10_surf":
        return x / np.maximum(x.sum(axis=1, keepdims=True), 1e-12)
    return x


def train_source_model(x, y, *, hidden: int, seed: int, epochs: int):
    """One-hidden-layer ReLU MLP (torch, Adam, cross-entropy, seeded); returns
    ``forward(x) -> (logits, hidden activations)`` as float64 numpy arrays."""
    import torch
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    torch.manual_seed(seed)
    n_classes = int(y.max()) + 1
    body = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU())
    head = torch.nn.Linear(hidden, n_classes)
    params = [*body.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3, weight_decay=1e-4)
    xt = torch.as_tensor(scaler.transform(x), dtype=torch.float32)
    yt = torch.as_tensor(y)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(yt), generator=gen).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(head(body(xt[idx])), yt[idx]).backward()
            opt.step()

    @torch.no_grad()
    def forward(v):
        h = body(torch.as_tensor(scaler.transform(v), dtype=torch.float32))
        return head(h).double().numpy(), h.double().numpy()

    return forward


def run_dataset(dataset: str, *, draws: int, hidden: int, epochs: int, seed: int, log,
                gate_params: dict | None = None) -> list:
    names = DATASETS[dataset]
    raw = {d: load_domain(dataset, d) for d in names}
    raw = {d: (preprocess(dataset, x), y) for d, (x, y) in raw.items()}
    results = []
    for source in names:
        x, y = raw[source]
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(y))
        n_train = int(round(0.6 * len(y)))
        tr, ho = perm[:n_train], perm[n_train:]
        t0 = time.perf_counter()
        forward = train_source_model(x[tr], y[tr], hidden=hidden, seed=seed, epochs=epochs)
        data = {}
        for d in names:
            xd, yd = (x[ho], y[ho]) if d == source else raw[d]
            logits, feats = forward(xd)
            data[d] = DomainData(logits, yd, feats)
        acc = {d: float(np.mean(np.argmax(data[d].logits, 1) == data[d].labels)) for d in names}
        log(f"[{dataset}, seed {seed}] source {source}: trained on {n_train} rows in {time.perf_counter() - t0:.1f}s; "
            "accuracy " + ", ".join(f"{d} {100 * a:.1f}%" for d, a in acc.items()))
        for split in all_splits(names, 2):
            if split.source != source:
                continue
            t0 = time.perf_counter()
            res = evaluate_split(data[source], {c: data[c] for c in split.calibration}, data[split.target],
                                 split=split, n_draws=draws, seed=seed, tag=dataset, gate_params=gate_params)
            results.append(res)
            log(f"  {split}: {time.perf_counter() - t0:.1f}s, " + ", ".join(
                f"{m} {100 * r.ece_mean:.2f}" for m, r in res.methods.items()))
            for w in res.warnings:
                log(f"    warning: {w}")
    return results


def headline(results) -> list[str]:
    """The issue's targets, computed from the results.

    Per-split IR divides by ``ECE_source-only - ECE_target-only``, which is
    near zero or negative on some splits (the NLL-fitted oracle is not the
    ECE-optimal map), so the plain mean is reported next to the median, the IR
    of the mean ECEs, and the mean over splits where the oracle gains >= 1 pp.
    """
    lines = []
    n = len(results)
    s_mean = float(np.mean([r.methods["source-only"].ece_mean for r in results]))
    o_mean = float(np.mean([r.methods["target-only"].ece_mean for r in results]))
    clear = [r for r in results if r.methods["source-only"].ece_mean - r.methods["target-only"].ece_mean >= 0.01]
    stats = {}
    for m in PROPOSED:
        irs = [r.methods[m].ir for r in results if r.methods[m].ir is not None]
        e = float(np.mean([r.methods[m].ece_mean for r in results]))
        stats[m] = {
            "mean": float(np.mean(irs)) if irs else float("nan"), "median": float(np.median(irs)) if irs else
            float("nan"), "defined": len(irs), "ge_half": sum(v >= 0.5 for v in irs),
            "of_mean": (s_mean - e) / (s_mean - o_mean),
            "clear": float(np.mean([r.methods[m].ir for r in clear])) if clear else float("nan"),
        }
    best = max(PROPOSED, key=lambda m: stats[m]["mean"])
    n_def = stats[PROPOSED[0]]["defined"]
    lines.append(f"- Mean IR over the {n_def} of {n} splits where eq. 19 is defined (oracle better than "
                 "source-only; the issue's target: >= 0.5 for the best proposed method): "
                 + ", ".join(f"{m} {stats[m]['mean']:.2f}" for m in PROPOSED)
                 + f". Best: {best} {stats[best]['mean']:.2f} -> "
                 + ("met" if stats[best]["mean"] >= 0.5 else "NOT met")
                 + ". Caveat: per-split IR divides by ECE_source-only - ECE_target-only, which is below 1 pp "
                 f"or negative on {n - len(clear)} of {n} splits, so this mean is dominated by a few splits; "
                 "the robust figures below say more.")
    lines.append("- Median per-split IR: " + ", ".join(f"{m} {stats[m]['median']:.2f}" for m in PROPOSED)
                 + "; splits with IR >= 0.5: " + ", ".join(f"{m} {stats[m]['ge_half']}/{n}" for m in PROPOSED)
                 + ".")
    lines.append(f"- IR of the mean ECE over all {n} splits (source-only {100 * s_mean:.2f}%, oracle "
                 f"{100 * o_mean:.2f}%): " + ", ".join(f"{m} {stats[m]['of_mean']:.2f}" for m in PROPOSED)
                 + f". Mean IR over the {len(clear)} splits where the oracle beats source-only by >= 1 pp: "
                 + ", ".join(f"{m} {stats[m]['clear']:.2f}" for m in PROPOSED) + ".")
    neg = [str(r.split) for r in results
           if r.methods["source-only"].ece_mean < r.methods["target-only"].ece_mean]
    if neg:
        lines.append(f"- On {len(neg)} splits the NLL-fitted oracle has a higher ECE than source-only TS "
                     f"(negative eq. 19 denominator: small oracle fit sets, or a mostly-wrong model whose NLL "
                     f"optimum is a high T); eq. 19 would give a method WORSE than source-only a positive IR "
                     f"there, so IR is n/a on: "
                     + "; ".join(neg) + ".")
    for tag in dict.fromkeys(r.tag for r in results):
        rs = [r for r in results if r.tag == tag]
        e = {m: float(np.mean([r.methods[m].ece_mean for r in rs])) for m in PROPOSED}
        irs = {m: float(np.mean([r.methods[m].ir for r in rs if r.methods[m].ir is not None])) for m in PROPOSED}
        wins = {m: sum(r.methods[m].ece_mean < r.methods["set-ts"].ece_mean for r in rs)
                for m in ("cluster-ts", "cluster-ts-regression", "domain-ensemble")}
        line = (f"- {tag}, mean ECE over {len(rs)} splits: set-level {100 * e['set-ts']:.2f}%, cluster-NN "
                f"{100 * e['cluster-ts']:.2f}% (below set-level on {wins['cluster-ts']}/{len(rs)} splits), "
                f"cluster-reg. {100 * e['cluster-ts-regression']:.2f}% ({wins['cluster-ts-regression']}/{len(rs)}), "
                f"ensemble {100 * e['domain-ensemble']:.2f}% ({wins['domain-ensemble']}/{len(rs)}); mean IR "
                + ", ".join(f"{m} {irs[m]:.2f}" for m in PROPOSED))
        if tag == "digits":
            ok = min(e["cluster-ts"], e["cluster-ts-regression"]) < e["set-ts"]
            line += " -> cluster-level beats set-level on average on digits: " + ("yes" if ok else "NO")
        lines.append(line + ".")
    return lines


def gated_targets(results) -> list[str]:
    """The issue's "done when" for source-gated TS, checked per seed against the committed figures."""
    rows = method_summary(results)
    lines = []
    for seed in sorted({r["seed"] for r in rows}):
        by = {r["method"]: r for r in rows if r["seed"] == seed}
        g = by["source-gated-ts"]
        others = {m: by[m]["ece_mean"] for m in PROPOSED if m != "source-gated-ts"}
        best = min(others, key=others.get)
        ok_ir = g["paper_ir"] is not None and g["paper_ir"] >= 0.83
        ok_ece = g["ece_mean"] < others[best]
        ok_bad = g["n_worse_than_source"] <= 1
        lines.append(
            f"- seed {seed}: source-gated paper-IR {g['paper_ir']:.3f} (target >= 0.83: "
            f"{'met' if ok_ir else 'NOT met'}); mean ECE {100 * g['ece_mean']:.2f}% vs best existing method "
            f"{best} {100 * others[best]:.2f}% ({'met' if ok_ece else 'NOT met'}); splits worse than "
            f"source-only by > {100 * BAD_SPLIT_MARGIN:g} pts: {g['n_worse_than_source']} "
            f"(target <= 1: {'met' if ok_bad else 'NOT met'}); ensemble "
            f"{by['domain-ensemble']['n_worse_than_source']}.")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=1000, help="bootstrap draws per method and split")
    ap.add_argument("--hidden", type=int, default=128, help="hidden units of the MLP")
    ap.add_argument("--epochs", type=int, default=30, help="training epochs of the MLP")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1],
                    help="seeds (source split, MLP, oracle split, bootstrap); default 0 1")
    ap.add_argument("--gate-param", action="append", default=[], metavar="KEY=VALUE",
                    help="hyper-parameter of source-gated TS (JSON value), e.g. n_neighbors=20")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--out", default=str(RESULTS / "domain_generalization"),
                    help="output path without suffix (.md and .csv are written)")
    args = ap.parse_args(argv)
    import json

    import torch

    torch.set_num_threads(1)  # tiny MLP: threads only add contention on a shared 2-core machine
    gate_params = {}
    for item in args.gate_param:
        key, _, value = item.partition("=")
        gate_params[key] = json.loads(value)
    seeds = list(dict.fromkeys(args.seeds))

    for d in args.datasets:
        if not (DATA / d).is_dir():
            raise SystemExit(f"data not found: {DATA / d} (expected ../shared/data beside the repository)")
    log_lines: list[str] = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    t0 = time.perf_counter()
    results = []
    for seed in seeds:
        for d in args.datasets:
            results += run_dataset(d, draws=args.draws, hidden=args.hidden, epochs=args.epochs, seed=seed,
                                   log=log, gate_params=gate_params)
    elapsed = time.perf_counter() - t0
    command = (f"python benchmarks/domain_generalization.py --draws {args.draws} --hidden {args.hidden} "
               f"--epochs {args.epochs} --seeds {' '.join(map(str, seeds))}"
               + "".join(f" --gate-param {p}" for p in args.gate_param))

    md = [
        "# Calibration under domain shift (Gong et al., ICCV 2021 protocol)",
        "",
        f"Generated by `{command}` in {elapsed:.0f} s on 2 shared CPU cores.",
        "",
        "Classifier: one-hidden-layer MLP (torch, ReLU, "
        f"{args.hidden} units, Adam, {args.epochs} epochs, seeded) trained on 60% of the source domain; features = "
        "its hidden activations. Source-only TS: fitted on the other 40% of the source. Target-only TS (oracle): "
        "fitted on 20% of the target; every method is evaluated on the remaining 80%. Set-/cluster-level methods: "
        "fitted on all rows of the two calibration domains (8 k-means clusters, seed 0, sample weighting). "
        "Source-gated TS: log T(x) = g(x) log T_source + (1 - g(x)) log T_ensemble(x), g = kNN probability of "
        "the source under equal domain priors over the held-out source rows and the calibration rows (k = 20, "
        "pool capped at 2000 rows), rescaled by the median leave-one-out gate of the calibration rows "
        "(hyper-parameters: " + (", ".join(f"{k}={v!r}" for k, v in gate_params.items()) or "defaults")
        + "). "
        f"ECE: 15 equal-width bins, bootstrap mean ± std over {args.draws} draws of min(1500, n) target samples "
        "(in %). IR = (ECE_source-only - ECE) / (ECE_source-only - ECE_target-only) (eq. 19); "
        "'n/a' where the oracle is no better than source-only. Seeds: the seed drives the source split, the MLP, "
        "the oracle split and the bootstrap draws.",
        "",
        "## Per method, per seed (all 24 splits)",
        "",
        "paper-IR = eq. 19 on the ECEs averaged over the splits (the paper's measure); 'worse' = splits "
        f"whose ECE exceeds source-only's by more than {100 * BAD_SPLIT_MARGIN:g} points.",
        "",
        method_summary_table(results),
        "",
        *gated_targets(results),
        "",
    ]
    for seed in seeds:
        rs = [r for r in results if r.seed == seed]
        md += [
            f"## Seed {seed}: headline",
            "",
            *headline(rs),
            "",
            f"## Seed {seed}: per target (like the paper's Table 1; mean over the splits with that target)",
            "",
            target_summary_table(rs),
            "",
            f"## Seed {seed}: per split (like the paper's Table 2)",
            "",
            split_table(rs),
            "",
        ]
    md += ["## Log", "", "```", *log_lines, "```", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out.with_suffix(".md"), "w") as fh:
        fh.write("\n".join(md))
    with atomic_write(out.with_suffix(".csv"), "w") as fh:
        fh.write(rows_to_csv(results_to_rows(results)))
    print(method_summary_table(results))
    print("\n".join(gated_targets(results)))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
