"""The hyper-parameters of :class:`~confcal.adaptation.PriorAdapted`, checked in one place (at fit, at adapt
and when a manifest is loaded)."""

from __future__ import annotations

import numpy as np

from confcal.adaptation.estimate import check_em_settings

__all__ = ["ESTIMATORS", "MIN_ROWS_PER_CLASS", "check_settings", "warn_small_calibration"]

#: the prior estimators
ESTIMATORS = ("em", "bbse")

#: fewer labelled calibration rows than this in some class draws a warning. The source prior (and BBSE's
#: confusion matrix) is estimated from them with a relative standard error near ``1 / sqrt(rows per class)``,
#: and EM divides by it. Simulated with a known truth (10 Gaussian classes, exact posteriors, target prior =
#: source prior, 5000 target rows, 400 calibration draws per size; benchmarks/results/adapt_small_calibration.md):
#: adaptation raised the target NLL by more than 5 % in 99.25 % (95 % Wilson interval 97.8-99.7 %) of draws at 1
#: row per class, 79 % (75-83 %) at 3, 9.5 % (7.0-12.8 %) at 10, 0.25 % (0.04-1.4 %) at 20 and 0 % (0-0.95 %) at 30.
MIN_ROWS_PER_CLASS = 20


def check_settings(params: dict) -> None:
    """The hyper-parameters of :class:`PriorAdapted` checked, one-line errors naming the parameter."""
    if params["source_prior"] not in ("calibrated", "labels"):
        raise ValueError(f"source_prior: expected 'calibrated' or 'labels', got {params['source_prior']!r}")
    if params["estimator"] not in ESTIMATORS:
        raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {params['estimator']!r}")
    check_em_settings(params["smoothing"], params["tol"], params["max_iter"])
    nb = params["n_boot"]
    if isinstance(nb, bool) or not isinstance(nb, (int, np.integer)) or not 0 <= nb <= 100_000:
        raise ValueError(f"n_boot: expected an integer in [0, 100000], got {nb!r}")
    c = params["confidence"]
    if isinstance(c, bool) or not isinstance(c, (int, float, np.number)) or not 0 < c < 1:
        raise ValueError(f"confidence: expected a number in (0, 1), got {c!r}")
    rs = params["random_state"]
    if isinstance(rs, bool) or not isinstance(rs, (int, np.integer)) or not 0 <= rs < 2 ** 32:
        raise ValueError(f"random_state: expected an integer in [0, 2**32), got {rs!r}")


def warn_small_calibration(label_counts, estimator: str) -> None:
    """A ``UserWarning`` when the smallest class of the calibration set has fewer than
    :data:`MIN_ROWS_PER_CLASS` labelled rows: its source prior (and, for BBSE, the confusion matrix) is
    then too noisy for the reweighting ``pi_t / pi_s`` to help, and the adapted probabilities may be worse
    than the base's even when there is no label shift."""
    counts = np.asarray(label_counts)
    j = int(np.argmin(counts))
    if counts[j] >= MIN_ROWS_PER_CLASS:
        return
    import warnings

    what = "source prior and confusion matrix" if estimator == "bbse" else "source prior"
    warnings.warn(f"labels (calibration set): class {j} has {int(counts[j])} labelled row(s) "
                  f"({int((counts < MIN_ROWS_PER_CLASS).sum())} of {counts.size} classes have fewer than "
                  f"{MIN_ROWS_PER_CLASS}); the {what} estimated from so few rows is too noisy for prior adaptation "
                  f"(simulated with no shift: NLL worse by > 5 % in 99 % of draws at 1 row per class, 9.5 % at 10); "
                  f"calibrate on at least {MIN_ROWS_PER_CLASS} rows per class or keep the unadapted calibrator",
                  UserWarning, stacklevel=4)
