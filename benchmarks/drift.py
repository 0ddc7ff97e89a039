"""Drift check (``confcal drift``, :func:`confcal.metrics.drift.drift_check`): false alarms and real shifts.

1. False alarms. CIFAR-100 DenseNet-BC-100 test outputs (10000 rows): ``--draws`` random
   halves; the summary of one half (what ``confcal fit`` stores) against the other half.
   Target: at most 5% flagged at the default ``alpha = 0.01`` (also shown at 0.05).
   Same check on RarePlanes box scores (random halves of 194 boxes, with the 3 airports
   as domains: pooled + per-domain tests).
2. Real shifts. (a) digits (``../shared/data/domains/digits``): a one-hidden-layer MLP
   trained on 60% of one domain (as ``benchmarks/domain_generalization.py``), the summary
   of the held-out 40% of that domain against every other domain's logits (and, as a
   control, against a random half of the held-out rows). (b) RarePlanes: the box scores of
   one airport against another's. (c) KITTI BEV car scores against RarePlanes scores.

Writes ``benchmarks/results/drift.md``.
Usage: python benchmarks/drift.py [--draws 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from confcal.detection import match_detections
from confcal.io import atomic_write
from confcal.metrics.drift import DEFAULT_ALPHA, data_summary, drift_check

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))


def false_alarms(x, draws, seed, alphas, domains=None):
    rng = np.random.default_rng(seed)
    hits = {a: 0 for a in alphas}
    stats = []
    for _ in range(draws):
        perm = rng.permutation(len(x))
        a, b = perm[: len(x) // 2], perm[len(x) // 2:]
        s = data_summary(x[a], domains=None if domains is None else domains[a])
        for al in alphas:
            rows = drift_check(s, x[b], domains=None if domains is None else domains[b], alpha=al)
            hits[al] += any(r["drift"] for r in rows)
            if al == DEFAULT_ALPHA:
                stats.append(rows[0]["statistic"] / rows[0]["threshold"])
    return {a: hits[a] / draws for a in alphas}, float(np.max(stats))


def shift_row(name, ref, new, **kw):
    r = drift_check(data_summary(ref), new, **kw)[0]
    return f"| {name} | {r['n_ref']} | {r['n_new']} | {r['statistic']:.4f} | {r['threshold']:.4f} | " \
           f"{'**yes**' if r['drift'] else 'no'} |"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    t0 = time.perf_counter()
    alphas = (0.01, 0.05)
    lines = ["# Drift check: false-alarm rate and real shifts", "",
             "Two-sample KS test of the uncalibrated top-label confidence (raw score for boxes) against the "
             "1000 quantiles stored in the manifest; drift when D > sqrt(-ln(a/2)/2) sqrt((n+m)/(nm)), "
             f"a = alpha / (groups tested), default alpha = {DEFAULT_ALPHA}. "
             f"Produced by `python benchmarks/drift.py --draws {args.draws} --seed {args.seed}`.", "",
             "## False alarms on same-distribution data (random halves)", "",
             "| data | draws | tests per draw | flagged at alpha 0.01 | flagged at alpha 0.05 | max D / threshold (0.01) |",
             "|---|---|---|---|---|---|"]
    with np.load(DATA / "cifar" / "densenet-bc-100-cifar-100.npz") as z:
        cifar = np.log(np.clip(z["predictions"].astype(np.float64), 1e-300, None))
    far, worst = false_alarms(cifar, args.draws, args.seed, alphas)
    lines.append(f"| CIFAR-100 DenseNet-BC-100 (10000 rows) | {args.draws} | 1 | {100 * far[0.01]:.1f}% | "
                 f"{100 * far[0.05]:.1f}% | {worst:.3f} |")
    rp = DATA / "detection" / "rareplanes_solaris_airports"
    m = match_detections(rp / "gt_coco.json", rp / "detections.json", crowd="fp", domain_key="location")
    far, worst = false_alarms(m.score, args.draws, args.seed, alphas, domains=m.domain)
    lines.append(f"| RarePlanes box scores (194 boxes, 3 airports) | {args.draws} | 4 (pooled + 3 airports) | "
                 f"{100 * far[0.01]:.1f}% | {100 * far[0.05]:.1f}% | {worst:.3f} |")
    print("\n".join(lines[-2:]), flush=True)

    lines += ["", "## Real shifts (alpha 0.01, pooled test)", "",
              "| reference (calibration data) -> new data | n_ref | n_new | KS D | threshold | drift flagged |",
              "|---|---|---|---|---|---|"]
    from domain_generalization import DATASETS, load_domain, preprocess, train_source_model

    names = DATASETS["digits"]
    raw = {d: load_domain("digits", d) for d in names}
    for source in names:
        x, y = raw[source]
        x = preprocess("digits", x)
        rng = np.random.default_rng(args.seed)
        perm = rng.permutation(len(y))
        n_train = int(round(0.6 * len(y)))
        forward = train_source_model(x[perm[:n_train]], y[perm[:n_train]], hidden=128, seed=args.seed,
                                     epochs=args.epochs)
        ho, _ = forward(x[perm[n_train:]])
        half = len(ho) // 2
        lines.append(shift_row(f"digits {source} held-out half -> other half (control)", ho[:half], ho[half:]))
        for target in names:
            if target != source:
                lt, _ = forward(preprocess("digits", raw[target][0]))
                lines.append(shift_row(f"digits model on {source}: {source} held-out -> {target}", ho, lt))
        print(lines[-1], flush=True)
    locs = sorted(np.unique(m.domain))
    for a in locs:
        for b in locs:
            if a != b:
                lines.append(shift_row(f"RarePlanes {a} -> {b}", m.score[m.domain == a], m.score[m.domain == b]))
    kt = DATA / "detection" / "kitti_bev_cars"
    k = np.load(kt / "matched_iou50.npz")["score"]
    lines.append(shift_row("KITTI BEV cars -> RarePlanes (all airports)", k, m.score))
    lines.append(shift_row("RarePlanes (all airports) -> KITTI BEV cars", m.score, k))
    lines += ["", f"Total time {time.perf_counter() - t0:.0f} s."]
    RESULTS.mkdir(exist_ok=True)
    with atomic_write(RESULTS / "drift.md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
