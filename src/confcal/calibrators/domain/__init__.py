"""Calibration for domain generalization: set-level and cluster-level TS (Gong et al. 2021), source-gated TS.

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "ClusterRegressionTemperatureScaling": "methods",
    "ClusterTemperatureScaling": "methods",
    "DomainEnsembleTemperatureScaling": "methods",
    "SetLevelTemperatureScaling": "methods",
    "SourceGatedTemperatureScaling": "source_gated",
}, compat={  # the flat module's names of earlier releases
    "domain_sample_weight": "methods",
    "DEFAULT_RIDGE_ALPHAS": "methods",
})
