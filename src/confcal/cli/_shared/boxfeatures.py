"""``--box-features NAMES``: box geometry columns read by name from the box scores' file.

``confcal detections match`` writes one array per geometry feature (``cx, cy, w, h, edge`` for
axis-aligned boxes with a known image size; ``range, bearing, length_m, width_m`` for rotated
BEV boxes) beside ``score``. ``fit --box-features cx,cy`` stacks ``matched.npz:cx`` and
``matched.npz:cy`` into the ``(n_boxes, 2)`` features of a geometry-dependent method and records
the names in the manifest; ``apply`` / ``evaluate`` read the same names from their scores' file.
"""

from __future__ import annotations

__all__ = ["add_box_features_arg", "add_category_ids_arg", "refuse_category_ids", "read_box_features", "names_of"]

_HINT = ("`confcal detections match` writes cx, cy, w, h, edge for axis-aligned boxes (with the images' "
         "width/height or --image-size W,H) and range, bearing, length_m, width_m for rotated BEV boxes")


def add_box_features_arg(p, *, what: str) -> None:
    p.add_argument("--box-features", metavar="NAMES",
                   help=f"comma-separated box geometry features read from the --logits file by name (e.g. "
                        f"cx,cy,w,h or range), {what}")


def add_category_ids_arg(p) -> None:
    p.add_argument("--category-ids", metavar="SPEC",
                   help="box scores: category id per box (n_boxes,), for a calibrator fitted --per-class "
                        "(det-ts/det-platt/det-beta and the geometry maps); ids unseen at fit time use the pooled map")


def refuse_category_ids(args, logits_kind: str) -> None:
    """Class vectors take no category ids: a given ``--category-ids`` is refused, not silently ignored
    (a missing or damaged file there went unnoticed)."""
    if getattr(args, "category_ids", None):
        raise ValueError(f"--category-ids: only for 1-D box scores with a calibrator fitted --per-class; "
                         f"--logits holds {logits_kind}")


def names_of(text: str) -> list[str]:
    names = [t.strip() for t in str(text).split(",")]
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"--box-features: expected distinct comma-separated names such as cx,cy, got {text!r}")
    return names


def read_box_features(logits_specs, names, *, option: str = "--box-features", fitted: bool = False):
    """``(n_boxes, len(names))`` float64 from ``PATH:name`` of every ``--logits`` file (concatenated
    in order). A missing array raises ``ValueError`` naming it, the file and how to get it."""
    import numpy as np  # here, not at import: building the parser imports no numpy

    from confcal.io import load_array
    from confcal.sources import split_spec

    specs = [logits_specs] if isinstance(logits_specs, str) else list(logits_specs)
    parts = []
    for spec in specs:
        path, _ = split_spec(spec)
        cols = []
        for name in names:
            try:
                cols.append(np.asarray(load_array(f"{path}:{name}", name=option), dtype=np.float64).reshape(-1))
            except (ValueError, FileNotFoundError) as exc:
                why = "the calibrator was fitted on box features " + ", ".join(names) if fitted else \
                    "asked for by --box-features"
                raise ValueError(f"{option}: {path} has no box feature {name!r} ({why}); {_HINT} "
                                 f"[{str(exc).splitlines()[0]}]") from None
        # every feature one value per box: the scores' own length, named, not numpy's "same shape" error
        n = int(np.shape(load_array(spec, name=option))[0])
        for name, col in zip(names, cols):
            if col.shape[0] != n:
                raise ValueError(f"{option}: box feature {name!r} of {path} has {col.shape[0]} rows, expected {n} "
                                 f"(one per box of {spec}); re-run `confcal detections match` to write them together")
        parts.append(np.stack(cols, axis=1))
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{option}: box feature row {i} is {out[i].tolist()} (NaN: this box has no "
                         f"{', '.join(n for n, v in zip(names, out[i]) if not np.isfinite(v))}, e.g. an "
                         "axis-aligned box among rotated ones); fit one calibrator per box kind")
    return out
