"""Three-way decisions: the smallest review band against brute force, the joint guarantee by simulation."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.decisions import ltt_threshold, three_way

from ._sim import draw, mc_upper, true_fdr, true_for


def _brute_force_review(s, y, grid, aa, ar, delta, procedure):
    """Oracle: each side certified on its own at delta/2 (ltt_threshold), then every pair tried."""
    acc = ltt_threshold(s, y, risk="fdr", alpha=aa, delta=delta / 2, grid=grid, procedure=procedure)
    rej = ltt_threshold(s, y, risk="for", alpha=ar, delta=delta / 2, grid=grid, procedure=procedure)
    his = [*grid[acc.certified], np.inf]
    los = [-np.inf, *grid[rej.certified]]
    return min(int(((s >= lo) & (s < hi)).sum()) for lo, hi in itertools.product(los, his) if lo <= hi)


@given(seed=st.integers(0, 100_000), n=st.integers(3, 80), procedure=st.sampled_from(["fixed_sequence", "holm"]),
       aa=st.sampled_from([0.1, 0.3]), ar=st.sampled_from([0.1, 0.3]))
def test_review_band_is_the_smallest_among_all_valid_pairs(seed, n, procedure, aa, ar):
    rng = np.random.default_rng(seed)
    s = np.round(rng.random(n), 1)
    y = rng.random(n) < s**0.5
    grid = np.round(np.linspace(0, 1, 11), 1)
    fit = three_way(s, y, alpha_accept=aa, alpha_reject=ar, delta=0.4, grid=grid, procedure=procedure)
    best = _brute_force_review(s, y, grid, aa, ar, 0.4, procedure)
    assert round(fit.review_share * n) == best
    assert fit.lambda_lo <= fit.lambda_hi
    review = (s >= fit.lambda_lo) & (s < fit.lambda_hi)
    assert review.sum() == best


def test_joint_guarantee_holds_by_simulation():
    # 2,000 draws of n = 2,000: a draw violates if either side's true risk exceeds its level
    rng = np.random.default_rng(5)
    delta, draws, bad, review = 0.1, 2000, 0, []
    for _ in range(draws):
        s, y = draw(rng, 2000)
        fit = three_way(s, y, alpha_accept=0.1, alpha_reject=0.1, delta=delta)
        bad += (true_fdr(fit.lambda_hi) > 0.1) or (true_for(fit.lambda_lo) > 0.1)
        review.append(fit.review_share)
    assert bad / draws <= mc_upper(delta, draws)
    # the truth allows accepting >= 0.8 and rejecting < 0.2, a band of 0.6; at this n the median band
    # is wider (fixed-sequence testing stops at the first p-value above delta / 2) but far from 1
    assert 0.6 <= np.median(review) <= 0.85, np.median(review)


def test_one_sided_rules_and_the_delta_split():
    rng = np.random.default_rng(6)
    s, y = draw(rng, 3000)
    acc_only = three_way(s, y, alpha_accept=0.1, alpha_reject=None, delta=0.1)
    assert acc_only.reject is None and acc_only.lambda_lo == -np.inf and acc_only.accept.delta == 0.1
    assert acc_only.lambda_hi == ltt_threshold(s, y, alpha=0.1, delta=0.1).threshold
    both = three_way(s, y, alpha_accept=0.1, alpha_reject=0.1, delta=0.1, delta_split=0.8)
    assert both.accept.delta == pytest.approx(0.08) and both.reject.delta == pytest.approx(0.02)
    even = three_way(s, y, alpha_accept=0.1, alpha_reject=0.1, delta=0.1)  # delta_split None: 0.5
    assert even.accept.delta == pytest.approx(0.05) and even.reject.delta == pytest.approx(0.05)


@pytest.mark.parametrize("off, other", [("alpha_accept", "reject"), ("alpha_reject", "accept")])
@pytest.mark.parametrize("split", [0.5, 0.8])  # 0.5 too: the old default, given explicitly, was ignored as well
def test_delta_split_with_one_side_off_is_refused(off, other, split):
    with pytest.raises(ValueError, match=rf"^delta_split: expected None with {off}=None \(one side: the {other} "
                                         rf"side gets all of delta\), got {split}$"):
        three_way([0.1, 0.9], [0, 1], delta_split=split, **{off: None})


@pytest.mark.parametrize("kw,msg", [
    (dict(alpha_accept=None, alpha_reject=None), r"^alpha_accept: expected a risk level for at least one side"),
    (dict(alpha_reject=1.0), r"^alpha_reject: expected a number in \(0, 1\), got 1.0"),
    (dict(delta_split=0.0), r"^delta_split: expected a number in \(0, 1\)"),
    (dict(accept_risk="for"), r"^accept_risk: expected one of \['fdr', 'fpr'\]"),
])
def test_bad_arguments_get_one_line_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        three_way([0.1, 0.9], [0, 1], **kw)
