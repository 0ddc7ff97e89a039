"""Issue 40, defect 10: set-ts, source-gated-ts and ts-multilabel manifests with a temperature outside
their own [t_min, t_max] are refused on load, as ts refuses them (they loaded); ts-multilabel warns
when a label's temperature ends on a bound, as ts does (it was silent)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from confcal import load_calibrator
from confcal.calibrators import METHODS, CalibrationWarning


def _fit(method):
    rng = np.random.default_rng(0)
    n = 600
    z = rng.normal(size=(n, 3)) * 2
    y = np.where(rng.random(n) < 0.7, z.argmax(1), rng.integers(0, 3, n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "set-ts":
            return METHODS[method]().fit(z, y, domains=rng.integers(0, 2, n))
        if method == "source-gated-ts":
            f = rng.normal(size=(n, 4))
            return METHODS[method](source_domain=0).fit(z, y, domains=rng.integers(0, 3, n), features=f)
        yy = (rng.random((n, 3)) < 1 / (1 + np.exp(-z / 2))).astype(int)
        return METHODS[method]().fit(z, yy)


CASES = [("set-ts", ["temperature"]), ("source-gated-ts", ["source_temperature"]),
         ("ts-multilabel", ["label_temperatures", 1])]


@pytest.mark.parametrize("method, path", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("where", ["above", "below"])
def test_temperature_outside_its_bounds_is_refused_on_load(method, path, where):
    m = _fit(method).to_dict()
    load_calibrator(json.loads(json.dumps(m)))  # the fitted manifest loads
    hyper = m["hyperparameters"]
    bad = hyper["t_max"] * 2 if where == "above" else hyper["t_min"] / 2
    node = m["parameters"]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = bad
    field = path[0] + (f"[{path[1]}]" if len(path) > 1 else "")
    with pytest.raises(ValueError, match=rf"parameters\.{field.replace('[', '.').split('.')[0]}.*expected a number in "
                                         r"\[t_min, t_max\]"):
        load_calibrator(m)


def test_ts_multilabel_warns_at_a_bound_like_ts():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(400, 2)) * 3
    y = np.c_[(z[:, 0] > 0), rng.integers(0, 2, 400)].astype(int)  # label 0 separable: T -> t_min
    with pytest.warns(CalibrationWarning, match="search bound T = 0.01"):
        cal = METHODS["ts-multilabel"]().fit(z, y)
    assert cal.temperatures_[0] == 0.01
    with pytest.warns(CalibrationWarning, match="search bound T = 0.01"):
        METHODS["ts"]().fit(np.c_[np.zeros(400), z[:, 0]], y[:, 0])
