"""Annotation queue: closed-form uncertainties, aggregation, quota guarantees, and the
cross-domain re-ordering that per-domain calibration causes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.active import (
    aggregate_by_tile,
    bald,
    build_queue,
    entropy,
    least_confidence,
    margin,
    quota_order,
    rank_tiles,
)
from confcal.calibrators import DetectionTemperatureScaling


def test_hand_computed_uncertainties():
    p = np.array([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [0.6, 0.3, 0.1]])
    np.testing.assert_allclose(entropy(p), [1.5 * math.log(2), 0.0,
                                            -(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1))])
    np.testing.assert_allclose(least_confidence(p), [0.5, 0.0, 0.4])
    np.testing.assert_allclose(margin(p), [0.75, 0.0, 0.7])
    np.testing.assert_allclose(entropy(np.full((1, 4), 0.25)), [math.log(4)])
    np.testing.assert_allclose(entropy(np.array([0.5])), [math.log(2)])  # 1-D binary


def test_bald_closed_forms():
    # two confident samples that disagree: H(mean) = log 2, mean H = 0
    mc = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    np.testing.assert_allclose(bald(mc), [math.log(2)])
    # identical samples: no disagreement
    np.testing.assert_allclose(bald(np.repeat([[[0.3, 0.7]]], 5, axis=0)), [0.0], atol=1e-15)
    # binary samples (S, n): p in {a, b} half and half -> h((a+b)/2) - (h(a) + h(b))/2
    a, b = 0.9, 0.3
    h = lambda q: -(q * math.log(q) + (1 - q) * math.log(1 - q))  # noqa: E731
    np.testing.assert_allclose(bald(np.array([[a], [b]])), [h((a + b) / 2) - (h(a) + h(b)) / 2])


@given(st.integers(1, 6), st.integers(1, 5), st.integers(2, 5), st.integers(0, 1000))
def test_bald_bounds(s, n, k, seed):
    rng = np.random.default_rng(seed)
    mc = rng.dirichlet(np.ones(k), size=(s, n))
    b = bald(mc)
    assert np.all(b >= 0) and np.all(b <= entropy(mc.mean(0)) + 1e-12) and np.all(b <= math.log(k) + 1e-12)


def test_aggregation():
    v = np.array([0.1, 0.5, 0.3, 0.9, 0.2])
    t = np.array(["b", "a", "a", "c", "b"])
    ids, agg, n = aggregate_by_tile(v, t, "max")
    assert ids.tolist() == ["a", "b", "c"] and agg.tolist() == [0.5, 0.2, 0.9] and n.tolist() == [2, 2, 1]
    np.testing.assert_allclose(aggregate_by_tile(v, t, "mean")[1], [0.4, 0.15, 0.9])
    np.testing.assert_allclose(aggregate_by_tile(v, t, "sum")[1], [0.8, 0.3, 0.9])
    assert aggregate_by_tile(v, t, "count", threshold=0.25)[1].tolist() == [2, 0, 1]
    ids, agg, n = aggregate_by_tile(v, t, "max", tiles=["c", "d", "a", "b"])
    assert agg.tolist() == [0.9, 0.0, 0.5, 0.2] and n.tolist() == [1, 0, 2, 2]
    with pytest.raises(ValueError, match="threshold"):
        aggregate_by_tile(v, t, "count")
    with pytest.raises(ValueError, match="how"):
        aggregate_by_tile(v, t, "median")


@given(st.lists(st.tuples(st.floats(0, 1), st.sampled_from("abc")), min_size=1, max_size=40),
       st.sampled_from(["equal", 0.1, 0.25, 0.3]))
def test_quota_prefix_guarantee(items, quota):
    p = np.array([i[0] for i in items])
    d = np.array([i[1] for i in items])
    order = quota_order(p, d, quota)
    assert sorted(order.tolist()) == list(range(len(items)))
    doms = np.unique(d)
    share = 1 / len(doms) if quota == "equal" else quota
    for k in doms:
        n_k = int((d == k).sum())
        in_k = (d[order] == k)
        counts = np.cumsum(in_k)
        for m in range(1, len(items) + 1):
            assert counts[m - 1] >= min(math.floor(share * m + 1e-9), n_k)
        # within a domain: falling priority
        assert np.all(np.diff(p[order][in_k]) <= 0)


def test_no_quota_is_pure_priority_order_and_quota_lifts_a_starved_domain():
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.1, 0.05])
    d = np.array(["sat"] * 4 + ["drone"] * 2)
    assert quota_order(p, d, None).tolist() == [0, 1, 2, 3, 4, 5]
    assert d[quota_order(p, d, "equal")][:2].tolist() == ["sat", "drone"]
    q = build_queue(np.array([10, 11, 12, 13, 14, 15]), p, domains=d, quota=0.5, n_boxes=np.arange(6))
    assert q["rank"].tolist() == [1, 2, 3, 4, 5, 6] and q["image_id"][:2].tolist() == [10, 14]
    with pytest.raises(ValueError, match="sum"):
        quota_order(p, d, {"sat": 0.7, "drone": 0.7})
    with pytest.raises(ValueError, match="domains"):
        build_queue([1, 2], [0.1, 0.2], quota="equal")


def test_per_domain_calibration_reorders_tiles_across_domains():
    """Raw scores: the drone detector is under-confident (true precision far above its scores),
    the satellite one over-confident. A per-domain temperature is monotone within each domain,
    so the within-domain tile order by top score is unchanged, but the interleaving of the
    two domains in the queue changes."""
    rng = np.random.default_rng(0)
    n = 4000
    dom = np.where(np.arange(n) % 2 == 0, "drone", "sat")
    z = rng.normal(0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-np.where(dom == "drone", 3.0, 0.4) * z))).astype(int)
    s = 1 / (1 + np.exp(-z))
    cal = DetectionTemperatureScaling().fit(s, y, domains=dom)
    assert cal.groups_[("drone",)]["temperature"] < 0.6 and cal.groups_[("sat",)]["temperature"] > 1.8
    tiles = np.arange(n) // 4 * 2 + (dom == "sat")  # 4 boxes per tile, one domain per tile
    ps = cal.predict_score(s, domains=dom)
    raw = rank_tiles(s, tiles, by="least_confidence", aggregate="max", domains=dom)
    new = rank_tiles(ps, tiles, by="least_confidence", aggregate="max", domains=dom)
    assert raw["image_id"].tolist() != new["image_id"].tolist()
    # the calibrated drone scores are more decisive: fewer drone tiles at the top of the queue
    top = 100
    assert (new["domain"][:top] == "drone").sum() < (raw["domain"][:top] == "drone").sum()
    # within each domain, the tile order by top score is the same before and after
    for k in ("drone", "sat"):
        raw_top = raw["top_score"][raw["domain"] == k]
        ids_raw = raw["image_id"][raw["domain"] == k][np.argsort(-raw_top, kind="stable")]
        new_top = new["top_score"][new["domain"] == k]
        ids_new = new["image_id"][new["domain"] == k][np.argsort(-new_top, kind="stable")]
        assert ids_raw.tolist() == ids_new.tolist()


def test_rank_tiles_columns_and_mixed_domain_error():
    q = rank_tiles(np.array([0.9, 0.5, 0.2]), np.array([1, 1, 2]), by="entropy", aggregate="max")
    assert set(q) == {"rank", "image_id", "priority", "n_boxes", "top_score", "total_uncertainty"}
    assert q["image_id"].tolist() == [1, 2] and q["top_score"].tolist() == [0.9, 0.2]
    with pytest.raises(ValueError, match="two domains"):
        rank_tiles(np.array([0.9, 0.5]), np.array([1, 1]), domains=np.array(["a", "b"]))
    with pytest.raises(ValueError, match="mc_probs"):
        rank_tiles(np.array([0.9]), np.array([1]), by="bald")


def test_near_ties_at_the_top_go_to_the_larger_total_uncertainty():
    from confcal.active import entropy, tie_broken_order
    # tile 1: one box at p = 0.5 (entropy ln 2); tile 2: three boxes near 0.5 (max 0.6929 < ln 2, within 1%)
    p = np.array([0.5, 0.49, 0.48, 0.51, 0.05])
    t = np.array([1, 2, 2, 2, 3])
    q = rank_tiles(p, t, by="entropy", aggregate="max")
    assert q["image_id"].tolist() == [2, 1, 3]
    np.testing.assert_allclose(q["total_uncertainty"][0], entropy(p[1:4]).sum())
    # without the tie rule: plain falling priority
    assert rank_tiles(p, t, tie_tolerance=0.0)["image_id"].tolist() == [1, 2, 3]
    # a clear gap (more than 1% of the top) is never overridden by the secondary key
    assert tie_broken_order(np.array([0.5, 0.69]), np.array([100.0, 0.0]), 0.01).tolist() == [1, 0]


@settings(max_examples=100)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.floats(0, 0.2))
def test_tie_broken_order_is_a_permutation_that_keeps_bands(prio, tol):
    from confcal.active import tie_broken_order
    p = np.array(prio)
    sec = np.random.default_rng(len(prio)).random(p.size)
    order = tie_broken_order(p, sec, tol)
    assert sorted(order.tolist()) == list(range(p.size))
    if tol * p.max() > 0:
        with np.errstate(over="ignore"):
            band = np.floor((p.max() - p[order]) / (tol * p.max()))
        assert np.all(band[1:] >= band[:-1])  # bands in order (inf-safe): never a band width out of place
