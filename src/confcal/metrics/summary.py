"""One call for the standard metric set used by the CLI and reports."""

from __future__ import annotations

from confcal._validation import check_labels, check_probs
from confcal.metrics.calibration import ece, mce
from confcal.metrics.scores import accuracy, brier_score, nll


def calibration_summary(probs, labels, *, n_bins: int = 15) -> dict[str, float]:
    """Accuracy, top-label ECE (equal-width and equal-mass), MCE, NLL (nats) and Brier score.

    ``probs``: ``(n_samples, n_classes)``; ``labels``: ``(n_samples,)``. ECE/MCE use
    ``n_bins`` bins with the ``(lo, hi]`` convention of :func:`confcal.metrics.ece`.
    """
    p = check_probs(probs)
    y = check_labels(labels, p.shape[0], p.shape[1])
    return {
        "accuracy": accuracy(p, y),
        "ece": ece(p, y, n_bins=n_bins),
        "ece_equal_mass": ece(p, y, n_bins=n_bins, binning="equal_mass"),
        "mce": mce(p, y, n_bins=n_bins),
        "nll": nll(p, y),
        "brier": brier_score(p, y),
    }
