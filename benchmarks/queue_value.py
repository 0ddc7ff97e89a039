"""The annotation queue's gain from calibration, measured on the real detection sets.

One queue over two sensors (../shared/data/detection): KITTI BEV frames (LiDAR) and RarePlanes
airport scenes (satellite) cut into ``--tile-m`` x ``--tile-m`` metre tiles (a box belongs to the
tile of its centre). Tiles with at least one detection or GT box take part. Every box gets a
P(true positive) under three scorings, each fitted out of fold (5 folds grouped by tile; a tile's
boxes are scored by maps that never saw that tile):

* ``raw``: the detector's score clipped to [0, 1];
* ``per-sensor``: ``det-platt`` with one map per sensor (``domains=``);
* ``geometry``: ``det-platt-geo`` fitted per sensor on its box geometry (KITTI: ``range``;
  RarePlanes: ``cx, cy, w, h`` within the scene's frame, as in detection_geometry.py).

A tile's priority is the sum (or max, ``--aggregate``) of its boxes' binary entropies. For
budgets of 5%, 10% and 20% of the tiles, the table gives the share of the model's errors (false
positives plus missed GT boxes) inside the top tiles, with 95% bootstrap intervals (resampling
tiles; the out-of-fold probabilities are fixed), the paired difference to ``raw``, a random
queue's expected share (= the budget) and the best possible share (tiles ranked by their own error
count).

Usage:  python benchmarks/queue_value.py [--bootstrap 1000] [--aggregate sum] [--out benchmarks/results/queue_value.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.detection import match_detections

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection_geometry import DATA, grouped_folds, rareplanes_frames  # noqa: E402

BUDGETS = (0.05, 0.10, 0.20)


def _centres(boxes):
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, max(4, len(boxes[0]) if len(boxes) else 4))
    return b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2


def load(tile_m: float):
    """Per box: sensor, tile, score, label, features; per tile: missed GT count."""
    rows = []
    missed = {}
    # KITTI: one tile per frame
    d = DATA / "kitti_bev_cars"
    gt = json.load(open(d / "gt.json"))
    m = match_detections(gt, d / "detections.json")
    matched = set(int(j) for j in m._matched_gt if j >= 0)
    for j, a in enumerate(gt["annotations"]):
        if j not in matched:
            key = f"kitti/{a['image_id']}"
            missed[key] = missed.get(key, 0) + 1
    kt = np.asarray([f"kitti/{i}" for i in m.image_id])
    rows.append(("kitti", kt, m.score, m.correct, m.geometry["range"][:, None]))
    # RarePlanes: tiles of tile_m metres within each scene
    d = DATA / "rareplanes_solaris_airports"
    gt, dets = rareplanes_frames(json.load(open(d / "gt_coco.json")), json.load(open(d / "detections.json")))
    m = match_detections(gt, dets, geometry=True)
    matched = set(int(j) for j in m._matched_gt if j >= 0)

    def tile(im, x, y):
        return f"rareplanes/{im}/{int(x // tile_m)}_{int(y // tile_m)}"

    for j, a in enumerate(gt["annotations"]):
        if j not in matched:
            x, y = _centres([a["bbox"]])
            key = tile(a["image_id"], x[0], y[0])
            missed[key] = missed.get(key, 0) + 1
    x, y = _centres([r["bbox"] for r in dets])
    rt = np.asarray([tile(r["image_id"], xi, yi) for r, xi, yi in zip(dets, x, y)])
    rows.append(("rareplanes", rt, m.score, m.correct,
                 np.stack([m.geometry[k] for k in ("cx", "cy", "w", "h")], axis=1)))
    return rows, missed


def oof_probs(rows, n_folds=5, seed=0):
    tiles = np.concatenate([r[1] for r in rows])
    fold = grouped_folds(tiles, n_folds, seed)
    sensor = np.concatenate([[r[0]] * len(r[1]) for r in rows])
    s = np.concatenate([r[2] for r in rows])
    y = np.concatenate([r[3] for r in rows]).astype(np.int64)
    out = {"raw": np.clip(s, 0, 1), "per-sensor": np.empty(s.size), "geometry": np.empty(s.size)}
    feats = {r[0]: r[4] for r in rows}
    offset = {}
    start = 0
    for r in rows:
        offset[r[0]] = (start, start + len(r[1]))
        start += len(r[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for k in range(n_folds):
            tr, te = fold != k, fold == k
            per = METHODS["det-platt"](min_samples=10).fit(s[tr], y[tr], domains=sensor[tr])
            out["per-sensor"][te] = per.predict_proba(s[te], domains=sensor[te])[:, 1]
            for name, (a, b) in offset.items():
                idx = np.arange(a, b)
                f = feats[name]
                trs, tes = idx[tr[a:b]], idx[te[a:b]]
                if tes.size == 0:
                    continue
                geo = METHODS["det-platt-geo"]().fit(s[trs], y[trs], features=f[trs - a])
                out["geometry"][tes] = geo.predict_proba(s[tes], features=f[tes - a])[:, 1]
    return tiles, y, out


def entropy(p):
    q = np.clip(p, 1e-12, 1 - 1e-12)
    return -(q * np.log(q) + (1 - q) * np.log(1 - q))


def tile_table(tiles, y, probs, missed, aggregate):
    names = sorted(set(tiles.tolist()) | set(missed))
    index = {t: i for i, t in enumerate(names)}
    ti = np.asarray([index[t] for t in tiles])
    errors = np.bincount(ti, weights=(y == 0).astype(float), minlength=len(names))
    errors += np.asarray([missed.get(t, 0) for t in names], dtype=float)
    prio = {}
    for m, p in probs.items():
        u = entropy(p)
        if aggregate == "sum":
            prio[m] = np.bincount(ti, weights=u, minlength=len(names))
        else:
            pr = np.zeros(len(names))
            np.maximum.at(pr, ti, u)
            prio[m] = pr
    return names, errors, prio


def share(prio, errors, budget, rng=None):
    """Share of all errors inside the top ``ceil(budget * n_tiles)`` tiles (ties broken at random)."""
    n = errors.size
    k = int(np.ceil(budget * n))
    jitter = (rng or np.random.default_rng(0)).uniform(size=n) * 1e-12
    top = np.argsort(-(prio + jitter), kind="stable")[:k]
    return float(errors[top].sum() / errors.sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--tile-m", type=float, default=100.0)
    ap.add_argument("--aggregate", choices=["sum", "max"], default="sum")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows, missed = load(args.tile_m)
    tiles, y, probs = oof_probs(rows)
    names, errors, prio = tile_table(tiles, y, probs, missed, args.aggregate)
    n_tiles = len(names)
    n_k = sum(t.startswith("kitti/") for t in names)
    rng = np.random.default_rng(0)
    boots = {m: {b: [] for b in BUDGETS} for m in [*prio, "best"]}
    for _ in range(args.bootstrap):
        idx = rng.integers(0, n_tiles, n_tiles)
        e = errors[idx]
        for b in BUDGETS:
            for m in prio:
                boots[m][b].append(share(prio[m][idx], e, b, rng))
            boots["best"][b].append(share(e, e, b, rng))
    point = {m: {b: share(prio[m], errors, b) for b in BUDGETS} for m in prio}
    point["best"] = {b: share(errors, errors, b) for b in BUDGETS}
    lines = [f"# Annotation-queue value of calibration (benchmarks/queue_value.py)", "",
             f"Run: `python benchmarks/queue_value.py --bootstrap {args.bootstrap} --tile-m {args.tile_m:g} "
             f"--aggregate {args.aggregate}`, {time.strftime('%Y-%m-%d', time.gmtime())}, "
             f"{time.perf_counter() - t0:.1f} s on this machine.", "",
             f"{n_tiles} tiles with a detection or a GT box ({n_k} KITTI frames, {n_tiles - n_k} RarePlanes "
             f"{args.tile_m:g} m tiles), {int(errors.sum())} errors ({int((y == 0).sum())} false positives, "
             f"{int(sum(missed.values()))} missed GT). Tile priority: {args.aggregate} of box entropies. "
             f"Share of all errors in the top tiles; 95% bootstrap intervals over tiles; 'vs raw': paired "
             "difference.", "",
             "| scoring | " + " | ".join(f"top {int(b * 100)}% ({int(np.ceil(b * n_tiles))} tiles)" for b in BUDGETS)
             + " |", "|---|" + "---|" * len(BUDGETS)]
    for m in [*prio, "best"]:
        cells = []
        for b in BUDGETS:
            lo, hi = np.percentile(boots[m][b], [2.5, 97.5])
            cell = f"{point[m][b]:.3f} [{lo:.3f}, {hi:.3f}]"
            if m not in ("raw", "best"):
                d = np.asarray(boots[m][b]) - np.asarray(boots["raw"][b])
                dlo, dhi = np.percentile(d, [2.5, 97.5])
                cell += f"; vs raw {point[m][b] - point['raw'][b]:+.3f} [{dlo:+.3f}, {dhi:+.3f}]"
            cells.append(cell)
        label = {"best": "best possible (by true errors)"}.get(m, m)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| random queue (expected) | " + " | ".join(f"{b:.3f}" for b in BUDGETS) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
