"""Draws the gallery thumbnail of ``examples/domain_logits.py`` (a script the docs build does not run,
so sphinx-gallery has no figure of its own for it): the source model's mean confidence against its
accuracy on every domain of the files the script writes, the covariate shift ``domain-eval`` measures.

Run from the repository root, with ``../shared/data`` beside it::

    python examples/domain_logits.py --data ../shared/data/domains/office_caltech10_surf \\
        --source amazon -o /tmp/office_logits
    python docs/_static/domain_logits_thumb.py /tmp/office_logits docs/_static/domain_logits_thumb.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import softmax  # noqa: E402


def main(folder: str, out: str) -> None:
    names, conf, acc = [], [], []
    for path in sorted(Path(folder).glob("*.npz"), key=lambda p: (p.stem != "amazon", p.stem)):
        d = np.load(path)
        p = softmax(d["logits"], axis=1)
        names.append(path.stem)
        conf.append(p.max(axis=1).mean())
        acc.append((p.argmax(axis=1) == d["labels"]).mean())
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    x = np.arange(len(names))
    ax.bar(x - 0.2, conf, 0.4, label="mean confidence", color="#4c72b0")
    ax.bar(x + 0.2, acc, 0.4, label="accuracy", color="#dd8452")
    ax.set_xticks(x, [f"{n}\n(source)" if i == 0 else n for i, n in enumerate(names)], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title("source model's logits on every domain", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
