"""``confcal rank``: the annotation queue of tiles (images) by calibrated uncertainty."""

from __future__ import annotations

import csv
import math

from confcal.cli._shared.choices import AGGREGATIONS, TIE_TOLERANCE, UNCERTAINTIES
from confcal.cli.detections import load_domain_map

COLUMNS = ["rank", "image_id", "file_name", "domain", "priority", "total_uncertainty", "n_boxes", "top_score",
           "calibrated_confidence", "uncertain_det_ids", "uncertain_confidences", "calibrator_sha256"]
#: the largest value of each per-box uncertainty for a binary box score; a box is "uncertain" at half of it
MAX_UNCERTAINTY = {"least_confidence": 0.5, "margin": 1.0, "entropy": math.log(2), "bald": math.log(2)}
#: uncertain detection ids listed per tile at most
MAX_IDS = 50


def register(sub):
    p = sub.add_parser("rank", help="rank image tiles for annotation by calibrated uncertainty",
                       description="Calibrate every box score with a det-ts/det-platt manifest, compute a per-box "
                                   "uncertainty, aggregate it per image tile, and write the queue as CSV "
                                   f"(columns: {', '.join(COLUMNS)}). top_score is the tile's largest calibrated "
                                   "box probability; calibrated_confidence the calibrated P(true positive) of its "
                                   "most uncertain box; uncertain_det_ids the detection ids (the record's 'id', "
                                   "else its position in the detections file) of the boxes whose uncertainty is "
                                   "at least half its maximum (entropy >= ln(2)/2: 0.11 < p < 0.89), most "
                                   f"uncertain first (at most {MAX_IDS}), with their calibrated confidences; "
                                   "calibrator_sha256 the sha256 of the manifest file. Ties: tiles whose "
                                   "priority lies in the same band of --tie-tolerance times the top priority "
                                   "are ordered by total_uncertainty (the sum over the tile's boxes), largest "
                                   "first, because binary entropy saturates at ln 2.")
    p.add_argument("--detections", required=True, action="append",
                   help="COCO results JSON; repeat it with --domain-name (and --gt) to rank several sensors in "
                        "one queue")
    p.add_argument("--domain-name", action="append", metavar="NAME",
                   help="domain (sensor) of each --detections file, in order (needed with several)")
    p.add_argument("--calibrator", help="det-ts/det-platt manifest from 'confcal fit'; without it the raw "
                                        "scores (clipped to [0, 1]) are used")
    p.add_argument("--by", choices=UNCERTAINTIES, default="entropy", help="per-box uncertainty (default entropy)")
    p.add_argument("--aggregate", choices=AGGREGATIONS, default="max", help="per-tile aggregation (default max)")
    p.add_argument("--threshold", type=float,
                   help="with --aggregate count: count boxes whose uncertainty is >= this")
    p.add_argument("--tie-tolerance", type=float, default=TIE_TOLERANCE,
                   help=f"relative width of the near-tie bands broken by total_uncertainty (default "
                        f"{TIE_TOLERANCE:g}; 0: plain priority order)")
    p.add_argument("--per-domain-quota", nargs="?", const="equal", metavar="SHARE",
                   help="guarantee every domain a share of every prefix of the queue: a number in (0, 1] "
                        "per domain, or no value for equal shares")
    p.add_argument("--gt", action="append",
                   help="COCO GT JSON, for each image's domain (its 'images' entries) and file name; with several "
                        "--detections, one per file")
    p.add_argument("--domain-key", default="domain", help="key of the GT 'images' entries with the domain id")
    p.add_argument("--domain-map", help="JSON file {image_id: domain}")
    p.add_argument("--mc-scores", metavar="SPEC",
                   help="with --by bald: Monte-Carlo box scores (n_samples_mc, n_boxes), file order")
    from confcal.cli._shared.common import add_csv_header_arg

    add_csv_header_arg(p)  # for --mc-scores
    p.add_argument("-o", "--output", required=True, help="queue CSV")
    p.set_defaults(func=run)


def _domains(dets, args):
    import numpy as np

    from confcal.detection import load_coco_gt

    images = {}
    if args.gt:
        for im in load_coco_gt(args.gt)["images"]:
            if args.domain_key in im:
                images[im["id"]] = str(im[args.domain_key])
    dmap = load_domain_map(args.domain_map)
    if dmap:
        from confcal.detection.matching import domain_map_by_id

        images.update(domain_map_by_id(dmap))
    have_any = bool(images) or any("domain" in r for r in dets)
    if not have_any:
        return None
    out = [str(r["domain"]) if "domain" in r else images.get(r["image_id"]) for r in dets]
    missing = [dets[i]["image_id"] for i, v in enumerate(out) if v is None]
    if missing:
        from confcal._validation import plain  # (here: building the parser must not import numpy)
        raise ValueError(f"domains: no domain for image_id {plain(missing[0])} ({len(missing)} boxes); give it in "
                         "--gt images, --domain-map, or the detection records")
    return np.asarray(out)


