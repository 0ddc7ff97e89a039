"""Damaged manifests: every numeric field of every method's manifest, tampered, gives a one-line
``ValueError`` naming the field, or loads into a calibrator whose probabilities are finite rows
summing to 1. Never NaN output, never another exception type."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, calibrator_from_dict
from confcal.calibrators.protocol.constraints import COMMON_HYPER
from confcal.cli import main

# small, fast fits: Adam methods get a few epochs, k-means few clusters
FAST = {
    "pts": {"epochs": 3, "progress": False},
    "pts+pb": {"epochs": 3, "progress": False},
    "pb-mlp": {"epochs": 3, "progress": False},
    "cluster-ts": {"n_clusters": 2, "n_init": 1, "min_cluster_size": 5},
    "cluster-ts-regression": {"n_clusters": 4, "n_init": 1, "min_cluster_size": 5},
    "domain-ensemble": {"n_clusters": 4, "n_init": 1, "min_cluster_size": 5},
    "source-gated-ts": {"source_domain": "a", "base": "set-ts", "n_neighbors": 5},
}


def _data(n=120, k=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    f = rng.normal(size=(n, d))
    w = rng.normal(size=(k, d)) * 2
    b = rng.normal(size=k)
    z = f @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in p])
    domains = np.where(np.arange(n) % 2 == 0, "a", "b")
    scores = 1.0 / (1.0 + np.exp(-(z[:, 0] - z[:, 1]) / 3))
    hit = (rng.random(n) < scores).astype(np.int64)
    multi = (rng.random(z.shape) < 1.0 / (1.0 + np.exp(-z))).astype(np.int64)  # multi-hot, sigmoid heads
    return dict(z=z, y=y, f=f, domains=domains, scores=scores, hit=hit, multi=multi)


def _cls(method):
    """The class behind a registry entry (a preset such as ``ts+pb`` wraps one)."""
    entry = METHODS[method]
    return getattr(entry, "cls", entry)


def _side(cls, data):
    names = set(cls.side_inputs) | set(cls.optional_side_inputs)
    side = {}
    if "features" in cls.side_inputs:
        side["features"] = data["f"]
    if "domains" in names and ("domains" in cls.side_inputs or getattr(cls, "takes_box_scores", False)
                               or getattr(cls, "method", "") == "source-gated-ts"):
        side["domains"] = data["domains"]
    return side


def _fit(method):
    cls = _cls(method)
    data = _data()
    cal = METHODS[method](**FAST.get(method, {}))
    side = _side(cls, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if getattr(cls, "takes_box_scores", False):
            cal.fit(data["scores"], data["hit"], **side)
        else:
            cal.fit(data["z"], data["multi"] if getattr(cls, "multilabel", False) else data["y"], **side)
    return cal, data, side


def _predict(cal, data, side):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if getattr(cal, "takes_box_scores", False):
            return cal.predict_proba(data["scores"], **side)
        return cal.predict_proba(data["z"], **side)


_FITTED: dict = {}


@pytest.fixture(scope="module", params=sorted(METHODS))
def fitted(request):
    if request.param not in _FITTED:
        _FITTED[request.param] = _fit(request.param)
    cal, data, side = _FITTED[request.param]
    return request.param, json.loads(json.dumps(cal.to_dict())), data, side


def _path_text(path) -> str:
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif key.isidentifier():
            out += f".{key}" if out else key
        else:
            out += f"[{key!r}]"
    return out


def _numeric_leaves(obj, path=()):
    """Paths of numeric leaves; inside lists only the first item (arrays would multiply the cases)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numeric_leaves(v, path + (k,))
    elif isinstance(obj, list) and obj:
        yield from _numeric_leaves(obj[0], path + (0,))


TAMPERS = ("nan", "zero", "minus_one", "huge", "wrong_type", "wrong_shape", "missing", "extra")


