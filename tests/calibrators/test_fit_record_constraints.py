"""T14 (issue 21): every field of a manifest's fit record is checked on load against its constraint
table (:data:`confcal.calibrators.protocol.fit_record.FIT_RECORD`: type, range, finiteness, allowed keys).

A damaged field is named in ONE warning (field path, expected, found, file) and never blocks ``apply``
(the fitted map is checked apart and used as is); ``drift``, which reads ``fit.data_summary`` and
``fit.input_kind``, refuses in one line naming the damaged one. Before, only ``n_samples``,
``data_sha256``, ``input_kind`` and ``sample_weight`` were checked: a NaN metric, a negative pass
count, a time stamp "yesterday" or an unknown key loaded without a word (and a NaN anywhere in the
file, the record included, blocked ``apply``)."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from confcal.cli import main

#: (method, data kind) of the manifests tampered with: class vectors (ts: data summary, provenance),
#: histogram binning (accuracy_change, argmax_changed), box scores (det-platt: precision, d_ece, n_left_out)
METHODS = [("ts", "cls"), ("histogram-binning-top", "cls"), ("det-platt", "box")]
#: fields the Dask engine adds (valid values, put in so that they are tampered with too)
DASK_FIELDS = {"engine": "dask", "fitted_on": "sample", "sample": {"rows": 300, "seed": 0}, "n_passes": 3}
#: the leaf each tamper hits inside a field that is a JSON object
LEAF = {"metrics_before": ("nll",), "metrics_after": ("brier",), "provenance": ("command",),
        "data_summary": ("n",), "sample": ("rows",)}
REQUIRED = {"n_samples", "data_sha256", "input_kind", "metrics_before", "metrics_after", "library_version",
            "utc_time"}
#: a value of the wrong JSON type for each kind of leaf
WRONG_TYPE = {str: 12345, int: "12", float: "0.5", bool: "yes"}
TAMPERS = ["type", "nan", "negative", "huge", "missing", "extra"]


def _run(*argv, capsys):
    """``(exit status, stdout, stderr, [warning])``: the CLI prints each warning as one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main([str(a) for a in argv])
    out = capsys.readouterr()
    said = [line[len("confcal: warning: "):] for line in out.err.splitlines() if line.startswith("confcal: warning: ")]
    return code, out.out, out.err, said


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """``{method: (folder, manifest dict)}``: each fitted through ``confcal fit`` on 300 seeded rows, with
    the Dask engine's fields added (valid values)."""
    root = tmp_path_factory.mktemp("fitrec")
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 300)
    z = 2 * (rng.normal(size=(300, 3)) + np.eye(3)[y])
    s = rng.random(300)
    np.savez(root / "cls.npz", x=z, y=y)
    np.savez(root / "box.npz", x=s, y=(rng.random(300) < s).astype(np.int64))
    out = {}
    for method, kind in METHODS:
        man = root / f"{method}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["fit", "-q", "--method", method, "--logits", f"{root}/{kind}.npz:x",
                         "--labels", f"{root}/{kind}.npz:y", "-o", str(man)]) == 0
        m = json.loads(man.read_text())
        m["fit"].update(DASK_FIELDS)
        out[method] = (root, kind, m)
    return out


def _cases():
    fields = ["n_samples", "data_sha256", "input_kind", "metrics_before", "metrics_after", "library_version",
              "utc_time", "provenance", "data_summary", *DASK_FIELDS]
    extra = {"histogram-binning-top": ["accuracy_change", "argmax_changed"], "det-platt": ["n_left_out"]}
    return [(m, f, t) for m, _ in METHODS for f in fields + extra.get(m, []) for t in TAMPERS]


def _tamper(record: dict, field: str, how: str) -> str:
    """Damage ``record[field]`` (in place) one way; returns the path the warning must name."""
    if how == "missing":
        del record[field]
        return field
    if how == "extra":
        if isinstance(record[field], dict):
            record[field]["zzz"] = 1
            return f"{field}.zzz"
        record["zzz"] = 1
        return "zzz"
    holder, key = record, field
    for k in LEAF.get(field, ()):
        holder, key = holder[key], k
    path = ".".join((field, *LEAF.get(field, ())))
    old = holder[key]
    holder[key] = {"type": WRONG_TYPE.get(type(old), "x"), "nan": float("nan"), "negative": -5,
                   "huge": 10 ** 400}[how]
    return path


