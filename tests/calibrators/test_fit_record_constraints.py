"""T14 (issue 21): every field of a manifest's fit record is checked on load against its constraint
table (:data:`confcal.calibrators._constraints.FIT_RECORD`: type, range, finiteness, allowed keys).

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
