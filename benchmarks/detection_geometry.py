"""Geometry-dependent box calibration on real detector outputs, side by side with netcal 1.4.

Sets (../shared/data/detection), matched at IoU >= 0.5, out-of-fold predictions pooled:

* KITTI BEV cars (4948 boxes, 374 frames), box feature ``range`` (metres from the sensor);
  5 folds grouped by frame;
* RarePlanes (194 boxes, 3 airports), box features ``cx, cy, w, h``; leave one airport out.
  The scenes' extents are not in the data: each scene's frame is the bounding rectangle of all
  its GT and detected boxes, so ``cx, cy`` are positions within that rectangle and ``w, h``
  fractions of it (an approximation of the image tile, said so in the results).

Methods: raw scores (clipped to [0, 1]); ``det-platt`` (score only); ``det-platt-geo``,
``det-beta-geo``, ``det-hist-geo`` (confcal, on the raw features: they standardise / scale them
themselves); netcal's ``LogisticCalibrationDependent`` and ``BetaCalibrationDependent``
(``detection=True``, default ``mle`` / ``momentum`` fits) on the confidence and the features
min-max scaled into [0, 1] on each training fold (netcal's box features are expected in [0, 1]),
in a separate venv (``--netcal-python``; netcal is not a confcal dependency).

Metrics on the pooled out-of-fold predictions: D-ECE (10 equal-width confidence bins), geometry
D-ECE (confidence x features: KITTI 5 x 5 bins of range; RarePlanes 3 x 2^4 bins of cx, cy, w, h),
binary NLL and Brier, each with a 95% bootstrap interval (``--bootstrap`` resamples of boxes), and
the paired bootstrap interval of confcal minus netcal for the like-for-like pairs (det-platt-geo vs
LogisticCalibrationDependent, det-beta-geo vs BetaCalibrationDependent). Fit time: summed over
the folds (confcal's includes its cross-validation of the penalty).

Usage:  python benchmarks/detection_geometry.py [--netcal-python /tmp/cc-geometry/benchvenv/bin/python]
        [--bootstrap 500] [--out benchmarks/results/detection_geometry.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.detection import match_detections
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece
from confcal.metrics.detection_geometry import geometry_ece

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "detection"
EPS = 1e-6


def grouped_folds(groups, k, seed=0):
    ids = np.unique(groups.astype(str))
    rng = np.random.default_rng(seed)
    f_of = {g: i % k for i, g in enumerate(ids[rng.permutation(ids.size)])}
    return np.asarray([f_of[g] for g in groups.astype(str)])


def kitti():
    d = DATA / "kitti_bev_cars"
    m = match_detections(d / "gt.json", d / "detections.json")
    return {"name": "KITTI BEV cars", "score": m.score, "y": m.correct.astype(np.int64),
            "features": ["range"], "feat": m.geometry["range"][:, None],
            "fold": grouped_folds(m.image_id, 5), "folds": "5 folds grouped by frame",
            "geo_bins": (5, 5), "hist": {"n_bins": 5, "n_feature_bins": 3}, "netcal_scale": True,
            "image_id": m.image_id}


def rareplanes_frames(gt: dict, dets: list):
    """Shift each scene's boxes so its frame (bounding rectangle of all boxes) starts at 0, and
    give its image that width/height (the data has no tile extent)."""
    boxes = {}
    for r in gt["annotations"] + dets:
        boxes.setdefault(r["image_id"], []).append(r["bbox"])
    frame = {}
    for im, bs in boxes.items():
        b = np.asarray(bs, dtype=np.float64)
        x0, y0 = b[:, 0].min(), b[:, 1].min()
        frame[im] = (x0, y0, (b[:, 0] + b[:, 2]).max() - x0, (b[:, 1] + b[:, 3]).max() - y0)

    def shift(r):
        x0, y0, _, _ = frame[r["image_id"]]
        return {**r, "bbox": [r["bbox"][0] - x0, r["bbox"][1] - y0, *r["bbox"][2:]]}

    g = {**gt, "images": [{**im, "width": frame[im["id"]][2], "height": frame[im["id"]][3]}
                          for im in gt["images"]], "annotations": [shift(a) for a in gt["annotations"]]}
    return g, [shift(r) for r in dets]


def rareplanes():
    d = DATA / "rareplanes_solaris_airports"
    gt, dets = rareplanes_frames(json.load(open(d / "gt_coco.json")), json.load(open(d / "detections.json")))
    m = match_detections(gt, dets, domain_key="location", geometry=True)
    names = ["cx", "cy", "w", "h"]
    airports = np.unique(m.domain)
    return {"name": "RarePlanes (3 airports)", "score": m.score, "y": m.correct.astype(np.int64),
            "features": names, "feat": np.stack([m.geometry[k] for k in names], axis=1),
            "fold": np.searchsorted(airports, m.domain), "folds": "leave one airport out (3 folds)",
            "geo_bins": (3, 2), "hist": {"n_bins": 3, "n_feature_bins": 2}, "netcal_scale": False,
            "image_id": m.image_id}


def confcal_oof(ds):
    s, y, f, fold = ds["score"], ds["y"], ds["feat"], ds["fold"]
    names = ",".join(ds["features"])
    makers = {
        "det-platt": lambda: METHODS["det-platt"](min_samples=1),
        "det-platt-geo": lambda: METHODS["det-platt-geo"](box_features=names),
        "det-beta-geo": lambda: METHODS["det-beta-geo"](box_features=names),
        "det-hist-geo": lambda: METHODS["det-hist-geo"](box_features=names, **ds["hist"]),
    }
    preds, times = {"raw": np.clip(s, 0, 1)}, {"raw": 0.0}
    for name, make in makers.items():
        p = np.empty(s.shape[0])
        total = 0.0
        for k in np.unique(fold):
            tr, te = fold != k, fold == k
            cal = make()
            side = {} if name == "det-platt" else {"features": f[tr]}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CalibrationWarning)
                t0 = time.perf_counter()
                cal.fit(s[tr], y[tr], **side)
                total += time.perf_counter() - t0
            p[te] = cal.predict_proba(s[te], **({} if name == "det-platt" else {"features": f[te]}))[:, 1]
        preds[name], times[name] = p, total
    return preds, times


def netcal_oof(ds, python):
    s, y, f, fold = ds["score"], ds["y"], ds["feat"], ds["fold"]
    arrays = {"conf": np.clip(s, EPS, 1 - EPS), "label": y, "fold": fold}
    for k in np.unique(fold):
        tr, te = fold != k, fold == k
        if ds["netcal_scale"]:
            lo, hi = f[tr].min(0), f[tr].max(0)
            sc = lambda v: np.clip((v - lo) / np.where(hi > lo, hi - lo, 1.0), 0, 1)  # noqa: E731
        else:
            sc = lambda v: np.clip(v, 0, 1)  # noqa: E731
        arrays[f"feat_train_{k}"], arrays[f"feat_test_{k}"] = sc(f[tr]), sc(f[te])
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **arrays)
        subprocess.run([python, str(ROOT / "benchmarks" / "_netcal_geometry.py"), str(src), str(dst)], check=True,
                       stdout=subprocess.DEVNULL)
        out = np.load(dst)
        names = sorted({k.rsplit("_", 1)[0] for k in out.files})
        return ({n: np.clip(out[f"{n}_p"], 0, 1) for n in names}, {n: float(out[f"{n}_time"].sum()) for n in names})


def metrics(p, y, f, geo_bins):
    return {"d_ece": detection_ece(p, y, 10), "geo_d_ece": geometry_ece(p, y, f, *geo_bins),
            "nll": binary_nll(p, y), "brier": binary_brier(p, y)}


def bootstrap(preds, y, f, geo_bins, n_boot, seed=0):
    rng = np.random.default_rng(seed)
    n = y.shape[0]
    draws = {m: [] for m in preds}
    ranges = [(float(f[:, j].min()), float(f[:, j].max())) for j in range(f.shape[1])]
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        for m, p in preds.items():
            draws[m].append({"d_ece": detection_ece(p[idx], y[idx], 10),
                             "geo_d_ece": geometry_ece(p[idx], y[idx], f[idx], *geo_bins, feature_ranges=ranges),
                             "nll": binary_nll(p[idx], y[idx]), "brier": binary_brier(p[idx], y[idx])})
    return {m: {k: np.asarray([d[k] for d in v]) for k in v[0]} for m, v in draws.items()}


KEYS = ("d_ece", "geo_d_ece", "nll", "brier")
PAIRS = (("det-platt-geo", "netcal_logistic_dependent"), ("det-beta-geo", "netcal_beta_dependent"))


def run_set(ds, python, n_boot):
    preds, times = confcal_oof(ds)
    if python:
        p2, t2 = netcal_oof(ds, python)
        preds.update(p2)
        times.update(t2)
    y, f = ds["y"], ds["feat"]
    ranges = [(float(f[:, j].min()), float(f[:, j].max())) for j in range(f.shape[1])]
    point = {m: {**metrics(p, y, f, ds["geo_bins"]),
                 "geo_d_ece": geometry_ece(p, y, f, *ds["geo_bins"], feature_ranges=ranges)} for m, p in preds.items()}
    boots = bootstrap(preds, y, f, ds["geo_bins"], n_boot)
    return preds, times, point, boots


def ci(a):
    lo, hi = np.percentile(a, [2.5, 97.5])
    return f"[{lo:.4f}, {hi:.4f}]"


def render(ds, times, point, boots, n_boot) -> str:
    out = [f"## {ds['name']}: {len(ds['y'])} boxes, precision {ds['y'].mean():.3f}; features "
           f"{', '.join(ds['features'])}; {ds['folds']}", "",
           f"geometry D-ECE: {ds['geo_bins'][0]} confidence bins x {ds['geo_bins'][1]} bins per feature "
           f"(equal width over the set's range); D-ECE: 10 bins. 95% intervals: {n_boot} bootstrap resamples "
           "of boxes.", "",
           "| method | D-ECE | geometry D-ECE | NLL | Brier | fit time (s, all folds) |",
           "|---|---|---|---|---|---|"]
    for m in point:
        cells = [f"{point[m][k]:.4f} {ci(boots[m][k])}" for k in KEYS]
        out.append(f"| {m} | " + " | ".join(cells) + f" | {times[m]:.3f} |")
    pairs = [(a, b) for a, b in PAIRS if a in point and b in point]
    if pairs:
        out += ["", "confcal minus netcal (paired bootstrap; negative = confcal better; 'ok' when the interval's "
                "lower end is <= 0, i.e. confcal is not worse beyond the interval):", "",
                "| pair | " + " | ".join(KEYS) + " | fit-time ratio (netcal / confcal) |",
                "|---|" + "---|" * len(KEYS) + "---|"]
        for a, b in pairs:
            cells = []
            for k in KEYS:
                diff = boots[a][k] - boots[b][k]
                lo, hi = np.percentile(diff, [2.5, 97.5])
                cells.append(f"{point[a][k] - point[b][k]:+.4f} [{lo:+.4f}, {hi:+.4f}] {'ok' if lo <= 0 else 'WORSE'}")
            out.append(f"| {a} vs {b} | " + " | ".join(cells) + f" | {times[b] / max(times[a], 1e-12):.1f}x |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--netcal-python", default=None, help="python of a venv with netcal 1.4 (omit: confcal only)")
    ap.add_argument("--bootstrap", type=int, default=500)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sections = [f"# Geometry-dependent box calibration (benchmarks/detection_geometry.py)\n\n"
                f"Run: `python benchmarks/detection_geometry.py --bootstrap {args.bootstrap}"
                f"{' --netcal-python VENV/bin/python' if args.netcal_python else ''}` "
                f"(netcal {'1.4.0 in a separate venv' if args.netcal_python else 'not run'}), "
                f"{time.strftime('%Y-%m-%d', time.gmtime())}, this machine (2 shared CPU cores)."]
    for load in (kitti, rareplanes):
        ds = load()
        _, times, point, boots = run_set(ds, args.netcal_python, args.bootstrap)
        sections.append(render(ds, times, point, boots, args.bootstrap))
        print(sections[-1], flush=True)
    text = "\n\n".join(sections) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
