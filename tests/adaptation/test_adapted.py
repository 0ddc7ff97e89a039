"""PriorAdapted: recovery of a known prior, invariance, intervals, streaming, hostile input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from confcal.adaptation import PriorAdapted
from confcal.calibrators import TemperatureScaling
from confcal.sources import open_source
from tests.adaptation import _synth

PS = np.array([0.25, 0.25, 0.25, 0.25])


def _calibration(rng, n=3000, prior=PS, scale=2.0):
    """Over-confident logits (2 x the calibrated ones), so the base TS has work to do."""
    x, y = _synth.draw(prior, n, rng)
    return scale * _synth.logits(x, PS), y


def _target(rng, prior, n, scale=2.0):
    x, y = _synth.draw(prior, n, rng)
    return scale * _synth.logits(x, PS), y


def test_recovers_known_priors_per_domain():
    rng = np.random.default_rng(0)
    z, y = _calibration(rng)
    ad = PriorAdapted(base="ts", n_boot=50).fit(z, y)
    pa, pb = np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.05, 0.05, 0.3, 0.6])
    za, _ = _target(rng, pa, 4000)
    zb, _ = _target(rng, pb, 4000)
    zt = np.concatenate([za, zb])
    d = np.array(["rural"] * 4000 + ["urban"] * 4000)
    ad.adapt(zt, domains=d)
    for key, truth in (("rural", pa), ("urban", pb), (None, (pa + pb) / 2)):
        rec = ad.priors_[key]
        assert rec["converged"] and rec["n_rows"] == (8000 if key is None else 4000)
        assert np.abs(rec["prior"] - truth).sum() < 0.06, (key, rec["prior"])
        assert (rec["low"] <= rec["prior"]).all() and (rec["prior"] <= rec["high"]).all()
        assert rec["test"]["p_value"] < 1e-6  # a shift this large is detected


def test_adapted_nll_beats_the_base_and_approaches_the_oracle():
    rng = np.random.default_rng(1)
    z, y = _calibration(rng)
    ad = PriorAdapted(base="ts", n_boot=0).fit(z, y)
    pt = np.array([0.8, 0.1, 0.05, 0.05])
    zt, yt = _target(rng, pt, 6000)
    base = ad.predict_proba(zt)
    np.testing.assert_allclose(base, ad.base_.predict_proba(zt), rtol=1e-12, atol=1e-15)  # not adapted yet
    ad.adapt(zt)
    out = ad.predict_proba(zt)

    def nll(p):
        return -np.mean(np.log(p[np.arange(len(yt)), yt]))

    oracle = base * (pt / ad.source_prior_)
    oracle /= oracle.sum(axis=1, keepdims=True)
    assert nll(out) < nll(base) - 0.05
    assert nll(out) - nll(oracle) < 0.01


def test_no_shift_on_the_calibration_set_itself_is_an_exact_fixed_point():
    """EM on the calibration rows: the source prior (their mean calibrated probability) is a fixed point
    of the first step, so the estimate is the source prior and the probabilities are the base's."""
    rng = np.random.default_rng(2)
    z, y = _calibration(rng, n=4000)
    ad = PriorAdapted(base="ts", n_boot=0, tol=1e-12).fit(z, y)
    rec = ad.adapt(z).priors_[None]
    np.testing.assert_allclose(rec["prior"], ad.source_prior_, atol=1e-12)
    assert rec["n_iter"] == 1
    np.testing.assert_allclose(ad.predict_proba(z), ad.base_.predict_proba(z), rtol=1e-10, atol=1e-14)


def test_no_shift_keeps_the_source_prior_inside_its_interval_and_predictions():
    rng = np.random.default_rng(2)
    z, y = _calibration(rng, n=4000)
    ad = PriorAdapted(base="ts", n_boot=100).fit(z, y)
    # no label shift: the target's class mix is the calibration set's (its label counts), x drawn afresh
    yt = np.repeat(np.arange(4), ad.label_counts_)
    zt = 2.0 * _synth.logits(_synth.means(4)[yt] + rng.normal(size=(len(yt), 4)), PS)
    before = ad.predict_proba(zt)
    rec = ad.adapt(zt).priors_[None]
    # close to the population's prior PS (which the intervals cover at the rate the simulation below
    # measures); the calibration rows' mean calibrated probability (source_prior_) is a second noisy
    # estimate of it, so "within the interval" is checked where it holds exactly: the test above
    assert np.abs(rec["prior"] - PS).sum() < 0.06, rec["prior"]
    assert rec["test"]["p_value"] > 0.01
    after = ad.predict_proba(zt)
    assert (before.argmax(1) == after.argmax(1)).mean() > 0.98
    assert np.abs(after - before).max() < 0.1


