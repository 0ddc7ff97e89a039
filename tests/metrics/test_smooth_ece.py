"""Smooth ECE: an exact direct-evaluation oracle, closed forms, the relplot package, properties."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from confcal.metrics import smooth_ece
from confcal.metrics.smooth_ece import SIGMA_MIN
from tests.conftest import require_shared_data

relplot = pytest.importorskip("relplot", reason="relplot is a test dependency (pip install -e .[test])")


# ------------------------------------------------------------------ the oracle
def exact_smece_sigma(conf, correct, sigma, n_points=6001):
    """Oracle: the definition evaluated directly, no grid for the samples.

    ``integral_0^1 |(1/n) sum_i K(t, f_i) (f_i - y_i)| dt`` with the reflected
    kernel written out as its images ``phi(t - f - 2k) + phi(t + f - 2k)``,
    evaluated exactly at ``n_points`` values of ``t`` and integrated by the
    trapezoid rule.
    """
    f = np.asarray(conf, dtype=np.float64)
    r = f - np.asarray(correct, dtype=np.float64)
    t = np.linspace(0.0, 1.0, n_points)
    g = np.zeros_like(t)
    # images with |k| = 2 are >= 3 away: below e^-36 relative for sigma <= 0.35
    n_images = 2 if sigma <= 0.35 else 4
    for k in range(-n_images, n_images + 1):
        for sign in (1.0, -1.0):
            z = (t[:, None] - sign * f[None, :] - 2.0 * k) / sigma
            g += np.exp(-0.5 * z * z) @ r
    g = np.abs(g) / (len(f) * sigma * np.sqrt(2.0 * np.pi))
    return float(np.sum((g[1:] + g[:-1]) * 0.5) * (t[1] - t[0]))


def exact_smece(conf, correct):
    """Oracle fixed point ``smECE_sigma* = sigma*`` by Brent's method on the exact evaluation."""
    s = brentq(lambda s: exact_smece_sigma(conf, correct, s, n_points=3001) - s, 0.01, 1.0, xtol=1e-10)
    return s


def top_label(probs, labels):
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def random_case(seed, n=150, k=4, sharp=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * sharp
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    # labels drawn from a tempered version, so the model is miscalibrated
    q = p ** 0.6
    q /= q.sum(1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in q])
    return p, y


# ------------------------------------------------------------------ oracle agreement
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("sigma", [0.02, 0.07, 0.3, 1.0])
def test_fixed_sigma_matches_exact_oracle(seed, sigma):
    p, y = random_case(seed, n=100)
    f, c = top_label(p, y)
    expected = exact_smece_sigma(f, c, sigma, n_points=12001 if sigma < 0.05 else 6001)
    assert smooth_ece(p, y, sigma=sigma) == pytest.approx(expected, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("seed", [3, 4])
def test_fixed_point_matches_exact_oracle(seed):
    p, y = random_case(seed, n=80)
    f, c = top_label(p, y)
    s_oracle = exact_smece(f, c)
    value, s = smooth_ece(p, y, return_sigma=True)
    assert s == pytest.approx(s_oracle, rel=1e-5)
    assert value == pytest.approx(s, rel=1e-8)  # smECE equals its own bandwidth


def test_real_cifar100_subsample_matches_exact_oracle():
    data = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    p = data["predictions"][:300].astype(np.float64)
    p /= p.sum(1, keepdims=True)
    y = data["ground_truth"][:300]
    f, c = top_label(p, y)
    # 40% of these confidences lie within 1e-3 of 1, where reflection at the boundary matters
    for sigma in (0.05, 0.14):
        assert smooth_ece(p, y, sigma=sigma) == pytest.approx(exact_smece_sigma(f, c, sigma), rel=1e-5)


# ------------------------------------------------------------------ closed forms
@given(c=st.floats(0.5, 1.0), n=st.integers(4, 60), data=st.data())
@settings(max_examples=40)
def test_single_confidence_block_is_its_gap(c, n, data):
    """One confidence ``c`` with accuracy ``a``: the reflected kernel integrates to 1 on
    [0, 1], so smECE_sigma = |c - a| for every sigma, and the fixed point is |c - a|."""
    n_correct = data.draw(st.integers(0, n))
    probs = np.full(n, c)  # binary positive-class probabilities, all >= 0.5
    labels = (np.arange(n) < n_correct).astype(int)
    gap = abs(c - n_correct / n)
    sigma = data.draw(st.floats(0.005, 1.0))
    assert smooth_ece(probs, labels, sigma=sigma) == pytest.approx(gap, abs=1e-12)
    value, s = smooth_ece(probs, labels, return_sigma=True)
    if gap > SIGMA_MIN:
        assert value == pytest.approx(gap, abs=1e-9) and s == pytest.approx(gap, abs=1e-9)
    else:
        assert s == SIGMA_MIN and value == pytest.approx(gap, abs=1e-12)


@given(blocks=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 4)), min_size=1, max_size=6),
       sigma=st.floats(0.005, 1.0))