def test_an_untouched_record_loads_without_a_warning(fitted, tmp_path, capsys):
    for method, (root, kind, m) in fitted.items():
        path = tmp_path / f"{method}.json"
        path.write_text(json.dumps(m))
        code, _, err, caught = _run("apply", "--calibrator", path, "--logits", f"{root}/{kind}.npz:x", "-o",
                                    tmp_path / "p.npy", capsys=capsys)
        assert code == 0 and caught == [], (method, caught, err)


@pytest.mark.parametrize(("method", "field", "how"), _cases(), ids=["-".join(c) for c in _cases()])
def test_damaged_fit_field_is_named_once_and_never_blocks_apply(fitted, tmp_path, capsys, method, field, how):
    root, kind, manifest = fitted[method]
    logits = f"{root}/{kind}.npz:x"
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(manifest))
    m = json.loads(json.dumps(manifest))
    where = _tamper(m["fit"], field, how)
    bad.write_text(json.dumps(m))  # NaN is written as the constant NaN
    code, _, err, _ = _run("apply", "--calibrator", good, "--logits", logits, "-o", tmp_path / "want.npy",
                           capsys=capsys)
    assert code == 0, err
    code, _, err, caught = _run("apply", "--calibrator", bad, "--logits", logits, "-o", tmp_path / "got.npy",
                                capsys=capsys)
    if how == "missing" and field not in REQUIRED:  # an optional field may be absent
        assert code == 0 and caught == [], caught
        return
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy"))
    # one warning: the file, the field path, what was expected and what was found
    assert len(caught) == 1, caught
    assert re.match(rf"^manifest {re.escape(str(bad))}: (.*; )?fit\.{re.escape(where)}: expected .+, got .+: "
                    r"the fit record is damaged \(kept for reference; the fitted map is used as is", caught[0]), caught
    # drift: refuses in one line naming a damaged field it reads; runs as on the good file otherwise
    code, out, err, _ = _run("drift", "--calibrator", bad, "--logits", logits, "--json", capsys=capsys)
    if field in ("data_summary", "input_kind") and where != "zzz":
        line = err.strip()  # one line: the error (the load warning is not said again)
        assert code == 2 and "\n" not in line and line.startswith("confcal: error:"), err
        assert f"fit.{where}" in line and str(bad) in line and "drift reads" in line
    else:
        code_good, out_good, _, _ = _run("drift", "--calibrator", good, "--logits", logits, "--json", capsys=capsys)
        assert (code, out) == (code_good, out_good), err


def test_library_load_collects_every_damaged_field(fitted):
    """One warning names every damaged field (not only the first), and ``fit_record_damage_`` keeps them."""
    from confcal.calibrators import calibrator_from_dict

    _, _, manifest = fitted["ts"]
    m = json.loads(json.dumps(manifest))
    m["fit"]["n_passes"] = -1
    m["fit"]["utc_time"] = "yesterday"
    m["fit"]["metrics_after"]["ece"] = float("nan")
    with pytest.warns(UserWarning) as rec:
        cal = calibrator_from_dict(m, source="x.json")
    assert len(rec) == 1
    text = str(rec[0].message)
    assert text.startswith("manifest x.json: ") and text.count("fit.") == 3
    assert set(cal.fit_record_damage_) == {"n_passes", "utc_time", "metrics_after"}


def test_nan_outside_the_fit_record_is_still_refused(fitted, tmp_path, capsys):
    _, _, manifest = fitted["ts"]
    m = json.loads(json.dumps(manifest))
    m["parameters"]["temperature"] = float("nan")
    (tmp_path / "c.json").write_text(json.dumps(m))
    code, _, err, _ = _run("apply", "--calibrator", tmp_path / "c.json", "--logits", "x.npy", "-o",
                           tmp_path / "p.npy", capsys=capsys)
    assert code == 2 and "NaN at parameters.temperature" in err and not (tmp_path / "p.npy").exists()


