"""Issue 26: the K Platt fits of ``platt-ovr`` solved together (:mod:`confcal.calibrators._fit.jobs.platt_batch`)
against independent oracles -- the one-class exact Newton (:func:`fit_constrained_logistic`) and
scikit-learn's ``LogisticRegression`` on the soft targets written as two weighted rows --, hypothesis
invariants (a permutation of the classes or the rows), and the ``score_space`` choice of ``platt-ovr``
(``auto`` keeps the score with the lower calibration NLL; old manifests load as log-odds; on the
WRN CIFAR-100 outputs the test NLL is within 0.002 of scikit-learn's, 0.961 before)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.constrained_logistic import fit_constrained_logistic, platt_targets
from confcal.calibrators._fit.jobs.platt_batch import fit_platt_batch
from confcal.calibrators.logistic.platt import _class_scores, _renormalised_nll, apply_platt_columns

#: parameters agree to this between two exact solvers of the same convex problem (gradient below 1e-11)
PARAM_ATOL = 1e-6


def _problem(n=600, k=5, seed=0, scale=2.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    z = rng.normal(size=(n, k)) * scale
    z[np.arange(n), y] += 1.5
    t = np.column_stack([platt_targets((y == j).astype(float)) for j in range(k)])
    return z, y, t


@pytest.mark.parametrize("kind", ["log-odds", "log-prob"])
@pytest.mark.parametrize("weighted", [False, True])
def test_batch_equals_one_class_newton(kind, weighted):
    z, y, t = _problem(seed=1)
    w = np.random.default_rng(2).uniform(0.2, 3.0, size=len(y)) if weighted else None
    s = _class_scores(z, kind)
    a, b, loss, conv = fit_platt_batch(s, t, sample_weight=w)
    assert conv.all()
    for j in range(s.shape[1]):
        ref = fit_constrained_logistic(s[:, j], t[:, j], sample_weight=w)
        assert a[j] == pytest.approx(ref.coef[0], abs=PARAM_ATOL)
        assert b[j] == pytest.approx(ref.intercept, abs=PARAM_ATOL)
        assert loss[j] == pytest.approx(ref.nll, rel=1e-12)


def test_batch_equals_sklearn_logistic_regression_on_weighted_rows():
    from sklearn.linear_model import LogisticRegression

    z, y, t = _problem(n=500, k=4, seed=3)
    s = _class_scores(z, "log-odds")
    a, b, _, _ = fit_platt_batch(s, t)
    for j in range(4):
        # soft target t = weight t on a positive copy and 1 - t on a negative copy of the row
        x2 = np.concatenate([s[:, j], s[:, j]])[:, None]
        y2 = np.concatenate([np.ones(len(y)), np.zeros(len(y))])
        w2 = np.concatenate([t[:, j], 1.0 - t[:, j]])
        lr = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(x2, y2, sample_weight=w2)
        assert a[j] == pytest.approx(lr.coef_[0, 0], abs=1e-4)
        assert b[j] == pytest.approx(lr.intercept_[0], abs=1e-4)


def test_batch_gradient_is_zero_at_the_solution_by_finite_differences():
    z, y, t = _problem(n=300, k=3, seed=4)
    s = _class_scores(z, "log-prob")
    a, b, loss, _ = fit_platt_batch(s, t)

    def f(aa, bb):
        u = s * aa + bb
        return (np.logaddexp(0.0, u) - t * u).mean(axis=0)

    h = 1e-5
    ga = (f(a + h, b) - f(a - h, b)) / (2 * h)
    gb = (f(a, b + h) - f(a, b - h)) / (2 * h)
    assert np.abs(ga).max() < 1e-8 and np.abs(gb).max() < 1e-8
    np.testing.assert_allclose(loss, f(a, b), rtol=1e-12)


def test_warm_start_on_a_subsample_reaches_the_same_optimum():
    z, y, t = _problem(n=5000, k=6, seed=5)
    s = _class_scores(z, "log-odds")
    cold = fit_platt_batch(s, t, warm_rows=0)
    warm = fit_platt_batch(s, t, warm_rows=500)
    np.testing.assert_allclose(warm[0], cold[0], atol=PARAM_ATOL)
    np.testing.assert_allclose(warm[1], cold[1], atol=PARAM_ATOL)
    assert warm[3].all() and cold[3].all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 6))
def test_permuting_classes_or_rows_permutes_the_solution(seed, k):
    z, y, t = _problem(n=200, k=k, seed=seed, scale=1.5)
    s = _class_scores(z, "log-odds")
    a, b, _, _ = fit_platt_batch(s, t)
    rng = np.random.default_rng(seed)
    cols, rows = rng.permutation(k), rng.permutation(len(y))
    a2, b2, _, _ = fit_platt_batch(s[:, cols], t[:, cols])
    np.testing.assert_allclose(a2, a[cols], atol=PARAM_ATOL)
    np.testing.assert_allclose(b2, b[cols], atol=PARAM_ATOL)
    a3, b3, _, _ = fit_platt_batch(s[rows], t[rows])
    np.testing.assert_allclose(a3, a, atol=PARAM_ATOL)
    np.testing.assert_allclose(b3, b, atol=PARAM_ATOL)


def test_bad_shapes_and_weights_are_refused():
    with pytest.raises(ValueError, match="scores/targets"):
        fit_platt_batch(np.zeros((5, 2)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="sample_weight"):
        fit_platt_batch(np.zeros((5, 2)), np.zeros((5, 2)), sample_weight=np.zeros(5))


@pytest.mark.parametrize("n", [600, 6000])  # full-data selection fits / subsample selection fits
def test_auto_keeps_the_score_with_the_lower_calibration_nll(n):
    rng = np.random.default_rng(7)
    k = 8
    y = rng.integers(0, k, size=n)
    z = rng.normal(size=(n, k)) * 3.0
    z[np.arange(n), y] += 2.0
    auto = METHODS["platt-ovr"]().fit(z, y)
    losses = {}
    for kind in ("log-odds", "log-prob"):
        cal = METHODS["platt-ovr"](score_space=kind).fit(z, y)
        a = np.array([m["a"] for m in cal.maps_])
        b = np.array([m["b"] for m in cal.maps_])
        losses[kind] = _renormalised_nll(apply_platt_columns(a, b, _class_scores(z, kind)), y)
        if kind == auto.score_space_:
            np.testing.assert_allclose(auto.predict_proba(z), cal.predict_proba(z), atol=1e-7)
    # with the subsample selection (n = 6000) a near tie may go either way
    assert (losses[auto.score_space_] <= min(losses.values()) + 1e-9
            or abs(losses["log-odds"] - losses["log-prob"]) < 1e-3)


def test_manifest_round_trip_keeps_the_score_and_old_manifests_load_as_log_odds():
    z, y, _ = _problem(n=400, k=4, seed=8)
    cal = METHODS["platt-ovr"](score_space="log-prob").fit(z, y)
    back = calibrator_from_dict(cal.to_dict())
    assert back.score_space_ == "log-prob"
    np.testing.assert_allclose(back.predict_proba(z), cal.predict_proba(z), rtol=0, atol=1e-15)
    lo = METHODS["platt-ovr"](score_space="log-odds").fit(z, y)
    d = lo.to_dict()
    d["parameters"].pop("score_space")
    old = calibrator_from_dict(d)
    assert old.score_space_ == "log-odds"
    np.testing.assert_allclose(old.predict_proba(z), lo.predict_proba(z), rtol=0, atol=1e-15)


def test_bad_score_is_refused():
    z, y, _ = _problem(n=100, k=3)
    with pytest.raises(ValueError, match="score_space"):
        METHODS["platt-ovr"](score_space="logit").fit(z, y)


def test_wrn_cifar100_nll_is_within_0002_of_sklearn(shared_data):
    """The regression of issue 26: confcal's platt-ovr had test NLL 0.9608 against scikit-learn's 0.9253."""
    from sklearn.linear_model import LogisticRegression

    from confcal._numeric import log_softmax
    from confcal.metrics import nll

    d = np.load(shared_data("cifar", "wideresnet-16-4-cifar-100.npz"))
    p = d["predictions"].astype(np.float64)
    y = d["ground_truth"].astype(np.int64)
    z = np.log(np.maximum(p, np.finfo(np.float64).tiny))
    perm = np.random.default_rng(0).permutation(len(y))
    c, te = perm[:5000], perm[5000:]
    ours = nll(METHODS["platt-ovr"]().fit(z[c], y[c]).predict_proba(z[te], dtype=np.float64), y[te])
    # the oracle: scikit-learn's per-class logistic regression on its decision function log p_k, soft
    # (Platt) targets as two weighted rows, renormalised as CalibratedClassifierCV does
    s, st_ = log_softmax(z[c]), log_softmax(z[te])
    q = np.empty_like(st_)
    for j in range(z.shape[1]):
        tj = platt_targets((y[c] == j).astype(float))
        lr = LogisticRegression(C=np.inf, tol=1e-8, max_iter=1000).fit(
            np.concatenate([s[:, j], s[:, j]])[:, None], np.r_[np.ones(5000), np.zeros(5000)],
            sample_weight=np.r_[tj, 1.0 - tj])
        q[:, j] = lr.predict_proba(st_[:, j:j + 1])[:, 1]
    ref = nll(q / q.sum(axis=1, keepdims=True), y[te])
    assert ref == pytest.approx(0.9253, abs=2e-3)
    assert ours <= ref + 2e-3, (ours, ref)


# ------------------------------------------------------------------ beta: the batched active sets
from confcal.calibrators._fit.jobs.platt_batch import fit_logistic_batch  # noqa: E402
from confcal.calibrators._fit.jobs.reduce import log_odds  # noqa: E402
from confcal.calibrators.logistic.beta import fit_beta, fit_beta_batch  # noqa: E402


def test_logistic_batch_equals_one_class_newton_with_two_features():
    rng = np.random.default_rng(11)
    n, k = 400, 4
    x = rng.normal(size=(k, n, 2))
    t = (rng.uniform(size=(k, n)) < 1 / (1 + np.exp(-(x[:, :, 0] - 0.5 * x[:, :, 1])))).astype(float)
    w = rng.uniform(0.5, 2.0, size=n)
    coef, icpt, loss, conv = fit_logistic_batch(x, t, sample_weight=w)
    assert conv.all()
    for j in range(k):
        ref = fit_constrained_logistic(x[j], t[j], sample_weight=w)
        np.testing.assert_allclose(coef[j], ref.coef, atol=PARAM_ATOL)
        assert icpt[j] == pytest.approx(ref.intercept, abs=PARAM_ATOL)
        assert loss[j] == pytest.approx(ref.nll, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beta_batch_equals_per_class_constrained_fits(seed):
    """Classes whose free fit breaks a >= 0 constraint (the decreasing column 0 here) take the smaller active sets."""
    z, y, _ = _problem(n=500, k=6, seed=seed, scale=2.5)
    z[:, 0] = -z[:, 0]  # class 0's probability now falls with its label: the free slope goes negative
    lo = log_odds(z)
    tgt = (y[:, None] == np.arange(6)[None, :]).astype(float)
    w = np.random.default_rng(seed).uniform(0.5, 2.0, size=len(y))
    maps = fit_beta_batch(lo, tgt, sample_weight=w)
    for j, m in enumerate(maps):
        ref = fit_beta(lo[:, j], tgt[:, j], sample_weight=w)
        for key in "abc":
            assert m[key] == pytest.approx(ref[key], abs=PARAM_ATOL), (j, key)
        assert m["a"] >= 0 and m["b"] >= 0
    assert any(m["a"] == 0 or m["b"] == 0 for m in maps)  # an active constraint was exercised


def test_beta_calibration_uses_the_batch_and_keeps_its_predictions():
    z, y, _ = _problem(n=400, k=4, seed=5)
    cal = METHODS["beta"]().fit(z, y)
    lo = log_odds(z)
    for j, m in enumerate(cal.maps_):
        ref = fit_beta(lo[:, j], (y == j).astype(float))
        for key in "abc":
            assert m[key] == pytest.approx(ref[key], abs=PARAM_ATOL)
    zb = z[:, :2]
    cal2 = METHODS["beta"]().fit(zb, (y % 2))
    ref = fit_beta(log_odds(zb)[:, 1], (y % 2 == 1).astype(float))
    assert len(cal2.maps_) == 1 and cal2.maps_[0]["a"] == pytest.approx(ref["a"], abs=PARAM_ATOL)


# ------------------------------------------------- issue 26: the fused Newton, the shared scores, the fit memo
def test_batch_equals_scipy_minimize_on_the_same_objective():
    """An independent oracle: scipy's trust-region Newton on each class's weighted mean cross-entropy,
    written with ``logaddexp`` (not the solver's ``softplus - linear`` split), exact gradient and Hessian."""
    from scipy.optimize import minimize

    z, y, t = _problem(n=800, k=5, seed=12, scale=3.0)
    w = np.random.default_rng(12).uniform(0.2, 3.0, size=len(y))
    r = w / w.sum()
    for kind in ("log-odds", "log-prob"):
        s = _class_scores(z, kind)
        a, b, loss, conv = fit_platt_batch(s, t, sample_weight=w)
        assert conv.all()
        for j in range(s.shape[1]):
            sj, tj = s[:, j], t[:, j]

            def f(th, sj=sj, tj=tj):
                u = th[0] * sj + th[1]
                return float(r @ (tj * np.logaddexp(0.0, -u) + (1.0 - tj) * np.logaddexp(0.0, u)))

            def g(th, sj=sj, tj=tj):
                e = 1.0 / (1.0 + np.exp(-(th[0] * sj + th[1]))) - tj
                return np.array([r @ (e * sj), r @ e])

            def h(th, sj=sj):
                p = 1.0 / (1.0 + np.exp(-(th[0] * sj + th[1])))
                v = r * p * (1.0 - p)
                return np.array([[v @ (sj * sj), v @ sj], [v @ sj, v.sum()]])

            ref = minimize(f, np.zeros(2), jac=g, hess=h, method="trust-exact", options={"gtol": 1e-13})
            assert a[j] == pytest.approx(ref.x[0], rel=1e-7, abs=1e-9), (kind, j)
            assert b[j] == pytest.approx(ref.x[1], rel=1e-7, abs=1e-9), (kind, j)
            assert loss[j] == pytest.approx(ref.fun, rel=1e-12)


def test_batch_meets_the_gradient_tolerance_with_rounding_level_steps():
    """Nearly separable classes (tiny Hessians): the last Newton steps change the loss below its rounding;
    they are taken on the gradient, so every class reaches the gradient tolerance (by an exact check)."""
    z, y, t = _problem(n=3000, k=6, seed=13, scale=6.0)
    s = _class_scores(z, "log-odds")
    a, b, _, conv = fit_platt_batch(s, t)
    assert conv.all()
    p = 1.0 / (1.0 + np.exp(-(s * a + b)))
    g = np.maximum(np.abs(((p - t) * s).mean(axis=0)), np.abs((p - t).mean(axis=0)))
    assert g.max() < 1e-10


def test_blocked_evaluation_does_not_change_the_solution(monkeypatch):
    import confcal.calibrators._fit.jobs.platt_batch as pb

    z, y, t = _problem(n=2000, k=9, seed=14)
    s = _class_scores(z, "log-odds")
    whole = fit_platt_batch(s, t)
    monkeypatch.setattr(pb, "_BLOCK_ELEMENTS", 2 * 2000)  # blocks of two classes
    blocked = fit_platt_batch(s, t)
    np.testing.assert_allclose(blocked[0], whole[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(blocked[1], whole[1], rtol=1e-9, atol=1e-12)


def test_log_odds_from_log_softmax_equals_log_odds():
    from confcal._numeric import log_softmax
    from confcal.calibrators._fit.jobs.reduce import LOGIT_CLIP, log_odds_from_log_softmax

    rng = np.random.default_rng(15)
    z = rng.normal(size=(400, 7)) * rng.choice([0.1, 1.0, 5.0, 20.0, 80.0], size=(400, 1))
    z[:20, 3] = -np.inf  # masked classes
    z[20:40] = 0.0  # ties: p = 1/K
    z[40:50, :2] = [50.0, 50.0]  # two classes at nearly 1/2 each
    ref = log_odds(z)
    got = log_odds_from_log_softmax(log_softmax(z))
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-13)
    assert np.abs(got).max() <= LOGIT_CLIP and np.isfinite(got).all()


def test_fit_record_is_the_one_computed_afresh_and_no_memo_is_kept():
    from confcal._numeric import softmax
    from confcal.calibrators.protocol.manifest import summary_metrics

    z, y, _ = _problem(n=900, k=6, seed=16, scale=2.5)
    cal = METHODS["platt-ovr"]().fit(z, y)
    assert "_fit_memo" not in cal.__dict__
    q = cal.predict_proba(z, dtype=np.float64)
    rec = cal.fit_record_
    assert rec["metrics_after"] == summary_metrics(q, y)
    assert rec["metrics_before"] == summary_metrics(softmax(z), y)
    assert rec["argmax_changed"] == float(np.mean(np.argmax(q, axis=1) != np.argmax(softmax(z), axis=1)))
    bad = METHODS["platt-ovr"]()
    with pytest.raises(ValueError):
        bad.fit(z, np.full(len(y), 99))
    assert "_fit_memo" not in bad.__dict__


# ------------------------------------- issue 39: the flat-step rule and the identity start of the batched Newton
def _projected_gradient(lo, tgt, maps, w=None):
    """Max over classes of the KKT residual of ``a, b >= 0`` for the mean cross-entropy, written directly
    (``logaddexp`` features, plain sigmoid): the free coordinates' gradient, a bound's only where negative."""
    n = lo.shape[0]
    r = np.full(n, 1.0 / n) if w is None else w / w.sum()
    out = []
    for j, m in enumerate(maps):
        x = np.column_stack([-np.logaddexp(0.0, -lo[:, j]), np.logaddexp(0.0, lo[:, j]), np.ones(n)])
        th = np.array([m["a"], m["b"], m["c"]])
        g = x.T @ ((1.0 / (1.0 + np.exp(-(x @ th))) - tgt[:, j]) * r)
        g[:2] = np.where(th[:2] == 0.0, np.minimum(g[:2], 0.0), g[:2])
        out.append(np.abs(g).max())
    return np.array(out)


@pytest.mark.parametrize("start", ["identity", "far"])
def test_logistic_batch_second_start_changes_nothing_but_the_path(start):
    """``init`` is only a start: with the identity or a start far off (loss above the base rate's) the fit
    is the one-class exact Newton's."""
    rng = np.random.default_rng(4)
    n, k = 600, 5
    x = rng.normal(size=(k, n, 2))
    t = (rng.uniform(size=(k, n)) < 1 / (1 + np.exp(-(x[:, :, 0] + 0.3 * x[:, :, 1] - 0.2)))).astype(float)
    init = (np.ones((k, 2)), np.zeros(k)) if start == "identity" else (np.full((k, 2), 40.0), np.full(k, -30.0))
    coef, icpt, loss, conv = fit_logistic_batch(x, t, init=init)
    assert conv.all()
    for j in range(k):
        ref = fit_constrained_logistic(x[j], t[j])
        np.testing.assert_allclose(coef[j], ref.coef, atol=PARAM_ATOL)
        assert icpt[j] == pytest.approx(ref.intercept, abs=PARAM_ATOL)
        assert loss[j] == pytest.approx(ref.nll, rel=1e-12)


def test_beta_batch_reaches_the_gradient_tolerance_on_densenet_c100(shared_data):
    """Real data where the Armijo test cannot see the last Newton steps (their predicted decrease is below the
    loss's rounding): 16 of the 100 classes used to stop at a projected gradient up to 6.5e-10 after 60
    futile halvings each; every class now reaches the solver's 1e-11, checked by an independent gradient."""
    d = np.load(shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    p = d["predictions"].astype(np.float64)
    y = d["ground_truth"].astype(np.int64)
    idx = np.random.default_rng(0).permutation(len(y))[:5000]
    lo = log_odds(np.log(np.maximum(p[idx], np.finfo(np.float64).tiny)))
    tgt = (y[idx][:, None] == np.arange(100)[None, :]).astype(float)
    maps = fit_beta_batch(lo, tgt)
    assert _projected_gradient(lo, tgt, maps).max() < 2e-11
    for j in (0, 37, 99):  # and the one-class exact constrained Newton agrees
        ref = fit_beta(lo[:, j], tgt[:, j])
        for key in "abc":
            assert maps[j][key] == pytest.approx(ref[key], abs=PARAM_ATOL)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-40.0, 40.0), st.sampled_from([0.0, -36.04, 36.04, 1e-300, -1e-300])),
                min_size=1, max_size=30))
