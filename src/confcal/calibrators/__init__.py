"""Stateful calibrators: ``fit`` / ``predict_proba`` / ``to_dict`` (see :mod:`confcal.calibrators.protocol.base`).

``METHODS`` knows every method by its CLI name; a method's module is imported on first lookup
(so does each class name below, on first access).

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

import importlib

from confcal.calibrators import _exports

_exports.install()  # the flat module paths of earlier releases (confcal.calibrators.scaling, ...) keep importing

# Lazy: importing the package loads the registry only; each name below loads its module on
# first use, so `load_calibrator` of a TS manifest never imports torch or scikit-learn's isotonic.
from confcal.calibrators.protocol.registry import METHODS, MissingExtraError, register  # noqa: E402

#: public name -> the module defining it
_LAZY = {
    "CalibrationWarning": "_fit.tsfit", "fit_temperature": "_fit.tsfit",
    "Calibrator": "protocol.base", "NotFittedError": "protocol.base", "calibrator_from_dict": "protocol.manifest",
    "DetectionPlattScaling": "detection.box", "DetectionTemperatureScaling": "detection.box",
    "ClusterRegressionTemperatureScaling": "domain.methods", "ClusterTemperatureScaling": "domain.methods",
    "DomainEnsembleTemperatureScaling": "domain.methods", "SetLevelTemperatureScaling": "domain.methods",
    "GroupedTemperatureScaling": "temperature.ts", "TemperatureScaling": "temperature.ts",
    "BiasCorrectedTemperatureScaling": "temperature.bcts",
    "GroupedCalibrator": "grouping", "group_key": "protocol.group_keys", "key_parts": "protocol.group_keys",
    "DirichletCalibration": "linear.scaling", "MatrixScaling": "linear.scaling", "VectorScaling": "linear.scaling",
    "EnsembleTemperatureScaling": "temperature.ensemble", "ParameterizedTemperatureScaling": "temperature.parametric",
    "FeatureClipping": "bounding.feature_clipping",
    "DualProbabilityBounding": "bounding.pb", "LogitBounding": "bounding.pb", "ProbabilityBounding": "bounding.pb",
    "BBQ": "binning.methods", "HistogramBinning": "binning.methods", "IsotonicCalibration": "binning.methods",
    "MarginalScalingBinning": "binning.methods", "ScalingBinning": "binning.methods", "TopLabelBBQ": "binning.methods",
    "TopLabelHistogramBinning": "binning.methods", "TopLabelIsotonicCalibration": "binning.methods",
    "BetaCalibration": "logistic.beta", "DetectionBetaCalibration": "detection.beta", "PlattOneVsRest": "logistic.platt",
    "SourceGatedTemperatureScaling": "domain.source_gated", "reuse_fits": "_fit.odir",
    "GeometryLogisticCalibration": "detection.geometry", "GeometryBetaCalibration": "detection.geometry",
    "GeometryHistogramBinning": "detection.geometry",
    "MultilabelTemperatureScaling": "multilabel.heads", "MultilabelPlattScaling": "multilabel.heads",
}
_TORCH_MODULES = {"linear.scaling", "temperature.ensemble", "temperature.parametric", "bounding.pb", "_fit.odir"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'confcal.calibrators' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(f"confcal.calibrators.{module}"), name)
    except ModuleNotFoundError as exc:
        if module not in _TORCH_MODULES or not (exc.name or "").split(".")[0] == "torch":
            raise
        from confcal.catalog import TORCH_EXTRA_HINT

        raise MissingExtraError(f"confcal.calibrators.{name} needs PyTorch, which is not installed: "
                                f"{TORCH_EXTRA_HINT}") from None
    globals()[name] = value  # next time without __getattr__
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])


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
    "reuse_fits",
    "GeometryLogisticCalibration", "GeometryBetaCalibration", "GeometryHistogramBinning",
    "MultilabelTemperatureScaling", "MultilabelPlattScaling", "group_key", "key_parts",
    "BiasCorrectedTemperatureScaling",
]
