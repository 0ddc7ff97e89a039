"""Paper-style table (Atarashi et al., arXiv 2506.10572, Table 2): every baseline X with and
without probability bounding (X vs X+PB), plus PB alone, LB, DPB and PB-MLP, on real CIFAR
outputs over random 5,000 / 5,000 calibration / test splits; mean ± std over splits.

Reads ``../shared/data/cifar/<dataset>.npz`` (softmax outputs ``predictions``, ``ground_truth``;
their log is used as logits). Every (dataset, split, method) result is appended to a JSON-lines
checkpoint as soon as it is computed (``<out>.jsonl``; a rerun skips what is there), and the
tables ``<out>.md`` / ``<out>.csv`` are rewritten from the checkpoint after every split, so an
interrupted run leaves a consistent partial table that says how many splits each cell has.

    python benchmarks/paper_table.py [--splits 10] [--cal-size 5000] [--datasets a,b]
        [--methods ts,vs,...] [--out benchmarks/results/paper_table] [--fresh]

Splits: split s permutes the 10,000 rows with ``numpy.random.default_rng([seed, s])``
(:func:`confcal.evaluation.compare.split_indices`); the first 5,000 calibrate, the rest test.
Hyper-parameters: the paper's protocol (:data:`PAPER_PARAMS`), which differs from confcal's defaults for
VS (unregularised, ``reg_lambda=0``; the default is a K/n ridge toward TS) and MS / Dirichlet (ODIR chosen by
3-fold cross-validation, ``reg="cv", cv=3``; the default is ``reg="auto"``), alone and as the X of X+PB; every
other method at its defaults (PTS / PB-MLP with the paper's Adam schedule of 500 epochs, batch 256).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from confcal._numeric import softmax
from confcal._validation import check_logits
from confcal.calibrators._fit.odir import reuse_fits
from confcal.evaluation.compare import fit_and_score, split_indices
from confcal.metrics import accuracy, ece, nll, smooth_ece

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "cifar"

#: the four CIFAR outputs of the paper's comparison, in the order they are run
DATASETS = {
    "densenet-bc-100-cifar-100": "DenseNet-BC-100, CIFAR-100",
    "wideresnet-16-4-cifar-100": "WideResNet-16-4, CIFAR-100",
    "wideresnet-16-4-cifar-10": "WideResNet-16-4, CIFAR-10",
    "lenet-5-cifar-10": "LeNet-5, CIFAR-10",
}
UNCAL = "uncalibrated"
#: base X -> display name; each is paired with "X+pb" (Uncal. with PB alone)
BASES = {UNCAL: "Uncal.", "ts": "TS", "vs": "VS", "ms": "MS", "dirichlet": "Dirichlet", "ets": "ETS", "pts": "PTS"}
#: the paper's hyper-parameters where confcal's defaults differ (Guo et al.'s plain VS, Kull et al.'s
#: cross-validated ODIR); an X+PB method gets its X's as ``base_params``
# 3 folds: the protocol of the committed tables (confcal's default became 5 folds in issue 26)
_PAPER_BASE = {"vs": {"reg_lambda": 0.0}, "ms": {"reg": "cv", "cv": 3}, "dirichlet": {"reg": "cv", "cv": 3}}
PAPER_PARAMS = {**_PAPER_BASE, **{f"{b}+pb": {"base_params": dict(p)} for b, p in _PAPER_BASE.items()}}
#: stand-alone rows
OTHERS = {"lb": "LB", "dpb": "DPB", "pb-mlp": "PB-MLP"}
#: columns: key -> (title, percent?)
SHOWN = {"smece": ("smECE (%)", True), "ece_ew": ("ewECE (%)", True), "ece_em": ("emECE (%)", True),
         "nll": ("NLL", False), "accuracy": ("accuracy (%)", True)}


def pb_of(base: str) -> str:
    return "pb" if base == UNCAL else f"{base}+pb"


def load(name: str):
    path = DATA / f"{name}.npz"
    if not path.exists():
        sys.exit(f"paper_table: {path} not found (expected ../shared/data/cifar beside the repository)")
    d = np.load(path)
    return check_logits(d["predictions"], input_kind="probs").astype(np.float64), d["ground_truth"]


def uncalibrated(x_cal, y_cal, x_test, y_test) -> dict:
    p = softmax(x_test)
    return {"smece": smooth_ece(p, y_test), "ece_em": ece(p, y_test, n_bins=15, binning="equal_mass"),
            "ece_ew": ece(p, y_test, n_bins=15, binning="equal_width"), "nll": nll(p, y_test),
            "error": 1.0 - accuracy(p, y_test), "cal_nll": nll(softmax(x_cal), y_cal), "fit_seconds": 0.0}


# ------------------------------------------------------------------ checkpoint
def read_checkpoint(path: Path) -> dict[tuple[str, int, str], dict]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["dataset"], r["split"], r["method"])] = r
    return done


def append_checkpoint(path: Path, record: dict) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record, allow_nan=False) + "\n")


# ------------------------------------------------------------------ tables
def _stats(vals):
    v = np.array([x for x in vals if x is not None], dtype=np.float64)
    if v.size == 0:
        return None, None, 0
    return float(v.mean()), (float(v.std(ddof=1)) if v.size > 1 else None), int(v.size)


def _value(rec, metric):
    if rec is None or rec.get("error"):
        return None
    if metric == "accuracy":
        return 1.0 - rec["values"]["error"]
    return rec["values"][metric]


def _cell(recs, metric, pct):
    mean, std, k = _stats([_value(r, metric) for r in recs])
    if mean is None:
        return "failed" if recs else "–"
    s = 100.0 if pct else 1.0
    d = 2 if pct else 4
    return f"{mean * s:.{d}f}" + (f" ± {std * s:.{d}f}" if std is not None else "")


def render(done: dict, datasets: list[str], n_splits: int, methods: list[str]) -> tuple[str, list[dict]]:
    md, rows_csv = [], []
    for ds in datasets:
        per = {m: [done[(ds, s, m)] for s in range(n_splits) if (ds, s, m) in done] for m in methods}
        finished = [s for s in range(n_splits) if all((ds, s, m) in done for m in methods)]
        if not any(per.values()):
            continue
        counts = sorted({len(v) for v in per.values()})
        md += [f"### {DATASETS[ds]}", "",
               f"Splits with every method done: {len(finished)} of {n_splits} "
               f"(per method: {', '.join(str(c) for c in counts)} splits). Test-set metrics, mean ± std over "
               "splits. Base = X alone, +PB = X with probability bounding fitted jointly "
               "(for Uncal.: PB alone). fallback = splits on which X+PB kept X's fit (a = 0, b = 1).", ""]
        head = ["method"] + [f"{t} {v}" for t, _ in SHOWN.values() for v in ("Base", "+PB")] + ["fallback"]
        md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for base, title in BASES.items():
            if base not in per and pb_of(base) not in per:
                continue
            rb, rp = per.get(base, []), per.get(pb_of(base), [])
            cells = [title]
            for metric, (_, pct) in SHOWN.items():
                cells += [_cell(rb, metric, pct), _cell(rp, metric, pct)]
            fb = [r["extra"].get("fallback") for r in rp if not r.get("error")]
            cells.append(f"{sum(bool(f) for f in fb)}/{len(fb)}" if fb else "–")
            md.append("| " + " | ".join(cells) + " |")
        for name, title in OTHERS.items():
            if name in per:
                cells = [title]
                for metric, (_, pct) in SHOWN.items():
                    cells += [_cell(per[name], metric, pct), ""]
                cells.append("")
                md.append("| " + " | ".join(cells) + " |")
        md.append("")
        # nesting and where +PB helps, split by split
        for base, title in BASES.items():
            if base == UNCAL or base not in per or pb_of(base) not in per:
                continue
            pairs = [(done[(ds, s, base)], done[(ds, s, pb_of(base))]) for s in range(n_splits)
                     if (ds, s, base) in done and (ds, s, pb_of(base)) in done]
            pairs = [(a, b) for a, b in pairs if not a.get("error") and not b.get("error")]
            if not pairs:
                continue
            ex_nll = [b["values"]["cal_nll"] - a["values"]["cal_nll"] for a, b in pairs]
            ex_obj = [b["extra"]["objective"] - a["extra"]["objective"] for a, b in pairs
                      if "objective" in a["extra"] and "objective" in b["extra"]]
            d_sm = [b["values"]["smece"] - a["values"]["smece"] for a, b in pairs]
            d_nll = [b["values"]["nll"] - a["values"]["nll"] for a, b in pairs]
            line = (f"- {title} → +PB over {len(pairs)} splits: test smECE {np.mean(d_sm) * 100:+.2f} pts "
                    f"(lower on {sum(v < 0 for v in d_sm)}), test NLL {np.mean(d_nll):+.4f} "
                    f"(lower on {sum(v < 0 for v in d_nll)}); nesting: cal. NLL of +PB above X by > 1e-6 on "
                    f"{sum(v > 1e-6 for v in ex_nll)}/{len(pairs)} splits (max {max(ex_nll):+.2e})")
            if ex_obj and base in ("ms", "dirichlet"):
                line += (f", fitted objective (NLL + ODIR penalty) above X on "
                         f"{sum(v > 1e-9 for v in ex_obj)}/{len(ex_obj)} (max {max(ex_obj):+.2e})")
            md.append(line)
        odir = [r["extra"].get("reg_lambda") for m in ("ms", "dirichlet") for r in per.get(m, [])
                if r["extra"].get("reg_lambda") is not None]
        if odir:
            md.append(f"- ODIR λ = μ chosen by 3-fold CV (MS, Dirichlet): "
                      f"{', '.join(f'{v:g}' for v in sorted(set(odir)))}")
        times = []
        for m in methods:
            if m != UNCAL and per.get(m):
                mean, _, _ = _stats([r["values"]["fit_seconds"] for r in per[m] if not r.get("error")])
                if mean is not None:
                    times.append(f"{m} {mean:.0f}")
        md += ["", f"Mean fit time per split (s, loaded shared machine): {', '.join(times)}.", ""]
        errs = sorted({f"- {m}: {r['error']}" for m in methods for r in per.get(m, []) if r.get("error")})
        md += errs + ([""] if errs else [])
        for m in methods:
            if not per.get(m):
                continue
            row = {"dataset": ds, "method": m, "n_splits": len(per[m]),
                   "n_failed": sum(bool(r.get("error")) for r in per[m])}
            for metric in list(SHOWN) + ["cal_nll", "fit_seconds"]:
                mean, std, _ = _stats([_value(r, metric) if metric in SHOWN else
                                       (None if r.get("error") else r["values"][metric]) for r in per[m]])
                row[f"{metric}_mean"], row[f"{metric}_std"] = mean, std
            fb = [r["extra"].get("fallback") for r in per[m] if not r.get("error")]
            row["n_fallback"] = sum(bool(f) for f in fb) if any(f is not None for f in fb) else None
            rows_csv.append(row)
    return "\n".join(md), rows_csv


def write_outputs(out: Path, done, datasets, n_splits, methods, header: list[str], footer: list[str]):
    body, rows = render(done, datasets, n_splits, methods)
    out.with_suffix(".md").write_text("\n".join(header) + "\n" + body + "\n" + "\n".join(footer) + "\n")
    if rows:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
        out.with_suffix(".csv").write_text(buf.getvalue())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--cal-size", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--methods", default=",".join(b for b in BASES if b != UNCAL),
                    help="base methods X; each runs with X+pb; PB alone, LB, DPB, PB-MLP are always added")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "paper_table"))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (default 1: run one process per dataset to use more cores)")
    ap.add_argument("--fresh", action="store_true", help="ignore (delete) an existing checkpoint")
    ap.add_argument("--render-only", action="store_true",
                    help="only rewrite the tables from the checkpoint (several runs may share one checkpoint)")
    ap.add_argument("--table-datasets", default=",".join(DATASETS),
                    help="datasets shown in the tables (default all; a run on a subset still shows the others' "
                         "checkpointed results)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, args.threads))

    bases = [b for b in args.methods.split(",") if b and b != UNCAL]
    wanted = [UNCAL, "pb"] + [m for b in bases for m in (b, pb_of(b))] + list(OTHERS)
    # run order: the rows of the checks first, the Adam-trained networks last
    order = [UNCAL, "ts", "pb", "ts+pb", "vs", "ms", "dirichlet", "ms+pb", "dirichlet+pb", "vs+pb", "ets", "ets+pb",
             "lb", "dpb", "pts", "pts+pb", "pb-mlp"]
    methods = sorted(wanted, key=lambda m: order.index(m) if m in order else len(order))
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = [d for d in datasets if d not in DATASETS]
    if unknown:
        sys.exit(f"paper_table: unknown dataset(s) {unknown}; known: {list(DATASETS)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ckpt = out.with_suffix(".jsonl")
    if args.fresh and ckpt.exists():
        ckpt.unlink()
    done = read_checkpoint(ckpt)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip() or "?"
    started = time.perf_counter()
    header = ["# X vs X+PB on real CIFAR outputs (paper Table 2 protocol)", ""]

    def footer():
        return ["## How this was made", "",
                "`python benchmarks/paper_table.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
                f"at commit {commit}, last update {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                f"{platform.machine()}, {time.perf_counter() - started:.0f} s in this run (2 cores shared "
                "with other jobs: times are noisy). Per-split records: the .jsonl checkpoint (not committed).",
                f"{args.splits} splits of {args.cal_size} calibration / rest test requested; split s permutes the "
                "rows with numpy.random.default_rng([seed, s]), seed "
                f"{args.seed}. The paper's protocol: VS unregularised (reg_lambda=0), MS / Dirichlet with ODIR λ = μ "
                "by 3-fold CV (reg='cv'), alone and inside X+PB; every other method at its defaults (PTS, "
                "PB-MLP: Adam, 500 epochs, batch 256). Std = standard deviation over splits (ddof 1).", ""]

    shown = [d for d in args.table_datasets.split(",") if d in DATASETS]
    table_methods = [UNCAL, "pb"] + [m for b in BASES if b != UNCAL for m in (b, pb_of(b))] + list(OTHERS)
    if args.render_only:
        datasets = []
    for ds in datasets:
        x, y = load(ds)
        for s, (cal, test) in enumerate(split_indices(len(y), args.splits, args.cal_size, args.seed)):
            # the λ read back by _reg_lambda comes from this block's memo, not from a second CV
            with reuse_fits():
                for m in methods:
                    if (ds, s, m) in done:
                        continue
                    rec = {"dataset": ds, "split": s, "method": m, "error": None, "extra": {}}
                    if m == UNCAL:
                        rec["values"] = uncalibrated(x[cal], y[cal], x[test], y[test])
                    else:
                        try:
                            values, warns, extra = fit_and_score(m, PAPER_PARAMS.get(m, {}), x[cal], y[cal], x[test],
                                                                 y[test])
                        except Exception as exc:  # a failure is a result
                            rec["error"], rec["values"] = f"{type(exc).__name__}: {exc}", None
                        else:
                            rec["values"], rec["warnings"] = values, warns
                            rec["extra"] = {k: v for k, v in extra.items()
                                            if not (isinstance(v, float) and not math.isfinite(v))}
                    if m in ("ms", "dirichlet") and rec["values"] is not None:
                        rec["extra"]["reg_lambda"] = _reg_lambda(m, x[cal], y[cal])
                    done[(ds, s, m)] = rec
                    append_checkpoint(ckpt, rec)
                    took = rec["values"]["fit_seconds"] if rec["values"] else float("nan")
                    print(f"{ds} split {s} {m}: {'ERROR ' + rec['error'] if rec['error'] else f'{took:.0f} s'}",
                          flush=True)
            # other runs may append to the same checkpoint: render from the file
            write_outputs(out, read_checkpoint(ckpt), shown, args.splits, table_methods, header, footer())
    write_outputs(out, read_checkpoint(ckpt), shown, args.splits, table_methods, header, footer())
    print(f"wrote {out.with_suffix('.md')} and .csv in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def _reg_lambda(method: str, x_cal, y_cal) -> float:
    """The λ the method's CV chose on this split (a refit with the same parameters and seed)."""
    from confcal.calibrators import METHODS

    return METHODS[method](**PAPER_PARAMS.get(method, {})).fit(x_cal, y_cal).reg_lambda_


if __name__ == "__main__":
    sys.exit(main())