def _tamper(manifest, path, how):
    m = copy.deepcopy(manifest)
    parent = m
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    value = parent[last]
    if how == "nan":
        parent[last] = math.nan
    elif how == "zero":
        parent[last] = 0
    elif how == "minus_one":
        parent[last] = -1
    elif how == "huge":
        parent[last] = 1e308
    elif how == "wrong_type":
        parent[last] = "x"
    elif how == "wrong_shape":
        parent[last] = [value]
    elif how == "missing":
        del parent[last]
    elif how == "extra":
        if isinstance(parent, dict):
            parent["tampered_extra"] = 1
        else:
            parent.append(copy.deepcopy(value))
    return m


def _field_named(message, path, how) -> bool:
    if how == "extra" and not isinstance(path[-1], int):
        return "tampered_extra" in message
    names = [p for p in path]
    while names and isinstance(names[-1], int):  # an array element: the array is the field
        names.pop()
    return _path_text(names) in message


def _expect_refused_or_sound(manifest, path, how, data, side):
    bad = _tamper(manifest, path, how)
    try:
        cal = calibrator_from_dict(bad)
    except ValueError as exc:
        msg = str(exc)
        assert "\n" not in msg, msg
        assert _field_named(msg, path, how), f"{how} at {_path_text(path)}: message does not name it: {msg}"
        return "refused"
    p = _predict(cal, data, side)
    assert np.all(np.isfinite(p)), f"{how} at {_path_text(path)} loaded and gave non-finite probabilities"
    if getattr(cal, "multilabel", False):  # independent per-label probabilities
        assert np.all((p >= 0) & (p <= 1))
    else:
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    return "loaded"


def test_every_numeric_field_tampered(fitted):
    method, manifest, data, side = fitted
    paths = list(_numeric_leaves(manifest))
    assert any(p[0] == "parameters" for p in paths) or method in ()
    outcomes = {}
    for path in paths:
        for how in TAMPERS:
            outcomes[(path, how)] = _expect_refused_or_sound(manifest, path, how, data, side)
    # every fitted parameter refuses NaN and a wrong type
    for path in paths:
        if path[0] == "parameters":
            assert outcomes[(path, "nan")] == "refused", _path_text(path)
            assert outcomes[(path, "wrong_type")] == "refused", _path_text(path)


def test_every_dict_refuses_unknown_keys(fitted):
    method, manifest, data, side = fitted

    def dicts(obj, path=()):
        if isinstance(obj, dict):
            yield path
            for k, v in obj.items():
                if k != "fit":  # the fit record is free-form (provenance, data summary, ...)
                    yield from dicts(v, path + (k,))
        elif isinstance(obj, list) and obj:
            yield from dicts(obj[0], path + (0,))

    for path in dicts(manifest):
        if path in ((), ("hyperparameters",)) or path[:2] == ("hyperparameters", "base_params"):
            continue
        bad = copy.deepcopy(manifest)
        target = bad
        for key in path:
            target = target[key]
        target["tampered_extra"] = 1
        with pytest.raises(ValueError, match="tampered_extra"):
            calibrator_from_dict(bad)
    with pytest.raises(ValueError, match="tampered_extra"):
        calibrator_from_dict({**manifest, "tampered_extra": 1})
    with pytest.raises(ValueError, match="hyperparameters.tampered_extra"):
        calibrator_from_dict({**manifest, "hyperparameters": {**manifest["hyperparameters"], "tampered_extra": 1}})


def test_round_trip_is_exact(fitted):
    method, manifest, data, side = fitted
    cal, _, _ = _FITTED[method]
    back = calibrator_from_dict(manifest)
    np.testing.assert_array_equal(_predict(back, data, side), _predict(cal, data, side))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_hyperparameter_and_fitted_parameter_has_a_table(method):
    cls = _cls(method)
    table = {**COMMON_HYPER, **cls.hyper_constraints}
    names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert sorted(set(names) - set(table)) == []
    # a composition's layout follows its hyper-parameters: its table comes from fitted_spec
    spec = cls.fitted_constraints if cls.fitted_constraints is not None else cls.fitted_spec(cls().get_params())
    assert spec is not None


