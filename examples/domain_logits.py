"""
Logits of a source-domain model on every domain (input of ``confcal domain-eval``)
==================================================================================

``confcal domain-eval`` needs one model's logits, labels and features on several domains. The
domain sets in ``../shared/data/domains`` hold features, not logits, so this script trains the
model: a multinomial logistic regression (scikit-learn) on part of the source domain's rows,
then writes its logits (``decision_function``) on the source's held-out rows and on every other
domain, one ``.npz`` per domain with ``logits`` float64 ``(n, K)``, ``labels`` int64 ``(n,)`` and
``features`` float32 ``(n, d)`` (the standardised inputs, which the cluster-level and
source-gated methods read).

Pre-processing follows the data's provenance notes (``office_caltech10_surf/README.md``): each row
L1-normalised, then z-scored with the mean and spread of the source's training rows only; rows are
shuffled (seeded) before the source is split, since the files are sorted by class.

Run from the repository root (the walkthrough in the audit guide does)::

    python examples/domain_logits.py --data ../shared/data/domains/office_caltech10_surf \\
        --source amazon -o office_logits
    confcal domain-eval --domain amazon=office_logits/amazon.npz ... --source amazon

This file is a script, not a gallery example (its name has no ``plot_`` prefix): it writes
files and draws nothing, so the documentation build does not run it.
"""

from __future__ import annotations

# the gallery's thumbnail: this script draws nothing (docs/_static/domain_logits_thumb.py draws it)
# sphinx_gallery_thumbnail_path = '_static/domain_logits_thumb.png'

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _l1_rows(x: np.ndarray) -> np.ndarray:
    s = np.abs(x).sum(axis=1, keepdims=True)
    return x / np.where(s > 0, s, 1.0)


def make_domain_logits(data_dir, source: str, out_dir, *, train_fraction: float = 0.5,
                       C: float = 1.0, random_state: int = 0) -> dict:
    """Train on ``train_fraction`` of the source's rows; write ``out_dir/<domain>.npz`` for every domain.

    Returns a summary ``{domain: {"n", "accuracy"}}`` (the source's entry is its held-out rows) and
    writes it to ``out_dir/summary.json``. Raises ``ValueError`` naming the argument for a missing
    source file, a folder without ``.npz`` files or a fraction outside (0, 1).
    """
    from sklearn.linear_model import LogisticRegression

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    files = sorted(data_dir.glob("*.npz"))
    if not files:
        raise ValueError(f"--data: expected a folder of per-domain .npz files, got {str(data_dir)!r}")
    domains = {f.stem: f for f in files}
    if source not in domains:
        raise ValueError(f"--source: expected one of {sorted(domains)}, got {source!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"--train-fraction: expected a number in (0, 1), got {train_fraction!r}")
    rng = np.random.default_rng(random_state)
    src = np.load(domains[source])
    x_src, y_src = _l1_rows(src["features"].astype(np.float64)), src["labels"].astype(np.int64)
    perm = rng.permutation(len(y_src))
    n_train = int(round(train_fraction * len(y_src)))
    train, held = perm[:n_train], perm[n_train:]
    mean = x_src[train].mean(axis=0)
    std = x_src[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    model = LogisticRegression(C=C, max_iter=2000).fit((x_src[train] - mean) / std, y_src[train])
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, path in domains.items():
        d = np.load(path)
        x, y = _l1_rows(d["features"].astype(np.float64)), d["labels"].astype(np.int64)
        if name == source:
            x, y = x[held], y[held]
        else:
            order = rng.permutation(len(y))
            x, y = x[order], y[order]
        z = (x - mean) / std
        logits = model.decision_function(z).astype(np.float64)
        np.savez(out_dir / f"{name}.npz", logits=logits, labels=y, features=z.astype(np.float32))
        summary[name] = {"n": int(len(y)), "accuracy": float(np.mean(logits.argmax(axis=1) == y))}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--data", required=True, help="folder of per-domain .npz files with features and labels")
    p.add_argument("--source", required=True, help="the source domain (file stem); the model is trained on it")
    p.add_argument("-o", "--output-dir", required=True, help="folder for <domain>.npz and summary.json")
    p.add_argument("--train-fraction", type=float, default=0.5, help="share of the source used to train (0.5)")
    p.add_argument("--C", type=float, default=1.0, help="inverse L2 strength of the logistic regression (1.0)")
    p.add_argument("--random-state", type=int, default=0, help="seed of the shuffles and the source split (0)")
    args = p.parse_args(argv)
    try:
        summary = make_domain_logits(args.data, args.source, args.output_dir, train_fraction=args.train_fraction,
                                     C=args.C, random_state=args.random_state)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, s in summary.items():
        print(f"{name}: {s['n']} rows, accuracy {s['accuracy']:.3f}" + (" (held out)" if name == args.source else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
