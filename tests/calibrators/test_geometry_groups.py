"""Per-class and per-domain geometry maps (det-platt-geo, det-beta-geo, det-hist-geo): each group's
map is the method fitted on that group's boxes alone, small or single-label groups and groups
unseen at fit time use the pooled map, and the manifest carries the groups."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from scipy.special import expit, logit

from confcal.calibrators import METHODS, CalibrationWarning, calibrator_from_dict
from confcal.cli import main

GEO = ["det-platt-geo", "det-beta-geo", "det-hist-geo"]


def _boxes(n=2400, seed=0):
    """Two classes whose miscalibration depends on cx in opposite ways, two sensors."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.05, 0.95, n)
    cx = rng.uniform(0, 1, n)
    cls = rng.integers(1, 3, n)
    dom = np.where(rng.uniform(size=n) < 0.5, "cam", "lidar")
    slope = np.where(cls == 1, 1.6 - 1.4 * cx, 0.5 + 1.0 * cx)
    y = (rng.uniform(size=n) < expit(logit(s) * slope)).astype(np.int64)
    return s, cx[:, None], cls, dom, y


@pytest.mark.parametrize("name", GEO)
def test_each_group_map_is_the_method_fitted_on_that_group_alone(name):
    s, f, cls, dom, y = _boxes()
    cal = METHODS[name](box_features="cx", per_class=True).fit(s, y, features=f, category_ids=cls, domains=dom)
    assert sorted(cal.groups_) == [(1, "cam"), (1, "lidar"), (2, "cam"), (2, "lidar")]
    p = cal.predict_proba(s, features=f, category_ids=cls, domains=dom)
    for c in (1, 2):
        for d in ("cam", "lidar"):
            m = (cls == c) & (dom == d)
            alone = METHODS[name](box_features="cx").fit(s[m], y[m], features=f[m])
            np.testing.assert_allclose(p[m], alone.predict_proba(s[m], features=f[m]), rtol=0, atol=1e-12)
    pooled = METHODS[name](box_features="cx").fit(s, y, features=f)
    # the pooled map (the fallback) is the ungrouped fit on all boxes; unseen groups use it, with a warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = cal.predict_proba(s[:5], features=f[:5], category_ids=np.full(5, 9), domains=dom[:5])
    assert any("not seen at fit time" in str(w.message) for w in caught)
    np.testing.assert_allclose(q, pooled.predict_proba(s[:5], features=f[:5]), rtol=0, atol=1e-12)


def test_per_class_beats_the_pooled_map_when_classes_differ():
    s, f, cls, dom, y = _boxes(n=6000, seed=1)
    st_, ft, ct, _, _ = _boxes(n=4000, seed=2)
    slope = np.where(ct == 1, 1.6 - 1.4 * ft[:, 0], 0.5 + 1.0 * ft[:, 0])
    truth = expit(logit(st_) * slope)
    grouped = METHODS["det-platt-geo"](box_features="cx", per_class=True).fit(s, y, features=f, category_ids=cls)
    pooled = METHODS["det-platt-geo"](box_features="cx").fit(s, y, features=f)
    err_g = np.abs(grouped.predict_proba(st_, features=ft, category_ids=ct)[:, 1] - truth).mean()
    err_p = np.abs(pooled.predict_proba(st_, features=ft)[:, 1] - truth).mean()
    assert err_g < 0.5 * err_p, (err_g, err_p)


def test_small_and_single_label_groups_fall_back_with_one_warning():
    s, f, cls, dom, y = _boxes(n=600, seed=3)
    cls = cls.copy()
    cls[:10] = 7  # 10 boxes: below min_samples
    cls[10:70] = 8
    y = y.copy()
    y[10:70] = 1  # one label only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        cal = METHODS["det-beta-geo"](box_features="cx", per_class=True, min_samples=50).fit(
            s, y, features=f, category_ids=cls)
    text = " ".join(str(w.message) for w in caught)
    assert "fewer than min_samples=50" in text and "one label only" in text
    assert set(cal.fallback_groups_) == {(7,), (8,)}
    pooled = METHODS["det-beta-geo"](box_features="cx").fit(s, y, features=f)
    np.testing.assert_allclose(cal.predict_proba(s[:70], features=f[:70], category_ids=cls[:70]),
                               pooled.predict_proba(s[:70], features=f[:70]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", GEO)
def test_grouped_manifest_round_trips_and_refuses_missing_group_inputs(name):
    s, f, cls, dom, y = _boxes(n=1200, seed=4)
    cal = METHODS[name](box_features="cx").fit(s, y, features=f, domains=dom)
    back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(back.predict_proba(s, features=f, domains=dom),
                                  cal.predict_proba(s, features=f, domains=dom))
    with pytest.raises(ValueError, match="domains"):
        back.predict_proba(s, features=f)
    bad = cal.to_dict()
    bad["parameters"]["groups"][0][1]["feature_names"] = ["cy"]
    with pytest.raises(ValueError, match="groups"):
        calibrator_from_dict(bad)
    # an ungrouped manifest keeps the old layout (no group fields)
    plain = METHODS[name](box_features="cx").fit(s, y, features=f).to_dict()["parameters"]
    assert not {"groups", "by_domain", "group_counts", "fallback_groups"} & set(plain)


def test_cli_per_class_fit_apply_equals_python(tmp_path, capsys):
    s, f, cls, dom, y = _boxes(n=1500, seed=5)
    np.savez(tmp_path / "m.npz", score=s, cx=f[:, 0], category_id=cls, domain=dom, correct=y)
    m = f"{tmp_path}/m.npz"
    man, out = tmp_path / "g.json", tmp_path / "p.npy"
    assert main(["fit", "--method", "det-platt-geo", "--logits", f"{m}:score", "--labels", f"{m}:correct",
                 "--box-features", "cx", "--per-class", "--category-ids", f"{m}:category_id",
                 "--domains", f"{m}:domain", "-o", str(man)]) == 0
    assert main(["apply", "--calibrator", str(man), "--logits", f"{m}:score", "--category-ids", f"{m}:category_id",
                 "--domains", f"{m}:domain", "-o", str(out)]) == 0
    want = METHODS["det-platt-geo"](box_features="cx", per_class=True).fit(
        s, y, features=f, category_ids=cls, domains=dom).predict_proba(s, features=f, category_ids=cls, domains=dom)
    np.testing.assert_allclose(np.load(out), want, rtol=0, atol=1e-12)
    capsys.readouterr()
    assert main(["apply", "--calibrator", str(man), "--logits", f"{m}:score", "--domains", f"{m}:domain",
                 "-o", str(tmp_path / "q.npy")]) == 2
    assert "category" in capsys.readouterr().err and not (tmp_path / "q.npy").exists()