def test_bootstrap_interval_coverage_by_simulation():
    """Coverage of the 95 % percentile intervals of class 0's prior over 100 simulations, with the exact
    posterior as calibrator and the exact source prior (the interval is of the target sample, as it states).

    Measured: 87 / 100 (99 % Clopper-Pearson [0.76, 0.94]) for class 0 with 1,000 target rows (classes 1-3:
    92, 97, 92 / 100); the Poisson bootstrap's
    spread matches a row-resampling bootstrap of ``em_prior`` (checked by hand), so the percentile interval
    itself undercovers at this size. The test holds that figure: coverage not demonstrably below 85 %.
    """
    pt = np.array([0.5, 0.3, 0.15, 0.05])
    x0, y0 = _synth.draw(PS, 400, np.random.default_rng(7))
    ad = PriorAdapted(base="ts", n_boot=100, source_prior="labels").fit(_synth.logits(x0, PS), y0)
    ad.base_.temperature_ = 1.0  # the exact posterior
    ad.label_counts_ = np.array([100, 100, 100, 100])  # the exact source prior
    hits, n_sim = 0, 100
    for s in range(n_sim):
        x, _ = _synth.draw(pt, 1000, np.random.default_rng(100 + s))
        ad.set_params(random_state=s)
        rec = ad.adapt(_synth.logits(x, PS)).priors_[None]
        hits += rec["low"][0] <= pt[0] <= rec["high"][0]
    ci = binomtest(hits, n_sim).proportion_ci(0.99)
    assert ci.high >= 0.85 and hits <= 100, (hits, ci)


def test_streamed_adaptation_equals_in_memory(tmp_path):
    rng = np.random.default_rng(3)
    z, y = _calibration(rng)
    zt, _ = _target(rng, [0.1, 0.2, 0.3, 0.4], 2500)
    d = np.where(np.arange(2500) % 3 == 0, 7, 11)
    np.save(tmp_path / "z.npy", zt.astype(np.float32))
    np.save(tmp_path / "d.npy", d)
    a = PriorAdapted(base="ts", n_boot=30).fit(z, y).adapt(zt.astype(np.float32), domains=d)
    b = PriorAdapted(base="ts", n_boot=30).fit(z, y).adapt(open_source(str(tmp_path / "z.npy"), name="logits"),
                                                        domains=open_source(str(tmp_path / "d.npy")),
                                                        batch_rows=97)
    assert set(a.priors_) == set(b.priors_) == {None, 7, 11}
    for key in a.priors_:
        for f in ("prior", "low", "high"):
            np.testing.assert_allclose(a.priors_[key][f], b.priors_[key][f], rtol=1e-9, atol=1e-12)
        assert a.priors_[key]["n_iter"] == b.priors_[key]["n_iter"]
    assert b.adaptation_["n_passes"] >= b.priors_[None]["n_iter"]


def test_bbse_through_the_composition():
    rng = np.random.default_rng(4)
    z, y = _calibration(rng, n=6000)
    pt = np.array([0.6, 0.2, 0.15, 0.05])
    zt, _ = _target(rng, pt, 8000)
    ad = PriorAdapted(base="ts", estimator="bbse", n_boot=50).fit(z, y).adapt(zt)
    rec = ad.priors_[None]
    assert np.abs(rec["prior"] - pt).sum() < 0.06
    # the hand solve of the recorded counts
    c = ad.confusion_ / ad.confusion_.sum()
    w = np.linalg.solve(c, rec["predicted_counts"] / rec["predicted_counts"].sum())
    np.testing.assert_allclose(rec["weights"], w, rtol=1e-9)


def test_from_fitted_equals_fit():
    rng = np.random.default_rng(5)
    z, y = _calibration(rng)
    ts = TemperatureScaling().fit(z, y)
    a = PriorAdapted.from_fitted(ts, z, y, n_boot=0)
    b = PriorAdapted(base="ts", n_boot=0).fit(z, y)
    np.testing.assert_array_equal(a.confusion_, b.confusion_)
    zt, _ = _target(rng, [0.4, 0.4, 0.1, 0.1], 1000)
    np.testing.assert_allclose(a.adapt(zt).priors_[None]["prior"], b.adapt(zt).priors_[None]["prior"], rtol=1e-9)


def test_unseen_domain_falls_back_to_the_pooled_prior():
    rng = np.random.default_rng(6)
    z, y = _calibration(rng)
    zt, _ = _target(rng, [0.7, 0.1, 0.1, 0.1], 2000)
    ad = PriorAdapted(base="ts", n_boot=0).fit(z, y).adapt(zt, domains=np.repeat(["a", "b"], 1000))
    got = ad.predict_proba(zt[:5], domains=np.array(["never-seen"] * 5))
    np.testing.assert_allclose(got, ad.predict_proba(zt[:5]), rtol=1e-12)
    np.testing.assert_allclose(ad.prior_of("never-seen"), ad.priors_[None]["prior"])


