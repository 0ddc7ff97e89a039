"""Stateful calibrators: ``fit`` / ``predict_proba`` / ``to_dict`` (see :mod:`.base`).

Importing this package registers every method under its CLI name in ``METHODS``.
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

__all__ = [
    "METHODS", "Calibrator", "NotFittedError", "CalibrationWarning", "calibrator_from_dict",
    "register", "fit_temperature", "TemperatureScaling", "GroupedTemperatureScaling",
    "SetLevelTemperatureScaling", "ClusterTemperatureScaling", "ClusterRegressionTemperatureScaling",
    "DomainEnsembleTemperatureScaling", "DetectionTemperatureScaling", "DetectionPlattScaling",
]
