"""Streamed metrics equal the one-shot functions: any batch split, any batch order, merged partials."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.metrics import (
    BinnedAccumulator,
    ClasswiseAccumulator,
    EqualMassAccumulator,
    ScoresAccumulator,
    SmoothECEAccumulator,
    SummaryAccumulator,
    accuracy,
    brier_score,
    calibration_summary,
    classwise_ece,
    ece,
    mce,
    nll,
    reliability_table,
    smooth_ece,
)
from confcal.metrics.detection import detection_ece
from tests.conftest import require_shared_data

REL = 1e-12


def close(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.allclose(a, b, rtol=REL, atol=1e-15, equal_nan=True)


def random_probs(rng, n, k, *, ties=False):
    z = rng.normal(size=(n, k)) * rng.uniform(0.5, 6)
    if ties:  # repeated rows and saturated confidences stress the equal-mass edges
        z[: n // 3] = z[0]
        z[n // 3: n // 2, 0] = 60.0
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), rng.integers(0, k, size=n)


def splits(rng, n, n_parts):
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n_parts - 1, n - 1), replace=False)) if n > 1 else []
    bounds = [0, *cuts.tolist(), n] if len(cuts) else [0, n]
    parts = [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    rng.shuffle(parts)
    return parts


def stream(make, parts, p, y, *, merge=True):
    """Feed the parts to fresh accumulators, half of them merged in from a pickled copy."""
    acc = make()
    for i, (a, b) in enumerate(parts):
        if merge and i % 2:
            other = make().update(p[a:b], y[a:b])
            acc.merge(pickle.loads(pickle.dumps(other)))
        else:
            acc.update(p[a:b], y[a:b])
    return acc


def equal_mass_stream(n_bins, parts, p, y):
    first = stream(lambda: EqualMassAccumulator(n_bins), parts, p, y)
    second = first.second_pass()
    for i, (a, b) in enumerate(parts[::-1]):
        if i % 2:
            second.merge(first.second_pass().update(p[a:b], y[a:b]))
        else:
            second.update(p[a:b], y[a:b])
    return second


@settings(max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), k=st.integers(2, 7),
       n_parts=st.integers(1, 12), n_bins=st.integers(1, 20), ties=st.booleans())
def test_every_accumulator_equals_the_one_shot_function(seed, n, k, n_parts, n_bins, ties):
    rng = np.random.default_rng(seed)
    p, y = random_probs(rng, n, k, ties=ties)
    parts = splits(rng, n, n_parts)
    s = stream(ScoresAccumulator, parts, p, y).result()
    assert close(s["accuracy"], accuracy(p, y)) and close(s["nll"], nll(p, y))
    assert close(s["brier"], brier_score(p, y))
    b = stream(lambda: BinnedAccumulator(n_bins), parts, p, y)
    assert close(b.ece(), ece(p, y, n_bins)) and close(b.mce(), mce(p, y, n_bins))
    assert close(b.ece("l2"), ece(p, y, n_bins, norm="l2"))
    table, ref = b.reliability_table(), reliability_table(p, y, n_bins)
    assert all(close(table[key], ref[key]) for key in ref)
    c = stream(lambda: ClasswiseAccumulator(k, n_bins), parts, p, y)
    value, per = c.result(return_per_class=True)
    ref_value, ref_per = classwise_ece(p, y, n_bins, return_per_class=True)
    assert close(value, ref_value) and close(per, ref_per)
    em = equal_mass_stream(n_bins, parts, p, y)
    assert close(em.ece(), ece(p, y, n_bins, binning="equal_mass"))
    assert close(em.mce(), mce(p, y, n_bins, binning="equal_mass"))
    conf, correct = p.max(1), p.argmax(1) == y
    d = stream(lambda: BinnedAccumulator(n_bins), [], p, y)
    for a, bb in parts:
        d.update_pairs(conf[a:bb], correct[a:bb])
    assert close(d.ece(), detection_ece(conf, correct, n_bins))


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 400), n_parts=st.integers(1, 9))
def test_smooth_ece_accumulator_equals_one_shot(seed, n, n_parts):
    rng = np.random.default_rng(seed)
    p, y = random_probs(rng, n, 3)
    acc = stream(SmoothECEAccumulator, splits(rng, n, n_parts), p, y)
    assert close(acc.result(sigma=0.05), smooth_ece(p, y, sigma=0.05))
    value, sigma = acc.result(return_sigma=True)
    ref_value, ref_sigma = smooth_ece(p, y, return_sigma=True)
    assert close(value, ref_value) and close(sigma, ref_sigma)


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_summary_on_real_cifar_outputs_with_odd_batches(batch):
    z = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    p, y = z["predictions"].astype(np.float64), z["ground_truth"]
    p /= p.sum(1, keepdims=True)
    acc = SummaryAccumulator(15)
    for i in range(0, len(y), batch):
        acc.update(p[i:i + batch], y[i:i + batch])
    assert acc.needs_second_pass
    acc.start_second_pass()
    for i in range(0, len(y), batch):
        acc.update(p[i:i + batch], y[i:i + batch])
    got, ref = acc.result(), calibration_summary(p, y, n_bins=15)
    assert got.keys() == ref.keys()
    assert all(close(got[key], ref[key]) for key in ref), (got, ref)


def test_equal_mass_buckets_split_values_near_one():
    # 10,000 distinct confidences within 1e-9 of 1: the edges must still be exact order statistics
    rng = np.random.default_rng(0)
    conf = 1.0 - rng.uniform(0, 1e-9, size=10_000)
    correct = rng.random(10_000) < 0.5
    first = EqualMassAccumulator(10).update_pairs(conf)
    second = first.second_pass().update_pairs(conf, correct)
    assert close(second.ece(), detection_ece(conf, correct, 10, binning="equal_mass"))


def test_second_pass_on_other_data_is_refused():
    p, y = random_probs(np.random.default_rng(1), 50, 3)
    second = EqualMassAccumulator(5).update(p, y).second_pass().update(p[:10], y[:10])
    with pytest.raises(ValueError, match="other data"):
        second.ece()


def test_empty_accumulators_and_mismatched_merges_raise():
    with pytest.raises(ValueError, match="no samples"):
        ScoresAccumulator().result()
    with pytest.raises(ValueError, match="no samples"):
        BinnedAccumulator(5).ece()
    with pytest.raises(TypeError, match="merge"):
        ScoresAccumulator().merge(BinnedAccumulator())
    with pytest.raises(ValueError, match="edges"):
        BinnedAccumulator(5).merge(BinnedAccumulator(5, edges=np.array([0, .1, .2, .3, .4, 1.])))


def _assert_exact(em, conf, correct, n_bins):
    """The oracle: numpy's inverted-cdf quantiles as edges, rows placed by the (lo, hi] rule."""
    edges = np.concatenate([[0.0], np.quantile(conf, np.arange(1, n_bins) / n_bins, method="inverted_cdf"), [1.0]])
    count, conf_sum, corr_sum, got_edges = em.bin_sums()
    np.testing.assert_array_equal(got_edges, edges)
    idx = np.searchsorted(edges[1:-1], conf, side="left")
    np.testing.assert_array_equal(count, np.bincount(idx, minlength=n_bins))
    np.testing.assert_array_equal(corr_sum, np.bincount(idx, weights=correct, minlength=n_bins))
    assert np.allclose(conf_sum, np.bincount(idx, weights=conf, minlength=n_bins), rtol=1e-12, atol=1e-12)
    # sums of values near 1 whose gap to the accuracy is tiny: compare on the scale of the sums
    assert np.isclose(em.ece(), detection_ece(conf, correct, n_bins, binning="equal_mass"), rtol=1e-12, atol=1e-13)