def test_hostile_inputs():
    rng = np.random.default_rng(7)
    z, y = _calibration(rng)
    y_missing = np.where(y == 2, 1, y)
    with pytest.raises(ValueError, match=r"^labels: class 2 has no rows in the calibration set") as e:
        PriorAdapted(base="ts").fit(z, y_missing)
    assert "\n" not in str(e.value)
    ad = PriorAdapted(base="ts", n_boot=0).fit(z, y)
    bad = _target(rng, PS, 300)[0]
    bad[211, 2] = np.nan
    with pytest.raises(ValueError, match=r"logits.*211") as e:
        ad.adapt(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="at least 1"):
        ad.adapt(np.zeros((0, 4)))
    with pytest.raises(ValueError, match=r"^estimator: expected one of"):
        PriorAdapted(base="ts", estimator="kmm").fit(z, y)
    # BBSE with a class never predicted on the calibration set: the confusion matrix is singular
    zs = z.copy()
    zs[:, 3] -= 100.0
    with pytest.raises(ValueError, match=r"^confusion: singular, class 3 is never predicted"):
        PriorAdapted(base="ts", estimator="bbse", n_boot=0).fit(zs, y).adapt(_target(rng, PS, 100)[0])


def test_clone_and_params():
    from sklearn.base import clone

    ad = PriorAdapted(base="bcts", estimator="bbse", n_boot=7)
    assert clone(ad).get_params() == ad.get_params()


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("method", ["ts", "bcts"])
def test_a_base_fitted_on_probabilities_adapts_as_on_their_log(method):
    # regression: the calibration rows were converted to log-probabilities, then checked again as
    # probabilities by the base ("input_kind='probs' expects values in [0, 1]"), for fit and from_fitted
    from confcal.calibrators.protocol.registry import make_calibrator

    rng = np.random.default_rng(11)
    z, y = _calibration(rng)
    zt, _ = _target(rng, [0.55, 0.25, 0.15, 0.05], 3000)
    p, pt = _softmax(z), _softmax(zt)
    on_probs = make_calibrator(method, {"input_kind": "probs"}).fit(p, y)
    on_logs = make_calibrator(method).fit(np.log(p), y)
    a = PriorAdapted.from_fitted(on_probs, p, y, n_boot=20).adapt(pt)
    b = PriorAdapted.from_fitted(on_logs, np.log(p), y, n_boot=20).adapt(np.log(pt))
    np.testing.assert_array_equal(a.confusion_, b.confusion_)
    np.testing.assert_allclose(a.priors_[None]["prior"], b.priors_[None]["prior"], rtol=1e-7, atol=1e-9)
    assert np.abs(a.priors_[None]["prior"] - [0.55, 0.25, 0.15, 0.05]).sum() < 0.08
    np.testing.assert_allclose(a.predict_proba(pt[:50]), b.predict_proba(np.log(pt[:50])), rtol=1e-6, atol=1e-9)
    # fit() hands the raw probabilities to its base too, and keeps the base's fit record (drift summary)
    c = PriorAdapted(base=make_calibrator(method, {"input_kind": "probs"}), n_boot=20).fit(p, y).adapt(pt)
    assert c.input_kind == "probs" and c.base_.input_kind == "probs"
    assert c.fit_record_["input_kind"] == "probs"
    np.testing.assert_allclose(c.priors_[None]["prior"], a.priors_[None]["prior"], rtol=1e-9, atol=1e-12)


def test_from_fitted_reads_the_string_labels_of_its_base():
    rng = np.random.default_rng(12)
    z, y = _calibration(rng)
    names = np.array(["bus", "car", "truck", "van"])
    ts = TemperatureScaling().fit(z, names[y])
    a = PriorAdapted.from_fitted(ts, z, names[y], n_boot=0)
    b = PriorAdapted.from_fitted(TemperatureScaling().fit(z, y), z, y, n_boot=0)
    np.testing.assert_array_equal(a.label_counts_, b.label_counts_)
    np.testing.assert_array_equal(a.confusion_, b.confusion_)
    assert list(a.classes_) == list(names)


def test_fit_refuses_side_inputs_it_does_not_take():
    rng = np.random.default_rng(13)
    z, y = _calibration(rng)
    with pytest.raises(TypeError, match=r"does not take \['category_ids'\]"):
        PriorAdapted(base="ts", n_boot=0).fit(z, y, category_ids=y)
    with pytest.raises(ValueError, match=r"^sample_weight: prior adaptation needs"):
        PriorAdapted(base="ts", n_boot=0).fit(z, y, sample_weight=np.ones(len(y)))
