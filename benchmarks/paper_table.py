"""Paper-style table (Atarashi et al., arXiv 2506.10572, Table 2): every baseline X with and
without probability bounding (X vs X+PB), on real CIFAR outputs, over random 5,000/5,000
calibration/test splits (mean ± standard error over splits).

Reads ``../shared/data/cifar/*.npz`` (softmax outputs: ``predictions``, ``ground_truth``;
their log is used as logits) and writes ``benchmarks/results/paper_table.{md,csv,json}``.
The "uncalibrated" row pairs with PB alone. Methods that are not registered in
``confcal.calibrators.METHODS`` are listed as missing; methods that fail on a split are
reported with their error.

    .venv/bin/python benchmarks/paper_table.py [--splits 10] [--cal-size 5000] [--methods ts,vs,...]
        [--datasets densenet-bc-100-cifar-100,...] [--out benchmarks/results/paper_table] [--progress]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from confcal.calibrators import METHODS
from confcal.evaluation import compare_methods
from confcal.evaluation.compare import UNCALIBRATED, format_cell

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "cifar"

DATASETS = {
    "densenet-bc-100-cifar-100": "DenseNet-BC-100, CIFAR-100",
    "wideresnet-16-4-cifar-100": "WideResNet-16-4, CIFAR-100",
    "wideresnet-16-4-cifar-10": "WideResNet-16-4, CIFAR-10",
    "lenet-5-cifar-10": "LeNet-5, CIFAR-10",
}
#: base method -> display name; each is paired with "<base>+pb" (uncalibrated with "pb")
BASES = {UNCALIBRATED: "Uncal.", "ts": "TS", "vs": "VS", "ms": "MS", "dirichlet": "Dirichlet",
         "ets": "ETS", "pts": "PTS"}
#: metrics shown in the markdown table: key -> (title, percent?)
SHOWN = {"smece": ("smECE (%)", True), "ece_em": ("emECE (%)", True), "ece_ew": ("ewECE (%)", True),
         "nll": ("NLL", False), "error": ("error (%)", True), "cal_nll": ("cal. NLL", False)}


def pb_of(base: str) -> str:
    return "pb" if base == UNCALIBRATED else f"{base}+pb"


def load(name: str):
    path = DATA / f"{name}.npz"
    if not path.exists():
        sys.exit(f"paper_table: {path} not found (expected ../shared/data/cifar beside the repository)")
    d = np.load(path)
    return d["predictions"], d["ground_truth"]


def nesting_violations(res, base: str, tol: float = 1e-6) -> tuple[int, int, float]:
    """Splits where X+PB's fitted calibration-set NLL exceeds X's by more than ``tol``
    (X+PB contains X at a = 0, b = 1), the number of splits compared, and the worst excess."""
    a = res[base].values["cal_nll"]
    b = res[pb_of(base)].values["cal_nll"]
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    excess = [y - x for x, y in pairs]
    return sum(e > tol for e in excess), len(pairs), max(excess, default=float("nan"))


def cell(row, metric, percent):
    if row is None:
        return "n/a"
    if row.n_ok == 0:
        return "failed"
    s = format_cell(row.mean(metric), row.se(metric), percent=percent, digits=2 if percent else 4)
    return s if row.n_ok == len(row.errors) else f"{s} [{row.n_ok}/{len(row.errors)}]"


def markdown_for(name: str, res, bases: list[str]) -> list[str]:
    def get(label):
        try:
            return res[label]
        except KeyError:
            return None

    head = ["method"] + [f"{title} {v}" for title, _ in SHOWN.values() for v in ("Base", "+PB")]
    lines = [f"### {DATASETS[name]}", "",
             f"{res.n_splits} splits × {res.cal_size} calibration / {res.test_size} test, "
             f"{res.n_classes} classes. Base = the method alone, +PB = the same method with "
             "probability bounding fitted jointly (for Uncal.: PB alone). Test-set metrics except "
             "cal. NLL (the fitted calibration-set NLL).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for base in bases:
        row_b, row_p = get(base), get(pb_of(base))
        cells = [BASES.get(base, base)]
        for metric, (_, pct) in SHOWN.items():
            cells += [cell(row_b, metric, pct), cell(row_p, metric, pct)]
        lines.append("| " + " | ".join(cells) + " |")
        for row in (row_b, row_p):
            if row is not None and row.error:
                notes.append(f"- {row.label}: {row.error}")
    lines.append("")
    # X+PB vs X: the two claims of the issue, checked split by split
    checks = []
    for base in bases:
        row_b, row_p = get(base), get(pb_of(base))
        if row_b is None or row_p is None or row_b.n_ok == 0 or row_p.n_ok == 0:
            continue
        viol, n, worst = nesting_violations(res, base)
        wins = sum(p < b for b, p in zip(row_b.values["smece"], row_p.values["smece"])
                   if b is not None and p is not None)
        d_sm = (row_p.mean("smece") - row_b.mean("smece")) * 100
        d_nll = row_p.mean("nll") - row_b.mean("nll")
        checks.append(f"- {BASES.get(base, base)} → +PB: test smECE {d_sm:+.2f} pts (lower on {wins}/{n} "
                      f"splits), test NLL {d_nll:+.4f}; cal. NLL of +PB above Base by > 1e-6 on "
                      f"{viol}/{n} splits (max excess {worst:+.2e})")
    lines += checks + [""] + notes + ([""] if notes else [])
    times = [f"{r.label} {r.mean('fit_seconds'):.2f} s" for r in res.rows
             if r.label != UNCALIBRATED and r.mean("fit_seconds") is not None]
    lines += [f"Mean fit time per split: {', '.join(times)}.", ""]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--cal-size", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(b for b in BASES if b != UNCALIBRATED),
                    help="base methods; each runs with its +pb version (and PB alone)")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "paper_table"))
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)

    bases = [UNCALIBRATED] + [b for b in args.methods.split(",") if b and b != UNCALIBRATED]
    wanted = [m for b in bases for m in ((b, pb_of(b)) if b != UNCALIBRATED else (pb_of(b),))]
    methods = [m for m in wanted if m in METHODS]
    missing = [m for m in wanted if m not in METHODS]
    if missing:
        print(f"not registered, skipped: {', '.join(missing)}", file=sys.stderr)

    started = time.perf_counter()
    md = ["# X vs X+PB on real CIFAR outputs (paper Table 2 protocol)", ""]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = "?"
    csv_rows, full = [], {}
    for name in args.datasets.split(","):
        logits, labels = load(name)
        t0 = time.perf_counter()
        res = compare_methods(logits, labels, methods, n_splits=args.splits, cal_size=args.cal_size,
                              seed=args.seed, input_kind="probs", progress=args.progress)
        elapsed = time.perf_counter() - t0
        print(f"\n== {DATASETS[name]} ({elapsed:.0f} s)\n{res.to_text()}", flush=True)
        md += markdown_for(name, res, bases)
        full[name] = res.to_dict()
        for r in res.summary():
            csv_rows.append({"dataset": name, **r})
    total = time.perf_counter() - started
    md += [
        "## How this was made", "",
        "`" + " ".join([".venv/bin/python benchmarks/paper_table.py", *(argv or sys.argv[1:])]) + "`",
        f"at commit {commit}, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()} with {torch.get_num_threads()} torch threads (shared machine: times are noisy); "
        f"total {total / 60:.1f} min.",
        "Splits: split s permutes the 10,000 samples with `numpy.random.default_rng([seed, s])`; the "
        "first 5,000 calibrate, the rest test. Rates in %, mean ± standard error over splits; "
        "[k/n] marks a method that fitted on only k of n splits.",
        f"Not registered when this ran (no row): {', '.join(missing) or 'none'}.", "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(md))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(csv_rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in csv_rows:
        writer.writerow({k: "" if v is None else (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
    out.with_suffix(".csv").write_text(buf.getvalue())
    out.with_suffix(".json").write_text(json.dumps(full, allow_nan=False))
    print(f"\nwrote {out.with_suffix('.md')} (.csv, .json) in {total / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
