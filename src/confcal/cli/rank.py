"""``confcal rank``: the annotation queue of tiles (images) by calibrated uncertainty."""

from __future__ import annotations

import csv
import math

import numpy as np

from confcal.active import AGGREGATIONS, UNCERTAINTIES, rank_tiles
from confcal.cli.detections import load_domain_map
from confcal.detection import load_coco_detections, load_coco_gt
from confcal.io import atomic_write, load_array, load_calibrator

COLUMNS = ["rank", "image_id", "domain", "priority", "n_boxes", "top_score"]


def register(sub):
    p = sub.add_parser("rank", help="rank image tiles for annotation by calibrated uncertainty",
                       description="Calibrate every box score with a det-ts/det-platt manifest, compute a per-box "
                                   "uncertainty, aggregate it per image tile, and write the queue as CSV "
                                   f"(columns: {', '.join(COLUMNS)}). top_score is the tile's largest calibrated "
                                   "box probability.")
    p.add_argument("--detections", required=True, help="COCO results JSON")
    p.add_argument("--calibrator", help="det-ts/det-platt manifest from 'confcal fit'; without it the raw "
                                        "scores (clipped to [0, 1]) are used")
    p.add_argument("--by", choices=UNCERTAINTIES, default="entropy", help="per-box uncertainty (default entropy)")
    p.add_argument("--aggregate", choices=AGGREGATIONS, default="max", help="per-tile aggregation (default max)")
    p.add_argument("--threshold", type=float,
                   help="with --aggregate count: count boxes whose uncertainty is >= this")
    p.add_argument("--per-domain-quota", nargs="?", const="equal", metavar="SHARE",
                   help="guarantee every domain a share of every prefix of the queue: a number in (0, 1] "
                        "per domain, or no value for equal shares")
    p.add_argument("--gt", help="COCO GT JSON, to read each image's domain from its 'images' entries")
    p.add_argument("--domain-key", default="domain", help="key of the GT 'images' entries with the domain id")
    p.add_argument("--domain-map", help="JSON file {image_id: domain}")
    p.add_argument("--mc-scores", metavar="SPEC",
                   help="with --by bald: Monte-Carlo box scores (n_samples_mc, n_boxes), file order")
    p.add_argument("-o", "--output", required=True, help="queue CSV")
    p.set_defaults(func=run)


def _domains(dets, args):
    images = {}
    if args.gt:
        for im in load_coco_gt(args.gt)["images"]:
            if args.domain_key in im:
                images[im["id"]] = str(im[args.domain_key])
    dmap = load_domain_map(args.domain_map)
    if dmap:
        for k, v in dmap.items():
            images[k] = str(v)
            images[str(k)] = str(v)
    have_any = bool(images) or any("domain" in r for r in dets)
    if not have_any:
        return None
    out = [str(r["domain"]) if "domain" in r else images.get(r["image_id"]) for r in dets]
    missing = [dets[i]["image_id"] for i, v in enumerate(out) if v is None]
    if missing:
        raise ValueError(f"domains: no domain for image_id {missing[0]!r} ({len(missing)} boxes); give it in "
                         "--gt images, --domain-map, or the detection records")
    return np.asarray(out)


def run(args) -> int:
    dets = load_coco_detections(args.detections)
    if not dets:
        raise ValueError(f"--detections: {args.detections} holds no detections")
    scores = np.asarray([float(r["score"]) for r in dets])
    cats = np.asarray([int(r["category_id"]) for r in dets], dtype=np.int64)
    tiles = np.asarray([r["image_id"] for r in dets])
    domains = _domains(dets, args)
    if args.per_domain_quota is not None and domains is None:
        raise ValueError("--per-domain-quota: no domains found; give --gt with --domain-key, or --domain-map")
    quota = None
    if args.per_domain_quota is not None:
        quota = "equal" if args.per_domain_quota == "equal" else float(args.per_domain_quota)
        if quota != "equal" and not (0 < quota <= 1 and math.isfinite(quota)):
            raise ValueError(f"--per-domain-quota: expected a share in (0, 1], got {args.per_domain_quota!r}")

    def calibrate(s):
        if cal is None:
            return np.clip(s, 0.0, 1.0)
        side = {"category_ids": cats} if cal.per_class else {}
        if cal.by_domain_:
            side["domains"] = domains
        return cal.predict_score(s, **side)

    cal = None
    if args.calibrator:
        cal = load_calibrator(args.calibrator)
        if not hasattr(cal, "predict_score"):
            raise ValueError(f"--calibrator: method {cal.method!r} does not calibrate box scores; "
                             "fit det-ts or det-platt")
        if cal.kind_ != "binary":
            raise ValueError("--calibrator: this manifest was fitted on class vectors; rank takes box scores")
    probs = calibrate(scores)
    mc = None
    if args.by == "bald":
        if not args.mc_scores:
            raise ValueError("--mc-scores: --by bald needs Monte-Carlo scores (n_samples_mc, n_boxes)")
        raw = load_array(args.mc_scores, name="mc_scores")
        if raw.ndim != 2 or raw.shape[1] != scores.size:
            raise ValueError(f"--mc-scores: expected shape (n_samples_mc, {scores.size}), got {raw.shape}")
        mc = np.stack([calibrate(row) for row in raw])
    queue = rank_tiles(probs if args.by != "bald" else None, tiles, by=args.by, aggregate=args.aggregate,
                       domains=domains, quota=quota, threshold=args.threshold, mc_probs=mc)
    n = queue["rank"].size
    with atomic_write(args.output, "w") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for i in range(n):
            w.writerow([int(queue["rank"][i]), queue["image_id"][i],
                        queue["domain"][i] if "domain" in queue else "",
                        repr(float(queue["priority"][i])), int(queue["n_boxes"][i]),
                        repr(float(queue["top_score"][i]))])
    print(f"ranked {n} tiles ({scores.size} boxes) by {args.aggregate} {args.by}"
          f"{' with per-domain quota ' + str(quota) if quota is not None else ''}"
          f"{'' if cal else ' on raw scores'} -> {args.output}")
    return 0
