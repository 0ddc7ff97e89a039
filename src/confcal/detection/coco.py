"""Reading COCO ground truth and COCO detection results, with every malformed entry refused.

Nothing is guessed: a GT annotation on an image absent from ``images``, a
``category_id`` absent from ``categories`` (when the GT lists categories), a
``bbox`` that is not a list of at least 4 numbers, a detections file that is not
a list of records: each raises ``ValueError`` naming the file part and index.
"""

from __future__ import annotations

import json
import math
from numbers import Real
from pathlib import Path

from confcal._validation import unique_json_keys

__all__ = ["load_coco_gt", "load_coco_detections", "check_bbox", "category_columns"]


def _read_json(src, name: str):
    if isinstance(src, (str, Path)):
        try:
            with open(src, encoding="utf-8-sig") as fh:
                return json.load(fh, object_pairs_hook=unique_json_keys)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, a key given twice
            raise ValueError(f"{name}: {src} is not valid JSON ({exc})") from None
        except IsADirectoryError:
            raise ValueError(f"{name}: {src} is a folder, expected a JSON file") from None
    return src


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def check_bbox(bbox, where: str) -> None:
    """Refuse a ``bbox`` that is not a list of at least 4 numbers (``where`` names the record)."""
    if not isinstance(bbox, (list, tuple)) or len(bbox) < 4 or not all(_is_number(v) for v in bbox):
        raise ValueError(f"{where} has bbox {bbox!r}; expected a list of 4 numbers [x, y, w, h] "
                         "or 5+ [x, y, w, h, yaw, ...]")


def _as_json(v) -> str:
    """A value as the JSON file spells it, with its JSON kind: ``true (a boolean)``, ``"1" (a string)``."""
    kind = ("a boolean" if isinstance(v, bool) else "null" if v is None else "a string" if isinstance(v, str)
            else "a number" if isinstance(v, (int, float)) else f"a JSON {type(v).__name__}")
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if kind == "null" else f"{text[:40]} ({kind})"


def check_category_id(v, where: str) -> None:
    """COCO's ``category_id`` is an integer: a bool (``true`` is not class 1), a string or a float is refused."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where} has category_id {_as_json(v)}; expected an integer (COCO format)")


def check_iscrowd(v, where: str) -> None:
    """COCO's ``iscrowd`` flag is the integer 0 or 1 (a string "1" or a 7 is not read as a flag)."""
    if isinstance(v, bool) or not isinstance(v, int) or v not in (0, 1):
        raise ValueError(f"{where} has iscrowd {_as_json(v)}; expected the integer 0 or 1 (COCO format)")