# ------------------------------------------------------------------ the cases, one by one
def _manifest(method):
    if method not in _FITTED:
        _FITTED[method] = _fit(method)
    cal, data, side = _FITTED[method]
    return json.loads(json.dumps(cal.to_dict())), data, side


@pytest.mark.parametrize("value", [0, -1, 0.0, -1.0])
def test_set_ts_temperature_not_positive_is_refused(value):
    m, _, _ = _manifest("set-ts")
    m["parameters"]["temperature"] = value
    with pytest.raises(ValueError, match=r"^manifest: parameters.temperature: expected a finite number > 0"):
        calibrator_from_dict(m)


@pytest.mark.parametrize("value", [0, -1])
def test_det_ts_pooled_temperature_not_positive_is_refused(value):
    m, _, _ = _manifest("det-ts")
    m["parameters"]["pooled"]["temperature"] = value
    with pytest.raises(ValueError, match=r"parameters.pooled.temperature: expected a finite number > 0"):
        calibrator_from_dict(m)


@pytest.mark.parametrize("value", [0, -1])
def test_det_ts_per_domain_temperature_not_positive_is_refused(value):
    m, _, _ = _manifest("det-ts")
    assert m["parameters"]["groups"], "the fixture fits per domain"
    m["parameters"]["groups"][0][1]["temperature"] = value
    with pytest.raises(ValueError, match=r"parameters.groups\[0\]\[1\].temperature: expected a finite number > 0"):
        calibrator_from_dict(m)


def test_det_ts_removed_pooled_key_is_named():
    m, _, _ = _manifest("det-ts")
    del m["parameters"]["pooled"]
    with pytest.raises(ValueError, match=r"parameters.pooled: expected this key to be present"):
        calibrator_from_dict(m)


def test_fc_bias_null_is_refused():
    m, _, _ = _manifest("fc")
    m["parameters"]["bias"] = None
    with pytest.raises(ValueError, match=r"parameters.bias: expected an array of shape \(n_classes,\)"):
        calibrator_from_dict(m)


def test_fc_wrong_length_bias_is_refused_at_load():
    m, _, _ = _manifest("fc")
    m["parameters"]["bias"] = m["parameters"]["bias"][:-1]
    with pytest.raises(ValueError, match=r"parameters.bias: expected an array of shape \(n_classes,\) with "
                                         r"n_classes = 4, got shape \(3,\)"):
        calibrator_from_dict(m)


def test_domain_ensemble_set_temperature_zero_is_refused():
    m, _, _ = _manifest("domain-ensemble")
    m["parameters"]["set_temperature"] = 0
    with pytest.raises(ValueError, match=r"parameters.set_temperature: expected a finite number > 0, got 0"):
        calibrator_from_dict(m)


def test_pb_mlp_link_n_classes_zero_is_refused():
    m, data, side = _manifest("pb-mlp")
    if "link_config" not in m["parameters"]:
        pytest.skip("pb-mlp kept uniform bounds on this data")
    m["parameters"]["link_config"]["n_classes"] = 0
    with pytest.raises(ValueError, match=r"parameters.link_config.n_classes: expected an integer >= 1, got 0"):
        calibrator_from_dict(m)


@pytest.mark.parametrize("value", [1e308, 4.5, "4", True, 1, 0, -4, None])
def test_n_classes_must_be_an_int_of_at_least_two(value):
    m, _, _ = _manifest("ts")
    m["n_classes"] = value
    with pytest.raises(ValueError, match=r"^manifest: n_classes: expected an integer >= 2, got "):
        calibrator_from_dict(m)


@pytest.mark.parametrize("value", [True, 1.0, "1", None, 0, 2])
def test_format_version_must_be_a_supported_int(value):
    m, _, _ = _manifest("ts")
    m["format_version"] = value
    with pytest.raises(ValueError, match=r"^manifest: format_version: expected "):
        calibrator_from_dict(m)


@pytest.mark.parametrize("value", [[], "record", 3])
def test_fit_record_must_be_a_dict_or_null(value):
    m, data, side = _manifest("ts")
    m["fit"] = value
    with pytest.raises(ValueError, match=r"^manifest: fit: expected a JSON object"):
        calibrator_from_dict(m)
    m["fit"] = None
    assert calibrator_from_dict(m).fit_record_ is None