def test_beta_feature_pair_equals_logaddexp(lo):
    """Oracle: ``ln p = -logaddexp(0, -x)`` and ``-ln(1 - p) = logaddexp(0, x)``, to 2.3e-16 absolute plus
    2 ulps (``log(1 + e)`` for ``log1p(e)``)."""
    from confcal.calibrators._fit.beta import beta_feature_pair

    x = np.array(lo)
    f1, f2 = beta_feature_pair(x)
    for got, ref in ((f1, -np.logaddexp(0.0, -x)), (f2, np.logaddexp(0.0, x))):
        np.testing.assert_allclose(got, ref, rtol=4.5e-16, atol=2.3e-16)
    assert np.all(f1 <= 0.0) and np.all(f2 >= 0.0)


def test_beta_columns_in_one_pass_equal_the_per_class_map():
    from confcal.calibrators._fit.beta import apply_beta, apply_beta_columns

    rng = np.random.default_rng(3)
    lo = np.clip(rng.normal(size=(300, 6)) * 8.0, -36.04, 36.04)
    maps = [{"a": float(a), "b": float(b), "c": float(c)}
            for a, b, c in zip(rng.uniform(0, 3, 6), [0.0, 1.0, 0.2, 2.5, 0.0, 1e-3], rng.normal(size=6))]
    got = apply_beta_columns(maps, lo)
    ref = np.column_stack([apply_beta(m, lo[:, j]) for j, m in enumerate(maps)])
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=1e-300)