def _equal_mass_all_passes(n_bins, parts, conf, correct, rng):
    """Every pass an EqualMassAccumulator asks for, over shuffled parts, half of them merged in
    from separate (pickled) accumulators; returns the last pass and the number of passes."""
    acc = EqualMassAccumulator(n_bins)
    for a, b in parts:
        acc.update_pairs(conf[a:b])
    n_passes = 1
    while acc.needs_another_pass:
        start, acc = acc, acc.next_pass()
        n_passes += 1
        for i, j in enumerate(rng.permutation(len(parts))):
            a, b = parts[j]
            if i % 2:
                other = pickle.loads(pickle.dumps(start)).next_pass().update_pairs(conf[a:b], correct[a:b])
                acc.merge(pickle.loads(pickle.dumps(other)))
            else:
                acc.update_pairs(conf[a:b], correct[a:b])
    return acc, n_passes


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 3000), n_parts=st.integers(1, 15),
       n_bins=st.integers(1, 20), keep=st.sampled_from([1, 4, 60, 1 << 20]),
       spread=st.sampled_from([1.0, 1e-3, 1e-9, 1e-13]), dup=st.booleans())
def test_equal_mass_is_exact_when_the_edge_cells_overflow(seed, n, n_parts, n_bins, keep, spread, dup):
    """With few values allowed per pass the edge cells are refined on finer sub-cells in extra
    passes (down to the value itself); the result is still numpy's inverted-cdf quantile bins."""
    import confcal.metrics.equal_mass as acc_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(acc_mod, "_KEEP_MAX", keep)
        _check_overflow_case(seed, n, n_parts, n_bins, keep, spread, dup)


