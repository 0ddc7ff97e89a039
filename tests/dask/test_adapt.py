"""Prior adaptation on the Dask engine equals the single-process passes (two worker processes)."""

from __future__ import annotations

import numpy as np

from confcal.adaptation import PriorAdapted
from confcal.calibrators import TemperatureScaling
from confcal.dask import adapt, apply, read_parquet


def test_em_per_domain_on_dask_equals_one_process(dask_client, cifar_dataset):
    folder, logits, labels, domains = cifar_dataset
    ts = TemperatureScaling().fit(logits[:3000], labels[:3000])
    make = lambda: PriorAdapted.from_fitted(ts, logits[:3000], labels[:3000], n_boot=10, tol=1e-8)  # noqa: E731
    local = make().adapt(logits, domains=domains)
    dist = adapt(make(), read_parquet(str(folder)), logits="logits", domains="domain")
    assert set(local.priors_) == set(dist.priors_) == {None, "s0", "s1", "s2"}
    for key, rec in local.priors_.items():
        for field in ("prior", "low", "high"):
            np.testing.assert_allclose(dist.priors_[key][field], rec[field], rtol=1e-9, atol=1e-13)
        assert dist.priors_[key]["n_iter"] == rec["n_iter"]
    # apply of the adapted calibrator on the cluster: the reweighted probabilities per domain
    out = apply(dist, read_parquet(str(folder)), domains="domain", keep_columns=["row_id"]).compute()
    probs = np.stack(out.sort_values("row_id")["probs"].to_numpy())
    # float32 logits: temperature scaling computes in float32 on one of the two paths, so float32's precision
    np.testing.assert_allclose(probs, local.predict_proba(logits, domains=domains), rtol=2e-6, atol=1e-9)
