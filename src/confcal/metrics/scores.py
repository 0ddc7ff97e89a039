"""Proper scores and accuracy on probabilities (float64, O(n * n_classes))."""

from __future__ import annotations

import numpy as np

from confcal._validation import as_numpy, check_labels, check_probs

__all__ = ["nll", "brier_score", "accuracy", "NLL_EPS"]

#: Probabilities of the true class are clipped below at this value, so a zero
#: probability gives a large but finite NLL (-log 1e-12 = 27.6 nats).
NLL_EPS = 1e-12


def nll(probs, labels, *, eps: float = NLL_EPS) -> float:
    """Mean negative log-likelihood ``-mean log p[i, y_i]`` in nats.

    ``probs``: ``(n_samples, n_classes)`` or 1-D binary positive-class probabilities.
    ``p[i, y_i]`` is clipped to ``[eps, 1]`` so a zero probability (common in
    float32) stays finite.
    """
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    py = np.clip(p[np.arange(p.shape[0]), y], eps, 1.0)
    return float(-np.mean(np.log(py))) + 0.0  # + 0.0 turns -0.0 into 0.0


def brier_score(probs, labels) -> float:
    """Multiclass Brier score: ``mean_i sum_k (p[i, k] - 1[y_i = k])^2`` (Brier 1950), in [0, 2].

    For a 2-column input this is twice scikit-learn's binary ``brier_score_loss``.
    A 1-D input of positive-class probabilities ``p`` gives the binary form
    ``mean (p - y)^2`` in [0, 1], which equals scikit-learn's.
    """
    arr = as_numpy(probs, "probs")
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    if arr.ndim == 1:
        return float(np.mean((p[:, 1] - y) ** 2))
    sq = np.sum(p**2, axis=1) - 2.0 * p[np.arange(p.shape[0]), y] + 1.0
    return float(np.mean(sq))


def accuracy(probs, labels) -> float:
    """Fraction of samples whose arg-max class equals the label.

    Tie rule, used everywhere in confcal: the lowest class index wins (``numpy.argmax``).
    Accepts probabilities or logits ``(n_samples, n_classes)``, or 1-D binary probabilities.
    """
    s = as_numpy(probs, "probs")
    if s.ndim == 1:
        s = check_probs(s)
    if s.ndim != 2:
        raise ValueError(f"probs: expected shape (n_samples, n_classes), got {s.shape}")
    if s.shape[0] == 0:
        raise ValueError(f"probs: expected at least 1 sample, got shape {s.shape}")
    y = check_labels(labels, s.shape[0], s.shape[1])
    return float(np.mean(np.argmax(s, axis=1) == y))