@pytest.mark.parametrize("field, value", [("n_samples", -5), ("n_samples", "300"), ("n_samples", 0),
                                          ("input_kind", "banana"), ("data_sha256", 7), ("sample_weight", "yes")])
def test_damaged_fit_record_is_named_and_the_map_still_applies(field, value):
    """A fit record's fields are checked on load; a damaged one is said in one warning naming the field,
    and never blocks apply (the fitted map is checked apart and used as is)."""
    m, data, side = _manifest("ts")
    want = calibrator_from_dict(m).predict_proba(data["z"], **side)
    m["fit"][field] = value
    with pytest.warns(UserWarning, match=rf"^manifest: fit\.{field}: expected .*: the fit record is damaged"):
        cal = calibrator_from_dict(m)
    np.testing.assert_array_equal(cal.predict_proba(data["z"], **side), want)


@pytest.mark.parametrize("value, message", [([1.0], "expected {k} frequencies .*, got 1"),
                                            ("extra", "expected {k} frequencies .*, got {k1}"),
                                            ("halved", "expected frequencies summing to 1, got a sum of 0.5")])
def test_class_frequencies_must_be_one_per_class_summing_to_one(value, message):
    """A hand-edited fit.data_summary.class_frequencies is named on load (drift read it with another width
    and blamed the new logits' width instead)."""
    from confcal.metrics.drift import data_summary

    m, data, side = _manifest("ts")
    m["fit"]["data_summary"] = data_summary(data["z"])  # as `confcal fit` records it
    calibrator_from_dict(m)  # (intact: no warning, under -W error)
    freq = m["fit"]["data_summary"]["class_frequencies"]
    k = m["n_classes"]
    assert len(freq) == k and abs(sum(freq) - 1) < 1e-12
    edits = {"extra": freq + [0.0], "halved": [f / 2 for f in freq]}
    m["fit"]["data_summary"]["class_frequencies"] = edits[value] if isinstance(value, str) else value
    msg = message.format(k=k, k1=k + 1)
    with pytest.warns(UserWarning, match=rf"^manifest: fit\.data_summary\.class_frequencies: {msg}: the fit record"):
        cal = calibrator_from_dict(m)
    assert set(cal.fit_record_damage_) == {"data_summary"}


@pytest.mark.parametrize("method, where", [
    ("pts", ("map_config", "hidden")), ("pts", ("map_config", "top_k")),
    ("pb-mlp", ("link_config", "hidden")), ("pb-mlp", ("link_config", "top_k"))])
def test_negative_hidden_or_top_k_in_a_manifest_is_refused(method, where):
    m, _, _ = _manifest(method)
    if where[0] not in m["parameters"]:
        pytest.skip(f"{method} kept uniform bounds on this data")
    m["parameters"][where[0]][where[1]] = -3
    with pytest.raises(ValueError, match=rf"parameters.{where[0]}.{where[1]}: expected an integer >= 1, got -3"):
        calibrator_from_dict(m)


@pytest.mark.parametrize("method, name", [("pts", "hidden"), ("pts", "top_k"), ("pb-mlp", "hidden"),
                                          ("pb-mlp", "top_k")])
def test_negative_hidden_or_top_k_at_fit_is_refused(method, name):
    data = _data()
    with pytest.raises(ValueError, match=rf"{name}: expected an integer >= 1, got -2"):
        METHODS[method](**{name: -2}).fit(data["z"], data["y"])


