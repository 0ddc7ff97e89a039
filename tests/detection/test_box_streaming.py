"""Streamed det-ts / det-platt fits (``fit`` on sources: every Newton pass reads row batches)
equal the in-memory fits, batch size whatever, with the same groups, fallbacks, record and digest."""

import math
import warnings

import numpy as np
import pytest

import confcal.sources
from confcal.calibrators import METHODS, CalibrationWarning


def _data(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z / 1.7 + 0.2))).astype(np.int64)
    s = (1 / (1 + np.exp(-z))).astype(np.float32)
    d = np.where(rng.random(n) < 0.3, "cam", "lidar")
    d[:5] = "radar"  # a small domain: it falls back to the pooled map
    c = rng.integers(0, 3, n)
    w = rng.uniform(0, 2, n)
    w[rng.random(n) < 0.1] = 0.0
    return s, y, d, c, w


def _files(tmp_path, **arrays):
    out = {}
    for k, v in arrays.items():
        np.save(tmp_path / f"{k}.npy", v)
        out[k] = confcal.sources.open_source(str(tmp_path / f"{k}.npy"))
    return out


def _same(a, b, method):
    if method == "det-ts":
        assert abs(math.log(a["temperature"]) - math.log(b["temperature"])) < 1e-9
        assert a["bias"] == pytest.approx(b["bias"], rel=1e-9, abs=1e-12)
    else:
        assert a["a"] == pytest.approx(b["a"], rel=1e-9, abs=1e-12)
        assert a["b"] == pytest.approx(b["b"], rel=1e-9, abs=1e-12)
    assert a["at_bound"] == b["at_bound"]