def _file_names(dets, gt):
    from confcal.detection import load_coco_gt

    names = {}
    if gt:
        names = {im["id"]: str(im.get("file_name", "")) for im in load_coco_gt(gt)["images"]}
    return [str(r.get("file_name", names.get(r["image_id"], ""))) for r in dets]


def _check_as_match_does(part: list, path, gt) -> None:
    """The record rules of ``detections match``: finite boxes with w, h >= 0 and, with a GT that lists its
    categories, known category ids; one line naming --detections, the file and the record index."""
    from confcal.detection.coco import category_columns
    from confcal.detection.geometry import box_array

    fmt = "xywha" if min(len(r["bbox"]) for r in part) >= 5 else "xywh"
    g = None
    if gt is not None:  # a damaged GT file is said as --gt's (outside the try)
        from confcal.detection import load_coco_gt

        g = load_coco_gt(gt)
    try:
        box_array([r["bbox"] for r in part], fmt, "detections", item="record")
        if g is not None:
            category_columns(g, part)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(f"--detections: {path}: {msg.partition(': ')[2] or msg}") from None


def _load_pairs(args):
    """``(dets, tiles, domains or None, file_names, det_ids)`` over every --detections file."""
    import numpy as np

    from confcal.detection import load_coco_detections

    dpaths, gts, names = args.detections, args.gt or [], args.domain_name or []
    if len(dpaths) > 1 and len(names) != len(dpaths):
        raise ValueError(f"--domain-name: with {len(dpaths)} --detections files give one --domain-name each, "
                         f"got {len(names)}")
    if names and len(names) != len(dpaths):
        raise ValueError(f"--domain-name: expected {len(dpaths)} (one per --detections), got {len(names)}")
    if gts and len(gts) != len(dpaths):
        raise ValueError(f"--gt: expected one per --detections ({len(dpaths)}), got {len(gts)}")
    if len(set(names)) != len(names) or any(not n for n in names):
        raise ValueError(f"--domain-name: expected distinct non-empty names, got {names}")
    dets, tiles, files, ids, doms = [], [], [], [], []
    for k, path in enumerate(dpaths):
        part = load_coco_detections(path)
        if not part:
            raise ValueError(f"--detections: {path} holds no detections")
        gt = gts[k] if gts else None
        _check_as_match_does(part, path, gt)
        if gt is not None:  # a queued image must be one the annotators can find
            from confcal.detection import load_coco_gt

            known = {im["id"] for im in load_coco_gt(gt)["images"]}
            missing = next((r["image_id"] for r in part if r["image_id"] not in known), None)
            if missing is not None:
                raise ValueError(f"--detections: {path} has a detection on image_id {missing!r}, which is not "
                                 f"in the images of --gt {gt}")
        dets += part
        files += _file_names(part, gt)
        ids += [r.get("id", i) for i, r in enumerate(part)]
        if names:
            # image ids of different sensors may collide: the tile is (sensor, image)
            tiles += [f"{names[k]}/{r['image_id']}" for r in part]
            doms += [names[k]] * len(part)
        else:
            tiles += [r["image_id"] for r in part]
    if names:
        return dets, np.asarray(tiles), np.asarray(doms), files, ids
    args.gt = gts[0] if gts else None
    return dets, np.asarray(tiles), _domains(dets, args), files, ids


def _tile_boxes(tiles, u, probs, det_ids, cut):
    """``{tile: (confidence of its most uncertain box, ids of uncertain boxes, their confidences)}``."""
    import numpy as np

    out = {}
    order = np.argsort(-u, kind="stable")
    for i in order:
        key = tiles[i].item() if hasattr(tiles[i], "item") else tiles[i]
        entry = out.setdefault(key, [float(probs[i]), [], []])
        if u[i] >= cut and len(entry[1]) < MAX_IDS:
            entry[1].append(str(det_ids[i]))
            entry[2].append(f"{float(probs[i]):.4f}")
    return out


def _cell(value):
    """A text cell a spreadsheet would run as a formula gets a leading ``'`` (:func:`confcal.io.csv_cell`,
    the one rule of every CSV confcal writes); numbers are written as they are."""
    from confcal.io import csv_cell

    return csv_cell(value)


