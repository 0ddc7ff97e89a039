"""Logistic and beta maps: one-vs-rest Platt scaling (Platt 1999) and beta calibration (Kull et al. 2017).

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "BetaCalibration": "beta",
    "PlattOneVsRest": "platt",
})
