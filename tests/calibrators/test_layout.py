"""The family layout (issue 39) keeps every import path of the flat layout working: the public names of
``confcal.calibrators``, the family packages, and the flat module paths of earlier releases."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import confcal.calibrators as cal
from confcal.calibrators._exports import MOVED

#: flat path of earlier releases -> a public name it defined
FLAT = {
    "confcal.calibrators.temperature": "TemperatureScaling", "confcal.calibrators.binning": "IsotonicCalibration",
    "confcal.calibrators.bounding": "ProbabilityBounding", "confcal.calibrators.domain": "SetLevelTemperatureScaling",
    "confcal.calibrators.detection": "DetectionPlattScaling", "confcal.calibrators.multilabel": "MultilabelPlattScaling",
    "confcal.calibrators.grouping": "GroupedCalibrator", "confcal.calibrators.base": "Calibrator",
    "confcal.calibrators.registry": "METHODS", "confcal.calibrators.manifest": "calibrator_from_dict",
    "confcal.calibrators.beta": "BetaCalibration", "confcal.calibrators.platt": "PlattOneVsRest",
    "confcal.calibrators.source_gated": "SourceGatedTemperatureScaling",
    "confcal.calibrators.detection_geometry": "GeometryLogisticCalibration",
}
TORCH = {"confcal.calibrators.scaling": "VectorScaling", "confcal.calibrators.ensemble": "EnsembleTemperatureScaling",
         "confcal.calibrators.parametric": "ParameterizedTemperatureScaling",
         "confcal.calibrators.feature_clipping": "FeatureClipping"}


@pytest.mark.parametrize("path, name", sorted(FLAT.items()))
def test_flat_module_paths_still_import_their_names(path, name):
    module = importlib.import_module(path)
    assert getattr(module, name) is getattr(cal, name) if hasattr(cal, name) else getattr(module, name)


@pytest.mark.parametrize("path, name", sorted(TORCH.items()))
def test_flat_paths_of_torch_methods(path, name):
    pytest.importorskip("torch")
    assert getattr(importlib.import_module(path), name) is getattr(cal, name)


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_a_moved_module_reads_every_name_at_its_new_place(old, new):
    if old in TORCH:
        pytest.importorskip("torch")
    moved, target = importlib.import_module(old), importlib.import_module(new)
    for name in getattr(target, "__all__", []):
        assert getattr(moved, name) is getattr(target, name), name


#: every name of the flat modules' __all__ at the last flat release (13efc6e) that lived on elsewhere
OLD_ALL = {
    "confcal.calibrators.beta": ["DetectionBetaCalibration", "BetaCalibration", "fit_beta", "apply_beta"],
    "confcal.calibrators.bounding": ["BASES", "tie_rate"],
    "confcal.calibrators.domain": ["domain_sample_weight", "DEFAULT_RIDGE_ALPHAS"],
    "confcal.calibrators.detection": ["score_logit", "fit_logistic", "LogisticFit"],
}


@pytest.mark.parametrize("path, names", sorted(OLD_ALL.items()))
def test_names_of_the_flat_modules_import_from_their_old_paths(path, names):
    if path.endswith("bounding"):
        pytest.importorskip("torch")
    module = importlib.import_module(path)
    for name in names:
        assert getattr(module, name) is not None, name
    assert set(names) <= set(dir(module))


def test_every_public_name_resolves_to_its_family():
    for name in cal.__all__:
        if name in {"ParameterizedTemperatureScaling", "EnsembleTemperatureScaling", "VectorScaling",
                    "MatrixScaling", "DirichletCalibration", "FeatureClipping", "ProbabilityBounding",
                    "LogitBounding", "DualProbabilityBounding", "reuse_fits"} and \
                importlib.util.find_spec("torch") is None:
            continue
        obj = getattr(cal, name)
        module = getattr(obj, "__module__", "")
        assert module.startswith("confcal.calibrators."), (name, module)


def test_the_facade_and_a_ts_manifest_do_not_import_torch():
    code = ("import sys, numpy as np\n"
            "from confcal.calibrators import TemperatureScaling, calibrator_from_dict\n"
            "import confcal.calibrators.temperature, confcal.calibrators.base\n"
            "rng = np.random.default_rng(0); z = rng.normal(size=(200, 3)); y = rng.integers(0, 3, 200)\n"
            "m = TemperatureScaling().fit(z, y).to_dict(); calibrator_from_dict(m).predict_proba(z)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_an_unknown_name_of_a_family_is_an_attribute_error():
    import confcal.calibrators.temperature as family

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        family.Nope  # noqa: B018
    assert "TemperatureScaling" in dir(family)
