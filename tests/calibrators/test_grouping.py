"""GroupedCalibrator and fit_groups against the oracle: the base calibrator fitted by hand on each
group's rows; the pooled fallback and the unseen-group warning; box-score logits (det-ts)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

from confcal import load_calibrator
from confcal.calibrators import METHODS, CalibrationWarning, GroupedTemperatureScaling
from confcal.calibrators.detection.box import DetectionTemperatureScaling
from confcal.calibrators.grouping import GroupedCalibrator, fit_groups


def _data(seed=0, n=300, k=3):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 3
    y = (z / 2 + rng.gumbel(size=z.shape)).argmax(axis=1)  # over-confident logits
    return z, y


@pytest.mark.parametrize("base", ["ts", "vs", "dirichlet"])
def test_each_group_equals_the_base_fitted_on_its_rows(base):
    z, y = _data(1)
    dom = np.array(["cam", "lidar", "radar"])[np.arange(z.shape[0]) % 3]
    cal = GroupedCalibrator(base, by="domains").fit(z, y, domains=dom)
    p = cal.predict_proba(z, domains=dom)
    for d in ("cam", "lidar", "radar"):
        m = dom == d
        oracle = METHODS[base]().fit(z[m], y[m]).predict_proba(z[m])
        # TemperatureScaling().fit streams its Newton passes, the group fit runs them in memory: the
        # two optima agree to ~1e-11 (issue 10's guarantee is 1e-9 in log T)
        np.testing.assert_allclose(p[m], oracle, rtol=1e-9, atol=1e-12)
    pooled = METHODS[base]().fit(z, y).predict_proba(z[:5])
    with pytest.warns(CalibrationWarning, match=r"groups \['sonar'\] were not seen at fit time"):
        q = cal.predict_proba(z[:5], domains=["sonar"] * 5)
    np.testing.assert_allclose(q, pooled, atol=1e-12)


def test_crossed_groups_by_class_and_domain():
    z, y = _data(2, n=400)
    dom = np.where(np.arange(400) < 200, "a", "b")
    cats = np.arange(400) % 2
    cal = GroupedCalibrator("ts", by=("category_ids", "domains")).fit(z, y, domains=dom, category_ids=cats)
    assert set(cal.groups_) == {(c, d) for c in (0, 1) for d in ("a", "b")}
    for (c, d), member in cal.groups_.items():
        m = (cats == c) & (dom == d)
        # the group fit runs its Newton passes in memory, TemperatureScaling().fit streams them
        assert abs(np.log(member.temperature_ / METHODS["ts"]().fit(z[m], y[m]).temperature_)) < 1e-9


def test_small_groups_fall_back_with_one_warning_and_no_predict_warning():
    z, y = _data(3)
    dom = np.array(["big"] * 290 + ["tiny"] * 10)
    with pytest.warns(CalibrationWarning, match=r"groups \['tiny'\] have fewer than min_samples=20") as rec:
        cal = GroupedCalibrator("ts", min_samples=20).fit(z, y, domains=dom)
    assert len([w for w in rec if "min_samples" in str(w.message)]) == 1
    assert cal.fallback_groups_ == ["tiny"] and "tiny" not in cal.groups_
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = cal.predict_proba(z[-10:], domains=dom[-10:])
    np.testing.assert_allclose(p, METHODS["ts"]().fit(z, y).predict_proba(z[-10:]), atol=1e-12)


def test_grouped_ts_is_the_composition_and_round_trips():
    z, y = _data(4)
    dom = np.arange(z.shape[0]) % 4
    a = GroupedTemperatureScaling().fit(z, y, domains=dom)
    b = GroupedCalibrator("ts").fit(z, y, domains=dom)
    np.testing.assert_allclose(a.predict_proba(z, domains=dom), b.predict_proba(z, domains=dom), atol=1e-12)
    manifest = json.loads(json.dumps(a.to_dict()))
    assert manifest["method"] == "grouped-ts"
    back = load_calibrator(manifest)
    np.testing.assert_array_equal(back.predict_proba(z, domains=dom), a.predict_proba(z, domains=dom))
    assert back.temperatures_ == a.temperatures_


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000), n_groups=st.integers(1, 4), min_samples=st.integers(1, 80))
def test_fit_groups_rules(seed, n_groups, min_samples):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, n_groups, size=120).tolist()
    calls = []

    def fit_one(rows):
        calls.append(None if rows is None else rows.copy())
        return "pooled" if rows is None else f"own{len(rows)}"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        fits = fit_groups(fit_one, keys, min_samples=min_samples)
    assert fits.pooled == "pooled" and calls[0] is None
    for g in set(keys):
        n = keys.count(g)
        assert fits.counts[g] == n
        assert (g in fits.fallback) == (n < min_samples)
        assert fits.fit_for(g) == ("pooled" if n < min_samples else f"own{n}")
    # each own fit saw exactly its group's rows
    for rows in calls[1:]:
        assert len({keys[i] for i in rows}) == 1


def test_single_label_and_rejected_groups_fall_back():
    keys = ["a"] * 5 + ["b"] * 5 + ["c"] * 5
    labels = [0, 1, 0, 1, 0] + [1] * 5 + [0, 1, 1, 0, 1]
    with pytest.warns(CalibrationWarning) as rec:
        fits = fit_groups(lambda rows: 0 if rows is None else int(rows[0]), keys, labels=labels,
                          reject=lambda fit: "a bad fit" if fit == 10 else None)
    assert fits.fallback == {"b": "one label only", "c": "a bad fit"} and set(fits.fits) == {"a"}
    assert any("groups ['c'] have a bad fit" in str(w.message) for w in rec)


# ------------------------------------------------------------- box scores as logits
def test_det_ts_on_raw_logits_oracle():
    """sigmoid(20 / T) = 3/4 gives T = 20 / ln 3; logit 30 then maps to 3^1.5 / (1 + 3^1.5)."""
    cal = DetectionTemperatureScaling(input_kind="logits").fit(np.array([20.0, 20, 20, 20]),
                                                               np.array([1, 1, 1, 0]))
    assert cal.temperature_ == pytest.approx(20 / math.log(3), rel=1e-9)
    assert cal.temperature_ == pytest.approx(18.2048, abs=5e-5)
    p = cal.predict_score(np.array([30.0]))  # input_kind is a hyper-parameter: logits at predict time too
    assert p[0] == pytest.approx(3 ** 1.5 / (1 + 3 ** 1.5), rel=1e-9)
    assert p[0] == pytest.approx(0.838610, abs=5e-7)
    back = load_calibrator(json.loads(json.dumps(cal.to_dict())))
    assert back.predict_score(np.array([30.0]))[0] == p[0]


def test_det_ts_probability_scores_lose_the_oracle_when_saturated():
    """The same data as float32 sigmoid outputs: every score is exactly 1, so T cannot be recovered."""
    s = expit(np.array([20.0, 20, 20, 20])).astype(np.float32)
    with pytest.warns(CalibrationWarning, match="4 of 4 probability scores"):
        cal = DetectionTemperatureScaling().fit(s, np.array([1, 1, 1, 0]))
    assert abs(cal.temperature_ - 20 / math.log(3)) > 1


def test_saturated_probability_scores_warn_with_their_count():
    z = np.array([20.0, 20, 20, 20, 1.0, -2.0], dtype=np.float32)
    s = expit(z).astype(np.float32)  # float32 sigmoid(20) is exactly 1
    assert int((s == 1).sum()) == 4
    with pytest.warns(CalibrationWarning, match=r"4 of 6 probability scores are exactly 0 or 1 in float32"):
        DetectionTemperatureScaling().fit(s, np.array([1, 1, 1, 0, 1, 0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        DetectionTemperatureScaling(input_kind="logits").fit(z, np.array([1, 1, 1, 0, 1, 0]))


def test_integer_weights_equal_repeated_rows_even_after_a_group_warns():
    """Weights 0/1/2 give the fit of the data with rows removed / kept / doubled; a group whose
    own fit warns (separable: T on its bound) does not disturb the groups after it."""
    z, y = _data(5, n=240)
    dom = np.array(["a", "b", "c"])[np.arange(240) % 3]
    sep = dom == "a"
    z[sep] = 0.0
    z[sep, y[sep]] = 30.0  # group "a" is perfectly separated: its T stops on t_min
    w = np.arange(240) % 3 % 2 + (np.arange(240) % 5 == 0)  # 0, 1 and 2
    rep = np.repeat(np.arange(240), w.astype(int))
    with pytest.warns(CalibrationWarning, match="domain 'a': temperature fit stopped at the search bound"):
        weighted = GroupedTemperatureScaling().fit(z, y, domains=dom, sample_weight=w.astype(float))
    with pytest.warns(CalibrationWarning):
        repeated = GroupedTemperatureScaling().fit(z[rep], y[rep], domains=dom[rep])
    for d in ("a", "b", "c"):
        assert weighted.temperatures_[d] == pytest.approx(repeated.temperatures_[d], rel=1e-9)
    assert weighted.temperature_ == pytest.approx(repeated.temperature_, rel=1e-9)


def test_grouped_ts_manifest_of_the_previous_release_loads():
    """confcal 0.1 wrote grouped-ts as temperature / temperatures / domain_counts: it still loads and
    predicts exactly as a fit with those temperatures; damaged values in it are still refused."""
    import json

    from confcal.calibrators import calibrator_from_dict

    z, y = _data(3)
    dom = np.where(np.arange(z.shape[0]) % 2 == 0, "cam", "lidar")
    new = METHODS["grouped-ts"]().fit(z, y, domains=dom)
    old = new.to_dict()
    old["parameters"] = {"temperature": new.temperature_,
                         "temperatures": [[k, t] for k, t in new.temperatures_.items()],
                         "domain_counts": [[k, n] for k, n in new.domain_counts_.items()]}
    back = calibrator_from_dict(json.loads(json.dumps(old)))
    np.testing.assert_array_equal(back.predict_proba(z, domains=dom), new.predict_proba(z, domains=dom))
    assert back.temperatures_ == new.temperatures_
    old["parameters"]["temperatures"][0][1] = -1.0
    with pytest.raises(ValueError, match=r"parameters\.groups.*temperature"):
        calibrator_from_dict(old)


@pytest.mark.parametrize("base,by", [("ts", "domains"), ("vs", "domains"), ("ts+pb", "domains"),
                                     ("ts", "category_ids"), ("dirichlet", ("category_ids", "domains"))])
def test_any_grouped_calibrator_round_trips_through_its_manifest(base, by):
    rng = np.random.default_rng(3)
    z = rng.normal(size=(400, 4)) * 3
    y = (z + rng.gumbel(size=z.shape)).argmax(axis=1)
    side = {"domains": np.where(np.arange(400) < 200, "cam", "lidar"), "category_ids": np.arange(400) % 3}
    kw = {k: side[k] for k in ((by,) if isinstance(by, str) else by)}
    params = {"reg": "fixed"} if base == "dirichlet" else None
    cal = GroupedCalibrator(base, base_params=params, by=by, min_samples=50).fit(z, y, **kw)
    manifest = json.loads(json.dumps(cal.to_dict()))
    assert manifest["method"] == "grouped" and manifest["hyperparameters"]["base"] == base
    back = load_calibrator(manifest)
    np.testing.assert_array_equal(back.predict_proba(z, **kw), cal.predict_proba(z, **kw))


def test_grouped_manifest_is_checked_with_the_base_methods_table():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(300, 3)) * 2
    y = (z + rng.gumbel(size=z.shape)).argmax(axis=1)
    d = np.where(np.arange(300) < 150, "a", "b")
    manifest = GroupedCalibrator("ts").fit(z, y, domains=d).to_dict()
    bad = {**manifest, "parameters": {**manifest["parameters"], "pooled": {"temperature": -1.0}}}
    with pytest.raises(ValueError, match=r"^manifest: parameters\.pooled\.temperature: "):
        load_calibrator(bad)
    for base in ("nope", "grouped"):
        bad = {**manifest, "hyperparameters": {**manifest["hyperparameters"], "base": base}}
        with pytest.raises(ValueError, match=r"^manifest: hyperparameters\.base: "):
            load_calibrator(bad)