@settings(max_examples=15)
def test_perfectly_calibrated_blocks_give_zero(blocks, sigma):
    """Blocks of m samples at confidence 0.5 + j/20 with exactly that fraction correct
    (m a multiple of 20 / gcd): residuals cancel inside every block, so smECE is 0."""
    probs, labels = [], []
    for j, reps in blocks:
        conf = 0.5 + j / 20
        m = 20 * reps
        k = round(conf * m)
        probs += [conf] * m
        labels += [1] * k + [0] * (m - k)
    probs, labels = np.array(probs), np.array(labels)
    assert smooth_ece(probs, labels, sigma=sigma) < 1e-12
    assert smooth_ece(probs, labels) < 1e-12


@given(c=st.floats(0.55, 1.0), a=st.integers(0, 40), w=st.integers(1, 5), cal=st.integers(0, 9))
@settings(max_examples=30)
def test_one_miscalibrated_block_among_calibrated_ones(c, a, w, cal):
    """Calibrated blocks contribute zero residual mass anywhere, so the only term is the
    miscalibrated block: smECE_sigma = weight * |c - acc| exactly, for every sigma,
    wherever the blocks sit (they may overlap in confidence)."""
    bad = 40 * w
    bad_correct = round(a / 40 * bad)
    conf_cal = 0.5 + cal / 20
    m = 40
    probs = np.r_[np.full(bad, c), np.full(m, conf_cal)]
    labels = np.r_[np.ones(bad_correct), np.zeros(bad - bad_correct),
                   np.ones(round(conf_cal * m)), np.zeros(m - round(conf_cal * m))].astype(int)
    expected = bad / (bad + m) * abs(c - bad_correct / bad)
    for sigma in (0.01, 0.1, 0.5):
        assert smooth_ece(probs, labels, sigma=sigma) == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------ the relplot package
def interior_case(seed, n=400):
    """Confidences inside (0.05, 0.95): relplot's 1e-3 grid is accurate there.

    Returns relplot's ``(f, y)`` pairs and 20-class probabilities whose top-label
    confidence is ``f`` (class 0, the rest share ``1 - f``) with labels correct iff ``y``.
    """
    rng = np.random.default_rng(seed)
    f = 0.05 + 0.9 * rng.beta(2.0 + seed, 1.5, n)
    y = (rng.uniform(size=n) < f ** (0.5 + 0.4 * seed)).astype(np.float64)
    probs = np.empty((n, 20))
    probs[:, 0] = f
    probs[:, 1:] = ((1.0 - f) / 19.0)[:, None]
    labels = np.where(y == 1.0, 0, 1 + rng.integers(0, 19, n))
    assert np.array_equal(top_label(probs, labels)[0], f)
    return f, y, probs, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sigma", [0.02, 0.05, 0.1])
