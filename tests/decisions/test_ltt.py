"""Learn-then-Test thresholds: the guarantee by simulation with a known truth, and oracles."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from confcal.decisions import ltt_threshold

from ._sim import draw, mc_upper, true_fdr, true_for

DRAWS = 2000


def _violation_rate(risk, procedure, pvalue, *, power, alpha, delta, n, seed):
    rng = np.random.default_rng(seed)
    truth = true_fdr if risk == "fdr" else true_for
    bad = 0
    for _ in range(DRAWS):
        s, y = draw(rng, n, power)
        fit = ltt_threshold(s, y, risk=risk, alpha=alpha, delta=delta, procedure=procedure, pvalue=pvalue)
        if fit.threshold is not None and truth(fit.threshold, power) > alpha:
            bad += 1
    return bad / DRAWS


@pytest.mark.parametrize("risk,procedure,pvalue,power", [
    ("fdr", "fixed_sequence", "binomial", 1.0),
    ("fdr", "fixed_sequence_single", "binomial", 1.0),
    ("fdr", "fixed_sequence", "binomial", 3.0),
    ("for", "fixed_sequence", "binomial", 1.0),
    ("fdr", "holm", "binomial", 1.0),
    ("fdr", "fixed_sequence", "hoeffding_bentkus", 1.0),
])
def test_guarantee_holds_by_simulation(risk, procedure, pvalue, power):
    # 2,000 calibration draws of n = 400 with a known risk curve: the share of draws whose certified
    # threshold has true risk above alpha stays below delta plus 3 Monte-Carlo standard errors
    delta = 0.1
    rate = _violation_rate(risk, procedure, pvalue, power=power, alpha=0.1, delta=delta, n=400, seed=1)
    assert rate <= mc_upper(delta, DRAWS), rate


def test_the_simulation_has_teeth_a_plug_in_cutoff_violates():
    # the smallest cutoff whose *empirical* false discovery is <= alpha fails about half the time:
    # the same simulation would catch a procedure without a guarantee
    rng = np.random.default_rng(2)
    bad = 0
    for _ in range(500):
        s, y = draw(rng, 400)
        order = np.argsort(-s)
        fdp = np.cumsum(~y[order]) / np.arange(1, s.size + 1)
        ok = np.flatnonzero(fdp <= 0.1)
        bad += true_fdr(s[order][ok[-1]]) > 0.1
    assert bad / 500 > 0.3


def test_threshold_is_close_to_the_truth_with_much_data():
    # n = 200,000, fdr <= 0.1 under P(Y=1|S=s) = s: the true cutoff is 0.8 (risk (1 - l)/2)
    rng = np.random.default_rng(3)
    s, y = draw(rng, 200_000)
    fit = ltt_threshold(s, y, alpha=0.1, delta=0.05)
    assert 0.8 <= fit.threshold <= 0.81
    assert fit.risk_hat <= 0.1


def _fst_by_loop(s, y, grid, alpha, delta):
    """Slow oracle: fixed-sequence testing from the top of the grid, one threshold at a time."""
    n_min = np.ceil(np.log(delta) / np.log1p(-alpha) - 1e-12)
    best, started = None, False
    for lam in grid[::-1]:
        acc = s >= lam
        m, k = int(acc.sum()), int((~y[acc]).sum())
        if not started and m < n_min:
            continue
        started = True
        p = stats.binom.cdf(k, m, alpha)
        assume(abs(p - delta) > 1e-9 * delta)  # a p-value within rounding of the level: either side is right
        if p > delta:
            break
        best = lam
    return best


@given(seed=st.integers(0, 10_000), n=st.integers(5, 120), alpha=st.sampled_from([0.05, 0.1, 0.3]))
def test_fixed_sequence_matches_a_loop_oracle(seed, n, alpha):
    rng = np.random.default_rng(seed)
    s = np.round(rng.random(n), 2)
    y = rng.random(n) < s
    grid = np.linspace(0, 1, 21)
    fit = ltt_threshold(s, y, alpha=alpha, delta=0.2, grid=grid, procedure="fixed_sequence_single")
    assert fit.threshold == _fst_by_loop(s, y, grid, alpha, 0.2)


def _multi_start_by_loop(s, y, grid, alpha, delta):
    """Slow oracle: J single sequences at delta / J from counts n_min * 2^j; the smallest certified cutoff."""
    n = s.size
    j = 1
    while True:  # the J of the module docstring, by brute force
        n0 = int(np.ceil(np.log(delta / j) / np.log1p(-alpha) - 1e-12))
        need = max(1, sum(1 for i in range(64) if n0 * 2**i <= n))
        if need <= j or j >= 20:
            break
        j = min(need, 20)
    n0 = int(np.ceil(np.log(delta / j) / np.log1p(-alpha) - 1e-12))
    best = None
    for i in range(j):
        started = False
        for lam in grid[::-1]:
            acc = s >= lam
            m, k = int(acc.sum()), int((~y[acc]).sum())
            if not started and m < n0 * 2**i:
                continue
            started = True
            p = stats.binom.cdf(k, m, alpha)
            assume(abs(p - delta / j) > 1e-9 * delta / j)
            if p > delta / j:
                break
            best = lam if best is None else min(best, lam)
        if not started:
            break
    return best


@given(seed=st.integers(0, 10_000), n=st.integers(5, 400), alpha=st.sampled_from([0.05, 0.1, 0.3]))
def test_multi_start_fixed_sequence_matches_a_loop_oracle(seed, n, alpha):
    rng = np.random.default_rng(seed)
    s = np.round(rng.random(n), 2)
    y = rng.random(n) < s**0.5
    grid = np.linspace(0, 1, 51)
    fit = ltt_threshold(s, y, alpha=alpha, delta=0.2, grid=grid)
    assert fit.threshold == _multi_start_by_loop(s, y, grid, alpha, 0.2)


def _holm_by_loop(p, delta):
    """Slow oracle: Holm's step-down, one hypothesis at a time."""
    out = np.zeros(p.size, dtype=bool)
    for i, j in enumerate(sorted(range(p.size), key=lambda j: (p[j], j))):
        if p[j] > delta / (p.size - i):
            break
        out[j] = True
    return out


