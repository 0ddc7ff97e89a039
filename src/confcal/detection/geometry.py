"""Geometry of detection boxes: axis-aligned ``[x, y, w, h]`` and rotated ``[x, y, w, h, yaw]``.

IoU (:func:`box_iou`) for matching, and per-box position / size features for
geometry-dependent calibration (:func:`box_geometry`).

Axis-aligned IoU comes from ``pycocotools.mask.iou`` (the COCO evaluation's own
routine); rotated IoU is the area ratio of the rectangles' polygons from shapely.
A rotated box is a ``w x h`` rectangle centred at ``(x + w/2, y + h/2)``, rotated
by ``yaw`` radians counter-clockwise about its centre; trailing values (a 3-D
height, ...) are ignored.
"""

from __future__ import annotations

import numpy as np

__all__ = ["box_iou", "box_array", "detect_box_format", "BOX_FORMATS", "box_geometry", "GEOMETRY_FEATURES"]

BOX_FORMATS = ("auto", "xywh", "xywha")


def box_array(boxes, fmt: str, what: str, item: str = "box") -> np.ndarray:
    """``(n, 4)`` or ``(n, 5)`` float64 boxes; ``ValueError`` naming ``what`` and the box (``item``
    followed by its index, or ``item`` with ``{}`` for the index: ``"annotations[{}]"``) for short,
    non-finite or negative-size boxes."""
    width = 4 if fmt == "xywh" else 5
    label = (lambda i: item.format(i)) if "{}" in item else (lambda i: f"{item} {i}")  # noqa: E731
    if len(boxes) == 0:
        return np.zeros((0, width))
    rows = []
    for i, b in enumerate(boxes):
        if len(b) < width:
            raise ValueError(f"{what}: {label(i)} has {len(b)} box values; format {fmt!r} needs {width}")
        rows.append([float(v) for v in b[:width]])
    a = np.asarray(rows, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a[:, 2:4] < 0):
        i = int(np.flatnonzero(~np.isfinite(a).all(1) | (a[:, 2:4] < 0).any(1))[0])
        raise ValueError(f"{what}: {label(i)} has box {a[i].tolist()}; expected finite values and w, h >= 0")
    return a