def test_beta_fit_computes_the_log_odds_once_and_predicts_as_a_fresh_call(monkeypatch):
    """The fit record's predictions reuse the fit's log-odds and softmax (the fit memo); a fitted
    calibrator holds no data and predicts the same array as the fit record saw it."""
    import confcal.calibrators.logistic.beta as beta_mod

    calls = []
    real = beta_mod.log_odds_from_log_softmax
    monkeypatch.setattr(beta_mod, "log_odds_from_log_softmax", lambda *a: calls.append(1) or real(*a))
    z, y, _ = _problem(n=400, k=5, seed=7)
    cal = METHODS["beta"]().fit(z, y)
    assert len(calls) == 1 and "_fit_memo" not in cal.__dict__
    q = cal.predict_proba(z)
    assert len(calls) == 2
    lo = log_odds(z)  # the reference scores, computed the other way
    ref = np.column_stack([1.0 / (1.0 + np.exp(-(m["a"] * -np.logaddexp(0.0, -lo[:, j])
                                                  + m["b"] * np.logaddexp(0.0, lo[:, j]) + m["c"])))
                           for j, m in enumerate(cal.maps_)])
    np.testing.assert_allclose(q, ref / ref.sum(axis=1, keepdims=True), rtol=1e-12)
    acc = float(np.mean(np.argmax(q, axis=1) == y)) - float(np.mean(np.argmax(z, axis=1) == y))
    assert cal.fit_record_["accuracy_change"] == pytest.approx(acc, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 5), n=st.integers(30, 400),
       scale=st.sampled_from([0.1, 1.0, 5.0, 30.0]), weighted=st.booleans())
