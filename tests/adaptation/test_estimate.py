"""EM, BBSE, reweighting and the no-shift test against independent references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest, chi2_contingency

from confcal.adaptation import bbse_prior, bbse_weights, em_prior, label_shift_test, reweight
from tests.adaptation import _synth


def _em_loop(p, ps, tol, max_iter, c=0.0):
    """Saerens et al. (2002) eqs. 2.9-2.10 written row by row: the reference."""
    pi = np.array(ps, dtype=np.float64)
    for _ in range(max_iter):
        counts = np.zeros_like(pi)
        for row in p:
            q = row * pi / ps
            counts += q / q.sum()
        new = (counts + c) / (len(p) + len(pi) * c)
        done = np.abs(new - pi).sum() <= tol
        pi = new
        if done:
            break
    return pi


@pytest.mark.parametrize("c", [0.0, 2.5])
def test_em_matches_a_direct_loop_and_is_a_fixed_point(c):
    rng = np.random.default_rng(1)
    ps = np.array([0.5, 0.3, 0.2])
    x, _ = _synth.draw([0.1, 0.2, 0.7], 400, rng)
    p = _synth.posterior(x, ps)
    r = em_prior(p, ps, smoothing=c, tol=1e-10, max_iter=5000)
    ref = _em_loop(p, ps, 1e-10, 5000, c)
    assert r.converged
    np.testing.assert_allclose(r.prior, ref, rtol=1e-9, atol=1e-12)
    # a fixed point: one more step of the reference from the result moves it by less than 1e-9
    np.testing.assert_allclose(_em_loop_from(p, ps, r.prior, c), r.prior, atol=1e-9)


def _em_loop_from(p, ps, pi, c):
    q = p * pi / ps
    q /= q.sum(axis=1, keepdims=True)
    return (q.sum(axis=0) + c) / (len(p) + len(pi) * c)


def test_em_stopping_rule_and_history():
    rng = np.random.default_rng(2)
    ps = np.array([0.25] * 4)
    p = _synth.posterior(_synth.draw([0.4, 0.3, 0.2, 0.1], 300, rng)[0], ps)
    r = em_prior(p, ps, tol=1e-6)
    assert r.converged and r.history[-1] <= 1e-6 and all(h > 1e-6 for h in r.history[:-1])
    assert r.n_iter == len(r.history)
    short = em_prior(p, ps, tol=1e-12, max_iter=3)
    assert not short.converged and short.n_iter == 3


@settings(max_examples=40)
@given(st.integers(0, 10_000), st.integers(2, 6), st.floats(0.05, 5))
def test_em_never_lowers_the_likelihood(seed, k, alpha):
    rng = np.random.default_rng(seed)
    ps = rng.dirichlet([5.0] * k)
    pt = rng.dirichlet([alpha] * k)
    p = _synth.posterior(_synth.draw(pt, 200, rng)[0], ps)
    lls = [em_prior(p, ps, tol=1e-300, max_iter=m).log_likelihood for m in (1, 2, 4, 8, 16)]
    assert all(b >= a - 1e-12 for a, b in zip(lls, lls[1:]))
    assert lls[0] >= -1e-12  # above the source prior's (0 by construction)


def test_em_recovers_a_known_prior():
    """Exact posteriors of a known Gaussian p(x | y): the estimate is within 4 standard errors."""
    rng = np.random.default_rng(3)
    ps = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    pt = np.array([0.5, 0.05, 0.3, 0.1, 0.05])
    x, _ = _synth.draw(pt, 20_000, rng)
    r = em_prior(_synth.posterior(x, ps), ps)
    assert np.abs(r.prior - pt).max() < 4 * np.sqrt(0.25 / 20_000) * 3  # the separation inflates the error ~3x
    assert np.abs(r.prior - pt).sum() < 0.03


def test_bbse_matches_a_hand_solve():
    # joint C = [[.4, .1], [.1, .4]], mu = (.65, .35): .4 a + .1 b = .65, .1 a + .4 b = .35 -> a = 1.5, b = 0.5
    np.testing.assert_allclose(bbse_weights([[40, 10], [10, 40]], [65, 35]), [1.5, 0.5], rtol=1e-12)
    np.testing.assert_allclose(bbse_prior([[40, 10], [10, 40]], [65, 35]), [0.75, 0.25], rtol=1e-12)
    # 3 classes, P(y_hat | y) = M = 0.7 I + 0.1 J, uniform source: joint C = M / 3, M^-1 = (I - 0.1 J) / 0.7,
    # so for mu summing to 1, q = (mu - 0.1) / 0.7 = (0.65, 0.1, -0.05) / 0.7 and w = q / (1/3) = 3 q
    m = 0.7 * np.eye(3) + 0.1
    mu = [0.75, 0.2, 0.05]
    np.testing.assert_allclose(bbse_weights(m / 3, mu), 3 * np.array([0.65, 0.1, -0.05]) / 0.7, rtol=1e-12)
    np.testing.assert_allclose(bbse_weights(m * 300, np.array(mu) * 17), 3 * np.array([0.65, 0.1, -0.05]) / 0.7,
                               rtol=1e-12)  # counts, not shares: normalised alike
    # the negative weight is clipped to 0, then (0.65, 0.1, 0) renormalised
    np.testing.assert_allclose(bbse_prior(m / 3, mu), [0.65 / 0.75, 0.1 / 0.75, 0.0], rtol=1e-12)


@pytest.mark.parametrize("conf, needle", [
    ([[10, 0, 0], [0, 10, 0], [0, 0, 0]], "class 2 is never predicted"),
    ([[10, 0, 3], [0, 10, 0], [0, 0, 0]], "class 2 is never predicted"),
    ([[10, 0, 0], [0, 10, 0], [0, 5, 0]], "class 2 has no calibration rows"),
    ([[5, 5, 0], [5, 5, 0], [0, 0, 9]], "predicted alike"),
])
def test_bbse_refuses_a_singular_confusion_matrix(conf, needle):
    with pytest.raises(ValueError, match=needle) as e:
        bbse_prior(conf, [3, 3, 3])
    assert "\n" not in str(e.value) and str(e.value).startswith("confusion: singular")


def test_reweight_is_bayes_rule():
    rng = np.random.default_rng(4)
    ps, pt = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.3, 0.6])
    x, _ = _synth.draw(pt, 50, rng)
    np.testing.assert_allclose(reweight(_synth.posterior(x, ps), pt, ps), _synth.posterior(x, pt), rtol=1e-10)
    p = _synth.posterior(x, ps)
    np.testing.assert_allclose(reweight(p, ps, ps), p, rtol=1e-14)  # no shift: unchanged


def test_reweight_prior_with_zeros_is_defined():
    p = np.array([[0.7, 0.2, 0.1], [0.0, 0.0, 1.0]])
    out = reweight(p[:1], [0.5, 0.5, 0.0], [1 / 3] * 3)
    np.testing.assert_allclose(out, [[0.7 / 0.9, 0.2 / 0.9, 0.0]])
    with pytest.raises(ValueError, match=r"target_prior: row 1 puts all its probability"):
        reweight(p, [0.5, 0.5, 0.0], [1 / 3] * 3)


@pytest.mark.parametrize("bad, needle", [
    (np.array([[0.5, 0.5], [np.nan, 0.5]]), "row 1"),
    (np.array([[0.5, 0.6]]), "row 0"),
    (np.array([0.5, 0.5]), "shape"),
])
def test_em_refuses_bad_posteriors(bad, needle):
    with pytest.raises(ValueError, match=needle) as e:
        em_prior(bad, [0.5, 0.5])
    assert "\n" not in str(e.value) and str(e.value).startswith("probs:")


def test_em_refuses_a_source_prior_with_a_zero():
    with pytest.raises(ValueError, match=r"source_prior: class 1 has prior 0"):
        em_prior(np.array([[0.5, 0.5]]), [1.0, 0.0])


@pytest.mark.parametrize("kw, needle", [({"smoothing": -1}, "smoothing"), ({"tol": 0}, "tol"),
                                        ({"max_iter": 0}, "max_iter"), ({"max_iter": 2.5}, "max_iter")])
def test_em_refuses_bad_settings(kw, needle):
    with pytest.raises(ValueError, match=needle):
        em_prior(np.array([[0.5, 0.5]]), [0.5, 0.5], **kw)


@settings(max_examples=30)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=8), st.integers(0, 10_000))
def test_label_shift_test_is_pearsons_chi_squared(a, seed):
    rng = np.random.default_rng(seed)
    a = np.array(a)
    b = rng.integers(0, 50, size=a.shape)
    if a.sum() == 0 or b.sum() == 0:
        return
    t = label_shift_test(a, b)
    keep = (a + b) > 0
    if keep.sum() < 2:
        assert t.p_value == 1.0
        return
    stat, p, dof, _ = chi2_contingency(np.stack([a[keep], b[keep]]), correction=False)
    assert t.dof == dof
    np.testing.assert_allclose([t.statistic, t.p_value], [stat, p], rtol=1e-9, atol=1e-300)


def test_label_shift_test_false_alarm_rate_under_no_shift():
    """No shift (both samples from one prior): the 5 % test rejects 5 % of the time, within the
    99 % Clopper-Pearson interval of 600 simulations."""
    rng = np.random.default_rng(5)
    ps = np.array([0.4, 0.3, 0.2, 0.1])
    rejects = 0
    for _ in range(600):
        ya = np.argmax(_synth.posterior(_synth.draw(ps, 500, rng)[0], ps), axis=1)
        yb = np.argmax(_synth.posterior(_synth.draw(ps, 500, rng)[0], ps), axis=1)
        rejects += label_shift_test(np.bincount(ya, minlength=4), np.bincount(yb, minlength=4)).p_value < 0.05
    ci = binomtest(rejects, 600).proportion_ci(0.99)
    assert ci.low <= 0.05 <= ci.high, (rejects, ci)
