"""Equal-width histogram binning: at most ``MAX_UNIFORM_BINS`` (10,000) bins at fit time (100,000 bins on 10
classes wrote a 39 MB manifest that took 17 s to load); manifests written before with more still load, and
long numeric lists are checked as one array on load (10 maps of 10,000 bins: 1.8 -> 0.3 s here)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators._fit.histogram import MAX_UNIFORM_BINS, uniform_edges


def _data(k=10, n=400):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, k)), rng.integers(0, k, n)


@pytest.mark.parametrize("method", ["histogram-binning", "histogram-binning-top"])
def test_uniform_above_the_cap_is_refused_naming_n_bins(method):
    z, y = _data()
    with pytest.raises(ValueError, match=rf"^n_bins: expected at most {MAX_UNIFORM_BINS} equal-width bins with "
                                         r"strategy='uniform' .*, got 100000; use fewer bins"):
        METHODS[method](strategy="uniform", n_bins=100_000).fit(z, y)
    cal = METHODS[method](strategy="uniform", n_bins=MAX_UNIFORM_BINS).fit(z, y)  # the cap itself fits
    assert len((cal.map_ if method.endswith("-top") else cal.maps_[0])["values"]) == MAX_UNIFORM_BINS
    # equal-mass bins have no such cap: tied edges merge, at most n_samples - 1 of them
    q = METHODS[method](n_bins=100_000).fit(z, y)
    assert len((q.map_ if method.endswith("-top") else q.maps_[0])["edges"]) <= z.shape[0] - 1


def test_cli_refuses_with_exit_2(tmp_path, capsys):
    from confcal.cli import main

    z, y = _data()
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    code = main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method",
                 "histogram-binning", "--param", "strategy=uniform", "--param", "n_bins=100000",
                 "-o", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "n_bins: expected at most 10000 equal-width bins" in err and "\n" not in err, err
    assert not (tmp_path / "m.json").exists()


def test_a_manifest_written_before_with_100000_uniform_bins_still_loads():
    z, y = _data(k=3)
    d = json.loads(json.dumps(METHODS["histogram-binning"](strategy="uniform", n_bins=10).fit(z, y).to_dict()))
    n_bins = 100_000
    d["hyperparameters"]["n_bins"] = n_bins
    for m in d["parameters"]["maps"]:
        m["edges"] = uniform_edges(n_bins).tolist()
        m["values"] = ((np.arange(n_bins) + 0.5) / n_bins).tolist()
    cal = calibrator_from_dict(d)
    p = cal.predict_proba(z[:5])
    assert np.allclose(p.sum(axis=1), 1.0)


def test_long_lists_are_refused_naming_the_first_bad_item():
    """The array check of long numeric lists names the same item as the per-item check."""
    z, y = _data(k=3)
    d = json.loads(json.dumps(METHODS["histogram-binning"](strategy="uniform", n_bins=200).fit(z, y).to_dict()))
    d["parameters"]["maps"][1]["values"][150] = 1.5
    with pytest.raises(ValueError, match=r"^manifest: parameters\.maps\[1\]\.values\[150\]: expected a finite "
                                         r"number >= 0 and <= 1, got 1\.5$"):
        calibrator_from_dict(d)
    d["parameters"]["maps"][1]["values"][150] = True
    with pytest.raises(ValueError, match=r"maps\[1\]\.values\[150\]: expected a finite number"):
        calibrator_from_dict(d)
