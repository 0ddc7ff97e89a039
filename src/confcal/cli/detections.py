"""``confcal detections match``: match COCO detections to ground truth -> (score, correct) arrays."""

from __future__ import annotations

import json
import math

from confcal.cli._shared.choices import BOX_FORMATS, CROWD_RULES
from confcal.cli._shared.common import format_table


def register(sub):
    p = sub.add_parser("detections", help="object-detection utilities: match detections to ground truth",
                       description="Object-detection utilities.")
    dsub = p.add_subparsers(dest="detections_command", metavar="ACTION")
    dsub.required = True
    m = dsub.add_parser(
        "match", help="match detections to GT and write per-box (score, correct, ...) arrays",
        description="Greedy COCO-style matching per image and class (detections in falling score, each to the "
                    "unmatched GT of highest IoU >= threshold). Writes an .npz with score, correct (=label), iou, "
                    "image_id, category_id, domain, ignore, det_index (+ class_logits/class_label when the "
                    "detections carry class vectors), in the order of the detections file.")
    m.add_argument("--gt", required=True, action="append",
                   help="COCO ground-truth JSON (images, annotations, categories); repeat it with --detections "
                        "and --domain-name to match several sensors into one file")
    m.add_argument("--detections", required=True, action="append",
                   help="COCO results JSON (list, or dict with 'annotations'), one per --gt")
    m.add_argument("--domain-name", action="append", metavar="NAME",
                   help="domain (sensor) name of each --gt/--detections pair, in order; needed with several "
                        "pairs (each pair then picks its own box format under --box-format auto)")
    m.add_argument("-o", "--output", required=True, help="output .npz")
    m.add_argument("--iou-threshold", type=float, default=0.5, help="IoU needed for a match (default 0.5)")
    m.add_argument("--crowd", choices=CROWD_RULES, default="coco",
                   help="'coco': detections on iscrowd regions are ignored (flag 'ignore'); "
                        "'fp': crowd GT is discarded, so they count as false positives (default coco)")
    m.add_argument("--box-format", choices=BOX_FORMATS, default="auto",
                   help="'xywh' axis-aligned, 'xywha' rotated [x, y, w, h, yaw]; auto: by box length")
    m.add_argument("--class-agnostic", action="store_true", help="match across categories within an image")
    m.add_argument("--domain-key", default="domain",
                   help="key of the GT 'images' entries holding the domain/sensor id (default 'domain')")
    m.add_argument("--domain-map", help="JSON file {image_id: domain}; overrides --domain-key")
    m.add_argument("--drop-ignored", action="store_true", help="leave out the detections flagged 'ignore'")
    m.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="also write a held-out test set: this fraction of the images (or boxes, --holdout-by box) "
                        "of every domain goes to --holdout-output, the rest to --output")
    m.add_argument("--holdout-output", metavar="PATH", help="held-out .npz (with --holdout)")
    m.add_argument("--holdout-by", choices=["image", "box"], default="image",
                   help="split unit: whole images (default; no image in both sets) or single boxes")
    m.add_argument("--seed", type=int, default=0, help="seed of the --holdout split (default 0)")
    m.add_argument("--image-size", metavar="W,H",
                   help="image (tile) size for the box geometry of axis-aligned boxes (cx, cy, w, h, edge as "
                        "fractions of the image); default: the GT images' width/height, and no geometry "
                        "when they are missing. Rotated BEV boxes always get range, bearing, length_m, width_m")
    m.set_defaults(func=run_match)


def parse_image_size(text):
    """``"W,H"`` -> ``(W, H)`` floats > 0; ``ValueError`` naming ``--image-size`` otherwise."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        size = tuple(float(v) for v in parts)
    except ValueError:
        size = ()
    if len(size) != 2 or not all(math.isfinite(v) and v > 0 for v in size):
        raise ValueError(f"--image-size: expected W,H (two numbers > 0), got {text!r}")
    return size


def load_domain_map(path):
    if path is None:
        return None
    from confcal.cli._shared.common import read_json

    d = read_json(path, "--domain-map")
    if not isinstance(d, dict):
        raise ValueError(f"--domain-map: expected a JSON object {{image_id: domain}}, got {type(d).__name__}")
    return d


def holdout_mask(res, fraction: float, *, by: str = "image", seed: int = 0):
    """Boolean ``(n,)``: rows of the held-out part. Per domain (all rows when there are none),
    ``round(fraction * units)`` of its images (or boxes) chosen at random, at least one unit
    and at least one left for calibration when the domain has two or more."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(res)
    groups = np.zeros(n, dtype=np.int64) if res.domain is None else np.unique(res.domain, return_inverse=True)[1]
    test = np.zeros(n, dtype=bool)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        units = rows if by == "box" else np.unique(res.image_id[rows].astype(str))
        k = min(max(1, int(round(fraction * units.size))), max(units.size - 1, 1))
        pick = rng.choice(units.size, size=k, replace=False)
        if by == "box":
            test[units[pick]] = True
        else:
            test[rows[np.isin(res.image_id[rows].astype(str), units[pick])]] = True
    return test