@pytest.mark.parametrize("method, params, field", [
    ("ts", {"t_min": 0}, "t_min"), ("ts", {"t_min": 5.0, "t_max": 2.0}, "t_min"),
    ("set-ts", {"t_max": float("nan")}, "t_max"), ("grouped-ts", {"min_samples": 0}, "min_samples"),
    ("dirichlet", {"reg_lambda": -1}, "reg_lambda"), ("vs", {"max_iter": 2.5}, "max_iter"),
    ("pb", {"lr": 0}, "lr"), ("ts+pb", {"base_params": {"t_min": -1}}, "base_params.t_min"),
    ("dirichlet+pb", {"base_params": {"reg_mu": -1}}, "base_params.reg_mu"),
    ("dirichlet+pb", {"base_params": {"nope": 1}}, "base_params.nope"),
    ("cluster-ts", {"n_clusters": 0}, "n_clusters"), ("cluster-ts-regression", {"alphas": [1.0, -1.0]}, "alphas"),
    ("fc", {"max_residual": 0}, "max_residual"), ("det-ts", {"min_samples": -1}, "min_samples")])
def test_bad_hyperparameters_are_refused_at_fit(method, params, field):
    cls = _cls(method)
    data = _data()
    cal = METHODS[method](**params)  # __init__ only stores
    side = _side(cls, data)
    x, y = (data["scores"], data["hit"]) if getattr(cls, "takes_box_scores", False) else (data["z"], data["y"])
    # named by the method, as the CLI and the manifest name it ("ts+pb", not ProbabilityBounding)
    with pytest.raises(ValueError, match=rf"^{re.escape(method)}: {field}"):
        cal.fit(x, y, **side)


def test_fc_without_useful_clipping_stores_null_and_applies(tmp_path):
    """An fc fit where clipping does not help stores threshold null; its own loader takes it back."""
    rng = np.random.default_rng(3)
    f = rng.normal(size=(300, 3))
    w = rng.normal(size=(3, 3)) * 0.3  # labels = arg-max: an underconfident model, clipping only hurts
    z = f @ w.T
    y = z.argmax(axis=1)
    cal = METHODS["fc"]().fit(z, y, features=f)
    assert cal.threshold_ == math.inf
    manifest = json.loads(json.dumps(cal.to_dict()))
    assert manifest["parameters"]["threshold"] is None
    back = calibrator_from_dict(manifest)
    np.testing.assert_array_equal(back.predict_proba(z, features=f), cal.predict_proba(z, features=f))
    # and through the CLI: fit then apply
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "f.npy", f)
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--features", str(tmp_path / "f.npy"), "--method", "fc", "-o", str(tmp_path / "fc.json")]) == 0
    assert json.loads((tmp_path / "fc.json").read_text())["parameters"]["threshold"] is None
    assert main(["apply", "--calibrator", str(tmp_path / "fc.json"), "--logits", str(tmp_path / "z.npy"),
                 "--features", str(tmp_path / "f.npy"), "-o", str(tmp_path / "p.npy")]) == 0
    assert np.allclose(np.load(tmp_path / "p.npy").sum(1), 1.0)


@pytest.mark.parametrize("method, edit, message", [
    ("set-ts", lambda m: m["parameters"].update(temperature=0), "parameters.temperature"),
    ("set-ts", lambda m: m["parameters"].update(temperature=-1), "parameters.temperature"),
    ("det-ts", lambda m: m["parameters"]["pooled"].update(temperature=-1), "parameters.pooled.temperature"),
    ("det-ts", lambda m: m["parameters"].pop("pooled"), "parameters.pooled"),
    ("fc", lambda m: m["parameters"].update(bias=None), "parameters.bias"),
    ("domain-ensemble", lambda m: m["parameters"].update(set_temperature=0), "parameters.set_temperature"),
    ("ts", lambda m: m.update(n_classes=1e308), "n_classes"),
    ("ts", lambda m: m.update(n_classes="4"), "n_classes"),
    ("ts", lambda m: m.update(format_version=True), "format_version"),
    ("pts", lambda m: m["parameters"]["map_config"].update(hidden=-1), "parameters.map_config.hidden"),
])
def test_cli_apply_refuses_a_damaged_manifest(tmp_path, capsys, method, edit, message):
    m, data, side = _manifest(method)
    edit(m)
    (tmp_path / "bad.json").write_text(json.dumps(m))
    is_box = getattr(_cls(method), "takes_box_scores", False)
    np.save(tmp_path / "x.npy", data["scores"] if is_box else data["z"])
    argv = ["apply", "--calibrator", str(tmp_path / "bad.json"), "--logits", str(tmp_path / "x.npy"),
            "-o", str(tmp_path / "p.npy")]
    for name, value in side.items():
        np.save(tmp_path / f"{name}.npy", value)
        argv += [f"--{name}", str(tmp_path / f"{name}.npy")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.npy").exists()


# ------------------------------------------------------------------ any JSON value anywhere
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.sampled_from([10**400, -10**400, 2**63, 2**64])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)


