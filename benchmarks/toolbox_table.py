"""The rest of the toolbox (issue 13) on real outputs: isotonic, histogram binning, BBQ,
scaling-binning, beta and Platt one-vs-rest next to temperature scaling.

Part ``cifar``: the four CIFAR softmax outputs in ``../shared/data/cifar`` (their log is
used as logits), 10 seeded random 5,000/5,000 calibration/test splits
(:func:`confcal.evaluation.compare_methods`, seed 0): test ECE (15 equal-width bins),
smECE, NLL, accuracy and the accuracy change against the uncalibrated outputs, mean ±
standard error over splits. ``-top`` rows (and ``scaling-binning``) keep the arg-max by
construction; the check "acc. kept" says whether every split's test predictions are
unchanged.

Part ``detection``: box scores of ``../shared/data/detection/*/matched_iou50.npz`` (label =
true positive at IoU 0.5), clipped to [0, 1]. KITTI: out of fold, 5 folds grouped by frame;
RarePlanes: leave one airport out (3 folds). Binary methods get the 2-column logits
``[0, logit(score)]``; ``det-*`` methods take the 1-D scores. D-ECE (15 equal-width bins),
NLL and Brier of the pooled out-of-fold predictions.

    python benchmarks/toolbox_table.py [--part cifar|detection|all] [--splits 10]
        [--out benchmarks/results/toolbox_table]

Writes ``<out>_cifar.{md,json}`` and/or ``<out>_detection.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.evaluation import compare_methods
from confcal.evaluation.compare import UNCALIBRATED, format_cell
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"

DATASETS = {
    "densenet-bc-100-cifar-100": "DenseNet-BC-100, CIFAR-100",
    "wideresnet-16-4-cifar-100": "WideResNet-16-4, CIFAR-100",
    "wideresnet-16-4-cifar-10": "WideResNet-16-4, CIFAR-10",
    "lenet-5-cifar-10": "LeNet-5, CIFAR-10",
}
CIFAR_METHODS = ["ts", "isotonic-top", "histogram-binning-top", "bbq-top", "scaling-binning",
                 ("scaling-binning (scaler=ts)", "scaling-binning", {"scaler": "ts"}),
                 ("scaling-binning (scaler=platt)", "scaling-binning", {"scaler": "platt"}),
                 "isotonic", "histogram-binning", "bbq", "scaling-binning-marginal", "beta", "platt-ovr"]
BINARY_METHODS = ["isotonic", "histogram-binning", "bbq", "scaling-binning-marginal", "beta", "platt-ovr"]
BOX_METHODS = ["det-ts", "det-platt", "det-beta"]
SHOWN = {"ece_ew": ("ECE (%)", True), "smece": ("smECE (%)", True), "nll": ("NLL", False),
         "error": ("accuracy (%)", True), "acc_change": ("Δacc (pp)", True)}


def _git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - provenance only
        return "unknown"


def _header(title: str) -> list[str]:
    return [f"# {title}", "",
            f"confcal {_git_rev()}, {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}, "
            f"Python {platform.python_version()}, numpy {np.__version__}", ""]


def cifar(splits: int, out: Path, names) -> None:
    lines = _header("Toolbox calibrators on CIFAR outputs (issue 13)")
    lines += [f"{splits} random 5,000/5,000 calibration/test splits (seed 0), mean ± standard error over "
              "splits. ECE: 15 equal-width bins, top-label. Δacc: test accuracy minus the uncalibrated "
              "accuracy (percentage points). 'kept' = test accuracy exactly equal to the uncalibrated one on "
              "every split (Δacc == 0.0), 'moved' otherwise. 'keeps arg-max' = by construction.", ""]
    dump = {}
    for name in names:
        d = np.load(DATA / "cifar" / f"{name}.npz")
        x, y = d["predictions"], d["ground_truth"]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            res = compare_methods(x, y, CIFAR_METHODS, n_splits=splits, cal_size=5000, random_state=0,
                                  input_kind="probs")
        seconds = time.perf_counter() - t0
        dump[name] = res.to_dict()
        lines += [f"## {DATASETS[name]} ({seconds:.0f} s)", "",
                  "| method | keeps arg-max | " + " | ".join(t for t, _ in SHOWN.values()) + " |",
                  "|---|---|" + "---|" * len(SHOWN)]
        for row in res.rows:
            cells = []
            for key, (_, pct) in SHOWN.items():
                if key == "error":
                    m = row.mean("error")
                    cells.append("–" if m is None else format_cell(1 - m, row.se("error"), percent=True, digits=2))
                else:
                    cells.append(format_cell(row.mean(key), row.se(key), percent=pct, digits=2 if pct else 4))
            if row.method == UNCALIBRATED:
                kept = "–"
            else:
                deltas = [v for v in row.values["acc_change"] if v is not None]
                by_design = getattr(METHODS[row.method], "keeps_argmax", None)
                exact = all(v == 0.0 for v in deltas)
                kept = ("yes" if by_design or row.method == "ts" else "no") + (", kept" if exact else ", moved")
            label = row.label if row.n_ok == len(row.errors) else f"{row.label} [{row.n_ok}/{len(row.errors)}]"
            lines.append(f"| {label} | {kept} | " + " | ".join(cells) + " |")
        lines.append("")
        print("\n".join(lines[-len(res.rows) - 4:]), flush=True)
    (out.parent / f"{out.name}_cifar.md").write_text("\n".join(lines) + "\n")
    (out.parent / f"{out.name}_cifar.json").write_text(json.dumps(dump, allow_nan=False, separators=(",", ":")))


def _clip_scores(s):
    return np.clip(s, 0.0, 1.0)


def _binary_logits(s):
    eps = np.finfo(np.float64).eps
    p = np.clip(s, eps, 1 - eps)
    return np.column_stack([np.zeros_like(p), np.log(p) - np.log1p(-p)])


def _oof(method, s, y, folds):
    out = np.full(s.size, np.nan)
    for test in folds:
        train = np.setdiff1d(np.arange(s.size), test)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            if method.startswith("det-"):
                kw = {"clip_scores": True} if method == "det-ts" else {}
                cal = METHODS[method](**kw).fit(s[train], y[train])
                out[test] = cal.predict_proba(s[test])[:, 1]
            else:
                cal = METHODS[method]().fit(_binary_logits(s[train]), y[train])
                out[test] = cal.predict_proba(_binary_logits(s[test]))[:, 1]
    return out


def detection(out: Path) -> None:
    lines = _header("Toolbox calibrators on detector box scores (issue 13)")
    lines += ["Pooled out-of-fold predictions. D-ECE: 15 equal-width bins on P(true positive). Binary "
              "methods see the logits [0, logit(clip(score))]; det-* methods see the 1-D scores "
              "(det-ts with clip_scores=True).", ""]
    sets = {"kitti_bev_cars": "KITTI BEV cars: 5 folds grouped by frame",
            "rareplanes_solaris_airports": "RarePlanes: leave one airport out"}
    for name, title in sets.items():
        d = np.load(DATA / "detection" / name / "matched_iou50.npz")
        raw, y, img = d["score"].astype(np.float64), d["label"].astype(np.int64), d["image_id"]
        s = _clip_scores(raw)
        uniq = np.unique(img)
        if name.startswith("kitti"):
            perm = np.random.default_rng(0).permutation(uniq)
            folds = [np.flatnonzero(np.isin(img, perm[i::5])) for i in range(5)]
        else:
            folds = [np.flatnonzero(img == u) for u in uniq]
        lines += [f"## {title} ({s.size} boxes, precision {y.mean():.3f})", "",
                  "| method | D-ECE (%) | NLL | Brier |", "|---|---|---|---|",
                  f"| raw score (clipped) | {100 * detection_ece(s, y, 15):.2f} | {binary_nll(s, y):.4f} | "
                  f"{binary_brier(s, y):.4f} |"]
        for method in BOX_METHODS + BINARY_METHODS:
            if method not in METHODS:
                lines.append(f"| {method} | not registered | | |")
                continue
            try:
                p = _oof(method, raw if method == "det-platt" else s, y, folds)
            except Exception as exc:  # noqa: BLE001 - a failing method is a result
                lines.append(f"| {method} | failed: {type(exc).__name__}: {exc} | | |")
                continue
            lines.append(f"| {method} | {100 * detection_ece(p, y, 15):.2f} | {binary_nll(p, y):.4f} | "
                         f"{binary_brier(p, y):.4f} |")
        lines.append("")
    (out.parent / f"{out.name}_detection.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["cifar", "detection", "all"], default="all")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "toolbox_table"))
    args = ap.parse_args(argv)
    if not (DATA / "cifar").exists():
        sys.exit(f"toolbox_table: {DATA} not found (expected ../shared/data beside the repository)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.part in ("detection", "all"):
        detection(out)
    if args.part in ("cifar", "all"):
        cifar(args.splits, out, [n for n in args.datasets.split(",") if n])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