def run_match(args) -> int:
    import numpy as np

    from confcal.detection import match_detections, match_many
    from confcal.io import atomic_write
    from confcal.metrics.detection import ALL, detection_ece, per_domain

    if len(args.gt) != len(args.detections):
        raise ValueError(f"--gt/--detections: expected one --detections per --gt, got {len(args.gt)} --gt and "
                         f"{len(args.detections)} --detections")
    names = args.domain_name or []
    if len(args.gt) > 1 and len(names) != len(args.gt):
        raise ValueError(f"--domain-name: with {len(args.gt)} --gt/--detections pairs give one --domain-name per "
                         f"pair, got {len(names)}")
    if names and len(names) != len(args.gt):
        raise ValueError(f"--domain-name: expected {len(args.gt)} (one per pair), got {len(names)}")
    if names and args.domain_map:
        raise ValueError("--domain-map: not with --domain-name (the pair's name is the domain of its boxes)")
    if not str(args.output).lower().endswith(".npz"):
        raise ValueError(f"--output: expected a .npz path, got {args.output!r}")
    if (args.holdout is None) != (args.holdout_output is None):
        raise ValueError("--holdout/--holdout-output: give both (a fraction and the held-out .npz path) or neither")
    if args.holdout is not None:
        if not 0.0 < args.holdout < 1.0:  # also refuses nan
            raise ValueError(f"--holdout: expected a fraction in (0, 1), got {args.holdout!r}")
        if not str(args.holdout_output).lower().endswith(".npz"):
            raise ValueError(f"--holdout-output: expected a .npz path, got {args.holdout_output!r}")
    from confcal.io import check_output_path

    check_output_path(args.output, name="--output")  # both outputs writable before any work
    if args.holdout_output is not None:
        check_output_path(args.holdout_output, name="--holdout-output")
    size = parse_image_size(args.image_size)
    geo = {"geometry": "auto" if size is None else True, "image_size": size}
    if names:
        res = match_many(list(zip(args.gt, args.detections, names)), iou_threshold=args.iou_threshold,
                         crowd=args.crowd, box_format=args.box_format, class_agnostic=args.class_agnostic, **geo)
    else:
        res = match_detections(args.gt[0], args.detections[0], iou_threshold=args.iou_threshold, crowd=args.crowd,
                               box_format=args.box_format, class_agnostic=args.class_agnostic,
                               domain_key=args.domain_key, domain_map=load_domain_map(args.domain_map), **geo)
    # provenance: which files were matched, and how (read back by `confcal fit` into the manifest)
    res.matching = {**res.matching, "gt": [str(p) for p in args.gt], "detections": [str(p) for p in args.detections],
                    "drop_ignored": bool(args.drop_ignored)}
    n_ignored = int(res.ignore.sum())
    if args.drop_ignored:
        res = res.drop_ignored()
    outputs = [(args.output, res)]
    if args.holdout is not None:
        test = holdout_mask(res, args.holdout, by=args.holdout_by, seed=args.seed)
        split = {"holdout": args.holdout, "by": args.holdout_by, "seed": args.seed}
        cal_part, test_part = res.subset(~test), res.subset(test)
        cal_part.matching = {**res.matching, "split": {**split, "part": "calibration"}}
        test_part.matching = {**res.matching, "split": {**split, "part": "held-out"}}
        outputs = [(args.output, cal_part), (args.holdout_output, test_part)]
        print(f"held out {int(test.sum())} of {len(res)} detections ({args.holdout:g} of the "
              f"{'images' if args.holdout_by == 'image' else 'boxes'} of each domain) -> {args.holdout_output}")
    import contextlib

    with contextlib.ExitStack() as stack:  # both files or neither: a failed second write removes the first
        for path, part in outputs:
            np.savez(stack.enter_context(atomic_write(path)), **part.to_arrays())
    # with a hold-out, say where each part went (the calibration file holds only its part)
    where = " and ".join(f"{len(part)} -> {path}" for path, part in outputs) if len(outputs) > 1 else f"-> {args.output}"
    print(f"matched {len(res)} detections at IoU >= {args.iou_threshold:g} (crowd rule {args.crowd!r}, "
          f"{n_ignored} on crowd regions {'dropped' if args.drop_ignored else 'flagged ignore'}) {where}")
    print("box geometry features: " + (", ".join(res.geometry) if res.geometry else
                                       "none (axis-aligned boxes without image width/height: pass --image-size W,H)"))
    if len(res):
        conf = np.clip(res.score, 0.0, 1.0)
        rows = []
        keep = ~res.ignore
        for key, idx in per_domain(res.domain, len(res)).items():
            idx = idx[keep[idx]]
            if idx.size == 0:
                continue
            rows.append({"domain": key, "boxes": int(idx.size),
                         "precision": float(res.correct[idx].mean()), "mean_score": float(res.score[idx].mean()),
                         "d_ece15": detection_ece(conf[idx], res.correct[idx], 15)})
        rows.sort(key=lambda r: (r["domain"] != ALL, str(r["domain"])))
        if rows:
            print(format_table(rows, ["domain", "boxes", "precision", "mean_score", "d_ece15"]))
        else:  # every detection lies on a crowd region: the arrays are written, there is nothing to summarise
            print("no detection outside crowd regions: no precision / D-ECE summary (all are flagged ignore)")
        if np.any((res.score < 0) | (res.score > 1)):
            print("note: some scores lie outside [0, 1] (not probabilities); D-ECE used clipped scores; "
                  "calibrate with det-platt")
    return 0
