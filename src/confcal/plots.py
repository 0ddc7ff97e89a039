"""Reliability diagrams and confidence histograms (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from confcal.metrics import ece, reliability_table

__all__ = ["reliability_diagram", "save_reliability_diagram"]


def reliability_diagram(probs_by_name: dict, labels, *, n_bins: int = 15, title: str | None = None):
    """A figure with one column per entry of ``probs_by_name`` (``name -> (n, K) probabilities``):
    top, accuracy per confidence bin as bars against the diagonal (gap shaded);
    bottom, the histogram of top-label confidence. Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(probs_by_name)
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.0), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex=True)
    for j, name in enumerate(names):
        probs = probs_by_name[name]
        table = reliability_table(probs, labels, n_bins=n_bins)
        lo, hi = table["bin_lo"], table["bin_hi"]
        width = hi - lo
        acc = np.nan_to_num(table["accuracy"])
        conf = np.nan_to_num(table["mean_confidence"])
        top, bottom = axes[0, j], axes[1, j]
        top.bar(lo, acc, width=width, align="edge", color="#4c72b0", edgecolor="black", label="accuracy")
        top.bar(lo, np.abs(conf - acc), bottom=np.minimum(conf, acc), width=width, align="edge",
                color="#dd8452", alpha=0.45, edgecolor="#dd8452", label="gap to mean confidence")
        top.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        top.set_xlim(0, 1)
        top.set_ylim(0, 1)
        top.set_title(f"{name}\nECE = {100 * ece(probs, labels, n_bins=n_bins):.2f}%")
        if j == 0:
            top.set_ylabel("accuracy")
            top.legend(loc="upper left", fontsize=8)
        counts = table["count"]
        bottom.bar(lo, counts / max(1, counts.sum()), width=width, align="edge", color="#999999",
                   edgecolor="black")
        bottom.set_xlabel("confidence (top-label probability)")
        if j == 0:
            bottom.set_ylabel("fraction of samples")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_reliability_diagram(path, probs_by_name: dict, labels, **kw) -> Path:
    """Draw :func:`reliability_diagram` and save it to ``path`` (PNG by suffix), atomically."""
    from confcal.io import atomic_write

    fig = reliability_diagram(probs_by_name, labels, **kw)
    path = Path(path)
    try:
        with atomic_write(path) as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".") or "png", dpi=110)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path
