"""The adapted manifest: exact round trip, and a tamper walk over every field outside the base's manifest
(which the base's own tamper walk covers): each damaged value gives a one-line ``ValueError`` naming the
field, or loads into a calibrator whose probabilities are finite rows summing to 1."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from confcal.adaptation import PriorAdapted, adapted_from_dict
from confcal.io import load_calibrator
from tests.adaptation import _synth

PS = np.array([0.25, 0.25, 0.25, 0.25])


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    x, y = _synth.draw(PS, 600, rng)
    xt, _ = _synth.draw([0.6, 0.2, 0.1, 0.1], 600, rng)
    zt = 2 * _synth.logits(xt, PS)
    d = np.where(np.arange(600) % 2 == 0, "a", "b")
    ad = PriorAdapted(base="ts", n_boot=20).fit(2 * _synth.logits(x, PS), y).adapt(zt, domains=d)
    return ad, zt, d


def test_round_trip_is_exact(fitted, tmp_path):
    ad, zt, d = fitted
    m = json.loads(json.dumps(ad.to_dict(), allow_nan=False))
    back = adapted_from_dict(m)
    np.testing.assert_array_equal(back.predict_proba(zt, domains=d), ad.predict_proba(zt, domains=d))
    assert back.to_dict()["target"] == m["target"]
    (tmp_path / "a.json").write_text(json.dumps(m))
    via_io = load_calibrator(str(tmp_path / "a.json"), n_classes=4)
    np.testing.assert_array_equal(via_io.predict_proba(zt), ad.predict_proba(zt))
    with pytest.raises(ValueError, match=r"n_classes=4, but the logits have 5"):
        load_calibrator(str(tmp_path / "a.json"), n_classes=5)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    else:
        yield path, obj


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def _variants(v):
    if isinstance(v, bool):
        return [not v, 1, "yes", None]
    if isinstance(v, (int, float)):
        return [-1, 0, 1.5, 1e300, math.nan, math.inf, -v - 1, "1", None, [v]]
    if isinstance(v, str):
        return [1, "", None]
    return [0, "x"]


def _check(m, zt, d):
    try:
        ad = adapted_from_dict(m)
    except ValueError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith("manifest"), text
        return "refused"
    p = ad.predict_proba(zt, domains=d)
    assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0)
    return "loaded"


def test_tamper_walk(fitted):
    ad, zt, d = fitted
    base = ad.to_dict()
    leaves = [(p, v) for p, v in _leaves(base) if p and p[0] not in ("base", "fit")]
    assert len(leaves) > 100
    seen = {"refused": 0, "loaded": 0}
    for path, value in leaves:
        for bad in _variants(value):
            m = copy.deepcopy(base)
            _set(m, path, bad)
            seen[_check(m, zt, d)] += 1
    # structural damage: a missing key, an unknown key, a wrong container at every dict of the walk
    for key in list(base):
        m = copy.deepcopy(base)
        del m[key]
        assert _check(m, zt, d) == "refused"
    for path in [("target", "pooled"), ("target", "domains", 0), ("source",), ("hyperparameters",)]:
        m = copy.deepcopy(base)
        obj = m
        for p in path:
            obj = obj[p]
        obj["surprise"] = 1
        assert _check(m, zt, d) == "refused"
    assert seen["refused"] > seen["loaded"]


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m["target"]["pooled"]["prior"].__setitem__(0, 0.9), "target.pooled.prior: expected probabilities summing to 1"),
    (lambda m: m["source"]["label_counts"].__setitem__(2, 0), r"source.label_counts\[2\]"),
    (lambda m: m["target"]["domains"][1].__setitem__("id", "a"), r"target.domains\[1\].id: expected each domain id once"),
    (lambda m: m["hyperparameters"].__setitem__("estimator", "kmm"), "hyperparameters.estimator"),
    (lambda m: m.__setitem__("format_version", 2), "format_version"),
    (lambda m: m["base"]["parameters"].__setitem__("temperature", -1.0), "base: parameters.temperature"),
])
def test_named_refusals(fitted, edit, needle):
    ad, zt, d = fitted
    m = copy.deepcopy(ad.to_dict())
    edit(m)
    with pytest.raises(ValueError, match=needle) as e:
        adapted_from_dict(m, source="ad.json")
    assert str(e.value).startswith("manifest ad.json: ") and "\n" not in str(e.value)
