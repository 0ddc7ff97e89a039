"""p-values of Learn-then-Test against scipy's binomial tail and a hand evaluation of Hoeffding--Bentkus."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from confcal.decisions import binomial_pvalue, hoeffding_bentkus_pvalue


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.2, 0.5])
def test_binomial_pvalue_is_scipys_binomial_cdf(alpha):
    n = np.arange(0, 300)
    k = (n * 0.07).astype(int)
    got = binomial_pvalue(k, n, alpha)
    want = np.where(n > 0, stats.binom.cdf(k, n, alpha), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-300)


@given(n=st.integers(1, 200), alpha=st.floats(0.01, 0.6), u=st.floats(0.001, 0.5))
def test_binomial_pvalue_is_valid_at_the_boundary_of_the_null(n, alpha, u):
    # under R = alpha exactly (the worst case of H: R >= alpha), P(p <= u) <= u: exact enumeration of k
    k = np.arange(n + 1)
    p = binomial_pvalue(k, np.full_like(k, n), alpha)
    assert stats.binom.pmf(k, n, alpha)[p <= u].sum() <= u * (1 + 1e-9)


def _hb_by_hand(k, n, alpha):
    """The bound for k losses of 1 among n (r_hat = k / n; ceil(n r_hat) = k exactly, no float rounding)."""
    r = k / n
    a = min(r, alpha)
    h1 = (a * math.log(a / alpha) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - alpha))
    tail = sum(math.comb(n, i) * alpha**i * (1 - alpha) ** (n - i) for i in range(k + 1))
    return min(math.exp(-n * h1), math.e * tail, 1.0)


def test_hoeffding_bentkus_hand_evaluation():
    # n = 100, r_hat = 0.02, alpha = 0.05: h1 = 0.02 ln 0.4 + 0.98 ln(0.98/0.95) = 0.0121434...,
    # Hoeffding exp(-1.21434) = 0.29692; Bentkus e * P(Bin(100, .05) <= 2) = e * 0.118263 = 0.32147
    assert hoeffding_bentkus_pvalue(0.02, 100, 0.05) == pytest.approx(0.29692, rel=2e-4)
    # n = 2000, r_hat = 0.04: the Bentkus term is the smaller one
    hb = float(hoeffding_bentkus_pvalue(0.04, 2000, 0.05))
    assert hb == pytest.approx(_hb_by_hand(80, 2000, 0.05), rel=1e-9)
    assert hb == pytest.approx(math.e * stats.binom.cdf(80, 2000, 0.05), rel=1e-9)


@given(n=st.integers(1, 300), k=st.integers(0, 300), alpha=st.floats(0.01, 0.5))
def test_hoeffding_bentkus_matches_hand_formula_and_is_above_binomial(n, k, alpha):
    k = min(k, n)
    hb = float(hoeffding_bentkus_pvalue(k / n, n, alpha))
    assert hb == pytest.approx(_hb_by_hand(k, n, alpha), rel=1e-7, abs=1e-300)
    assert hb >= float(binomial_pvalue(k, n, alpha)) * (1 - 1e-9)  # the binomial is exact for 0/1 losses


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, float("nan"), "x"])
def test_levels_outside_the_open_unit_interval_are_refused(bad):
    with pytest.raises(ValueError, match=r"^alpha: expected a number in \(0, 1\)"):
        binomial_pvalue(1, 10, bad)


def test_counts_out_of_range_are_refused():
    with pytest.raises(ValueError, match="^k: expected 0 <= k <= n"):
        binomial_pvalue(11, 10, 0.1)
    with pytest.raises(ValueError, match=r"^risk_hat: expected empirical risks in \[0, 1\]"):
        hoeffding_bentkus_pvalue(np.nan, 10, 0.1)
