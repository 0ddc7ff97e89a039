"""The light method catalogue: every method's CLI name, one-line help, the module that
registers it and whether that module needs PyTorch.

Plain Python data (no numpy, no scikit-learn), so ``confcal --help`` and ``confcal fit
--help`` list the methods without importing a calibrator. The registry
(:data:`confcal.calibrators.METHODS`) imports a method's module the first time the name
is looked up; ``tests/calibrators/test_catalog.py`` checks that this table and the
registered classes agree.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MethodInfo", "CATALOG", "TORCH_EXTRA_HINT", "MissingExtraError", "method_names", "method_info"]

#: what a user without the ``torch`` extra is told to run
TORCH_EXTRA_HINT = "pip install 'confcal[torch]'"


class MissingExtraError(ImportError):
    """A method or operator needs an optional dependency that is not installed (the message
    names the extra to install)."""


class MethodInfo(NamedTuple):
    name: str
    module: str  #: ``confcal.calibrators.<module>`` registers ``name`` when imported
    help: str
    #: the module imports torch (autograd fits, BCSoftmax); calling it without torch names the extra
    needs_torch: bool


_PB = "bounding.pb"
_ROWS = [
    # name, module, one-line help, needs torch
    ("ts", "temperature.ts", "temperature scaling: softmax(z / T), one T (Guo et al. 2017)", False),
    ("grouped-ts", "temperature.ts", "one temperature per --domains id, pooled T for unseen ids", False),
    ("grouped", "grouping", "any method fitted per group (--param base=vs, by=domains)", False),
    ("vs", "linear.scaling", "vector scaling (Guo et al. 2017)", True),
    ("bcts", "temperature.bcts", "bias-corrected TS: softmax(z / T + b) (Alexandari et al. 2020)", False),
    ("ms", "linear.scaling", "matrix scaling with ODIR (Guo et al. 2017; Kull et al. 2019)", True),
    ("dirichlet", "linear.scaling", "Dirichlet calibration, ODIR (Kull et al. 2019)", True),
    ("ets", "temperature.ensemble", "ensemble temperature scaling (Zhang et al. 2020)", True),
    ("pts", "temperature.parametric", "parameterized temperature scaling (Tomani et al. 2022)", True),
    ("fc", "bounding.feature_clipping", "feature clipping; needs --features (Tao et al. 2025)", False),
    ("pb", _PB, "probability bounding, lower and upper bounds (Atarashi et al. 2025)", True),
    ("pb-lower", _PB, "probability bounding, lower bound only", True),
    ("pb-upper", _PB, "probability bounding, upper bound only", True),
    ("pb-mlp", _PB, "TS with instance-dependent bounds from a small network", True),
    ("ts+pb", _PB, "temperature scaling + probability bounding", True),
    ("vs+pb", _PB, "vector scaling + probability bounding", True),
    ("ms+pb", _PB, "matrix scaling + probability bounding", True),
    ("dirichlet+pb", _PB, "Dirichlet calibration + probability bounding", True),
    ("ets+pb", _PB, "ensemble TS + probability bounding", True),
    ("pts+pb", _PB, "parameterized TS + probability bounding", True),
    ("lb", _PB, "logit bounding (Atarashi et al. 2025)", True),
    ("dpb", _PB, "dual probability bounding (Atarashi et al. 2025)", True),
    ("set-ts", "domain.methods", "set-level TS over calibration domains (Gong et al. 2021)", False),
    ("cluster-ts", "domain.methods", "cluster-level TS, nearest centroid (Gong et al. 2021)", False),
    ("cluster-ts-regression", "domain.methods", "cluster-level TS, linear regression of T (Gong et al. 2021)", False),
    ("domain-ensemble", "domain.methods", "ensemble of domain temperatures (Gong et al. 2021)", False),
    ("source-gated-ts", "domain.source_gated", "per sample between source-only TS and a DG method", False),
    ("isotonic", "binning.methods", "isotonic regression, one-vs-rest (Zadrozny & Elkan 2002)", False),
    ("isotonic-top", "binning.methods", "isotonic regression of the top-label confidence", False),
    ("histogram-binning", "binning.methods", "histogram binning (equal-mass or equal-width bins), one-vs-rest (Zadrozny & Elkan 2001)", False),
    ("histogram-binning-top", "binning.methods", "histogram binning of the top-label confidence", False),
    ("bbq", "binning.methods", "Bayesian binning into quantiles, one-vs-rest (Naeini et al. 2015)", False),
    ("bbq-top", "binning.methods", "BBQ of the top-label confidence", False),
    ("scaling-binning", "binning.methods", "scaling-binning, top-label (Kumar et al. 2019)", False),
    ("scaling-binning-marginal", "binning.methods", "scaling-binning, per class (Kumar et al. 2019)", False),
    ("beta", "logistic.beta", "beta calibration (Kull et al. 2017)", False),
    ("platt-ovr", "logistic.platt", "Platt scaling, one-vs-rest (Platt 1999)", False),
    ("det-ts", "detection.box", "box scores: binary temperature scaling (per --domains / class)", False),
    ("det-platt", "detection.box", "box scores: Platt scaling (per --domains / class)", False),
    ("det-beta", "detection.beta", "box scores: beta calibration (per --domains / class)", False),
    ("det-platt-geo", "detection.geometry", "box scores + --box-features: dependent logistic (Kueppers et al. 2020)",
     False),
    ("det-beta-geo", "detection.geometry", "box scores + --box-features: dependent beta (Kueppers et al. 2020)", False),
    ("det-hist-geo", "detection.geometry", "box scores + --box-features: binning over confidence x geometry", False),
    ("ts-multilabel", "multilabel.heads", "sigmoid heads: one temperature per label", False),
    ("platt-multilabel", "multilabel.heads", "sigmoid heads: Platt scaling per label", False),
]

#: name -> :class:`MethodInfo`, in the order the README lists the methods
CATALOG: dict[str, MethodInfo] = {
    name: MethodInfo(name, f"confcal.calibrators.{module}", help, torch) for name, module, help, torch in _ROWS}


def method_names() -> list[str]:
    """Every method name, sorted (what ``confcal fit --method`` accepts)."""
    return sorted(CATALOG)


def method_info(name: str) -> MethodInfo:
    """The catalogue entry of ``name``; ``KeyError`` for an unknown name."""
    return CATALOG[name]