def _check_overflow_case(seed, n, n_parts, n_bins, keep, spread, dup):
    rng = np.random.default_rng(seed)
    conf = 1.0 - rng.uniform(0, spread, size=n)
    if dup:  # repeated values: several ranks in one cell, ties on the edges
        conf = rng.choice(conf[: max(1, n // 10)], size=n)
    correct = rng.random(n) < conf
    em, n_passes = _equal_mass_all_passes(n_bins, splits(rng, n, n_parts), conf, correct, rng)
    _assert_exact(em, conf, correct, n_bins)
    assert n_passes <= 5
    if keep == 1 << 20:
        assert n_passes == 2


def test_a_third_pass_only_when_needed_and_bounded(monkeypatch):
    import confcal.metrics.equal_mass as acc_mod

    rng = np.random.default_rng(3)
    conf = rng.uniform(0.3, 1.0, size=200_000)
    correct = rng.random(conf.size) < conf
    parts = [(a, min(a + 7000, conf.size)) for a in range(0, conf.size, 7000)]
    ref = detection_ece(conf, correct, 15, binning="equal_mass")
    em, n_passes = _equal_mass_all_passes(15, parts, conf, correct, rng)
    assert n_passes == 2 and close(em.ece(), ref)
    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 1000)  # ~14 * 200k / 1.5k rows lie in the edge cells
    em, n_passes = _equal_mass_all_passes(15, parts, conf, correct, rng)
    assert n_passes == 3 and close(em.ece(), ref)
    assert em.n_kept <= 1000 + 7000  # at most the cap plus one batch's values before compaction
    with pytest.raises(ValueError, match="no further pass"):
        em.next_pass()


def test_later_pass_on_other_data_is_refused(monkeypatch):
    import confcal.metrics.equal_mass as acc_mod

    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 10)
    conf = np.random.default_rng(2).uniform(0.5, 1.0, size=5000)
    second = EqualMassAccumulator(5).update_pairs(conf).next_pass().update_pairs(conf[:4000], conf[:4000] > 0.7)
    assert second.needs_another_pass
    with pytest.raises(ValueError, match="other data"):
        second.next_pass()


def test_windows_resolve_an_overflow_in_two_passes_unless_the_rows_are_sorted(monkeypatch):
    """Past the cap the second pass guesses each edge's window of sub-cells from the values seen so
    far: on shuffled rows that is enough (two passes, far fewer values kept); rows sorted by
    confidence defeat the guess and a third pass resolves the edges. Exact either way."""
    import confcal.metrics.equal_mass as acc_mod

    rng = np.random.default_rng(3)
    conf = rng.uniform(0.3, 1.0, size=400_000)
    correct = rng.random(conf.size) < conf
    parts = [(a, min(a + 20_000, conf.size)) for a in range(0, conf.size, 20_000)]
    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 5_000)  # ~17k values lie in the 14 edge cells
    em, n_passes = _equal_mass_all_passes(15, parts, conf, correct, rng)
    assert n_passes == 2 and em.sub is not None and em.n_kept < 5_000
    _assert_exact(em, conf, correct, 15)
    order = np.argsort(conf)
    em, n_passes = _equal_mass_all_passes(15, parts, conf[order], correct[order], rng)
    assert n_passes == 3
    _assert_exact(em, conf, correct, 15)


def test_merging_passes_whose_windows_differ(monkeypatch):
    """Two workers each overflow and guess their own windows; the merge keeps their intersection
    (rows outside a larger window lie on the same side of the edge) and stays exact."""
    import confcal.metrics.equal_mass as acc_mod

    rng = np.random.default_rng(5)
    conf = rng.uniform(0.2, 1.0, size=300_000)
    correct = rng.random(conf.size) < conf
    monkeypatch.setattr(acc_mod, "_KEEP_MAX", 3_000)
    first = EqualMassAccumulator(10).update_pairs(conf)
    halves = []
    for lo in (0, 1):
        part = first.next_pass()
        for a in range(lo * 150_000, (lo + 1) * 150_000, 10_000):
            part.update_pairs(conf[a:a + 10_000], correct[a:a + 10_000])
        assert part.sub is not None
        halves.append(pickle.loads(pickle.dumps(part)))
    assert not np.array_equal(halves[0].win, halves[1].win)
    merged = halves[0].merge(halves[1])
    assert not merged.needs_another_pass  # (an intersection could miss an edge: then one more pass)
    _assert_exact(merged, conf, correct, 10)
