"""The domain-shift evaluation protocol (Gong et al., ICCV 2021, sec. 5)."""

import csv
import io
import warnings

import numpy as np
import pytest
from scipy.special import softmax as sp_softmax

from confcal.calibrators import (
    ClusterRegressionTemperatureScaling,
    ClusterTemperatureScaling,
    DomainEnsembleTemperatureScaling,
    SetLevelTemperatureScaling,
    SourceGatedTemperatureScaling,
    TemperatureScaling,
)
from confcal.evaluation.domain import (
    METHODS,
    DomainData,
    Split,
    all_splits,
    evaluate_split,
    method_summary,
    target_summary,
)
from confcal.evaluation.domain_tables import (
    CSV_COLUMNS,
    method_summary_table,
    results_to_rows,
    rows_to_csv,
    split_table,
    target_summary_table,
)
from confcal.metrics import bootstrap_ece, improvement_ratio
from tests.conftest import require_shared_data


def make_domain(rng, n, temperature, shift, k=4, d=5):
    """Logits whose labels follow softmax(z / temperature); features offset by ``shift``."""
    z = rng.normal(0, 3, (n, k))
    p = sp_softmax(z / temperature, axis=1)
    y = np.minimum((p.cumsum(1) < rng.random(n)[:, None]).sum(1), k - 1)
    f = rng.normal(shift, 1, (n, d))
    return DomainData(z, y, f)


@pytest.fixture(scope="module")
def domains():
    rng = np.random.default_rng(0)
    # source: well calibrated at T = 1; the shifted domains all need T ~ 2.5
    return {"src": make_domain(rng, 800, 1.0, 0.0), "c1": make_domain(rng, 700, 2.5, 3.0),
            "c2": make_domain(rng, 600, 2.5, -3.0), "tgt": make_domain(rng, 1000, 2.5, 1.0)}


@pytest.fixture(scope="module")
def result(domains):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate_split(domains["src"], {"c1": domains["c1"], "c2": domains["c2"]}, domains["tgt"],
                              split=Split("src", ("c1", "c2"), "tgt"), n_draws=200, random_state=4)


def test_all_splits():
    s = all_splits(["a", "b", "c", "d"], 2)
    assert len(s) == 12 and len(set(s)) == 12
    for sp in s:
        assert len({sp.source, sp.target, *sp.calibration}) == 4
    assert len(all_splits(["a", "b", "c"], 1)) == 6
    with pytest.raises(ValueError, match="n_calibration"):
        all_splits(["a", "b", "c"], 2)
    with pytest.raises(ValueError, match="must all differ"):
        Split("a", ("a",), "b")


def test_every_method_matches_an_independent_recomputation(domains, result):
    """Each row = bootstrap ECE of probabilities from separately fitted calibrators on the same rows."""
    tgt = domains["tgt"]
    rng = np.random.default_rng(4)
    n_fit = int(round(0.2 * len(tgt)))
    perm = rng.permutation(len(tgt))
    fit_idx, ev = np.sort(perm[:n_fit]), np.sort(perm[n_fit:])
    assert (result.n_target_oracle, result.n_target_eval) == (200, 800)
    zc = np.concatenate([domains["c1"].logits, domains["c2"].logits])
    yc = np.concatenate([domains["c1"].labels, domains["c2"].labels])
    fc = np.concatenate([domains["c1"].features, domains["c2"].features])
    z, y, f = tgt.logits[ev], tgt.labels[ev], tgt.features[ev]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probs = {
            "uncalibrated": sp_softmax(z, axis=1),
            "source-only": TemperatureScaling().fit(domains["src"].logits, domains["src"].labels).predict_proba(z),
            "target-only": TemperatureScaling().fit(tgt.logits[fit_idx], tgt.labels[fit_idx]).predict_proba(z),
            "set-ts": SetLevelTemperatureScaling().fit(zc, yc).predict_proba(z),
            "cluster-ts": ClusterTemperatureScaling().fit(zc, yc, features=fc).predict_proba(z, features=f),
            "cluster-ts-regression": ClusterRegressionTemperatureScaling().fit(zc, yc, features=fc)
            .predict_proba(z, features=f),
            "domain-ensemble": DomainEnsembleTemperatureScaling().fit(zc, yc, features=fc)
            .predict_proba(z, features=f),
            "source-gated-ts": SourceGatedTemperatureScaling(source_domain="src").fit(
                np.concatenate([domains["src"].logits, zc]), np.concatenate([domains["src"].labels, yc]),
                features=np.concatenate([domains["src"].features, fc]),
                domains=np.repeat(["src", "c1", "c2"], [len(domains[d]) for d in ("src", "c1", "c2")]))
            .predict_proba(z, features=f),
        }
    assert list(result.methods) == list(METHODS)
    for m in METHODS:
        ref = bootstrap_ece(probs[m], y, n_draws=200, random_state=4)
        r = result.methods[m]
        assert r.ece_mean == pytest.approx(ref.mean, abs=1e-10), m
        assert (r.ece_lo, r.ece_hi, r.ece_std) == pytest.approx((ref.lo, ref.hi, ref.std), abs=1e-10)
        assert r.accuracy == pytest.approx(np.mean(probs[m].argmax(1) == y))
        assert r.ir == pytest.approx(improvement_ratio(r.ece_mean, result.methods["source-only"].ece_mean,
                                                       result.methods["target-only"].ece_mean))
    assert result.methods["uncalibrated"].temperature_mean is None


