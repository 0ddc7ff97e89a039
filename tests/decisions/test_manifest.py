"""Decision manifests: exact round trip, every field tampered gets a one-line refusal, calibrator by digest."""

import copy
import json
import re

import numpy as np
import pytest

from confcal.decisions import (decision_manifest, fit_conformal, fit_decisions, load_decision_manifest,
                               scores_digest)

from ._sim import draw


def _rule_manifest(calibrator=None):
    rng = np.random.default_rng(20)
    s, y = draw(rng, 3000)
    g = np.where(np.arange(3000) < 2990, "drone", "tiny")
    y[-10:] = [1, 0] * 5
    rule = fit_decisions(s, y, g, alpha_accept=0.1, alpha_reject=0.1, delta=0.1)
    m = decision_manifest(rule, data_sha256=scores_digest(s, y, g), n_samples=s.size, calibrator=calibrator,
                          scale="raw" if calibrator is None else "calibrator", per="domain")
    return rule, m, s, g


def _sets_manifest():
    rng = np.random.default_rng(21)
    p = rng.dirichlet(np.ones(4), 400)
    y = rng.integers(0, 4, 400)
    sets = fit_conformal(p, y, alpha=0.2, score="raps", class_conditional=True, groups=np.arange(400) % 2)
    return sets, decision_manifest(sets, data_sha256=scores_digest(p, y), n_samples=400, input_kind="sets"), p


def test_three_way_round_trip_is_exact_through_json():
    rule, m, s, g = _rule_manifest()
    back = load_decision_manifest(json.loads(json.dumps(m, allow_nan=False)))
    np.testing.assert_array_equal(back.decide(s, g), rule.decide(s, g))
    for name in ("drone", "tiny", "*"):
        assert back.thresholds(name) == rule.thresholds(name)
    assert back.notes == rule.notes and any("'tiny'" in n for n in rule.notes)
    assert "jointly with probability >= 0.9" in m["guarantee"]["statement"]


def test_conformal_round_trip_is_exact_through_json():
    sets, m, p = _sets_manifest()
    back = load_decision_manifest(json.loads(json.dumps(m, allow_nan=False)))
    groups = np.arange(400) % 2
    np.testing.assert_array_equal(back.predict(p, groups), sets.predict(p, groups))


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    if value is _DROP:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


_DROP = object()
TAMPERS = [None, -1, 0, 1e308, "x", True, [], _DROP]


@pytest.mark.parametrize("which", ["three_way", "conformal"])
def test_every_field_tampered_is_refused_in_one_line(which):
    m = _rule_manifest()[1] if which == "three_way" else _sets_manifest()[1]
    paths = list(_leaves(m))
    assert len(paths) > 40
    for path in paths:
        for value in TAMPERS:
            bad = copy.deepcopy(m)
            try:
                before = _get(bad, path)
            except (KeyError, IndexError):
                continue
            if value is not _DROP and type(value) is type(before) and value == before:
                continue
            _set(bad, path, value)
            with pytest.raises(ValueError) as info:
                load_decision_manifest(bad)
            msg = str(info.value)
            assert "\n" not in msg and msg.startswith("decisions: "), (path, value, msg)
            assert re.match(r"^decisions: [^:]+: (expected|unknown key|missing|the manifest was edited)", msg), msg
            if value == "x" and not isinstance(before, str):  # a wrong type is named at its own path
                assert _shown(path) in msg, (path, msg)


def _shown(path):
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def test_an_edited_threshold_is_refused_by_the_digest():
    _, m, _, _ = _rule_manifest()
    m["groups"]["drone"]["lambda_hi"] = m["groups"]["drone"]["accept"]["threshold"] = 0.5
    with pytest.raises(ValueError, match=r"^decisions: sha256: the manifest was edited after the fit"):
        load_decision_manifest(m)


def test_top_level_damage_is_named():
    _, m, _, _ = _rule_manifest()
    with pytest.raises(ValueError, match=r"^decisions: format: expected 'confcal.decisions', got \"x\""):
        load_decision_manifest({**m, "format": "x"})
    with pytest.raises(ValueError, match=r"^decisions: extra: unknown key"):
        load_decision_manifest({**m, "extra": 1})
    with pytest.raises(ValueError, match=r"^decisions: guarantee.delta: expected a number in \(0, 1\), got 1.5"):
        load_decision_manifest({**m, "guarantee": {**m["guarantee"], "delta": 1.5}})
    with pytest.raises(ValueError, match=r"^decisions d.json: groups.drone.n_samples: expected an integer >= 1"):
        g = copy.deepcopy(m["groups"])
        g["drone"]["n_samples"] = 0
        load_decision_manifest({**m, "groups": g}, source="d.json")


def test_the_calibrator_is_named_by_digest_missing_and_tampered_are_refused():
    from confcal.calibrators import TemperatureScaling

    rng = np.random.default_rng(22)
    z = rng.normal(size=(200, 3)) * 3
    cal = TemperatureScaling().fit(z, (z + rng.normal(size=z.shape) * 3).argmax(1))
    _, m, _, _ = _rule_manifest(calibrator=cal)
    assert m["calibrator"]["method"] == "ts"
    load_decision_manifest(m, calibrator=cal)
    load_decision_manifest(m, calibrator=json.loads(json.dumps(cal.to_dict())))
    with pytest.raises(ValueError, match=r"^calibrator: the decisions were fitted on the output of calibrator 'ts' "
                                         r"sha256 [0-9a-f]{12}\.\.\.: pass that calibrator"):
        load_decision_manifest(m)
    other = cal.to_dict()
    other["parameters"] = {**other["parameters"], "temperature": other["parameters"]["temperature"] * 1.01}
    with pytest.raises(ValueError, match=r"^calibrator: expected the calibrator with sha256 [0-9a-f]{12}\.\.\. the "
                                         r"decisions were fitted on, got sha256"):
        load_decision_manifest(m, calibrator=other)


def test_applied_thresholds_are_checked_against_the_rule():
    from confcal.decisions.manifest import canonical_sha256

    rng = np.random.default_rng(3)
    s = rng.random(3000)
    y = rng.random(3000) < s
    g = np.where(np.arange(3000) < 20, "tiny", "big")
    m = decision_manifest(fit_decisions(s, y, g, pool_small=True), data_sha256="0" * 64, n_samples=3000)
    assert m["groups"]["tiny"]["applied"]["lambda_hi"] == m["groups"]["*"]["lambda_hi"]
    m["groups"]["tiny"]["applied"]["lambda_hi"] = 0.5
    m["sha256"] = canonical_sha256({k: v for k, v in m.items() if k != "sha256"})
    with pytest.raises(ValueError, match=r"^decisions: groups\.tiny\.applied\.lambda_hi: expected the applied accept"):
        load_decision_manifest(m)