def test_fixed_sigma_matches_relplot_fine_mesh(seed, sigma, monkeypatch):
    f, y, probs, labels = interior_case(seed)
    # relplot integrates on 200 points by default; a finer mesh removes that error term,
    # leaving its 1e-3 linear-binning grid (relative error ~ (1e-3 / sigma)^2 / 8). Its
    # kernel is cut at |t - f| <= 0.5 with one reflection, so wide bandwidths (0.3 and
    # up) differ from the definition; those are checked against the exact oracle above.
    monkeypatch.setattr(relplot.config, "smECE_mesh_pts", 20001)
    ours = smooth_ece(probs, labels, sigma=sigma)
    assert ours == pytest.approx(relplot.smECE_sigma(f, y, sigma), rel=2e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fixed_point_matches_relplot(seed):
    """relplot bisects sigma on [0, 1] ten times and returns the upper end of the last
    bracket, so its bandwidth is within 2^-10 above sigma*; its value is smECE there."""
    f, y, probs, labels = interior_case(seed)
    value, s = smooth_ece(probs, labels, return_sigma=True)
    r_value, r_width = relplot.smECE(f, y, return_width=True)
    assert r_width - 2.0 ** -10 - 1e-4 <= s <= r_width + 1e-4
    assert value == pytest.approx(r_value, abs=2e-3)
    # the fixed point, checked with relplot's own smECE_sigma
    assert relplot.smECE_sigma(f, y, s) == pytest.approx(s, rel=1e-2)


def test_multiclass_top_label_matches_relplot():
    p, y = random_case(7, n=500, k=10, sharp=1.0)
    f, c = relplot.multiclass_logits_to_confidences(p, y, probs=True)
    # a few confidences sit near the edges, where relplot's grid is coarser: 1% tolerance
    for sigma in (0.05, 0.1):
        assert smooth_ece(p, y, sigma=sigma) == pytest.approx(relplot.smECE_sigma(f, c, sigma), rel=1e-2)


# ------------------------------------------------------------------ properties
probs_labels = st.integers(0, 10_000).map(lambda s: random_case(s, n=80, k=3, sharp=1.5))


@given(case=probs_labels, seed=st.integers(0, 1000))
@settings(max_examples=25)
def test_bounds_and_invariances(case, seed):
    p, y = case
    f, c = top_label(p, y)
    sigma = 0.05
    value = smooth_ece(p, y, sigma=sigma)
    # |integral of g| <= integral |g| <= integral of (1/n) sum K |r| = mean |r|
    assert abs(np.mean(f - c)) - 1e-9 <= value <= np.mean(np.abs(f - c)) + 1e-9
    assert 0.0 <= smooth_ece(p, y) <= 1.0
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    assert smooth_ece(p[perm], y[perm], sigma=sigma) == pytest.approx(value, rel=1e-10, abs=1e-13)
    cols = rng.permutation(p.shape[1])  # relabel classes consistently
    inv = np.argsort(cols)
    assert smooth_ece(p[:, cols], inv[y], sigma=sigma) == pytest.approx(value, rel=1e-10, abs=1e-13)
    # the empirical distribution is what matters: every sample twice gives the same value
    assert smooth_ece(np.r_[p, p], np.r_[y, y], sigma=sigma) == pytest.approx(value, rel=1e-10, abs=1e-13)


@given(case=probs_labels)
@settings(max_examples=15)
def test_non_increasing_in_sigma(case):
    """Smoothing more can only lower smECE_sigma (paper, sec. 4): this is what makes the
    fixed point unique."""
    p, y = case
    values = [smooth_ece(p, y, sigma=s) for s in (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)]
    assert all(a >= b - 1e-9 for a, b in zip(values, values[1:]))


def test_torch_and_float32_inputs():
    p, y = random_case(11, n=200)
    ref = smooth_ece(p, y)
    assert smooth_ece(torch.from_numpy(p), torch.from_numpy(y)) == ref
    assert smooth_ece(p.astype(np.float32), y) == pytest.approx(ref, rel=1e-5)


def test_bad_inputs_are_named():
    p, y = random_case(12, n=20)
    with pytest.raises(ValueError, match="sigma"):
        smooth_ece(p, y, sigma=0.0)
    with pytest.raises(ValueError, match="sigma"):
        smooth_ece(p, y, sigma=float("nan"))
    with pytest.raises(ValueError, match="labels"):
        smooth_ece(p, y[:-1])
    with pytest.raises(ValueError, match="labels"):
        smooth_ece(p, y + 4)
    with pytest.raises(ValueError, match="probs"):
        smooth_ece(np.log(p), y)