# ------------------------------------------------ T34 (rest): fitted diagnostics and group lists
#: methods whose parameters hold optional diagnostics, and the diagnostic keys of each (at the top of
#: ``parameters``, or of ``parameters.pooled`` for a grouped fit)
DIAGNOSTICS = {"ts": ("nll", "n_iter", "at_bound"), "vs": ("nll", "n_iter", "converged"),
               "pb": ("nll", "base_nll", "fallback", "tie_rate", "n_iter"), "set-ts": ("at_bound",),
               "grouped-ts": ("nll", "n_iter", "at_bound")}


def _class_data(n=300, k=3, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * 2
    y = np.where(rng.random(n) < 0.8, z.argmax(1), rng.integers(0, k, n))
    d = np.where(np.arange(n) < 6, "tiny", np.where(np.arange(n) % 2 == 0, "cam", "lidar"))
    return z, y, d


def _fit(method, **hyper):
    from confcal.calibrators import METHODS

    z, y, d = _class_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method](**hyper)
        side = {"domains": d} if method in ("grouped-ts", "set-ts") else {}
        cal.fit(z, y, **side)
    return cal, z, side


@pytest.mark.parametrize("method", sorted(DIAGNOSTICS))
def test_a_manifest_without_diagnostics_loads_and_nothing_is_invented(method):
    """Older (format_version 1) manifests may lack nll / n_iter / at_bound (and the other diagnostics): they
    load and predict as before; the loaded calibrator reports them as None (not 0, False or NaN) and writes
    them back absent (before: n_iter 0, at_bound false, nll NaN, and the NaN made the rewritten file unloadable)."""
    from confcal.calibrators import calibrator_from_dict

    cal, z, side = _fit(method)
    m = json.loads(json.dumps(cal.to_dict()))
    holder = m["parameters"]["pooled"] if method == "grouped-ts" else m["parameters"]
    assert set(DIAGNOSTICS[method]) <= set(holder)
    for key in DIAGNOSTICS[method]:
        del holder[key]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: absence is allowed
        back = calibrator_from_dict(json.loads(json.dumps(m)), source="old.json")
    np.testing.assert_allclose(back.predict_proba(z, **side), cal.predict_proba(z, **side), rtol=1e-12, atol=0)
    loaded = back.pooled_ if method == "grouped-ts" else back
    for key in DIAGNOSTICS[method]:
        assert getattr(loaded, key + "_") is None, key
    again = back.to_dict()
    again_holder = again["parameters"]["pooled"] if method == "grouped-ts" else again["parameters"]
    assert not set(DIAGNOSTICS[method]) & set(again_holder)
    calibrator_from_dict(json.loads(json.dumps(again)))  # the rewritten manifest loads