@pytest.mark.parametrize("batch_bytes", [96, 4096, 1 << 26])
@pytest.mark.parametrize("method, params, side, weighted", [
    ("det-ts", {}, (), False),
    ("det-ts", {"bias": True, "per_class": True}, ("domains", "category_ids"), True),
    ("det-ts", {"input_kind": "logits"}, ("domains",), False),
    ("det-platt", {}, ("domains",), True),
    ("det-platt", {"increasing": False, "platt_targets": False, "per_class": True}, ("category_ids",), False),
])
def test_streamed_fit_equals_in_memory(tmp_path, monkeypatch, batch_bytes, method, params, side, weighted):
    s, y, d, c, w = _data()
    if params.get("input_kind") == "logits" or method == "det-platt":
        s = np.log(s) - np.log1p(-s)
    arrays = {"scores": s, "labels": y, "domains": d, "category_ids": c, "w": w}
    f = _files(tmp_path, **arrays)
    kw = {k: arrays[k] for k in side}
    monkeypatch.setattr(confcal.sources, "DEFAULT_BATCH_BYTES", batch_bytes)
    with warnings.catch_warnings(record=True) as mem_w:
        warnings.simplefilter("always")
        ref = METHODS[method](**params).fit(s, y, sample_weight=w if weighted else None, **kw)
    with warnings.catch_warnings(record=True) as st_w:
        warnings.simplefilter("always")
        got = METHODS[method](**params).fit(f["scores"], f["labels"], sample_weight=f["w"] if weighted else None,
                                            **{k: f[k] for k in side})
    assert "n_passes" in got.fit_record_  # it streamed
    _same(got.pooled_, ref.pooled_, method)
    assert sorted(got.groups_) == sorted(ref.groups_)
    for g in ref.groups_:
        _same(got.groups_[g], ref.groups_[g], method)
    assert got.group_counts_ == ref.group_counts_ and got.fallback_groups_ == ref.fallback_groups_
    assert got.by_domain_ == ref.by_domain_
    for which in ("metrics_before", "metrics_after"):
        for key, value in ref.fit_record_[which].items():
            assert got.fit_record_[which][key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    for key in ("n_samples", "input_kind", "n_left_out"):
        assert got.fit_record_[key] == ref.fit_record_[key]
    assert [str(m.message) for m in st_w if m.category is CalibrationWarning] == \
        [str(m.message) for m in mem_w if m.category is CalibrationWarning]
    np.testing.assert_allclose(got.predict_proba(s[:200], **{k: v[:200] for k, v in kw.items()}),
                               ref.predict_proba(s[:200], **{k: v[:200] for k, v in kw.items()}),
                               rtol=1e-9, atol=1e-12)


def test_digest_equals_the_in_memory_one(tmp_path):
    s, y, *_ = _data()
    f = _files(tmp_path, scores=s, labels=y)
    ref = METHODS["det-platt"]().fit(s, y)
    got = METHODS["det-platt"]().fit(f["scores"], f["labels"])
    assert got.fit_record_["data_sha256"] == ref.fit_record_["data_sha256"]


def test_saturated_scores_warn_once_with_the_total_count(tmp_path, monkeypatch):
    s, y, *_ = _data()
    s[:7] = 1.0
    s[-3:] = 0.0
    f = _files(tmp_path, scores=s, labels=y)
    monkeypatch.setattr(confcal.sources, "DEFAULT_BATCH_BYTES", 4096)
    with pytest.warns(CalibrationWarning, match=r"10 of 3000 probability scores are exactly 0 or 1") as rec:
        METHODS["det-ts"]().fit(f["scores"], f["labels"])
    assert sum("saturated" in str(r.message) for r in rec) == 1


def test_bad_rows_are_named_by_their_index_in_the_whole_data(tmp_path, monkeypatch):
    s, y, *_ = _data()
    s[2345] = np.nan
    f = _files(tmp_path, scores=s, labels=y)
    monkeypatch.setattr(confcal.sources, "DEFAULT_BATCH_BYTES", 4096)
    with pytest.raises(ValueError, match="expected finite scores, got nan at index 2345"):
        METHODS["det-ts"]().fit(f["scores"], f["labels"])
    s[2345] = 1.5
    f = _files(tmp_path, scores=s, labels=y)
    with pytest.raises(ValueError, match="got 1.5 at index 2345"):
        METHODS["det-ts"]().fit(f["scores"], f["labels"])
    y[2999] = 2
    f = _files(tmp_path, scores=np.clip(s, 0, 1), labels=y)
    with pytest.raises(ValueError, match="labels"):
        METHODS["det-platt"]().fit(f["scores"], f["labels"])


def test_per_class_needs_category_ids_and_det_beta_reads_whole(tmp_path):
    s, y, d, c, _ = _data()
    f = _files(tmp_path, scores=s, labels=y)
    with pytest.raises(ValueError, match="category_ids"):
        METHODS["det-ts"](per_class=True).fit(f["scores"], f["labels"])
    beta = METHODS["det-beta"]().fit(f["scores"], f["labels"])  # not a full-data sum: loaded, then fitted
    ref = METHODS["det-beta"]().fit(s, y)
    assert beta.pooled_ == ref.pooled_ and "n_passes" not in beta.fit_record_


def test_cli_fit_streams_parquet_box_scores(tmp_path, monkeypatch):
    """``confcal fit --method det-ts`` on a Parquet file goes through the streamed fit."""
    import json

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from confcal.cli import main

    s, y, d, c, _ = _data()
    pq.write_table(pa.table({"score": s, "hit": y, "domain": d}), tmp_path / "boxes.parquet", row_group_size=700)
    monkeypatch.setattr(confcal.sources, "DEFAULT_BATCH_BYTES", 8192)
    out = tmp_path / "det.json"
    p = str(tmp_path / "boxes.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        assert main(["fit", "--method", "det-ts", "--param", "bias=true", "--logits", f"{p}:score",
                     "--labels", f"{p}:hit", "--domains", f"{p}:domain", "-o", str(out)]) == 0
        ref = METHODS["det-ts"](bias=True).fit(s, y, domains=d)
    man = json.loads(out.read_text())
    assert man["fit"]["n_passes"] >= 3
    _same(man["parameters"]["pooled"], ref.pooled_, "det-ts")
    for key, params in man["parameters"]["groups"]:
        _same(params, ref.groups_[tuple(key)], "det-ts")


@pytest.mark.parametrize("method", ["det-ts", "det-platt"])
def test_bool_true_positive_flags_read_as_one_and_zero(method, tmp_path):
    rng = np.random.default_rng(5)
    s = rng.uniform(0.01, 0.99, 600)
    flags = rng.random(600) < s
    ref = METHODS[method](input_kind="probs").fit(s, flags.astype(np.int64))
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", flags)
    for cal in (METHODS[method](input_kind="probs").fit(s, flags),
                METHODS[method](input_kind="probs").fit(confcal.sources.open_source(str(tmp_path / "s.npy")),
                                                          confcal.sources.open_source(str(tmp_path / "y.npy")))):
        np.testing.assert_array_equal(cal.predict_proba(s), ref.predict_proba(s))
