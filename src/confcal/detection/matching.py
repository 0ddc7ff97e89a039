"""Match detections to ground truth: COCO-format boxes -> (score, correct) pairs.

The rule (the COCO evaluation's greedy matching at one IoU threshold, without
its area ranges and ``maxDets`` cut):

* per image and category (or per image with ``class_agnostic=True``),
  detections are taken in order of falling score (a stable sort, so ties keep
  file order);
* each one is matched to the still-unmatched, non-crowd GT box of highest IoU,
  if that IoU is ``>= iou_threshold``; equal IoUs go to the GT box listed first;
* a matched detection is a true positive (``correct = 1``), any other is a
  false positive (``correct = 0``).

Crowd regions (GT with ``iscrowd = 1``), two conventions:

* ``crowd="coco"`` (default, as in ``pycocotools.cocoeval.COCOeval``): a
  detection that matches no regular GT box but covers a crowd region with
  ``intersection / area(detection) >= iou_threshold`` is *ignored*: it keeps
  ``correct = 0`` and gets ``ignore = True``, and calibration and metrics
  should drop it (:meth:`MatchedDetections.drop_ignored`). A crowd region can
  absorb any number of detections.
* ``crowd="fp"``: crowd GT is discarded, so detections on crowd regions count
  as false positives. This is the rule used to make the ``matched_iou50.npz``
  files in ``shared/data/detection``.

Boxes: ``[x, y, w, h]`` axis-aligned (pixels, or any unit shared by GT and
detections), IoU from ``pycocotools.mask.iou``; or ``[x, y, w, h, yaw, ...]``
rotated boxes (a ``w x h`` rectangle centred at ``(x + w/2, y + h/2)``,
rotated by ``yaw`` radians counter-clockwise about its centre; trailing
values such as a 3-D height are ignored), IoU of the polygons from shapely.

Class vectors: a detection may carry ``class_scores`` (probabilities) or
``class_logits`` (a list of ``K`` floats), whose columns follow the GT
``categories`` list in file order, optionally with one extra last column for
background. Then ``class_label`` is the column of the category of the GT box
matched to it class-agnostically, the background column for an unmatched
detection (or ``-1``, excluded, when there is no background column).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["MatchedDetections", "match_detections", "load_coco_gt", "load_coco_detections",
           "box_iou", "CROWD_RULES", "BOX_FORMATS"]

CROWD_RULES = ("coco", "fp")
BOX_FORMATS = ("auto", "xywh", "xywha")


# ---------------------------------------------------------------------------- reading
def _read_json(src, name: str):
    if isinstance(src, (str, Path)):
        try:
            with open(src) as fh:
                return json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: {src} is not valid JSON ({exc})") from None
    return src


def load_coco_gt(gt) -> dict:
    """Read COCO ground truth (path or dict) and check its structure.

    Expects a dict with ``images`` (each with ``id``), ``annotations`` (each with
    ``image_id``, ``category_id``, ``bbox``; ``iscrowd`` defaults to 0) and
    optionally ``categories``. Returns the dict. Raises ``ValueError`` naming the
    first malformed entry.
    """
    g = _read_json(gt, "gt")
    if not isinstance(g, dict) or "annotations" not in g or "images" not in g:
        raise ValueError("gt: expected a COCO dict with 'images' and 'annotations', got "
                         f"{type(g).__name__}{' with keys ' + str(sorted(g)) if isinstance(g, dict) else ''}")
    for i, im in enumerate(g["images"]):
        if "id" not in im:
            raise ValueError(f"gt: images[{i}] has no 'id'")
    for i, a in enumerate(g["annotations"]):
        for key in ("image_id", "category_id", "bbox"):
            if key not in a:
                raise ValueError(f"gt: annotations[{i}] has no {key!r}")
    return g


def load_coco_detections(detections) -> list[dict]:
    """Read COCO detection results (path, list, or a dict with ``annotations``).

    Each record needs ``image_id``, ``category_id``, ``bbox`` and a finite
    ``score``. Returns the list of records. Raises ``ValueError`` naming the
    first malformed record.
    """
    d = _read_json(detections, "detections")
    if isinstance(d, dict):
        if "annotations" not in d:
            raise ValueError(f"detections: a dict must hold the results under 'annotations', got keys {sorted(d)}")
        d = d["annotations"]
    if not isinstance(d, list):
        raise ValueError(f"detections: expected a list of result records, got {type(d).__name__}")
    for i, r in enumerate(d):
        for key in ("image_id", "category_id", "bbox", "score"):
            if key not in r:
                raise ValueError(f"detections: record {i} has no {key!r}")
        s = r["score"]
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not math.isfinite(s):
            raise ValueError(f"detections: record {i} has score {s!r}; expected a finite number")
    return d


# -------------------------------------------------------------------------------- IoU
def _box_array(boxes, fmt: str, what: str) -> np.ndarray:
    width = 4 if fmt == "xywh" else 5
    if len(boxes) == 0:
        return np.zeros((0, width))
    rows = []
    for i, b in enumerate(boxes):
        if len(b) < width:
            raise ValueError(f"{what}: box {i} has {len(b)} values; format {fmt!r} needs {width}")
        rows.append([float(v) for v in b[:width]])
    a = np.asarray(rows, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a[:, 2:4] < 0):
        i = int(np.flatnonzero(~np.isfinite(a).all(1) | (a[:, 2:4] < 0).any(1))[0])
        raise ValueError(f"{what}: box {i} = {a[i].tolist()} needs finite values and w, h >= 0")
    return a


def _polygons(a: np.ndarray):
    import shapely

    cx, cy = a[:, 0] + a[:, 2] / 2, a[:, 1] + a[:, 3] / 2
    c, s = np.cos(a[:, 4]), np.sin(a[:, 4])
    # corners of the centred rectangle, rotated counter-clockwise by yaw, then shifted
    ux = np.array([-0.5, 0.5, 0.5, -0.5])[None, :] * a[:, 2:3]
    uy = np.array([-0.5, -0.5, 0.5, 0.5])[None, :] * a[:, 3:4]
    px = cx[:, None] + c[:, None] * ux - s[:, None] * uy
    py = cy[:, None] + s[:, None] * ux + c[:, None] * uy
    return shapely.polygons(np.stack([px, py], axis=-1))


def box_iou(det_boxes, gt_boxes, iscrowd=None, *, box_format: str = "xywh") -> np.ndarray:
    """IoU matrix ``(n_det, n_gt)`` between detection and GT boxes.

    ``box_format="xywh"``: axis-aligned ``[x, y, w, h]`` rows, computed by
    ``pycocotools.mask.iou``. ``"xywha"``: rotated ``[x, y, w, h, yaw]`` rows
    (see the module docstring), polygon IoU from shapely. For a crowd GT
    column (``iscrowd[j]`` true) the value is ``intersection / area(det)``, as
    in COCO evaluation. Degenerate (zero-area) boxes give IoU 0. Rotated pairs whose
    exact GEOS overlay comes back lower-dimensional although the boxes intersect (a
    known robustness limit with nearly collinear edges) are recomputed on a snapping
    grid of 1e-9 times the coordinate extent.
    """
    if box_format not in ("xywh", "xywha"):
        raise ValueError(f"box_format: expected 'xywh' or 'xywha', got {box_format!r}")
    d = _box_array(det_boxes, box_format, "det_boxes")
    g = _box_array(gt_boxes, box_format, "gt_boxes")
    crowd = np.zeros(len(g), dtype=bool) if iscrowd is None else np.asarray(iscrowd, dtype=bool)
    if crowd.shape != (len(g),):
        raise ValueError(f"iscrowd: expected shape ({len(g)},), got {crowd.shape}")
    if len(d) == 0 or len(g) == 0:
        return np.zeros((len(d), len(g)))
    if box_format == "xywh":
        from pycocotools import mask as mask_utils

        return np.asarray(mask_utils.iou(d, g, crowd.astype(np.uint8).tolist()), dtype=np.float64)
    import shapely

    pd, pg = _polygons(d), _polygons(g)
    geom = shapely.intersection(pd[:, None], pg[None, :])
    inter = shapely.area(geom)
    # GEOS can lose the overlap of rectangles whose edges are nearly collinear after rotation
    # (e.g. a box inside another that shares an edge): it returns a point or a line. Redo those
    # pairs on a fine snapping grid (1e-9 of the boxes' extent), which is robust.
    suspect = (shapely.get_dimensions(geom) < 2) & shapely.intersects(pd[:, None], pg[None, :])
    if suspect.any():
        i, j = np.nonzero(suspect)
        scale = float(np.abs(np.concatenate([d[:, :4], g[:, :4]])).max()) or 1.0
        inter[i, j] = shapely.area(shapely.intersection(pd[i], pg[j], grid_size=scale * 1e-9))
    ad, ag = shapely.area(pd), shapely.area(pg)
    denom = np.where(crowd[None, :], ad[:, None], ad[:, None] + ag[None, :] - inter)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(denom > 0, inter / np.where(denom > 0, denom, 1.0), 0.0)
    return out


# --------------------------------------------------------------------------- matching
@dataclass
class MatchedDetections:
    """Per-detection arrays, in the order of the detections file (``det_index``).

    Attributes
    ----------
    score : float64 ``(n,)``, the detector's box score (not necessarily in [0, 1])
    correct : int8 ``(n,)``, 1 = true positive at ``iou_threshold``
    iou : float64 ``(n,)``, largest IoU with any same-class (any-class when matched
        class-agnostically) non-crowd GT box of the image, before greedy exclusion
        (0 when there is none)
    image_id : ``(n,)`` ids as in the files (int64 or str)
    category_id : int64 ``(n,)``
    domain : str ``(n,)``, the image's domain/sensor id (``""`` when unknown)
    ignore : bool ``(n,)``, detections on crowd regions under ``crowd="coco"``
    det_index : int64 ``(n,)``, position in the detections file
    class_logits : float64 ``(n, K)`` or None; log of ``class_scores`` when those were given
    class_label : int64 ``(n,)`` or None; multiclass target column (``-1``: excluded)
    n_gt : dict ``{category_id: number of non-crowd GT boxes}``
    """

    score: np.ndarray
    correct: np.ndarray
    iou: np.ndarray
    image_id: np.ndarray
    category_id: np.ndarray
    domain: np.ndarray
    ignore: np.ndarray
    det_index: np.ndarray
    class_logits: np.ndarray | None = None
    class_label: np.ndarray | None = None
    n_gt: dict = field(default_factory=dict)
    iou_threshold: float = 0.5
    crowd: str = "coco"

    _ARRAYS = ("score", "correct", "iou", "image_id", "category_id", "domain", "ignore",
               "det_index", "class_logits", "class_label")

    def __len__(self) -> int:
        return int(self.score.shape[0])

    def subset(self, mask) -> "MatchedDetections":
        """Rows where ``mask`` is true (or the given indices), other fields kept."""
        kw = {k: (getattr(self, k)[mask] if getattr(self, k) is not None else None) for k in self._ARRAYS}
        return replace(self, **kw)

    def drop_ignored(self) -> "MatchedDetections":
        """Without the detections that COCO evaluation ignores (on crowd regions)."""
        return self.subset(~self.ignore)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Named arrays for ``np.savez`` (``label`` is ``correct`` under the name used
        by ``matched_iou50.npz``; absent class vectors are left out)."""
        out = {k: getattr(self, k) for k in self._ARRAYS if getattr(self, k) is not None}
        out["label"] = self.correct
        cats = sorted(self.n_gt)
        out["gt_category_id"] = np.asarray(cats, dtype=np.int64)
        out["gt_count"] = np.asarray([self.n_gt[c] for c in cats], dtype=np.int64)
        out["iou_threshold"] = np.asarray(self.iou_threshold)
        return out