def test_logistic_batch_equals_one_class_newton_property(seed, k, n, scale, weighted):
    """The flat-step rule (a full step accepted within the loss's rounding) against the one-class exact
    Newton on random designs, feature scales from 0.1 to 30 (the larger ones near separable), weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(k, n, 2)) * scale
    coef_true = rng.normal(size=(k, 2))
    t = (rng.uniform(size=(k, n)) < 1 / (1 + np.exp(-np.einsum("knj,kj->kn", x, coef_true)))).astype(float)
    w = rng.uniform(0.2, 3.0, size=n) if weighted else None
    init = (np.ones((k, 2)), np.zeros(k)) if seed % 2 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coef, icpt, loss, conv = fit_logistic_batch(x, t, sample_weight=w, init=init)
        refs = [fit_constrained_logistic(x[j], t[j], sample_weight=w) for j in range(k)]
    for j, ref in enumerate(refs):
        if not (ref.converged and conv[j]) or ref.nll < 1e-4:
            # (nearly) separable: no finite optimum; both stop where the gradient is below 1e-11
            assert loss[j] < 1e-9 if ref.nll < 1e-10 else True
            continue
        assert loss[j] == pytest.approx(ref.nll, rel=1e-10)
        np.testing.assert_allclose(coef[j], ref.coef, atol=PARAM_ATOL * (1 + np.abs(ref.coef).max()))
        assert icpt[j] == pytest.approx(ref.intercept, abs=PARAM_ATOL * (1 + abs(ref.intercept)))