def _grouped_manifests():
    """``{name: (manifest, where the group lists are)}`` of grouped fits with a fallback group."""
    from confcal.calibrators import METHODS

    out = {}
    cal, _, _ = _fit("grouped-ts", min_samples=10)
    out["grouped-ts"] = (cal.to_dict(), "parameters")
    rng = np.random.default_rng(1)
    s = rng.uniform(0.05, 0.95, 600)
    y = (rng.random(600) < s).astype(int)
    cats = np.where(np.arange(600) < 5, 9, np.arange(600) % 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = METHODS["det-platt"](per_class=True, min_samples=10).fit(s, y, category_ids=cats)
        geo = METHODS["det-platt-geo"](per_class=True, min_samples=10, box_features="cx").fit(
            s, y, features=rng.uniform(0, 1, (600, 1)), category_ids=cats)
    out["det-platt"] = (det.to_dict(), "parameters")
    out["det-platt-geo"] = (geo.to_dict(), "parameters")
    return {k: (json.loads(json.dumps(m)), at) for k, (m, at) in out.items()}


GROUPED = _grouped_manifests()


def _group_tamper(p, how):
    groups, fallback, counts = p["groups"], p["fallback_groups"], p["group_counts"]
    if how == "count_dropped":
        counts.pop()
    elif how == "count_of_another_group":
        counts.append([counts[0][0] + ["x"] if isinstance(counts[0][0], list) else "x", 4])
    elif how == "fallback_twice":
        fallback.append(fallback[0])
    elif how == "fallback_with_own_map":
        fallback.append(groups[0][0])
    elif how == "fallback_not_counted":
        fallback.append(["zz"] if isinstance(groups[0][0], list) else "zz")


#: (tamper, the field path the refusal names, words of what it expected)
GROUP_ROWS = [
    ("count_dropped", "group_counts", "one count per group of parameters.groups and parameters.fallback_groups"),
    ("count_of_another_group", r"group_counts\[\d+\]\[0\]", "a group of parameters.groups or "
                                                            "parameters.fallback_groups"),
    ("fallback_twice", r"fallback_groups\[\d+\]", "a group not listed before"),
    ("fallback_with_own_map", r"fallback_groups\[\d+\]", "a group without its own map in parameters.groups"),
    ("fallback_not_counted", "group_counts", "one count per group of parameters.groups and "
                                             "parameters.fallback_groups"),
]


@pytest.mark.parametrize("method", sorted(GROUPED))
@pytest.mark.parametrize(("how", "path", "said"), GROUP_ROWS, ids=[r[0] for r in GROUP_ROWS])
def test_group_lists_that_disagree_are_refused_naming_the_field_and_the_manifest(method, how, path, said):
    """T34 (rest): group_counts / fallback_groups are checked against the groups they describe (before, a
    count for a group without a map, or a fallback group that also had a map, loaded silently; a count of
    another group made route_groups take its rows for a seen group, without the unseen-group warning)."""
    from confcal.calibrators import calibrator_from_dict

    manifest, _ = GROUPED[method]
    assert manifest["parameters"]["fallback_groups"], "the fixture needs a fallback group"
    calibrator_from_dict(json.loads(json.dumps(manifest)))  # untouched: loads
    m = json.loads(json.dumps(manifest))
    _group_tamper(m["parameters"], how)
    with pytest.raises(ValueError) as exc:
        calibrator_from_dict(m, source="g.json")
    text = str(exc.value)
    assert "\n" not in text
    assert re.match(rf"^manifest g\.json: parameters\.{path}: expected {re.escape(said)}.*, got .+", text), text


KEY_FORMS = {"grouped-ts": ["cam", ["cam"], ["cam", "x"]], "det-platt": [0, [], [0, "cam"]],
             "det-platt-geo": [0, [], [0, "cam"]]}  # a good key first, then keys of the wrong form


@pytest.mark.parametrize("method", sorted(KEY_FORMS))
@pytest.mark.parametrize("where", ["groups", "group_counts", "fallback_groups"])
def test_group_keys_of_another_form_than_the_hyper_parameters_give_are_refused(method, where):
    """T34 (rest): a key must have the form its grouping gives it (one id for one column, [id, ...] for
    crossed ones, [category id] for per_class box maps); before, a crossed key in a per-class manifest
    loaded and named no group (its rows took the pooled map), and a plain id raised a TypeError naming no field."""
    from confcal.calibrators import calibrator_from_dict

    manifest, _ = GROUPED[method]
    for bad in KEY_FORMS[method][1:]:
        m = json.loads(json.dumps(manifest))
        p = m["parameters"]
        i = {"groups": 0, "group_counts": 0, "fallback_groups": 0}[where]
        old = p[where][i][0] if where != "fallback_groups" else p[where][i]
        for lst, pos in (("groups", 0), ("group_counts", 0)):  # rename the key everywhere (lists still agree)
            for item in p[lst]:
                if item[0] == old:
                    item[0] = bad
        p["fallback_groups"] = [bad if k == old else k for k in p["fallback_groups"]]
        with pytest.raises(ValueError, match=r"^manifest k\.json: parameters\.(groups|group_counts|fallback_groups)"
                                             r"\[\d+\](\[0\])?: expected a group key of "):
            calibrator_from_dict(m, source="k.json")


def test_a_legacy_grouped_ts_manifest_gets_its_fallback_domains_from_its_counts():
    """confcal 0.1's grouped-ts listed every domain in domain_counts and only those with their own
    temperature in temperatures: the upgrade names the others as fallback groups (the lists then agree)."""
    from confcal.calibrators import calibrator_from_dict

    cal, z, side = _fit("grouped-ts", min_samples=10)
    assert cal.fallback_groups_ == ["tiny"]
    old = cal.to_dict()
    old["parameters"] = {"temperature": cal.pooled_.temperature_,
                         "temperatures": [[k, g.temperature_] for k, g in cal.groups_.items()],
                         "domain_counts": [[k, n] for k, n in cal.group_counts_.items()]}
    back = calibrator_from_dict(json.loads(json.dumps(old)))
    assert back.fallback_groups_ == ["tiny"]
    np.testing.assert_allclose(back.predict_proba(z, **side), cal.predict_proba(z, **side), rtol=1e-12, atol=0)


def _cv_tamper(p, how):
    cv = p["cv_scores"]
    if how == "row_dropped_at_the_choice":
        p["cv_scores"] = [r for r in cv if r[0] != p["reg_lambda"]]
    elif how == "lowest_elsewhere":
        other = next(r for r in cv if r[0] != p["reg_lambda"])
        other[1] = min(r[1] for r in cv) / 2
    elif how == "penalty_twice":
        cv.append(list(cv[0]))
    elif how == "negative_nll":
        cv[0][1] = -1.0


CV_ROWS = [("row_dropped_at_the_choice", "cv_scores", "cross-validated NLLs"),
           ("lowest_elsewhere", "cv_scores", "cross-validated NLLs"),
           ("penalty_twice", "cv_scores", "cross-validated NLLs"),
           ("negative_nll", r"cv_scores\[0\]\[1\]", "a finite number >= 0")]


@pytest.mark.parametrize(("how", "path", "said"), CV_ROWS, ids=[r[0] for r in CV_ROWS])
@pytest.mark.parametrize("where", ["pooled", "group"])
def test_cv_scores_must_describe_the_chosen_penalty(how, path, said, where):
    """T34 (rest): det-platt-geo's cv_scores ([[lambda, held-out NLL], ...]) must choose its reg_lambda
    (each penalty once, the lowest NLL at reg_lambda), in the pooled map and in every group's map."""
    from confcal.calibrators import calibrator_from_dict

    manifest, _ = GROUPED["det-platt-geo"]
    m = json.loads(json.dumps(manifest))
    params = m["parameters"] if where == "pooled" else m["parameters"]["groups"][0][1]
    assert len(params["cv_scores"]) >= 2
    _cv_tamper(params, how)
    with pytest.raises(ValueError) as exc:
        calibrator_from_dict(m, source="geo.json")
    prefix = r"parameters\." if where == "pooled" else r"parameters\.groups\[0\]\[1\]\."
    assert re.match(rf"^manifest geo\.json: {prefix}{path}: expected {re.escape(said)}.*, got .+", str(exc.value)), \
        str(exc.value)


def test_cv_scores_with_reg_fixed_are_refused():
    from confcal.calibrators import calibrator_from_dict

    manifest, _ = GROUPED["det-platt-geo"]
    m = json.loads(json.dumps(manifest))
    m["hyperparameters"]["reg"] = "fixed"
    with pytest.raises(ValueError, match=r"^manifest: parameters\.cv_scores: expected \[\] \(hyper-parameter "
                                         r"reg='fixed' cross-validates nothing\), got \d+ rows$"):
        calibrator_from_dict(m)


def test_a_damaged_group_list_is_refused_by_apply_in_one_line_naming_the_file(tmp_path, capsys):
    """Through the CLI: exit 2, one line naming --calibrator, the manifest file and the field; no output."""
    manifest, _ = GROUPED["grouped-ts"]
    m = json.loads(json.dumps(manifest))
    m["parameters"]["group_counts"].pop()
    (tmp_path / "g.json").write_text(json.dumps(m))
    z, _, d = _class_data()
    np.savez(tmp_path / "v.npz", z=z, d=d)
    code, out, err, _ = _run("apply", "--calibrator", tmp_path / "g.json", "--logits", f"{tmp_path}/v.npz:z",
                             "--domains", f"{tmp_path}/v.npz:d", "-o", tmp_path / "p.npy", capsys=capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"confcal: error: --calibrator: manifest {tmp_path / 'g.json'}: parameters.group_counts: "
                          "expected one count per group"), err
    assert not (tmp_path / "p.npy").exists()


@pytest.mark.parametrize("method", ["grouped-ts", "grouped-ts-base", "det-ts"])
@pytest.mark.parametrize("where", ["pooled", "group"])
def test_a_group_temperature_outside_the_manifests_bounds_is_refused(method, where):
    """T34 (rest): as for a ts manifest, every temperature of a grouped fit (pooled and per group) lies in
    the manifest's [t_min, t_max]; before, a grouped-ts, grouped(base=ts) or det-ts group with T = 1000
    loaded (only the base's table was applied per group, not its rules)."""
    from confcal.calibrators import METHODS, calibrator_from_dict

    if method == "det-ts":
        rng = np.random.default_rng(1)
        s = rng.uniform(0.05, 0.95, 600)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = METHODS["det-ts"](per_class=True).fit(s, (rng.random(600) < s).astype(int),
                                                        category_ids=np.arange(600) % 2)
    elif method == "grouped-ts":
        cal, _, _ = _fit("grouped-ts")
    else:
        z, y, d = _class_data()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = METHODS["grouped"](base="ts").fit(z, y, domains=d)
    m = json.loads(json.dumps(cal.to_dict()))
    calibrator_from_dict(json.loads(json.dumps(m)))
    p = m["parameters"]
    (p["pooled"] if where == "pooled" else p["groups"][1][1])["temperature"] = 1000.0
    at = r"pooled" if where == "pooled" else r"groups\[1\]\[1\]"
    with pytest.raises(ValueError, match=rf"^manifest t\.json: parameters\.{at}\.temperature: expected a number in "
                                         r"\[t_min, t_max\] = \[0\.01, 100\], got 1000\.0$"):
        calibrator_from_dict(m, source="t.json")


@pytest.mark.parametrize("n, k", [(1, 2), (300, 3), (5000, 100), (40_000, 4)])
def test_summary_metrics_equal_the_four_public_metrics(n, k):
    """The fit record's shared-pass summary (float64, up to 32,768 rows) and the whole-array
    path above it give the values of accuracy / ece / nll / brier_score, ties and a zero
    label probability included."""
    from confcal.calibrators.protocol.manifest import summary_metrics
    from confcal.metrics import accuracy, brier_score, ece, nll

    rng = np.random.default_rng(n + k)
    p = rng.dirichlet(np.full(k, 0.3), size=n)
    y = rng.integers(0, k, size=n)
    p[0] = 0.0
    p[0, (y[0] + 1) % k] = 1.0  # the label's probability is 0: nll clips it
    if n > 1:
        p[1] = 1.0 / k  # a tie: the lowest index is the prediction
    got = summary_metrics(p, y)
    want = {"accuracy": accuracy(p, y), "ece": ece(p, y, n_bins=15), "nll": nll(p, y), "brier": brier_score(p, y)}
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-14, abs=1e-15), key


def test_summary_metrics_refuses_invalid_probabilities_with_the_argument_named():
    from confcal.calibrators.protocol.manifest import summary_metrics

    p = np.full((4, 2), 0.5)
    p[2, 0] = np.nan
    with pytest.raises(ValueError, match="probs"):
        summary_metrics(p, [0, 1, 0, 1])
    with pytest.raises(ValueError, match="labels"):
        summary_metrics(np.full((4, 2), 0.5), [0, 1, 2, 1])