def _detect_format(gt_anns, dets) -> str:
    lengths = {len(a["bbox"]) for a in gt_anns} | {len(r["bbox"]) for r in dets}
    if not lengths:
        return "xywh"
    if lengths == {4}:
        return "xywh"
    if min(lengths) >= 5:
        return "xywha"
    raise ValueError(f"bbox: mixed box lengths {sorted(lengths)}; pass box_format='xywh' or 'xywha'")


def _image_domains(gt: dict, domain_key: str | None, domain_map: Mapping | None) -> dict:
    out = {}
    for im in gt["images"]:
        if domain_key is not None and domain_key in im:
            out[im["id"]] = str(im[domain_key])
    if domain_key not in (None, "domain") and not out and gt["images"]:
        # an explicitly named key found nowhere is almost surely a typo; the default may be absent
        warnings.warn(f"domain_key {domain_key!r} is in none of the GT images; every domain is ''. "
                      f"Keys of the first image: {sorted(gt['images'][0])}", UserWarning, stacklevel=3)
    if domain_map is not None:
        for k, v in domain_map.items():
            out[k] = str(v)
            out[str(k)] = str(v)  # JSON maps have string keys: accept them for int image ids
    return out


def _class_vectors(dets, n_categories: int):
    have = [("class_logits" in r) or ("class_scores" in r) for r in dets]
    if not any(have):
        return None
    if not all(have):
        i = have.index(False)
        raise ValueError(f"detections: record {i} has no class_scores/class_logits while others do")
    rows = []
    for i, r in enumerate(dets):
        if "class_logits" in r:
            v = np.asarray(r["class_logits"], dtype=np.float64)
        else:
            p = np.asarray(r["class_scores"], dtype=np.float64)
            if np.any(p < 0) or np.any(p > 1) or abs(p.sum() - 1) > 1e-3:
                raise ValueError(f"detections: record {i} class_scores must be probabilities summing to 1, "
                                 f"got sum {p.sum():.6g}, min {p.min():.6g}")
            with np.errstate(divide="ignore"):
                v = np.log(p)
        rows.append(v)
    widths = {len(v) for v in rows}
    if len(widths) != 1 or next(iter(widths)) not in (n_categories, n_categories + 1):
        raise ValueError(f"detections: class vectors must all have length {n_categories} (GT categories) "
                         f"or {n_categories + 1} (plus background), got lengths {sorted(widths)}")
    return np.stack(rows)


