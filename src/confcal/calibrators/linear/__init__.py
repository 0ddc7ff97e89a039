"""Linear logit maps: vector / matrix scaling (Guo et al. 2017) and Dirichlet calibration with ODIR (Kull et al. 2019).

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "DirichletCalibration": "scaling",
    "MatrixScaling": "scaling",
    "VectorScaling": "scaling",
})
