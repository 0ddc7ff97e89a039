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


import numpy as np  # noqa: E402

from confcal.calibrators import NotFittedError, TemperatureScaling  # noqa: E402


def _probs(seed=0, n=900, k=4):
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % k)
    z = 2.5 * (rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y])  # over-confident: TS has work to do
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), y


def test_cross_val_score_as_the_calibrators():
    # regression: no score (TypeError) and no classes_ (neg_log_loss gave [nan, nan, nan])
    ms = pytest.importorskip("sklearn.model_selection")
    p, y = _probs()
    for scoring in (None, "neg_log_loss"):
        auto = ms.cross_val_score(AutoCalibrator(input_kind="probs", n_boot=100), p, y, cv=3, scoring=scoring)
        ts = ms.cross_val_score(TemperatureScaling(input_kind="probs"), p, y, cv=3, scoring=scoring)
        assert np.isfinite(auto).all() and auto.shape == (3,)
        # on these draws TS is chosen in every fold (the guard): the same scores as TS itself
        np.testing.assert_allclose(auto, ts, rtol=1e-6)


def test_fitted_attributes_delegate_to_the_chosen_calibrator():
    p, y = _probs(1)
    a = AutoCalibrator(input_kind="probs", n_boot=100)
    for use in (lambda: a.predict_proba(p), lambda: a.classes_, lambda: a.fit_record_, lambda: a.score(p, y),
                lambda: a.predict(p), lambda: a.to_dict()):
        with pytest.raises(NotFittedError, match=r"AutoCalibrator is not fitted yet"):
            use()
    sk = pytest.importorskip("sklearn.exceptions")
    with pytest.raises(sk.NotFittedError):
        a.predict_proba(p)
    a.fit(p, y)
    cal = a.calibrator_
    assert a.fit_record_ is cal.fit_record_ and a.fit_record_["selection"]["chosen"] == a.chosen_
    np.testing.assert_array_equal(a.classes_, cal.classes_)
    assert a.score(p, y) == cal.score(p, y) < 0
    np.testing.assert_array_equal(a.predict(p), cal.predict(p))


def test_input_kind_set_after_fit_is_read_at_predict_time_as_a_calibrators():
    p, y = _probs(2)
    a = AutoCalibrator(input_kind="probs", n_boot=100).fit(p, y)
    ts = TemperatureScaling(input_kind="probs").fit(p, y)
    a.set_params(input_kind="logits")
    ts.set_params(input_kind="logits")
    lp = np.log(p)
    np.testing.assert_allclose(a.predict_proba(lp), ts.predict_proba(lp), rtol=1e-9)  # both read logits now
    with pytest.raises(ValueError, match="probabilities"):
        a.predict_proba(p)  # probabilities read as logits: refused, as TemperatureScaling refuses them
    assert a.to_dict()["hyperparameters"]["input_kind"] == "logits"


def test_string_labels_as_the_calibrators_take_them():
    # regression: AutoCalibrator refused string labels that TemperatureScaling maps through classes_
    p, y = _probs(3)
    names = np.array(["bus", "car", "truck", "van"])
    a = AutoCalibrator(input_kind="probs", n_boot=100).fit(p, names[y])
    ref = AutoCalibrator(input_kind="probs", n_boot=100).fit(p, y)
    assert a.classes_.tolist() == names.tolist() and a.chosen_ == ref.chosen_
    np.testing.assert_allclose(a.predict_proba(p), ref.predict_proba(p), rtol=1e-12)
    assert (a.predict(p) == names[ref.predict(p)]).all()
    assert a.score(p, names[y]) == pytest.approx(ref.score(p, y), rel=1e-12)
    assert a.to_dict()["fit"]["classes"] == names.tolist()
    with pytest.warns(UserWarning, match="every string label is an integer"):  # as TemperatureScaling warns
        AutoCalibrator(input_kind="probs", n_boot=100).fit(*_probs(4, n=1200, k=12)[:1],
                                                           _probs(4, n=1200, k=12)[1].astype(str))
