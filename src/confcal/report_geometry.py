"""The report's geometry section: where on the image (or how far from the sensor) boxes are
over- or under-confident, before and after calibration.

* a heat map of the calibration gap (mean confidence minus precision) over the box centre,
  when both ``cx`` and ``cy`` are given, one panel per stage;
* the gap against every other feature (``range``, ``w``, ``h``, ...), one line per stage;
* the geometry D-ECE of each stage (:func:`confcal.metrics.detection_geometry.geometry_ece`).

Charts are matplotlib SVG, inlined like the rest of :mod:`confcal.report`.
"""

from __future__ import annotations

import html
import io

import numpy as np

from confcal.metrics.detection_geometry import geometry_ece, geometry_gap_map

__all__ = ["geometry_section"]


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def position_heatmap_svg(stages: dict, labels, cx, cy, n_bins: int = 5) -> str:
    """SVG: one heat map per stage of the gap over ``(cx, cy)`` in [0, 1]^2 (``n_bins`` per axis)."""
    plt = _plt()
    f = np.stack([cx, cy], axis=1)
    fig, axes = plt.subplots(1, len(stages), figsize=(3.8 * len(stages), 3.4), squeeze=False)
    for ax, (name, p) in zip(axes[0], stages.items()):
        g = geometry_gap_map(p, labels, f, n_bins=5, n_feature_bins=n_bins, feature_ranges=[(0, 1), (0, 1)])
        im = ax.imshow(g["gap"].T, origin="upper", extent=(0, 1, 1, 0), cmap="RdBu_r", vmin=-0.5, vmax=0.5)
        for i in range(n_bins):
            for j in range(n_bins):
                if g["count"][i, j]:
                    ax.text((i + 0.5) / n_bins, (j + 0.5) / n_bins, str(int(g["count"][i, j])), ha="center",
                            va="center", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("cx")
        ax.set_ylabel("cy")
    fig.colorbar(im, ax=axes[0].tolist(), label="confidence - precision")
    return _svg(fig)


def gap_curve_svg(stages: dict, labels, values, name: str, n_bins: int = 8) -> str:
    """SVG: the gap per equal-width bin of one feature, one line per stage."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    for stage, p in stages.items():
        g = geometry_gap_map(p, labels, np.asarray(values)[:, None], n_bins=5, n_feature_bins=n_bins)
        e = g["edges"][0]
        ax.plot((e[:-1] + e[1:]) / 2, g["gap"], marker="o", label=stage)
    ax.axhline(0.0, color="#888", lw=0.8)
    ax.set_xlabel(name)
    ax.set_ylabel("confidence - precision")
    ax.legend(fontsize=8)
    return _svg(fig)


def geometry_section(stages: dict, labels, features: dict) -> str:
    """HTML of the geometry section for box-score ``stages`` ``{name: (n,) P(TP)}``, 0/1 ``labels``
    and ``features`` ``{name: (n,) values}``."""
    y = np.asarray(labels)
    names = list(features)
    f = np.stack([np.asarray(features[k], dtype=np.float64) for k in names], axis=1)
    rows = "".join(f"<tr><td class=l>{html.escape(s)}</td><td>{geometry_ece(p, y, f, 5, 5 if f.shape[1] <= 2 else 2):.4f}"
                   "</td></tr>" for s, p in stages.items())
    parts = ["<h2>Calibration over box geometry</h2>",
             f"<p>Geometry D-ECE over confidence x {html.escape(', '.join(names))} (5 confidence bins x "
             f"{5 if f.shape[1] <= 2 else 2} equal-width bins per feature; Küppers et al. 2020, eq. 3).</p>",
             f"<table><tr><th class=l>stage</th><th>geometry D-ECE</th></tr>{rows}</table>"]
    if "cx" in features and "cy" in features:
        parts.append(f"<figure>{position_heatmap_svg(stages, y, features['cx'], features['cy'])}"
                     "<figcaption>gap over the box centre (red: over-confident; numbers: boxes)</figcaption></figure>")
    for k in names:
        if k in ("cx", "cy"):
            continue
        parts.append(f"<figure>{gap_curve_svg(stages, y, features[k], k)}"
                     f"<figcaption>gap against {html.escape(k)}</figcaption></figure>")
    return "\n".join(parts)
