"""confcal: post-hoc confidence calibration of classifiers and object detectors."""

__version__ = "0.1.0"
