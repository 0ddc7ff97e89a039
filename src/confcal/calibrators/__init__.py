"""Stateful calibrators: ``fit`` / ``predict_proba`` / ``to_dict`` (see :mod:`.base`).

Importing this package registers every method under its CLI name in ``METHODS``.

Probability bounding and its baselines (Atarashi et al., arXiv 2506.10572), by
method name (``METHODS[name]``, ``confcal fit --method name``):

* ``pb``, ``pb-lower``, ``pb-upper`` -- uniform probability bounds (both / lower only / upper only)
* ``ts+pb``, ``vs+pb``, ``ms+pb``, ``dirichlet+pb``, ``ets+pb``, ``pts+pb`` -- X+PB: X's logit map
  with a box-constrained softmax, fitted jointly (one composition, :class:`ProbabilityBounding`)
* ``pb-mlp`` -- TS with instance-dependent bounds from a two-layer network (sec. 3.3)
* ``lb`` (logit bounding), ``dpb`` (dual probability bounding)
* ``vs``, ``ms``, ``dirichlet`` (ODIR: ``reg_lambda``, ``reg_mu``), ``ets``, ``pts`` -- baselines
* ``source-gated-ts`` -- per-sample gate between source-only TS and a domain-generalization method
* ``fc`` -- feature clipping; needs ``features=`` and the last linear layer (given or recovered)

Adam-based (network) methods: ``pts``, ``pts+pb``, ``pb-mlp``; the others use full-batch L-BFGS.
Neural clamping and tilt-and-average, also compared by the paper, need the
model itself (its input or its weights), so they are out of scope for a
logits-level tool.
"""

from confcal.calibrators._tsfit import CalibrationWarning, fit_temperature
from confcal.calibrators.base import (
    METHODS,
    Calibrator,
    NotFittedError,
    calibrator_from_dict,
    register,
)
from confcal.calibrators.detection import DetectionPlattScaling, DetectionTemperatureScaling
from confcal.calibrators.domain import (
    ClusterRegressionTemperatureScaling,
    ClusterTemperatureScaling,
    DomainEnsembleTemperatureScaling,
    SetLevelTemperatureScaling,
)
from confcal.calibrators.temperature import GroupedTemperatureScaling, TemperatureScaling
from confcal.calibrators.grouping import GroupedCalibrator
from confcal.calibrators.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from confcal.calibrators.ensemble import EnsembleTemperatureScaling
from confcal.calibrators.parametric import ParameterizedTemperatureScaling
from confcal.calibrators.feature_clipping import FeatureClipping
from confcal.calibrators.bounding import DualProbabilityBounding, LogitBounding, ProbabilityBounding
from confcal.calibrators.binning import (
    BBQ,
    HistogramBinning,
    IsotonicCalibration,
    MarginalScalingBinning,
    ScalingBinning,
    TopLabelBBQ,
    TopLabelHistogramBinning,
    TopLabelIsotonicCalibration,
)
from confcal.calibrators.beta import BetaCalibration, DetectionBetaCalibration
from confcal.calibrators.platt import PlattOneVsRest
from confcal.calibrators.source_gated import SourceGatedTemperatureScaling
from confcal.calibrators.detection_geometry import (
    GeometryBetaCalibration,
    GeometryHistogramBinning,
    GeometryLogisticCalibration,
)
from confcal.calibrators.multilabel import MultilabelPlattScaling, MultilabelTemperatureScaling

__all__ = [
    "METHODS", "Calibrator", "NotFittedError", "CalibrationWarning", "calibrator_from_dict",
    "register", "fit_temperature", "TemperatureScaling", "GroupedTemperatureScaling", "GroupedCalibrator",
    "SetLevelTemperatureScaling", "ClusterTemperatureScaling", "ClusterRegressionTemperatureScaling",
    "DomainEnsembleTemperatureScaling", "DetectionTemperatureScaling", "DetectionPlattScaling",
    "VectorScaling", "MatrixScaling", "DirichletCalibration", "EnsembleTemperatureScaling",
    "ParameterizedTemperatureScaling", "FeatureClipping", "ProbabilityBounding", "LogitBounding",
    "DualProbabilityBounding", "SourceGatedTemperatureScaling", "IsotonicCalibration",
    "TopLabelIsotonicCalibration", "HistogramBinning", "TopLabelHistogramBinning", "BBQ", "TopLabelBBQ",
    "ScalingBinning", "MarginalScalingBinning", "BetaCalibration", "DetectionBetaCalibration", "PlattOneVsRest",
    "GeometryLogisticCalibration", "GeometryBetaCalibration", "GeometryHistogramBinning",
    "MultilabelTemperatureScaling", "MultilabelPlattScaling",
]
