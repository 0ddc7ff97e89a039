"""``confcal domain-eval`` and the domain methods through the generic ``fit``/``apply``."""

import csv
import json
import warnings

import numpy as np
import pytest
from scipy.special import softmax as sp_softmax

from confcal.calibrators import ClusterTemperatureScaling
from confcal.cli import main
from confcal.evaluation.domain import METHODS


def run(*argv):
    return main([str(a) for a in argv])


def domain_arrays(rng, n, temperature, shift, k=3, d=4):
    z = rng.normal(0, 3, (n, k))
    p = sp_softmax(z / temperature, axis=1)
    y = np.minimum((p.cumsum(1) < rng.random(n)[:, None]).sum(1), k - 1)
    return z, y, rng.normal(shift, 1, (n, d))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dom")
    rng = np.random.default_rng(0)
    out = {}
    for name, (n, t, s) in {"src": (300, 1.0, 0), "a": (300, 2.0, 2), "b": (300, 2.0, -2),
                            "c": (400, 2.0, 1)}.items():
        z, y, f = domain_arrays(rng, n, t, s)
        np.savez(d / f"{name}.npz", logits=z, labels=y, features=f)
        out[name] = d / f"{name}.npz"
    return d, out


def test_domain_eval_tables_and_csv(files, capsys):
    d, f = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = run("domain-eval", *[x for k, p in f.items() for x in ("--domain", f"{k}={p}")],
                 "--source", "src", "--draws", 30, "--param", "n_clusters=3", "--csv", d / "rows.csv")
    assert rc == 0
    out = capsys.readouterr().out
    assert "per split:" in out and "per target:" in out
    for split in ("src | b+c -> a", "src | a+c -> b", "src | a+b -> c"):
        assert split in out
    rows = list(csv.DictReader(open(d / "rows.csv")))
    assert len(rows) == 3 * len(METHODS)
    assert {r["method"] for r in rows} == set(METHODS)


def test_domain_eval_one_target_one_calibration_domain(files, capsys):
    d, f = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run("domain-eval", *[x for k, p in f.items() for x in ("--domain", f"{k}={p}")],
                   "--source", "src", "--target", "c", "--n-calibration", 1, "--draws", 10) == 0
    out = capsys.readouterr().out
    assert "src | a -> c" in out and "src | b -> c" in out and "-> a" not in out


@pytest.mark.parametrize("extra, message", [
    (("--source", "nope"), "--source: 'nope' is not one of the domains"),
    (("--source", "src", "--target", "src"), "--target: 'src' must be one of the non-source domains"),
    (("--source", "src", "--n-calibration", 3), "--n-calibration: expected 1..2"),
    (("--source", "src", "--keys", "logits,labels"), "--keys: expected three"),
])
def test_domain_eval_errors(files, capsys, extra, message):
    d, f = files
    rc = run("domain-eval", *[x for k, p in f.items() for x in ("--domain", f"{k}={p}")], *extra)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_domain_eval_missing_array_names_the_file(files, tmp_path, capsys):
    d, f = files
    np.savez(tmp_path / "bad.npz", logits=np.zeros((5, 3)), labels=np.zeros(5, int))
    rc = run("domain-eval", "--domain", f"src={f['src']}", "--domain", f"a={f['a']}", "--domain",
             f"bad={tmp_path / 'bad.npz'}", "--source", "src", "--n-calibration", 1)
    assert rc == 2
    assert "features" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["set-ts", "cluster-ts", "cluster-ts-regression", "domain-ensemble"])