def load_coco_gt(gt) -> dict:
    """Read COCO ground truth (path or dict) and check its structure.

    Parameters
    ----------
    gt : str, Path or dict
        A dict with ``images`` (each with ``id``), ``annotations`` (each with
        ``image_id``, ``category_id``, ``bbox``; ``iscrowd`` defaults to 0) and
        optionally ``categories`` (each with ``id``).

    Returns
    -------
    dict
        The GT dict, unchanged.

    Raises
    ------
    ValueError
        Naming the first malformed entry: a missing key, a bbox that is not a
        list of >= 4 numbers, an annotation whose ``image_id`` is not in
        ``images``, or whose ``category_id`` is not in ``categories``.

    Examples
    --------
    >>> g = load_coco_gt({"images": [{"id": 1}], "annotations": []})
    >>> len(g["images"])
    1
    """
    g = _read_json(gt, "gt")
    if not isinstance(g, dict) or "annotations" not in g or "images" not in g:
        raise ValueError("gt: expected a COCO dict with 'images' and 'annotations', got "
                         f"{type(g).__name__}{' with keys ' + str(sorted(g)) if isinstance(g, dict) else ''}")
    for part in ("images", "annotations", "categories"):
        if part in g and not isinstance(g[part], list):
            raise ValueError(f"gt: {part!r} must be a list, got {type(g[part]).__name__}")
    for i, im in enumerate(g["images"]):
        if not isinstance(im, dict) or "id" not in im:
            raise ValueError(f"gt: images[{i}] has no 'id'")
    cats = None
    if g.get("categories"):
        for i, c in enumerate(g["categories"]):
            if not isinstance(c, dict) or "id" not in c:
                raise ValueError(f"gt: categories[{i}] has no 'id'")
            if isinstance(c["id"], bool) or not isinstance(c["id"], int):
                raise ValueError(f"gt: categories[{i}] has id {_as_json(c['id'])}; expected an integer (COCO format)")
        cats = {c["id"] for c in g["categories"]}
    image_ids = {im["id"] for im in g["images"]}
    for part, ids in (("images", [im["id"] for im in g["images"]]),
                      ("categories", [c["id"] for c in g.get("categories") or []])):
        if len(set(map(repr, ids))) != len(ids):  # which entry would a lookup by id pick?
            seen, dup = set(), None
            for v in ids:
                if repr(v) in seen:
                    dup = v
                    break
                seen.add(repr(v))
            raise ValueError(f"gt: {part} has the id {dup!r} more than once; ids must be unique")
    for i, a in enumerate(g["annotations"]):
        if not isinstance(a, dict):
            raise ValueError(f"gt: annotations[{i}] is {type(a).__name__}; expected an object")
        for key in ("image_id", "category_id", "bbox"):
            if key not in a:
                raise ValueError(f"gt: annotations[{i}] has no {key!r}")
        check_bbox(a["bbox"], f"gt: annotations[{i}]")
        check_category_id(a["category_id"], f"gt: annotations[{i}]")
        if "iscrowd" in a:
            check_iscrowd(a["iscrowd"], f"gt: annotations[{i}]")
        if a["image_id"] not in image_ids:
            raise ValueError(f"gt: annotations[{i}] has image_id {a['image_id']!r}, which is not in gt images")
        if cats is not None and a["category_id"] not in cats:
            raise ValueError(f"gt: annotations[{i}] has category_id {a['category_id']!r}, which is not in gt "
                             f"categories {sorted(cats, key=str)[:10]}")
    return g


def load_coco_detections(detections) -> list[dict]:
    """Read COCO detection results (path, list, or a dict with ``annotations``).

    Parameters
    ----------
    detections : str, Path, list or dict
        Result records, each with ``image_id``, ``category_id``, ``bbox`` (a list
        of >= 4 numbers) and a finite ``score``.

    Returns
    -------
    list of dict

    Raises
    ------
    ValueError
        Naming the first malformed record (not an object, a missing key, a bad
        bbox, a non-finite score).

    Examples
    --------
    >>> load_coco_detections([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2], "score": 0.5}])[0]["score"]
    0.5
    """
    d = _read_json(detections, "detections")
    if isinstance(d, dict):
        if "annotations" not in d:
            raise ValueError(f"detections: a dict must hold the results under 'annotations', got keys {sorted(d)}")
        d = d["annotations"]
    if not isinstance(d, list):
        raise ValueError(f"detections: expected a list of result records, got {type(d).__name__}")
    for i, r in enumerate(d):
        if not isinstance(r, dict):
            raise ValueError(f"detections: record {i} is {type(r).__name__} {r!r}; expected an object with "
                             "image_id, category_id, bbox, score")
        for key in ("image_id", "category_id", "bbox", "score"):
            if key not in r:
                raise ValueError(f"detections: record {i} has no {key!r}")
        check_bbox(r["bbox"], f"detections: record {i}")
        check_category_id(r["category_id"], f"detections: record {i}")
        s = r["score"]
        if not _is_number(s) or not math.isfinite(s):
            raise ValueError(f"detections: record {i} has score {s!r}; expected a finite number")
    return d


def category_columns(gt: dict, dets: list[dict]) -> list:
    """Category ids in column order (the GT ``categories`` list, else the sorted ids of the GT
    annotations); a detection whose ``category_id`` is not among them raises ``ValueError``
    when the GT lists its categories."""
    if g_cats := [c["id"] for c in gt.get("categories") or []]:
        known = set(g_cats)
        for i, r in enumerate(dets):
            if r["category_id"] not in known:
                raise ValueError(f"detections: record {i} has category_id {r['category_id']!r}, which is not in "
                                 f"gt categories {sorted(known, key=str)[:10]}")
        return g_cats
    return sorted({a["category_id"] for a in gt["annotations"]})
