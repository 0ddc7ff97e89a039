"""Comparing box-score calibrators (``det-*``) on repeated calibration/test splits of boxes, with
the confidence-only and the geometry D-ECE side by side.

Split ``s`` permutes the boxes with ``numpy.random.default_rng([random_state, s])``, calibrates on the
first ``cal_size`` and tests on the rest. Each method is fitted on the calibration part (the
geometry methods with the ``features`` of those boxes) and scored on the test part: D-ECE (15
equal-width bins; Küppers et al. 2020, eq. 3 on the confidence), geometry D-ECE (5 confidence bins
x 5 bins per feature over the whole set's range, eq. 3 with the features), binary NLL and Brier, as
mean and standard error over splits, and the fit time.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from confcal._validation import check_features, renamed_seed
from confcal.calibrators import METHODS
from confcal.calibrators.protocol.base import make_calibrator
from confcal.metrics.detection import binary_brier, binary_nll, check_pairs, detection_ece
from confcal.metrics.detection_geometry import geometry_ece

__all__ = ["compare_box_methods", "BOX_METRICS", "format_box_comparison"]

BOX_METRICS = ("d_ece", "geo_d_ece", "nll", "brier", "fit_seconds")


def compare_box_methods(scores, labels, methods, *, features=None, feature_names=None, n_splits: int = 10,
                        cal_size: int | None = None, random_state: int = 0, seed: int | None = None) -> dict:
    """Fit every box method on calibration splits and score it on the matching test splits.

    Parameters
    ----------
    scores : ndarray
        Float ``(n_boxes,)`` raw box scores
    labels : ndarray
        0/1 ``(n_boxes,)``
    methods : list of str
        Names in :data:`confcal.calibrators.METHODS` (``det-*``; geometry methods need ``features``)
    features : ndarray, optional
        Float ``(n_boxes, d)`` box geometry
    feature_names : str, optional
        Comma-separated names of the ``features`` columns
    n_splits, cal_size, random_state : int
        The splits: their number, the calibration boxes per split (default half the boxes) and the
        seed (``seed`` is its old name, with a ``FutureWarning``)

    Returns
    -------
    dict
        Keys ``rows``, ``n_splits``, ``cal_size``, ``test_size``, ``features``. ``rows`` holds one dict
        per method with ``method``, each metric's mean (``<metric>``) and standard error
        (``<metric>_se``) and ``error`` (str or None); ``uncalibrated`` (scores clipped to [0, 1])
        comes first. A method whose fit fails gets its error message and no values.

    Raises
    ------
    ValueError
        Scores not 1-D, labels not 0/1, an unknown method, or ``cal_size`` outside ``[2, n_boxes)``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> s = rng.uniform(0, 1, 400); y = (rng.uniform(size=400) < s ** 2).astype(int)
    >>> out = compare_box_methods(s, y, ["det-platt"], n_splits=2)
    >>> [r["method"] for r in out["rows"]], out["rows"][1]["nll"] < out["rows"][0]["nll"]
    (['uncalibrated', 'det-platt'], True)
    """
    random_state = renamed_seed(random_state, seed, "compare_box_methods")
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores: expected 1-D box scores (n_boxes,), got shape {s.shape}")
    _, y = check_pairs(np.clip(s, 0, 1), labels, name="scores")
    y = y.astype(np.int64)
    n = s.shape[0]
    f = None if features is None else check_features(features, n)
    names = list(methods)
    for m in names:
        if m not in METHODS:
            raise ValueError(f"methods: unknown {m!r}; known: {sorted(METHODS)}")
    cal_size = n // 2 if cal_size is None else int(cal_size)
    if not 2 <= cal_size < n:
        raise ValueError(f"cal_size: expected an integer in [2, {n}), got {cal_size}")
    ranges = None if f is None else [(float(f[:, j].min()), float(f[:, j].max())) for j in range(f.shape[1])]
    values = {m: {k: [] for k in BOX_METRICS} for m in ["uncalibrated", *names]}
    errors = {m: None for m in names}
    for sp in range(int(n_splits)):
        perm = np.random.default_rng([random_state, sp]).permutation(n)
        cal, test = perm[:cal_size], perm[cal_size:]
        preds = {"uncalibrated": (np.clip(s[test], 0, 1), 0.0)}
        for m in names:
            if errors[m]:
                continue
            geo = getattr(METHODS[m], "takes_box_features", False)
            if geo and f is None:
                errors[m] = f"features: {m} needs the box geometry (features=, --box-features)"
                continue
            try:
                est = make_calibrator(m, {"box_features": feature_names} if geo and feature_names else {})
                side_c = {"features": f[cal]} if geo else {}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t0 = time.perf_counter()
                    est.fit(s[cal], y[cal], **side_c)
                    dt = time.perf_counter() - t0
                    p = est.predict_proba(s[test], dtype=np.float64, **({"features": f[test]} if geo else {}))[:, 1]
                preds[m] = (p, dt)
            except (ValueError, TypeError) as exc:
                errors[m] = str(exc).splitlines()[0]
        for m, (p, dt) in preds.items():
            v = values[m]
            v["d_ece"].append(detection_ece(p, y[test], 15))
            v["geo_d_ece"].append(np.nan if f is None else geometry_ece(p, y[test], f[test], 5, 5,
                                                                          feature_ranges=ranges))
            v["nll"].append(binary_nll(p, y[test]))
            v["brier"].append(binary_brier(p, y[test]))
            v["fit_seconds"].append(dt)
    rows = []
    for m in ["uncalibrated", *names]:
        row = {"method": m, "error": errors.get(m)}
        for k in BOX_METRICS:
            a = np.asarray(values[m][k], dtype=np.float64)
            row[k] = float(a.mean()) if a.size else None
            row[k + "_se"] = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else None
        rows.append(row)
    return {"rows": rows, "n_splits": int(n_splits), "cal_size": cal_size, "test_size": n - cal_size,
            "features": feature_names}


def format_box_comparison(result: dict) -> str:
    """A text table: mean ± standard error per metric."""
    head = ["method", "D-ECE", "geometry D-ECE", "NLL", "Brier", "fit s"]
    lines = []
    for r in result["rows"]:
        if r["error"]:
            lines.append([r["method"], f"failed: {r['error']}"])
            continue
        cells = [r["method"]]
        for k in BOX_METRICS:
            v, se = r[k], r[k + "_se"]
            cells.append("-" if v is None or np.isnan(v) else f"{v:.4f}" + (f" ± {se:.4f}" if se is not None else ""))
        lines.append(cells)
    widths = [max(len(str(c[i])) for c in [head, *[x for x in lines if len(x) == len(head)]]) for i in range(len(head))]
    out = [f"{result['n_splits']} splits, {result['cal_size']} calibration / {result['test_size']} test boxes"
           + (f"; geometry D-ECE over confidence x {result['features']}" if result["features"] else ""),
           "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    for c in lines:
        out.append("  ".join(str(x).rjust(w) for x, w in zip(c, widths)) if len(c) == len(head) else "  ".join(c))
    return "\n".join(out)
