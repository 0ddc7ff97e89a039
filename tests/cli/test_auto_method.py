"""``confcal fit --method auto`` and ``confcal compare --recommend``: the manifest apply reads, the printed
table, and one-line errors that leave no file behind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from confcal.cli import main

pytest.importorskip("torch")


def _softmax(a):
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def biased(tmp_path):
    """Labels from softmax(z / 2 + b), a per-class bias: vs / dirichlet beat TS and move the arg-max."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(1200, 4)) * 3
    p = _softmax(z / 2 + np.array([1.5, -1.0, 0.0, 0.8]))
    y = np.minimum((rng.random(1200)[:, None] > np.cumsum(p, 1)).sum(1), 3)
    np.savez(tmp_path / "val.npz", logits=z, labels=y, domains=np.where(np.arange(1200) % 2, "a", "b"))
    return tmp_path, z, y


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_auto_writes_the_chosen_manifest_and_apply_reads_it(biased, capsys):
    tmp, z, y = biased
    man = tmp / "cal.json"
    code, out, err = _run(capsys, "fit", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels",
                          "--method", "auto", "--allow-accuracy-change", "--param", "n_boot=200", "-o", man, "-q")
    assert code == 0, err
    m = json.loads(man.read_text())
    sel = m["fit"]["selection"]
    assert m["method"] == sel["method"] and sel["chosen"] in {"vs", "dirichlet"}
    assert sel["noise"]["n_boot"] == 200 and sel["allow_accuracy_change"] is True
    assert f"chosen: {sel['chosen']}" in out and "ΔNLL vs ref" in out
    assert "provenance" in m["fit"] and "data_summary" in m["fit"]
    code, out, err = _run(capsys, "apply", "--calibrator", man, "--logits", f"{tmp}/val.npz:logits",
                          "-o", tmp / "p.npy")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp / "p.npy").sum(1), 1.0, rtol=1e-9)


def test_fit_auto_default_keeps_the_arg_max_and_json(biased, capsys):
    tmp, z, y = biased
    code, out, err = _run(capsys, "fit", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels",
                          "--method", "auto", "--param", "n_boot=200", "-o", tmp / "cal.json", "--json", "-q")
    assert code == 0, err
    m = json.loads(out)
    assert m["fit"]["selection"]["chosen"] in {"ts", "ets", "ts+pb"}
    skipped = {r["label"]: r["reason"] for r in m["fit"]["selection"]["candidates"] if r["status"] == "skipped"}
    assert "may change accuracy" in skipped["vs"]


@pytest.mark.parametrize("extra, named", [
    (["--features", "{tmp}/val.npz:logits"], "--features: not used by --method auto"),
    (["--param", "t_max=3"], "--param: --method auto takes n_folds=VALUE"),
    (["--param", "n_folds=1"], "--param: n_folds: expected an integer in [2, 20], got 1"),
    # n_folds=5000 on 5,000 rows ran for more than 10 minutes with no output: capped (cli/_shared/caps.py)
    (["--param", "n_folds=5000"], "--param: n_folds: expected an integer in [2, 20], got 5000"),
    (["--param", "n_folds=2.5"], "--param: n_folds: expected an integer in [2, 20], got 2.5"),
    (["--param", "max_rows=10000000"], "--param: max_rows: expected an integer in [2, 1,000,000], got 10000000"),
    (["--param", "n_boot=50"], "--param: n_boot: expected an integer in [100, 100,000], got 50"),
    (["--param", "random_state=-1"], "--param: random_state: expected an integer in [0, 4,294,967,295], got -1"),
    (["--engine", "dask"], "--engine: --method auto cross-validates in one process"),
])
def test_fit_auto_errors_are_one_line_and_write_nothing(biased, capsys, extra, named):
    tmp, _, _ = biased
    out_file = tmp / "cal.json"
    code, out, err = _run(capsys, "fit", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels",
                          "--method", "auto", "-o", out_file, *[e.format(tmp=tmp) for e in extra])
    assert code != 0
    assert named in err and len(err.strip().splitlines()) == 1, err
    assert not out_file.exists()


def test_allow_accuracy_change_only_with_auto(biased, capsys):
    tmp, _, _ = biased
    code, out, err = _run(capsys, "fit", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels",
                          "--method", "ts", "--allow-accuracy-change", "-o", tmp / "cal.json")
    assert code != 0 and "--allow-accuracy-change: only with --method auto" in err


def test_compare_recommend_marks_and_flags(biased, capsys):
    tmp, _, _ = biased
    base = ["compare", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels", "--splits", "3",
            "--cal-size", "600", "--methods", "vs,dirichlet", "--recommend"]
    code, out, err = _run(capsys, *base)
    assert code == 0, err
    lines = {ln.split()[1] if ln.startswith("*") else ln.split()[0]: ln
             for ln in out.split("recommendation")[1].splitlines()[2:] if ln.strip() and not ln.startswith("chosen")}
    assert lines["ts"].startswith("*")  # ts added; vs / dirichlet move accuracy and are left out
    assert "accuracy +" in lines["vs"] and "accuracy +" in lines["dirichlet"]
    code, out, err = _run(capsys, *base, "--allow-accuracy-change", "--json")
    rec = json.loads(out)["recommendation"]
    assert code == 0 and rec["chosen"] in {"vs", "dirichlet"} and rec["allow_accuracy_change"]


def test_compare_recommend_refusals(biased, capsys):
    tmp, _, _ = biased
    np.savez(tmp / "box.npz", s=np.linspace(0, 1, 50), y=np.arange(50) % 2)
    code, out, err = _run(capsys, "compare", "--logits", f"{tmp}/box.npz:s", "--labels", f"{tmp}/box.npz:y",
                          "--recommend")
    assert code != 0 and "--recommend: for class vectors" in err
    code, out, err = _run(capsys, "compare", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels",
                          "--methods", "ts", "--allow-accuracy-change")
    assert code != 0 and "--allow-accuracy-change: only with --recommend" in err
    code, out, err = _run(capsys, "compare", "--logits", f"{tmp}/val.npz:logits", "--labels", f"{tmp}/val.npz:labels")
    assert code != 0 and "--methods: expected comma-separated method names" in err


def test_auto_caps_accept_their_edges():
    from confcal.cli._shared.caps import AUTO_CAPS, check_auto_params

    for key, (lo, hi) in AUTO_CAPS.items():
        check_auto_params({key: lo})
        check_auto_params({key: hi})
        for bad in (lo - 1, hi + 1, float(lo), True, "5"):
            with pytest.raises(ValueError, match=rf"^--param: {key}: expected an integer in "):
                check_auto_params({key: bad})


def test_fit_auto_says_when_max_rows_leaves_no_search(biased, capsys):
    t, _, _ = biased
    assert main(["fit", "--method", "auto", "--param", "max_rows=10", "--logits", f"{t / 'val.npz'}:logits",
                 "--labels", f"{t / 'val.npz'}:labels", "-o", str(t / "auto.json")]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "fell back" in ln]
    assert err == ["confcal: warning: max_rows: a search sample of 10 of the 1200 rows is too few for 5-fold "
                   "cross-validation (needs 50), so auto fell back to the reference ts without comparing any "
                   "candidate; raise max_rows to at least 50 (CLI: --param max_rows=50)"]
    assert json.loads((t / "auto.json").read_text())["method"] == "ts"
