"""Proper scores and accuracy on probabilities (float64, O(n * n_classes))."""

from __future__ import annotations

import numpy as np

from confcal._validation import as_numpy, check_labels, check_probs

__all__ = ["nll", "brier_score", "accuracy", "NLL_EPS"]

#: Probabilities of the true class are clipped below at this value, so a zero
#: probability gives a large but finite NLL (-log 1e-12 = 27.6 nats).
NLL_EPS = 1e-12


def nll(probs, labels, *, eps: float = NLL_EPS) -> float:
    """Mean negative log-likelihood ``-mean_i log p[i, y_i]``, in nats.

    Source: the NLL of Guo et al., ICML 2017, sec. 2 (a proper scoring rule,
    Gneiting & Raftery 2007).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities; 1-D: binary positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.
    eps : float, default=1e-12
        ``p[i, y_i]`` is clipped to ``[eps, 1]``, so a zero probability
        (common in float32) gives a large but finite loss.

    Returns
    -------
    float
        ``>= 0``, in nats.

    Raises
    ------
    ValueError
        Invalid probabilities or labels (see
        :func:`confcal._validation.check_probs`).

    Examples
    --------
    The true-class probabilities are 0.9, 0.25, 0.55 and 0.7:

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> value = nll(probs, [0, 0, 0, 1])
    >>> round(value, 6), round(float(-np.log([0.9, 0.25, 0.55, 0.7]).mean()), 6)
    (0.611542, 0.611542)
    >>> round(nll([[1.0, 0.0]], [1]), 2)  # -log(1e-12)
    27.63
    """
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    py = np.clip(p[np.arange(p.shape[0]), y], eps, 1.0)
    return float(-np.mean(np.log(py))) + 0.0  # + 0.0 turns -0.0 into 0.0


def brier_score(probs, labels) -> float:
    """Multiclass Brier score ``mean_i sum_k (p[i, k] - 1[y_i = k])^2``.

    Source: Brier, "Verification of forecasts expressed in terms of
    probability", Monthly Weather Review 1950, eq. 1 (normalised by n).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities.  For 2 columns the value is twice scikit-learn's
        binary ``brier_score_loss``; a 1-D input of positive-class
        probabilities ``p`` gives the binary form ``mean (p - y)^2``, equal to
        scikit-learn's.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.

    Returns
    -------
    float
        In ``[0, 2]`` (``[0, 1]`` for a 1-D input).

    Raises
    ------
    ValueError
        Invalid probabilities or labels.

    Examples
    --------
    Per sample: ``2 * 0.1^2``, ``0.75^2 + 0.75^2``, ``2 * 0.45^2`` and
    ``2 * 0.3^2``; their mean is ``1.73 / 4``:

    >>> import numpy as np
    >>> from confcal.metrics import brier_score
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> round(brier_score(probs, [0, 0, 0, 1]), 6)
    0.4325
    >>> round(brier_score(probs[:, 1], [0, 0, 0, 1]), 6)  # binary form: half of it
    0.21625
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

    Tie rule, used everywhere in confcal: the lowest class index wins
    (``numpy.argmax``).

    Parameters
    ----------
    probs : array-like of shape (n_samples, n_classes) or (n_samples,)
        Probabilities or logits (only their arg-max matters), or 1-D binary
        positive-class probabilities.
    labels : array-like of int, shape (n_samples,)
        True classes in ``[0, n_classes)``.

    Returns
    -------
    float
        In ``[0, 1]``.

    Raises
    ------
    ValueError
        No samples, a shape other than 1-D/2-D, or invalid labels.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.metrics import accuracy
    >>> probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.55, 0.45], [0.3, 0.7]])
    >>> accuracy(probs, [0, 0, 0, 1])
    0.75
    >>> accuracy([[0.5, 0.5]], [0])  # a tie goes to the lowest index
    1.0
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