def test_pooled_calibration_domains_fix_the_source_temperature(result):
    m = result.methods
    # source-only keeps T ~ 1 on a target that needs T ~ 2.5: overconfident
    assert m["source-only"].temperature_mean < 1.3 and m["set-ts"].temperature_mean > 2.0
    assert m["set-ts"].ece_mean < 0.5 * m["source-only"].ece_mean
    assert m["set-ts"].ir > 0.7 and m["domain-ensemble"].ir > 0.7
    assert m["source-only"].ir == 0.0 and m["target-only"].ir == 1.0


def test_tables_and_csv(result, domains):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = evaluate_split(domains["src"], {"c1": domains["c1"]}, domains["c2"],
                               split=Split("src", ("c1",), "c2"), n_draws=20)
    results = [result, other]
    table = split_table(results)
    lines = table.splitlines()
    assert len(lines) == 4 and r"src \| c1\+c2 -> tgt" in table and r"src \| c1 -> c2" in table
    import re
    assert len({len(re.split(r"(?<!\\)\|", ln)) for ln in lines}) == 1  # escaped: one cell per column
    assert f"{100 * result.methods['set-ts'].ece_mean:.2f} ± " in table
    summary = target_summary(results)
    assert [r["target"] for r in summary] == ["tgt", "c2", "all"]
    assert summary[-1]["n_splits"] == 2
    assert summary[-1]["ece_set-ts"] == pytest.approx(np.mean([r.methods["set-ts"].ece_mean for r in results]))
    assert "all" in target_summary_table(results)
    rows = list(csv.DictReader(io.StringIO(rows_to_csv(results_to_rows(results)))))
    assert len(rows) == 2 * len(METHODS) and list(rows[0]) == CSV_COLUMNS
    first = rows[METHODS.index("cluster-ts")]
    assert float(first["ece_mean"]) == result.methods["cluster-ts"].ece_mean  # full precision
    assert first["calibration"] == "c1+c2" and rows[0]["temperature_mean"] == ""


def test_input_errors(domains):
    with pytest.raises(ValueError, match="labels"):
        DomainData(np.zeros((3, 2)), np.array([0, 1, 2]), np.zeros((3, 1)))
    bad = DomainData(domains["tgt"].logits, domains["tgt"].labels, domains["tgt"].features[:, :2])
    with pytest.raises(ValueError, match="features have 5 columns, the target has 2"):
        evaluate_split(domains["src"], {"c1": domains["c1"]}, bad, n_draws=5)
    with pytest.raises(ValueError, match="oracle_fraction"):
        evaluate_split(domains["src"], {"c1": domains["c1"]}, domains["tgt"], oracle_fraction=1.0)
    with pytest.raises(ValueError, match="calibration"):
        evaluate_split(domains["src"], {}, domains["tgt"])


def test_real_surf_split_runs_and_set_level_beats_source_only():
    """amazon -> (dslr + webcam) -> caltech10 with a linear model on SURF histograms."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    root = require_shared_data("domains", "office_caltech10_surf")
    load = {d: np.load(root / f"{d}.npz") for d in ("amazon", "caltech10", "dslr", "webcam")}
    xs = {d: z["features"] / np.maximum(z["features"].sum(1, keepdims=True), 1) for d, z in load.items()}
    ys = {d: z["labels"] for d, z in load.items()}
    perm = np.random.default_rng(0).permutation(len(ys["amazon"]))
    tr, ho = perm[:600], perm[600:]
    sc = StandardScaler().fit(xs["amazon"][tr])
    clf = LogisticRegression(C=1.0, max_iter=300).fit(sc.transform(xs["amazon"][tr]), ys["amazon"][tr])

    def dom(x, y):
        xx = sc.transform(x)
        return DomainData(clf.decision_function(xx), y, xx[:, :50])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = evaluate_split(dom(xs["amazon"][ho], ys["amazon"][ho]),
                             {d: dom(xs[d], ys[d]) for d in ("dslr", "webcam")},
                             dom(xs["caltech10"], ys["caltech10"]), n_draws=50)
    for r in res.methods.values():
        assert np.isfinite(r.ece_mean) and 0 <= r.ece_lo <= r.ece_hi <= 1
    assert res.methods["set-ts"].ece_mean < res.methods["source-only"].ece_mean


def test_method_summary_per_seed(domains):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rs = [evaluate_split(domains["src"], {"c1": domains["c1"]}, domains[t], split=Split("src", ("c1",), t),
                             n_draws=20, random_state=s, gate_params={"n_neighbors": 5})
              for s in (0, 1) for t in ("c2", "tgt")]
    rows = method_summary(rs, margin=0.01)
    assert [(r["seed"], r["method"]) for r in rows] == [(s, m) for s in (0, 1) for m in METHODS]
    for row in rows:
        mine = [r for r in rs if r.seed == row["seed"]]
        e = {m: np.mean([r.methods[m].ece_mean for r in mine]) for m in METHODS}
        assert row["n_splits"] == 2 and row["ece_mean"] == pytest.approx(e[row["method"]])
        assert row["paper_ir"] == pytest.approx((e["source-only"] - e[row["method"]])
                                                / (e["source-only"] - e["target-only"]))
        assert row["n_worse_than_source"] == sum(
            r.methods[row["method"]].ece_mean > r.methods["source-only"].ece_mean + 0.01 for r in mine)
    table = method_summary_table(rs, margin=0.01)
    assert "seed 1 worse than source-only by > 1 pts" in table and len(table.splitlines()) == 2 + len(METHODS)
    gated = next(r for r in rows if r["seed"] == 1 and r["method"] == "source-gated-ts")
    assert f"{100 * gated['ece_mean']:.2f}" in table.splitlines()[-1]
