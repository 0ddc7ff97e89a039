"""Box-score calibration of object detectors: binary TS, Platt and beta per domain / class, and the geometry-dependent maps of Kueppers et al. (CVPR-W 2020).

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DetectionBetaCalibration": "beta",
    "DetectionPlattScaling": "box",
    "DetectionTemperatureScaling": "box",
    "GeometryBetaCalibration": "geometry",
    "GeometryHistogramBinning": "geometry",
    "GeometryLogisticCalibration": "geometry",
}, compat={  # the flat module's names of earlier releases
    "score_logit": "box",
    "fit_logistic": "box",
    "LogisticFit": "box",
})
