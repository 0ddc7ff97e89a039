"""AutoCalibrator follows scikit-learn's estimator protocol (get_params / set_params / clone), as the calibrators do."""

import pytest

from confcal.evaluation.selection import AutoCalibrator


def test_get_and_set_params_round_trip():
    a = AutoCalibrator(n_folds=3, level=0.8)
    params = a.get_params()
    assert params["n_folds"] == 3 and params["level"] == 0.8 and set(params) == {
        "input_kind", "allow_accuracy_change", "n_folds", "max_rows", "n_boot", "level", "random_state"}
    assert a.set_params(n_folds=4, random_state=7) is a
    assert (a.n_folds, a.random_state) == (4, 7)
    with pytest.raises(ValueError, match=r"^nfolds: not a hyper-parameter of AutoCalibrator"):
        a.set_params(nfolds=2)


def test_sklearn_clone_rebuilds_an_unfitted_copy():
    base = pytest.importorskip("sklearn.base")
    a = AutoCalibrator(n_boot=200, allow_accuracy_change=True)
    b = base.clone(a)
    assert b is not a and b.get_params() == a.get_params() and not hasattr(b, "calibrator_")
    assert "n_boot=200" in repr(a)
