"""Calibration metrics: pure functions on arrays (numpy or torch in, floats/arrays out)."""

from confcal.metrics.accumulators import (
    BinnedAccumulator,
    ClasswiseAccumulator,
    EqualMassAccumulator,
    ScoresAccumulator,
    SmoothECEAccumulator,
    SummaryAccumulator,
)
from confcal.metrics.bootstrap import BootstrapResult, bootstrap_ece, improvement_ratio
from confcal.metrics.calibration import ECEAccumulator, classwise_ece, ece, mce, reliability_table
from confcal.metrics.scores import accuracy, brier_score, nll
from confcal.metrics.smooth_ece import smooth_ece
from confcal.metrics.summary import calibration_summary

__all__ = ["ece", "mce", "classwise_ece", "reliability_table", "ECEAccumulator",
           "nll", "brier_score", "accuracy", "smooth_ece", "calibration_summary",
           "bootstrap_ece", "BootstrapResult", "improvement_ratio",
           "ScoresAccumulator", "BinnedAccumulator", "ClasswiseAccumulator", "SmoothECEAccumulator",
           "EqualMassAccumulator", "SummaryAccumulator"]