def _greedy(scores, ious, crowd_ious, thr):
    """Greedy matching of one group. Returns (matched gt index or -1, ignored flag)."""
    n_det, n_gt = ious.shape
    order = np.argsort(-scores, kind="stable")
    taken = np.zeros(n_gt, dtype=bool)
    match = np.full(n_det, -1, dtype=np.int64)
    ignored = np.zeros(n_det, dtype=bool)
    for i in order:
        if n_gt:
            cand = np.where(taken, -1.0, ious[i])
            j = int(np.argmax(cand))  # first of equal IoUs
            if cand[j] >= thr:
                match[i] = j
                taken[j] = True
                continue
        if crowd_ious is not None and crowd_ious.shape[1] and crowd_ious[i].max() >= thr:
            ignored[i] = True
    return match, ignored


def match_detections(gt, detections, *, iou_threshold: float = 0.5, crowd: str = "coco",
                     box_format: str = "auto", class_agnostic: bool = False,
                     domain_key: str | None = "domain", domain_map: Mapping | None = None
                     ) -> MatchedDetections:
    """Match detections to GT and return per-detection ``(score, correct, ...)`` arrays.

    Parameters
    ----------
    gt : path or COCO dict (see :func:`load_coco_gt`)
    detections : path, list of result records, or dict with ``annotations``
    iou_threshold : float in (0, 1], a match needs IoU ``>=`` this (default 0.5)
    crowd : ``"coco"`` (detections on crowd regions ignored) or ``"fp"`` (crowd GT
        discarded); see the module docstring
    box_format : ``"auto"`` (4 values -> axis-aligned, 5+ -> rotated), ``"xywh"`` or ``"xywha"``
    class_agnostic : match across categories within an image (a match is then a true
        positive whatever the two classes; ``iou`` is over GT of any class)
    domain_key : key of the GT ``images`` entries that holds the domain (sensor) id
    domain_map : optional ``{image_id: domain}``, overrides ``domain_key``; a detection
        record's own ``domain`` field overrides both

    Returns
    -------
    :class:`MatchedDetections`, rows in the order of the detections.

    Raises
    ------
    ValueError
        Malformed files, an unknown ``crowd``/``box_format``, ``iou_threshold``
        outside (0, 1], or a detection on an image absent from the GT.
    """
    if crowd not in CROWD_RULES:
        raise ValueError(f"crowd: expected one of {CROWD_RULES}, got {crowd!r}")
    if box_format not in BOX_FORMATS:
        raise ValueError(f"box_format: expected one of {BOX_FORMATS}, got {box_format!r}")
    thr = float(iou_threshold)
    if not 0.0 < thr <= 1.0:
        raise ValueError(f"iou_threshold: expected a value in (0, 1], got {iou_threshold!r}")
    thr_eff = min(thr, 1.0 - 1e-10)  # as COCO: a threshold of 1 still admits float-rounded perfect overlaps
    g = load_coco_gt(gt)
    dets = load_coco_detections(detections)
    fmt = _detect_format(g["annotations"], dets) if box_format == "auto" else box_format
    image_ids = {im["id"] for im in g["images"]}
    for i, r in enumerate(dets):
        if r["image_id"] not in image_ids:
            raise ValueError(f"detections: record {i} has image_id {r['image_id']!r}, which is not in gt images")
    dom_of_image = _image_domains(g, domain_key, domain_map)
    categories = [c["id"] for c in g.get("categories", [])]
    if not categories:
        categories = sorted({a["category_id"] for a in g["annotations"]})
    col_of_cat = {c: k for k, c in enumerate(categories)}
    class_logits = _class_vectors(dets, len(categories))

    n = len(dets)
    score = np.asarray([float(r["score"]) for r in dets], dtype=np.float64)
    cat = np.asarray([int(r["category_id"]) for r in dets], dtype=np.int64)
    img = [r["image_id"] for r in dets]
    domain = np.asarray([str(r["domain"]) if "domain" in r else dom_of_image.get(r["image_id"], "")
                         for r in dets], dtype=str)
    if n == 0:
        domain = np.zeros(0, dtype="<U1")

    # group GT and detections by (image, category) or image
    def key(rec):
        return (rec["image_id"],) if class_agnostic else (rec["image_id"], int(rec["category_id"]))

    gt_groups: dict[Any, list[int]] = {}
    anns = g["annotations"]
    for j, a in enumerate(anns):
        if crowd == "fp" and a.get("iscrowd", 0):
            continue
        gt_groups.setdefault(key(a), []).append(j)
    det_groups: dict[Any, list[int]] = {}
    for i, r in enumerate(dets):
        det_groups.setdefault(key(r), []).append(i)

    correct = np.zeros(n, dtype=np.int8)
    best_iou = np.zeros(n, dtype=np.float64)
    ignore = np.zeros(n, dtype=bool)
    matched_gt = np.full(n, -1, dtype=np.int64)
    for k, di in det_groups.items():
        gj = gt_groups.get(k, [])
        regular = [j for j in gj if not anns[j].get("iscrowd", 0)]
        crowds = [j for j in gj if anns[j].get("iscrowd", 0)]
        dboxes = [dets[i]["bbox"] for i in di]
        ious = box_iou(dboxes, [anns[j]["bbox"] for j in regular], box_format=fmt)
        cious = (box_iou(dboxes, [anns[j]["bbox"] for j in crowds], np.ones(len(crowds), bool), box_format=fmt)
                 if crowds else None)
        m, ig = _greedy(score[di], ious, cious, thr_eff)
        for a_, i in enumerate(di):
            if ious.shape[1]:
                best_iou[i] = ious[a_].max()
            if m[a_] >= 0:
                matched_gt[i] = regular[m[a_]]
                correct[i] = 1
            ignore[i] = ig[a_]

    class_label = None
    if class_logits is not None:
        # multiclass target: category of the class-agnostically matched GT box
        if class_agnostic:
            agn = matched_gt
        else:
            agn = match_detections(g, dets, iou_threshold=thr, crowd=crowd, box_format=fmt,
                                   class_agnostic=True, domain_key=None)._matched_gt
        bg = class_logits.shape[1] - 1 if class_logits.shape[1] == len(categories) + 1 else -1
        class_label = np.asarray([col_of_cat[anns[j]["category_id"]] if j >= 0 else bg for j in agn],
                                 dtype=np.int64)

    n_gt: dict[int, int] = {}
    for a in anns:
        if not a.get("iscrowd", 0):
            n_gt[int(a["category_id"])] = n_gt.get(int(a["category_id"]), 0) + 1
    out = MatchedDetections(
        score=score, correct=correct, iou=best_iou, image_id=np.asarray(img) if n else np.zeros(0, np.int64),
        category_id=cat, domain=domain, ignore=ignore, det_index=np.arange(n, dtype=np.int64),
        class_logits=class_logits, class_label=class_label, n_gt=n_gt, iou_threshold=thr, crowd=crowd)
    out._matched_gt = matched_gt  # index into gt['annotations'], for diagnostics
    return out
