"""Match detections to ground truth: COCO-format boxes -> (score, correct) pairs.

The rule (the COCO evaluation's greedy matching at one IoU threshold, without
its area ranges and ``maxDets`` cut):

* per image and category (or per image with ``class_agnostic=True``),
  detections are taken in order of falling score (a stable sort, so ties keep
  file order);
* each one is matched to the still-unmatched, non-crowd GT box of highest IoU,
  if that IoU is ``>= iou_threshold``; among equal IoUs the GT box listed *last*
  wins, exactly as ``COCOeval.evaluateImg`` (its scan replaces the candidate
  whenever ``iou >= best``). Example: GT A ``[0,0,10,10]`` (first), GT B
  ``[2,0,10,10]``; det1 ``[1,0,10,10]`` (score 0.9) has IoU 0.8182 with both
  and takes B, so det2 ``[-3,0,10,10]`` (score 0.8, IoU 0.5385 with A) takes A:
  ``correct = [1, 1]``, as COCOeval;
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

Boxes: ``[x, y, w, h]`` axis-aligned or ``[x, y, w, h, yaw, ...]`` rotated,
IoU from :mod:`confcal.detection.geometry`. Reading and checking the files is
:mod:`confcal.detection.coco`.

Domains: the domain (sensor) of a detection is its record's ``domain`` field,
else ``domain_map[image_id]``, else the GT image's ``domain_key`` entry. When no
image has that key (and no map or record gives one), there are no domains
(``MatchedDetections.domain is None``), never one empty-named group; a GT where
some images have the key and others not is refused. :func:`match_many` matches
several GT/detections pairs (one sensor each, box formats may differ) into one
result whose domain is the pair's name.

Class vectors: a detection may carry ``class_scores`` (probabilities) or
``class_logits`` (a list of ``K`` floats), whose columns follow the GT
``categories`` list in file order, optionally with one extra last column for
background. Then ``class_label`` is the column of the category of the GT box
matched to it class-agnostically, the background column for an unmatched
detection (or ``-1``, excluded, when there is no background column).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from confcal.detection.coco import category_columns, load_coco_detections, load_coco_gt
from confcal.detection.geometry import (BOX_FORMATS, GEOMETRY_FEATURES, box_array, box_geometry, box_iou,
                                        detect_box_format)

__all__ = ["MatchedDetections", "match_detections", "match_many", "load_coco_gt", "load_coco_detections",
           "box_iou", "CROWD_RULES", "BOX_FORMATS"]

CROWD_RULES = ("coco", "fp")


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
    domain : str ``(n,)`` or None, the image's domain/sensor id; None when the inputs give no domains
    ignore : bool ``(n,)``, detections on crowd regions under ``crowd="coco"``
    det_index : int64 ``(n,)``, position in the detections file
    class_logits : float64 ``(n, K)`` or None; log of ``class_scores`` when those were given
    class_label : int64 ``(n,)`` or None; multiclass target column (``-1``: excluded)
    n_gt : dict ``{category_id: number of non-crowd GT boxes}``
    source : str ``(n,)`` or None, the detections file (or pair name) of each row (set by :func:`match_many`)
    matching : dict, the matching parameters (``iou_threshold``, ``crowd``, ``class_agnostic``,
        ``box_format`` per pair, ``pairs``), stored by :meth:`to_arrays` as JSON under ``matching``
    geometry : dict ``{name: float64 (n,)}`` or None, the box geometry features of
        :func:`~confcal.detection.geometry.box_geometry` (``cx, cy, w, h, edge`` for axis-aligned
        boxes with a known image size; ``range, bearing, length_m, width_m`` for rotated boxes);
        NaN in rows of a :func:`match_many` pair that lacks a feature
    """

    score: np.ndarray
    correct: np.ndarray
    iou: np.ndarray
    image_id: np.ndarray
    category_id: np.ndarray
    domain: np.ndarray | None
    ignore: np.ndarray
    det_index: np.ndarray
    class_logits: np.ndarray | None = None
    class_label: np.ndarray | None = None
    n_gt: dict = field(default_factory=dict)
    iou_threshold: float = 0.5
    crowd: str = "coco"
    source: np.ndarray | None = None
    matching: dict = field(default_factory=dict)
    geometry: dict | None = None

    _ARRAYS = ("score", "correct", "iou", "image_id", "category_id", "domain", "ignore",
               "det_index", "class_logits", "class_label", "source")

    def __len__(self) -> int:
        return int(self.score.shape[0])

    def subset(self, mask) -> "MatchedDetections":
        """Rows where ``mask`` is true (or the given indices), other fields kept."""
        kw = {k: (getattr(self, k)[mask] if getattr(self, k) is not None else None) for k in self._ARRAYS}
        if self.geometry is not None:
            kw["geometry"] = {k: v[mask] for k, v in self.geometry.items()}
        return replace(self, **kw)

    def drop_ignored(self) -> "MatchedDetections":
        """Without the detections that COCO evaluation ignores (on crowd regions)."""
        return self.subset(~self.ignore)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Named arrays for ``np.savez`` (``label`` is ``correct`` under the name used
        by ``matched_iou50.npz``; absent class vectors and domains are left out; ``matching`` is
        the JSON of the matching parameters, read back by ``confcal fit`` as provenance)."""
        out = {k: getattr(self, k) for k in self._ARRAYS if getattr(self, k) is not None}
        out["label"] = self.correct
        cats = sorted(self.n_gt)
        out["gt_category_id"] = np.asarray(cats, dtype=np.int64)
        out["gt_count"] = np.asarray([self.n_gt[c] for c in cats], dtype=np.int64)
        out["iou_threshold"] = np.asarray(self.iou_threshold)
        out["matching"] = np.asarray(json.dumps(self.matching, sort_keys=True))
        if self.geometry:
            # one array per feature (selected by name: `confcal fit --box-features cx,cy`)
            for k, v in self.geometry.items():
                out[k] = v
            out["box_feature_names"] = np.asarray(list(self.geometry), dtype=str)
        return out


def _image_domains(gt: dict, domain_key: str | None, domain_map: Mapping | None) -> dict:
    out = {}
    if domain_key is not None:
        have = [im for im in gt["images"] if domain_key in im]
        if have and len(have) < len(gt["images"]):
            miss = next(im["id"] for im in gt["images"] if domain_key not in im)
            raise ValueError(f"gt: image {miss!r} has no {domain_key!r} key while {len(have)} of "
                             f"{len(gt['images'])} images have one; give every image a domain (--domain-key) "
                             "or pass a map (--domain-map)")
        out = {im["id"]: str(im[domain_key]) for im in have}
    if domain_key not in (None, "domain") and not out and gt["images"] and domain_map is None:
        # an explicitly named key found nowhere is almost surely a typo; the default may be absent
        warnings.warn(f"domain_key {domain_key!r} is in none of the GT images; there are no domains. "
                      f"Keys of the first image: {sorted(gt['images'][0])}", UserWarning, stacklevel=3)
    if domain_map is not None:
        out.update(domain_map_by_id(domain_map))
    return out


def domain_map_by_id(domain_map: Mapping) -> dict:
    """``{image_id: domain}`` with every key under its own type and its other spelling: a JSON object's
    keys are strings, so ``"1"`` also stands for the int image id ``1`` (and ``1`` for ``"1"``); ``"01"`` is
    only a string id. Domains are strings."""
    out = {}
    for k, v in domain_map.items():
        out[k] = out[str(k)] = str(v)
        if isinstance(k, str) and k.lstrip("-").isdigit() and k.isascii() and str(int(k)) == k:
            out[int(k)] = str(v)  # (T44: the str(k) spelling alone never matched an int id)
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
            # COCOeval's scan keeps the *last* GT of equal IoU (it replaces on iou >= best)
            j = n_gt - 1 - int(np.argmax(cand[::-1]))
            if cand[j] >= thr:
                match[i] = j
                taken[j] = True
                continue
        if crowd_ious is not None and crowd_ious.shape[1] and crowd_ious[i].max() >= thr:
            ignored[i] = True
    return match, ignored


def _name_source(exc: ValueError, gt, detections) -> ValueError:
    """``detections: record 3 ...`` -> ``detections: dets.json: record 3 ...`` when the input was a file
    (the same for ``gt:``), so a message names the file as well as the record."""
    import os

    msg = str(exc)
    for name, src in (("detections", detections), ("gt", gt)):
        if isinstance(src, (str, os.PathLike)) and msg.startswith(name + ": ") and str(src) not in msg:
            return ValueError(f"{name}: {src}: {msg[len(name) + 2:]}")
    return exc


def match_detections(gt, detections, *, iou_threshold: float = 0.5, crowd: str = "coco",
                     box_format: str = "auto", class_agnostic: bool = False,
                     domain_key: str | None = "domain", domain_map: Mapping | None = None,
                     geometry: bool | str = "auto", image_size=None) -> MatchedDetections:
    """Match detections to GT and return per-detection ``(score, correct, ...)`` arrays.

    Errors in the inputs name the file (when a path was given) and the record:
    ``detections: dets.json: record 3 has box [0.0, 0.0, -1.0, 2.0] ...``.

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
    geometry : ``"auto"`` (default), True or False: the box geometry features
        (``MatchedDetections.geometry``, see :func:`~confcal.detection.geometry.box_geometry`).
        Rotated boxes always have them; axis-aligned ones need each image's size, from the GT
        ``images`` entries' ``width`` and ``height`` or from ``image_size``. ``"auto"`` leaves
        them out when no size is known; True raises instead.
    image_size : ``(W, H)`` for every image; overrides the GT ``width``/``height``

    Returns
    -------
    :class:`MatchedDetections`, rows in the order of the detections.

    Raises
    ------
    ValueError
        Malformed files, an unknown ``crowd``/``box_format``, ``iou_threshold``
        outside (0, 1], a detection on an image absent from the GT, or (``geometry=True``)
        an image without ``width``/``height`` and no ``image_size``.
    """
    if geometry not in ("auto", True, False):
        raise ValueError(f"geometry: expected 'auto', True or False, got {geometry!r}")
    if crowd not in CROWD_RULES:
        raise ValueError(f"crowd: expected one of {CROWD_RULES}, got {crowd!r}")
    if box_format not in BOX_FORMATS:
        raise ValueError(f"box_format: expected one of {BOX_FORMATS}, got {box_format!r}")
    try:
        return _match(gt, detections, iou_threshold=iou_threshold, crowd=crowd, box_format=box_format,
                      class_agnostic=class_agnostic, domain_key=domain_key, domain_map=domain_map,
                      geometry=geometry, image_size=image_size)
    except ValueError as exc:
        raise _name_source(exc, gt, detections) from None


def _match(gt, detections, *, iou_threshold, crowd, box_format, class_agnostic, domain_key, domain_map,
           geometry, image_size) -> MatchedDetections:
    thr = float(iou_threshold)
    if not 0.0 < thr <= 1.0:
        raise ValueError(f"iou_threshold: expected a value in (0, 1], got {iou_threshold!r}")
    thr_eff = min(thr, 1.0 - 1e-10)  # as COCO: a threshold of 1 still admits float-rounded perfect overlaps
    g = load_coco_gt(gt)
    dets = load_coco_detections(detections)
    fmt = detect_box_format(g["annotations"], dets) if box_format == "auto" else box_format
    # every box checked once, by its index in the file (box_iou sees one image's boxes at a time)
    box_array([r["bbox"] for r in dets], fmt, "detections", item="record")
    box_array([a["bbox"] for a in g["annotations"]], fmt, "gt", item="annotations[{}]")
    image_ids = {im["id"] for im in g["images"]}
    for i, r in enumerate(dets):
        if r["image_id"] not in image_ids:
            raise ValueError(f"detections: record {i} has image_id {r['image_id']!r}, which is not in gt images")
    dom_of_image = _image_domains(g, domain_key, domain_map)
    categories = category_columns(g, dets)
    col_of_cat = {c: k for k, c in enumerate(categories)}
    class_logits = _class_vectors(dets, len(categories))

    n = len(dets)
    score = np.asarray([float(r["score"]) for r in dets], dtype=np.float64)
    cat = np.asarray([int(r["category_id"]) for r in dets], dtype=np.int64)
    img = [r["image_id"] for r in dets]
    domain = None
    if dom_of_image or any("domain" in r for r in dets):
        vals = [str(r["domain"]) if "domain" in r else dom_of_image.get(r["image_id"]) for r in dets]
        if None in vals:
            i = vals.index(None)
            raise ValueError(f"detections: record {i} (image_id {dets[i]['image_id']!r}) has no domain while "
                             "others have one; give every image a domain (--domain-key or --domain-map)")
        domain = np.asarray(vals, dtype=str) if n else np.zeros(0, dtype="<U1")

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
    geo = _geometry(g, dets, fmt, geometry, image_size) if geometry is not False else None
    out = MatchedDetections(
        score=score, correct=correct, iou=best_iou, image_id=np.asarray(img) if n else np.zeros(0, np.int64),
        category_id=cat, domain=domain, ignore=ignore, det_index=np.arange(n, dtype=np.int64),
        class_logits=class_logits, class_label=class_label, n_gt=n_gt, iou_threshold=thr, crowd=crowd,
        matching={"iou_threshold": thr, "crowd": crowd, "class_agnostic": bool(class_agnostic),
                  "box_format": [fmt], "tie_rule": "cocoeval (last GT of equal IoU)"},
        geometry=geo)
    if geo is not None:
        out.matching["box_features"] = list(geo)
        if image_size is not None:
            out.matching["image_size"] = [float(v) for v in image_size]
    out._matched_gt = matched_gt  # index into gt['annotations'], for diagnostics
    return out


def _geometry(gt: dict, dets: list, fmt: str, geometry, image_size) -> dict | None:
    """Box geometry features of the detections, or None (``geometry="auto"`` without an image size)."""
    boxes = [r["bbox"] for r in dets]
    if fmt == "xywha":
        return box_geometry(boxes, "xywha") if dets else {k: np.zeros(0) for k in GEOMETRY_FEATURES["xywha"]}
    if image_size is not None:
        size = _parse_size(image_size)
        sizes = np.broadcast_to(size, (len(dets), 2))
    else:
        by_id = {im["id"]: im for im in gt["images"]}
        missing = next((im for im in gt["images"] if not all(k in im for k in ("width", "height"))), None)
        if missing is not None:
            if geometry == "auto":
                return None
            key = "width" if "width" not in missing else "height"
            raise ValueError(f"gt: image {missing['id']!r} has no {key!r}, needed for the box geometry "
                             f"{', '.join(GEOMETRY_FEATURES['xywh'])}; add width/height to the GT images or pass "
                             "--image-size W,H (image_size=(W, H))")
        sizes = np.asarray([[by_id[r["image_id"]]["width"], by_id[r["image_id"]]["height"]] for r in dets],
                           dtype=np.float64).reshape(-1, 2)
        bad = ~(np.isfinite(sizes) & (sizes > 0)).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"gt: image {dets[i]['image_id']!r} has width/height {sizes[i].tolist()}; expected "
                             "finite values > 0 (or pass --image-size W,H)")
    if not dets:
        return {k: np.zeros(0) for k in GEOMETRY_FEATURES["xywh"]}
    return box_geometry(boxes, "xywh", image_size=sizes)


def _parse_size(image_size) -> np.ndarray:
    size = np.asarray(image_size, dtype=np.float64) if not isinstance(image_size, str) else None
    if size is None or size.shape != (2,) or not np.all(np.isfinite(size)) or np.any(size <= 0):
        raise ValueError(f"image_size: expected (W, H), two finite numbers > 0, got {image_size!r}")
    return size


def _as_str_ids(a: np.ndarray) -> np.ndarray:
    return a.astype(str) if a.dtype.kind != "U" else a


def match_many(pairs: Sequence[tuple], *, iou_threshold: float = 0.5, crowd: str = "coco",
               box_format: str = "auto", class_agnostic: bool = False, geometry: bool | str = "auto",
               image_size=None) -> MatchedDetections:
    """Match several GT/detections pairs (one sensor or domain each) into one result.

    Parameters
    ----------
    pairs : sequence of ``(gt, detections, domain)``
        ``gt`` and ``detections`` as in :func:`match_detections`; ``domain`` (str)
        names the pair and becomes the ``domain`` of each of its rows. Each pair
        picks its own box format under ``box_format="auto"``, so axis-aligned and
        rotated sets can be combined. Domain names must be distinct and non-empty.
    iou_threshold, crowd, box_format, class_agnostic, geometry, image_size
        As in :func:`match_detections`, for every pair. The result's ``geometry`` has every
        feature of any pair, NaN in the rows of pairs without it (rotated KITTI boxes have
        ``range``, axis-aligned ones ``cx``...).

    Returns
    -------
    MatchedDetections
        Rows of the pairs in order; ``det_index`` is the position in the pair's own
        detections file, ``source`` the pair's domain name, ``image_id`` strings when
        the pairs' id types differ; ``n_gt`` sums the GT counts per category id.
        Class vectors are dropped when the pairs do not all carry them with one width.

    Raises
    ------
    ValueError
        No pairs, a repeated or empty domain name, or any error of :func:`match_detections`
        (prefixed by the pair's domain name).

    Examples
    --------
    >>> g = {"images": [{"id": 1}], "annotations": [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4]}]}
    >>> d = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 4], "score": 0.9}]
    >>> m = match_many([(g, d, "cam_a"), (g, d, "cam_b")])
    >>> m.domain.tolist(), m.correct.tolist()
    (['cam_a', 'cam_b'], [1, 1])
    """
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs: expected at least one (gt, detections, domain) pair")
    names = [str(p[2]) for p in pairs]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"domain names: expected distinct non-empty names, one per GT/detections pair, got {names}")
    parts = []
    for gt, dets, name in pairs:
        try:
            parts.append(match_detections(gt, dets, iou_threshold=iou_threshold, crowd=crowd,
                                          box_format=box_format, class_agnostic=class_agnostic,
                                          domain_key=None, domain_map=None, geometry=geometry,
                                          image_size=image_size))
        except ValueError as exc:
            msg = str(exc)
            head, sep, rest = msg.partition(": ")
            if head in ("detections", "gt") and sep:  # keep the argument first: the CLI names its option
                raise ValueError(f"{head}: pair {name!r}: {rest}") from None
            raise ValueError(f"pair {name!r}: {exc}") from None
    ids = [p.image_id for p in parts]
    if len({a.dtype.kind for a in ids}) > 1:
        ids = [_as_str_ids(a) for a in ids]
    widths = {None if p.class_logits is None else p.class_logits.shape[1] for p in parts}
    keep_cls = len(widths) == 1 and None not in widths
    n_gt: dict = {}
    for p in parts:
        for k, v in p.n_gt.items():
            n_gt[k] = n_gt.get(k, 0) + v
    cat = lambda xs: np.concatenate(xs) if xs else None  # noqa: E731
    names_geo = [k for p in parts if p.geometry for k in p.geometry]
    geo = None
    if names_geo:
        geo = {k: cat([p.geometry[k] if p.geometry and k in p.geometry else np.full(len(p), np.nan)
                       for p in parts]) for k in dict.fromkeys(names_geo)}
    out = MatchedDetections(
        score=cat([p.score for p in parts]), correct=cat([p.correct for p in parts]),
        iou=cat([p.iou for p in parts]), image_id=cat(ids), category_id=cat([p.category_id for p in parts]),
        domain=np.asarray([n for p, n in zip(parts, names) for _ in range(len(p))], dtype=str),
        ignore=cat([p.ignore for p in parts]), det_index=cat([p.det_index for p in parts]),
        class_logits=cat([p.class_logits for p in parts]) if keep_cls else None,
        class_label=cat([p.class_label for p in parts]) if keep_cls else None,
        n_gt=n_gt, iou_threshold=parts[0].iou_threshold, crowd=crowd,
        source=np.asarray([n for p, n in zip(parts, names) for _ in range(len(p))], dtype=str),
        matching={**parts[0].matching, "box_format": [p.matching["box_format"][0] for p in parts],
                  "pairs": names}, geometry=geo)
    out.matching.pop("box_features", None)
    if geo is not None:
        out.matching["box_features"] = list(geo)
    return out