def run(args) -> int:
    import numpy as np

    from confcal.active import rank_tiles, uncertainty
    from confcal.cli._shared.provenance import file_sha256
    from confcal.io import atomic_write, check_output_path, load_array, load_calibrator

    for name in ("threshold", "tie_tolerance"):
        v = getattr(args, name)
        if v is not None and not math.isfinite(v):
            raise ValueError(f"--{name.replace('_', '-')}: expected a finite number, got {v!r}")
    if args.threshold is not None and args.aggregate != "count":  # it would be silently ignored
        raise ValueError(f"--threshold: only with --aggregate count (it counts boxes whose uncertainty is >= "
                         f"the threshold), not with --aggregate {args.aggregate}")
    if args.tie_tolerance < 0:
        raise ValueError(f"--tie-tolerance: expected a value >= 0, got {args.tie_tolerance!r}")
    check_output_path(args.output, suffixes=(".csv",), name="--output")
    multi = bool(args.domain_name)
    dets, tiles, domains, box_files, det_ids = _load_pairs(args)
    scores = np.asarray([float(r["score"]) for r in dets])
    cats = np.asarray([int(r["category_id"]) for r in dets], dtype=np.int64)
    if args.per_domain_quota is not None and domains is None:
        raise ValueError("--per-domain-quota: no domains found; give --gt with --domain-key, or --domain-map")
    quota = None
    if args.per_domain_quota is not None:
        try:
            quota = "equal" if args.per_domain_quota == "equal" else float(args.per_domain_quota)
        except ValueError:
            quota = math.nan
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
        if getattr(cal, "takes_box_features", False) or not hasattr(cal, "kind_"):
            raise ValueError(f"--calibrator: rank takes det-ts / det-platt / det-beta manifests; {cal.method} "
                             "maps box geometry features, which rank does not compute (apply it to the output "
                             "of 'confcal detections match' with 'confcal apply')")
        if cal.kind_ != "binary":
            raise ValueError("--calibrator: this manifest was fitted on class vectors; rank takes box scores")
        if cal.by_domain_ and domains is None:
            raise ValueError("--calibrator: this manifest was fitted per domain; give each box's domain with "
                             "--gt and --domain-key, --domain-map, or --domain-name")
    probs = calibrate(scores)
    mc = None
    if args.by == "bald":
        if not args.mc_scores:
            raise ValueError("--mc-scores: --by bald needs Monte-Carlo scores (n_samples_mc, n_boxes)")
        raw = load_array(args.mc_scores, name="mc_scores")
        if raw.ndim != 2 or raw.shape[1] != scores.size:
            raise ValueError(f"--mc-scores: expected shape (n_samples_mc, {scores.size}), got {raw.shape}")
        if raw.dtype.kind not in "fiu" or not np.all(np.isfinite(raw)):
            bad = "not numbers" if raw.dtype.kind not in "fiu" else \
                f"not finite at {tuple(int(v) for v in np.argwhere(~np.isfinite(raw))[0])}"
            raise ValueError(f"--mc-scores: {args.mc_scores} holds scores that are {bad}; expected finite box "
                             f"scores (dtype {raw.dtype})")
        mc = np.stack([calibrate(row) for row in raw])
    queue = rank_tiles(probs if args.by != "bald" else None, tiles, by=args.by, aggregate=args.aggregate,
                       domains=domains, quota=quota, threshold=args.threshold, mc_probs=mc,
                       tie_tolerance=args.tie_tolerance)
    u = uncertainty(probs if args.by != "bald" else None, args.by, mc_probs=mc)
    boxes = _tile_boxes(tiles, u, probs, det_ids, MAX_UNCERTAINTY[args.by] / 2)
    files, image_of = {}, {}
    for t, f, r in zip(tiles.tolist(), box_files, dets):
        files[t], image_of[t] = f, r["image_id"]
    sha = file_sha256(args.calibrator) if args.calibrator else ""
    n = queue["rank"].size
    with atomic_write(args.output, "w") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for i in range(n):
            tile = queue["image_id"][i]
            tile = tile.item() if hasattr(tile, "item") else tile
            conf, ids, confs = boxes.get(tile, [float("nan"), [], []])
            w.writerow([int(queue["rank"][i]), _cell(image_of[tile] if multi else tile), _cell(files.get(tile, "")),
                        _cell(queue["domain"][i] if "domain" in queue else ""),
                        repr(float(queue["priority"][i])), repr(float(queue["total_uncertainty"][i])),
                        int(queue["n_boxes"][i]), repr(float(queue["top_score"][i])), repr(conf),
                        ";".join(ids), ";".join(confs), sha])
    print(f"ranked {n} tiles ({scores.size} boxes) by {args.aggregate} {args.by}"
          f"{' with per-domain quota ' + str(quota) if quota is not None else ''}"
          f"{'' if cal else ' on raw scores'} -> {args.output}")
    return 0