@given(seed=st.integers(0, 10_000), n=st.integers(5, 200))
def test_holm_matches_a_loop_oracle_and_certified_pvalues_are_below_delta(seed, n):
    rng = np.random.default_rng(seed)
    s, y = draw(rng, n)
    grid = np.linspace(0, 1, 11)
    hol = ltt_threshold(s, y, alpha=0.2, delta=0.1, grid=grid, procedure="holm")
    np.testing.assert_array_equal(hol.certified, _holm_by_loop(hol.pvalues, 0.1))
    fst = ltt_threshold(s, y, alpha=0.2, delta=0.1, grid=grid)
    for f in (fst, hol):
        assert np.all(f.pvalues[f.certified] <= 0.1)
        if f.threshold is not None:
            assert f.certified[np.searchsorted(grid, f.threshold)]
            assert f.threshold == grid[f.certified].min()


def test_counts_reported_at_the_threshold_are_the_calibration_counts():
    rng = np.random.default_rng(4)
    s, y = draw(rng, 5000)
    fit = ltt_threshold(s, y, alpha=0.1, delta=0.1)
    acc = s >= fit.threshold
    assert fit.count == acc.sum() and fit.errors == (~y[acc]).sum()
    rej = ltt_threshold(s, y, risk="for", alpha=0.1, delta=0.1)
    below = s < rej.threshold
    assert rej.count == below.sum() and rej.errors == y[below].sum()


def test_nothing_certified_with_too_few_items_and_n_min_says_how_many():
    fit = ltt_threshold([0.9] * 20, [1] * 19 + [0], alpha=0.05, delta=0.05, procedure="fixed_sequence_single")
    assert fit.threshold is None
    assert fit.n_min == 59  # 0.95**59 = 0.0485 <= 0.05 < 0.95**58
    assert 0.95**59 <= 0.05 < 0.95**58


@pytest.mark.parametrize("kw,msg", [
    (dict(alpha=0.0), r"^alpha: expected a number in \(0, 1\), got 0.0"),
    (dict(delta=1.5), r"^delta: expected a number in \(0, 1\), got 1.5"),
    (dict(risk="precision"), r"^risk: expected one of \['fdr', 'fpr', 'miss', 'for'\]"),
    (dict(procedure="bonferroni"), r"^procedure: expected one of"),
    (dict(grid=[np.nan]), r"^grid: expected a non-empty array of finite thresholds"),
])
def test_bad_arguments_get_one_line_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ltt_threshold([0.1, 0.9], [0, 1], **kw)


def test_bad_scores_and_labels_get_one_line_errors():
    with pytest.raises(ValueError, match=r"^scores: expected finite scores, got nan at row 1"):
        ltt_threshold([0.1, np.nan], [0, 1])
    with pytest.raises(ValueError, match=r"^labels: expected 0/1 labels \(1 = positive\), got 2 at row 1"):
        ltt_threshold([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match=r"^labels: expected shape \(2,\)"):
        ltt_threshold([0.1, 0.2], [0, 1, 1])
    with pytest.raises(ValueError, match=r"^scores: expected at least one score"):
        ltt_threshold([], [])


def test_guarantee_holds_with_the_score_quantile_grid():
    # scores outside [0, 1] (logits) get the grid of 1,001 score quantiles, which depends on the scores but
    # not on the labels: 2,000 draws, the true risk curve in the logit scale is the same as in [0, 1]
    rng = np.random.default_rng(9)
    bad = 0
    for _ in range(DRAWS):
        s, y = draw(rng, 400)
        fit = ltt_threshold(np.log(s / (1 - s)), y, alpha=0.1, delta=0.1)
        if fit.threshold is not None and true_fdr(1 / (1 + np.exp(-fit.threshold))) > 0.1:
            bad += 1
    assert bad / DRAWS <= mc_upper(0.1, DRAWS), bad / DRAWS
