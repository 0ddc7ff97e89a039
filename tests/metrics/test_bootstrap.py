"""Bootstrap ECE and the improvement ratio (Gong et al., ICCV 2021, sec. 5 and eq. 19)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics import BootstrapResult, bootstrap_ece, ece, improvement_ratio
from confcal.metrics.bootstrap import bootstrap_indices


def data(n=2000, k=4, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, 0.4), size=n)
    y = np.where(rng.random(n) < 0.6, p.argmax(1), rng.integers(0, k, n))
    return p, y


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_each_draw_is_the_ece_of_its_resample(binning, n_bins):
    p, y = data()
    res = bootstrap_ece(p, y, n_draws=40, n_samples=700, n_bins=n_bins, binning=binning, random_state=3)
    idx = bootstrap_indices(len(y), 40, 700, 3)
    oracle = np.array([ece(p[i], y[i], n_bins=n_bins, binning=binning) for i in idx])
    np.testing.assert_allclose(res.values, oracle, rtol=0, atol=1e-12)
    assert res.mean == pytest.approx(oracle.mean(), abs=1e-12)
    assert res.std == pytest.approx(oracle.std(ddof=1), abs=1e-12)
    assert (res.lo, res.hi) == pytest.approx(tuple(np.percentile(oracle, [2.5, 97.5])), abs=1e-12)
    assert res.n_samples == 700


def test_paper_defaults_and_small_targets():
    p, y = data(n=5000)
    res = bootstrap_ece(p, y)
    assert isinstance(res, BootstrapResult)
    assert res.values.shape == (1000,) and res.n_samples == 1500
    small = bootstrap_ece(p[:300], y[:300], n_draws=20)
    assert small.n_samples == 300  # m = all samples when fewer than 1500
    assert np.unique(small.values).size > 1  # with replacement: draws differ even when m = n
    assert bootstrap_ece(p, y, n_draws=5, n_samples=None).n_samples == 5000


def test_seeded():
    p, y = data()
    a = bootstrap_ece(p, y, n_draws=30, random_state=1)
    b = bootstrap_ece(p, y, n_draws=30, random_state=1)
    c = bootstrap_ece(p, y, n_draws=30, random_state=2)
    np.testing.assert_array_equal(a.values, b.values)
    assert not np.array_equal(a.values, c.values)


def test_bootstrap_mean_tracks_the_full_sample_ece():
    p, y = data(n=20000, seed=5)
    res = bootstrap_ece(p, y, n_draws=300, n_samples=None)
    full = ece(p, y)
    assert abs(res.mean - full) < 4 * res.std / np.sqrt(300) + 0.01  # bootstrap ECE is biased upwards a bit
    assert res.lo < full < res.hi


def test_calibrated_certain_predictions_have_zero_ece():
    y = np.arange(500) % 3
    p = np.eye(3)[y]
    res = bootstrap_ece(p, y, n_draws=10)
    assert res.mean == 0 and res.std == 0 and res.hi == 0


def test_one_draw_has_zero_std():
    p, y = data(n=100)
    assert bootstrap_ece(p, y, n_draws=1).std == 0.0


@pytest.mark.parametrize("kw, match", [({"n_draws": 0}, "n_draws"), ({"n_samples": 0}, "n_samples"),
                                       ({"n_draws": 2.5}, "n_draws"), ({"binning": "x"}, "binning"),
                                       ({"n_bins": 0}, "n_bins")])
def test_bad_arguments(kw, match):
    p, y = data(n=50)
    with pytest.raises(ValueError, match=match):
        bootstrap_ece(p, y, **kw)


def test_bad_labels_are_not_clipped():
    p, y = data(n=50)
    y[3] = 7
    with pytest.raises(ValueError, match="labels"):
        bootstrap_ece(p, y, n_draws=2)


@settings(max_examples=40)
@given(st.integers(0, 10_000), st.integers(1, 60), st.integers(2, 6), st.integers(1, 20))
def test_properties(seed, n, k, n_bins):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), size=n)
    y = rng.integers(0, k, n)
    res = bootstrap_ece(p, y, n_draws=25, n_samples=max(1, n // 2), n_bins=n_bins, random_state=seed)
    assert np.all((res.values >= 0) & (res.values <= 1))
    assert res.lo <= res.hi and res.std >= 0
    assert res.values.min() - 1e-12 <= res.mean <= res.values.max() + 1e-12


# ---------------------------------------------------------------- improvement ratio
def test_improvement_ratio_eq19():
    assert improvement_ratio(0.10, 0.20, 0.05) == pytest.approx(2 / 3)
    assert improvement_ratio(0.20, 0.20, 0.05) == 0.0  # no better than source-only
    assert improvement_ratio(0.05, 0.20, 0.05) == 1.0  # as good as the target-only oracle
    assert improvement_ratio(0.02, 0.20, 0.05) == pytest.approx(1.2)  # better than the oracle
    assert improvement_ratio(0.30, 0.20, 0.05) == pytest.approx(-2 / 3)
    out = improvement_ratio(np.array([0.1, 0.2]), 0.2, np.array([0.05, 0.1]))
    np.testing.assert_allclose(out, [2 / 3, 0.0])
    assert isinstance(improvement_ratio(0.1, 0.2, 0.05), float)


def test_improvement_ratio_undefined_or_bad():
    with pytest.raises(ValueError, match="undefined"):
        improvement_ratio(0.1, 0.2, 0.2)
    with pytest.raises(ValueError, match="ece_source_only"):
        improvement_ratio(0.1, float("nan"), 0.2)


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_improvement_ratio_is_affine_in_ece(e1, e2, s, t):
    if abs(s - t) < 1e-3:
        return
    ir1, ir2 = improvement_ratio(e1, s, t), improvement_ratio(e2, s, t)
    # a lower ECE means a higher IR exactly when the oracle beats source-only
    assert ir1 - ir2 == pytest.approx((e2 - e1) / (s - t), rel=1e-9, abs=1e-9)


def test_seed_is_the_old_name_of_random_state():
    """One name per idea: ``random_state``; ``seed=`` still works, warns, and draws the same."""
    p, y = data(n=500)
    new = bootstrap_ece(p, y, n_draws=20, random_state=7)
    with pytest.warns(FutureWarning, match="seed= is renamed random_state="):
        old = bootstrap_ece(p, y, n_draws=20, seed=7)
    np.testing.assert_array_equal(old.values, new.values)  # the same kernel on the same input in one process
    with pytest.raises(ValueError, match="give random_state= only"):
        bootstrap_ece(p, y, n_draws=20, random_state=3, seed=7)