def _all_paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _all_paths(v, path + (k,))
    elif isinstance(obj, list) and obj:
        yield from _all_paths(obj[0], path + (0,))


@settings(max_examples=int(os.environ.get("TAMPER_EXAMPLES", 150)), suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(["ts", "grouped-ts", "set-ts", "vs", "ts+pb", "fc", "det-ts", "cluster-ts"]),
       pick=st.integers(0, 10**6), value=_json_values)
# an integer beyond float64 inside a numeric array (cluster-ts's centroids) raised OverflowError in the check
@example(method="cluster-ts", pick=2048, value=10**400)
def test_any_json_value_at_any_path_is_refused_in_one_line_or_sound(method, pick, value):
    manifest, data, side = _manifest(method)
    paths = [p for p in _all_paths(manifest) if p]
    path = paths[pick % len(paths)]
    bad = copy.deepcopy(manifest)
    parent = bad
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    is_box = getattr(_cls(method), "takes_box_scores", False)
    try:  # as `confcal apply` does: the logits' class count is checked against the manifest's
        cal = calibrator_from_dict(bad, n_classes=None if is_box else data["z"].shape[1])
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    try:
        p = _predict(cal, data, side)
    except ValueError as exc:
        # a switched-on option (det-ts per_class=True) may ask for a side input these data lack, or a
        # tampered class count no longer match the logits: predict refuses in one line naming the input
        assert "\n" not in str(exc) and str(exc).split(":")[0] in ("logits", "category_ids", "domains",
                                                                   "features"), exc
        return
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0)


def _all_leaves(obj, path=()):
    """Paths of every leaf (numbers, strings, booleans, nulls); inside lists only the first item."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _all_leaves(v, path + (k,))
    elif isinstance(obj, list) and obj:
        yield from _all_leaves(obj[0], path + (0,))
    else:
        yield path


def test_auto_selection_record_tampered():
    """``--method auto`` manifests: every leaf of ``fit.selection`` (the cross-validation table and the
    choice), tampered, loads the same fitted map (the record never blocks apply) and either warns once
    naming ``fit.selection`` or still holds a record that its own rule and the manifest agree with."""
    from confcal.calibrators.protocol.selection_record import check_selection_record, selection_disagrees
    from confcal.evaluation.selection import select_calibrator
    from confcal.evaluation.selection_candidates import Candidate

    data = _data(n=300)
    cands = [Candidate("ts", "ts"), Candidate("vs", "vs", moves_argmax=True)]
    cal = select_calibrator(data["z"], data["y"], allow_accuracy_change=True, candidates=cands, n_boot=100)
    manifest = json.loads(json.dumps(cal.to_dict()))
    want = cal.predict_proba(data["z"])
    paths = [("fit", "selection") + p for p in _all_leaves(manifest["fit"]["selection"])]
    assert len(paths) > 20
    for path in paths:
        for how in TAMPERS + ("text",):
            if how == "text":
                bad = copy.deepcopy(manifest)
                parent = bad
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = "tampered"
            else:
                bad = _tamper(manifest, path, how)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                back = calibrator_from_dict(bad)
            np.testing.assert_allclose(back.predict_proba(data["z"]), want, rtol=1e-12, atol=0)
            said = [str(w.message) for w in caught if "fit.selection" in str(w.message)]
            if said:
                assert len(said) == 1 and "\n" not in said[0]
                continue
            record = bad["fit"]["selection"]
            check_selection_record(record)  # loaded silently: the record must still be sound
            assert selection_disagrees(record, bad["method"], bad["hyperparameters"]) is None, (how, path)
