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
from confcal.metrics.calibration_tests import (
    CalibrationTestAccumulator,
    calibration_tests,
    kolmogorov_smirnov_test,
    kuiper_test,
    spiegelhalter_test,
)
from confcal.metrics.debiased import bias_corrected_ece, debiased_l2_ce
from confcal.metrics.intervals import bin_intervals, clopper_pearson, ece_bounds
from confcal.metrics.detection import binary_brier, binary_nll, detection_ece, detection_reliability
from confcal.metrics.scores import accuracy, brier_score, nll
from confcal.metrics.smooth_ece import smooth_ece
from confcal.metrics.summary import calibration_summary

__all__ = ["ece", "mce", "classwise_ece", "reliability_table", "ECEAccumulator",
           "nll", "brier_score", "accuracy", "smooth_ece", "calibration_summary",
           "bootstrap_ece", "BootstrapResult", "improvement_ratio",
           "detection_ece", "detection_reliability", "binary_nll", "binary_brier",
           "ScoresAccumulator", "BinnedAccumulator", "ClasswiseAccumulator", "SmoothECEAccumulator",
           "EqualMassAccumulator", "SummaryAccumulator",
           "clopper_pearson", "bin_intervals", "ece_bounds", "debiased_l2_ce", "bias_corrected_ece",
           "spiegelhalter_test", "kolmogorov_smirnov_test", "kuiper_test", "calibration_tests",
           "CalibrationTestAccumulator"]