def detect_box_format(gt_anns, dets, *, option: str = "box_format") -> str:
    """``"xywh"`` when every box has 4 values, ``"xywha"`` when every box has 5 or more;
    mixed lengths raise ``ValueError`` naming ``option`` (the caller's name for the choice)."""
    lengths = {len(a["bbox"]) for a in gt_anns} | {len(r["bbox"]) for r in dets}
    if not lengths or lengths == {4}:
        return "xywh"
    if min(lengths) >= 5:
        return "xywha"
    raise ValueError(f"bbox: mixed box lengths {sorted(lengths)} in one GT/detections pair; "
                     f"choose {option} 'xywh' or 'xywha'")


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

    Parameters
    ----------
    det_boxes, gt_boxes : sequences of boxes, ``(n_det, 4|5)`` and ``(n_gt, 4|5)``
    iscrowd : bool ``(n_gt,)``, optional
        For a crowd GT column the value is ``intersection / area(det)``, as in COCO evaluation.
    box_format : ``"xywh"`` (axis-aligned, ``pycocotools.mask.iou``) or ``"xywha"``
        (rotated, polygon IoU from shapely)

    Returns
    -------
    ndarray of float64, shape ``(n_det, n_gt)``
        Degenerate (zero-area) boxes give IoU 0. Rotated pairs whose exact GEOS
        overlay comes back lower-dimensional although the boxes intersect (a
        known robustness limit with nearly collinear edges) are recomputed on a
        snapping grid of 1e-9 times the coordinate extent.

    Raises
    ------
    ValueError
        Unknown ``box_format``, malformed boxes, or ``iscrowd`` of the wrong shape.

    Examples
    --------
    >>> float(box_iou([[0, 0, 10, 10]], [[5, 0, 10, 10]])[0, 0])
    0.3333333333333333
    """
    if box_format not in ("xywh", "xywha"):
        raise ValueError(f"box_format: expected 'xywh' or 'xywha', got {box_format!r}")
    d = box_array(det_boxes, box_format, "det_boxes")
    g = box_array(gt_boxes, box_format, "gt_boxes")
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


# --------------------------------------------------------------------------- box geometry features
#: names of the geometry features per box format (see :func:`box_geometry`)
GEOMETRY_FEATURES = {"xywh": ("cx", "cy", "w", "h", "edge"),
                     "xywha": ("range", "bearing", "length_m", "width_m")}


def box_geometry(boxes, box_format: str = "xywh", image_size=None) -> dict:
    """Geometry of each box as calibration features (Küppers et al., CVPR-W 2020, sec. 3: the box's
    position and size, normalised to the image).

    Parameters
    ----------
    boxes : ``(n, 4)`` ``[x, y, w, h]`` (axis-aligned, image units) or ``(n, 5+)``
        ``[x, y, w, h, yaw, ...]`` (rotated bird's-eye-view boxes in metres, sensor at the origin)
    box_format : ``"xywh"`` or ``"xywha"``
    image_size : ``(W, H)`` or ``(n, 2)`` per box; needed for ``"xywh"``, unused for ``"xywha"``

    Returns
    -------
    dict of float64 ``(n,)`` arrays, keys :data:`GEOMETRY_FEATURES` ``[box_format]``:

    * ``"xywh"``: ``cx = (x + w/2) / W`` and ``cy = (y + h/2) / H`` (centre, in [0, 1] for a box
      inside the image), ``w / W`` and ``h / H`` (size as fractions of the image), and
      ``edge = max(0, min(x / W, y / H, 1 - (x + w) / W, 1 - (y + h) / H))``: the gap between the
      box and the nearest image border, as a fraction of the image side it is measured along
      (0 for a box touching or cut by the border).
    * ``"xywha"``: the centre ``(x + w/2, y + h/2)`` (the rotated-box convention of :func:`box_iou`)
      in polar form, ``range`` (metres from the sensor) and ``bearing`` (radians in (-pi, pi],
      0 along +x), and the box's ``length_m = w`` and ``width_m = h`` (metres).

    Raises
    ------
    ValueError
        Malformed boxes, an unknown format, or ``image_size`` missing, of the wrong shape, or not
        positive for ``"xywh"``.

    Examples
    --------
    >>> g = box_geometry([[10, 20, 30, 40]], "xywh", image_size=(100, 200))
    >>> [round(float(g[k][0]), 4) for k in ("cx", "cy", "w", "h", "edge")]
    [0.25, 0.2, 0.3, 0.2, 0.1]
    """
    if box_format not in GEOMETRY_FEATURES:
        raise ValueError(f"box_format: expected 'xywh' or 'xywha', got {box_format!r}")
    a = box_array(boxes, box_format, "boxes")
    n = a.shape[0]
    if box_format == "xywha":
        cx, cy = a[:, 0] + a[:, 2] / 2, a[:, 1] + a[:, 3] / 2
        return {"range": np.hypot(cx, cy), "bearing": np.arctan2(cy, cx),
                "length_m": a[:, 2].copy(), "width_m": a[:, 3].copy()}
    if image_size is None:
        raise ValueError("image_size: axis-aligned box geometry needs the image size (W, H) "
                         "(--image-size W,H)")
    size = np.asarray(image_size, dtype=np.float64)
    size = np.broadcast_to(size, (n, 2)) if size.shape == (2,) else size
    if size.shape != (n, 2) or not np.all(np.isfinite(size)) or np.any(size <= 0):
        raise ValueError(f"image_size: expected (W, H) or shape ({n}, 2) of finite values > 0, "
                         f"got shape {np.shape(image_size)}")
    W, H = size[:, 0], size[:, 1]
    x, y, w, h = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    edge = np.minimum.reduce([x / W, y / H, 1.0 - (x + w) / W, 1.0 - (y + h) / H])
    return {"cx": (x + w / 2) / W, "cy": (y + h / 2) / H, "w": w / W, "h": h / H,
            "edge": np.maximum(edge, 0.0)}
