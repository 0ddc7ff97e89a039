"""Probability bounding (Atarashi et al., arXiv 2506.10572): PB, X+PB, LB, DPB, PB-MLP, and feature clipping.

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DualProbabilityBounding": "pb",
    "FeatureClipping": "feature_clipping",
    "LogitBounding": "pb",
    "ProbabilityBounding": "pb",
}, compat={  # the flat module's names of earlier releases
    "BASES": "pb",
    "tie_rate": "pb",
})
