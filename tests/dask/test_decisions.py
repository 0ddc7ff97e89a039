"""Decisions applied by Dask equal the single-process decisions (two worker processes)."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

from confcal.decisions import (decision_manifest, fit_conformal, fit_decisions,  # noqa: E402
                               scores_digest)
from confcal.dask.decisions import decide, predict_sets  # noqa: E402


def test_per_domain_decisions_equal_the_single_process_rule(dask_client):
    rng = np.random.default_rng(50)
    n = 30000
    g = np.where(rng.random(n) < 0.5, "drone", "sat")
    s = rng.random(n)
    y = rng.random(n) < np.where(g == "drone", s, s**3)
    rule = fit_decisions(s, y, g, alpha_accept=0.1, alpha_reject=0.1, delta=0.1)
    m = decision_manifest(rule, data_sha256=scores_digest(s, y, g), n_samples=n, per="domain")
    got = decide(m, da.from_array(s, chunks=7001), da.from_array(g, chunks=5000)).compute()
    np.testing.assert_array_equal(got, rule.decide(s, g))  # same rows, same comparisons: exact


def test_top_label_with_a_calibrator_and_sets(dask_client):
    from confcal.calibrators import TemperatureScaling

    rng = np.random.default_rng(51)
    z = rng.normal(size=(20000, 4)) * 2
    yy = (z + rng.normal(size=z.shape) * 1.5).argmax(1)
    cal = TemperatureScaling().fit(z, yy)
    p = cal.predict_proba(z)
    rule = fit_decisions(p.max(1), p.argmax(1) == yy, p.argmax(1), alpha_accept=0.1, alpha_reject=None, delta=0.1)
    m = decision_manifest(rule, data_sha256="0" * 64, n_samples=20000, input_kind="top_label", scale="calibrator",
                          per="class", calibrator=cal)
    got = decide(m, da.from_array(z, chunks=(3000, 4)), calibrator=cal).compute()
    want = rule.decide(p.max(1), p.argmax(1))
    # blockwise predict_proba may round differently from the whole-array call: only scores within
    # 1e-12 of a threshold may decide differently
    lo_hi = np.array([rule.thresholds(str(k)) for k in range(4)])[p.argmax(1)]
    near = np.min(np.abs(p.max(1)[:, None] - lo_hi), axis=1) < 1e-12
    assert np.all((got == want) | near)
    with pytest.raises(ValueError, match="^calibrator: the decisions were fitted on the output of calibrator 'ts'"):
        decide(m, da.from_array(z, chunks=(3000, 4)))
    sets = fit_conformal(p[:10000], yy[:10000], alpha=0.1, score="aps")
    sm = decision_manifest(sets, data_sha256="0" * 64, n_samples=10000, input_kind="sets")
    got = predict_sets(sm, da.from_array(p, chunks=(2500, 4))).compute()
    np.testing.assert_array_equal(got, sets.predict(p))