def test_generic_fit_and_apply_with_features_and_domains(tmp_path, method, capsys):
    rng = np.random.default_rng(1)
    za, ya, fa = domain_arrays(rng, 300, 0.7, 2)
    zb, yb, fb = domain_arrays(rng, 300, 2.5, -2)
    z, y, feats = np.concatenate([za, zb]), np.concatenate([ya, yb]), np.concatenate([fa, fb])
    dom = np.array(["a"] * 300 + ["b"] * 300)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "f.npy", feats)
    np.save(tmp_path / "d.npy", dom)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run("fit", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy", "--method", method,
                   "--features", tmp_path / "f.npy", "--domains", tmp_path / "d.npy",
                   "--param", "n_clusters=4" if method != "set-ts" else "domain_weighting=domain",
                   "-o", tmp_path / "cal.json") == 0
        assert run("apply", "--calibrator", tmp_path / "cal.json", "--logits", tmp_path / "z.npy",
                   "--features", tmp_path / "f.npy", "-o", tmp_path / "p.npy") == 0
    manifest = json.loads((tmp_path / "cal.json").read_text())
    assert manifest["method"] == method
    p = np.load(tmp_path / "p.npy")
    assert p.shape == (600, 3) and np.allclose(p.sum(1), 1)
    if method == "cluster-ts":
        ref = ClusterTemperatureScaling(n_clusters=4).fit(z, y, features=feats)
        np.testing.assert_array_equal(p, ref.predict_proba(z, features=feats))
        assert len(manifest["parameters"]["centroids"]) == 4
    if method != "set-ts":
        # cluster-level methods need the features at apply time; the error names them
        capsys.readouterr()
        assert run("apply", "--calibrator", tmp_path / "cal.json", "--logits", tmp_path / "z.npy",
                   "-o", tmp_path / "q.npy") == 2
        assert "features" in capsys.readouterr().err


def test_domain_eval_seeds_and_gate_param(files, capsys):
    d, f = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = run("domain-eval", *[x for k, p in f.items() for x in ("--domain", f"{k}={p}")],
                 "--source", "src", "--target", "c", "--draws", 10, "--param", "n_clusters=3",
                 "--gate-param", "n_neighbors=5", "--seeds", 0, 1, "--csv", d / "seeds.csv")
    assert rc == 0
    out = capsys.readouterr().out
    assert "seed 0 src | a+b -> c" in out and "seed 1 src | a+b -> c" in out
    assert "per method" in out and "seed 1 paper-IR" in out and "source-gated" in out
    rows = list(csv.DictReader(open(d / "seeds.csv")))
    assert len(rows) == 2 * len(METHODS) and {r["seed"] for r in rows} == {"0", "1"}
    # seed 0 of a two-seed run is the same run as --seed 0 alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run("domain-eval", *[x for k, p in f.items() for x in ("--domain", f"{k}={p}")], "--source", "src",
            "--target", "c", "--draws", 10, "--param", "n_clusters=3", "--gate-param", "n_neighbors=5",
            "--csv", d / "one.csv")
    one = list(csv.DictReader(open(d / "one.csv")))
    assert [r["ece_mean"] for r in one] == [r["ece_mean"] for r in rows if r["seed"] == "0"]


def test_generic_fit_and_apply_source_gated(tmp_path, capsys):
    rng = np.random.default_rng(2)
    parts = [domain_arrays(rng, 200, t, s) for t, s in ((1.0, 0), (2.5, 3), (2.5, -3))]
    z, y, feats = (np.concatenate([p[i] for p in parts]) for i in range(3))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "f.npy", feats)
    np.save(tmp_path / "d.npy", np.repeat(["src", "a", "b"], 200))
    common = ["--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy", "--features", tmp_path / "f.npy",
              "--domains", tmp_path / "d.npy", "--method", "source-gated-ts"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run("fit", *common, "--param", "source_domain=src", "--param", 'base_params={"n_clusters": 3}',
                   "-o", tmp_path / "cal.json") == 0
        assert run("apply", "--calibrator", tmp_path / "cal.json", "--logits", tmp_path / "z.npy",
                   "--features", tmp_path / "f.npy", "-o", tmp_path / "p.npy") == 0
    p = np.load(tmp_path / "p.npy")
    assert p.shape == (600, 3) and np.allclose(p.sum(1), 1)
    capsys.readouterr()
    assert run("fit", *common, "--param", "source_domain=nope", "-o", tmp_path / "bad.json") == 2
    assert "source_domain: 'nope' is not among the fit domains" in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()
    assert run("apply", "--calibrator", tmp_path / "cal.json", "--logits", tmp_path / "z.npy",
               "-o", tmp_path / "q.npy") == 2
    assert "features" in capsys.readouterr().err
