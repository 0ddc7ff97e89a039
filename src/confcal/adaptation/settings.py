"""The hyper-parameters of :class:`~confcal.adaptation.PriorAdapted`, checked in one place (at fit, at adapt
and when a manifest is loaded)."""

from __future__ import annotations

import numpy as np

from confcal.adaptation.estimate import check_em_settings

__all__ = ["ESTIMATORS", "check_settings"]

#: the prior estimators
ESTIMATORS = ("em", "bbse")


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
