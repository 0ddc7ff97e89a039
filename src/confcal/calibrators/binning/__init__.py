"""Binning family: histogram binning, isotonic regression, BBQ and scaling-binning.

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "BBQ": "methods",
    "HistogramBinning": "methods",
    "IsotonicCalibration": "methods",
    "MarginalScalingBinning": "methods",
    "ScalingBinning": "methods",
    "TopLabelBBQ": "methods",
    "TopLabelHistogramBinning": "methods",
    "TopLabelIsotonicCalibration": "methods",
})
