"""Above ``SPREAD_ROWS`` rows both engines summarise (``fit``) and check (``apply``) the same rows:
20 evenly spread blocks at the same global positions (:func:`confcal.passes.spread_ranges`), so
the manifests' ``data_summary`` are equal and ``apply`` warns alike. The constant is lowered (both
engines read it from :mod:`confcal.passes`) so real CIFAR-100 / KITTI outputs exceed it; the
blocks then straddle the datasets' uneven file boundaries."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import confcal.passes as passes
from tests.dask.conftest import write_dataset

#: floats of the summary: the same rows through the same function (exp/log inside), so equal up to
#: the summation order of class frequencies (none here), within this relative tolerance
REL = 1e-12
SPREAD = 2_000  # 20 blocks of 100 rows out of 10,000 (CIFAR-100) / ~4,000 (KITTI) rows


def _cli(capsys, *argv):
    """Exit code and the warnings the CLI printed (``confcal: warning: ...`` lines on stderr)."""
    from confcal.cli import main

    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, sorted(line for line in err.splitlines() if "warning" in line and "dask" not in line.lower())


def _same(got, want, path=""):
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            _same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=REL, abs=0), path
    else:
        assert got == want, path


@pytest.fixture
def small_spread(monkeypatch):
    monkeypatch.setattr(passes, "SPREAD_ROWS", SPREAD)


def test_spread_rows_are_the_same_global_rows(dask_client, cifar_dataset, small_spread):
    from confcal.dask import read_parquet, spread_rows

    folder, logits, _, domains = cifar_dataset
    ranges = passes.spread_ranges(len(logits))
    assert len(ranges) == 20 and sum(b - a for a, b in ranges) == SPREAD
    idx = np.concatenate([np.arange(a, b) for a, b in ranges])
    # a Dask DataFrame's partitions say no row offsets: counted first, the same global rows
    for data in (read_parquet(str(folder)), read_parquet(str(folder)).to_dask()):
        got = spread_rows(data, logits="logits", domains="domain")
        assert np.array_equal(got["logits"], logits[idx]) and np.array_equal(got["domains"], domains[idx])


@pytest.mark.parametrize(("method", "data"), [("ts", "cifar"), ("grouped-ts", "cifar"), ("isotonic", "cifar"),
                                              ("det-platt", "kitti")])
def test_fit_summary_equal_above_spread_rows(dask_client, cifar_dataset, kitti_dataset, tmp_path, small_spread,
                                             method, data, capsys):
    """A full-data fit (the rows ride along its first pass) and a sample fit (one pass over the
    partitions holding them) record the single-process summary of the same spread rows."""
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    if data == "cifar":
        folder, logits, labels, domains = cifar_dataset
        cols = {"logits": "logits", "labels": "label", "domains": "domain"}
        arrays = {"logits": logits, "label": labels, "domain": domains}
    else:
        folder, scores, correct, domains = kitti_dataset
        cols = {"logits": "score", "labels": "correct", "domains": "domain"}
        arrays = {"score": scores, "correct": correct, "domain": domains}
    assert len(arrays[cols["logits"]]) > SPREAD
    npz = tmp_path / "data.npz"
    np.savez(npz, **arrays)
    man_l, man_d = tmp_path / "local.json", tmp_path / "dask.json"
    side = ["--domains"] if method in ("grouped-ts", "det-platt") else []
    args = lambda src: ["--logits", f"{src}:{cols['logits']}", "--labels", f"{src}:{cols['labels']}",  # noqa: E731
                        *([side[0], f"{src}:{cols['domains']}"] if side else [])]
    assert _cli(capsys, "fit", "--method", method, *args(npz), "-o", man_l)[0] == 0
    assert _cli(capsys, "fit", "--method", method, *args(folder), "-o", man_d, *sched)[0] == 0
    want = json.loads(man_l.read_text())["fit"]["data_summary"]
    got = json.loads(man_d.read_text())["fit"]["data_summary"]
    assert want["n"] == SPREAD
    _same(got, want)

    # apply's drift check reads the same rows on both engines: on the same data no warning, on
    # over-confident (scaled) logits / shifted scores the same warning naming the same groups
    from confcal.dask import read_parquet  # noqa: F401  (the extra is there)

    shifted = dict(arrays)
    x = arrays[cols["logits"]]
    shifted[cols["logits"]] = (x * 4.0).astype(x.dtype) if x.ndim == 2 else np.clip(x ** 4, 1e-6, 1 - 1e-6)
    np.savez(tmp_path / "new.npz", **shifted)
    write_dataset(tmp_path / "new.parquet", shifted, n_parts=5)
    for src_l, src_d in ((npz, folder), (tmp_path / "new.npz", tmp_path / "new.parquet")):
        a = ["--logits", f"{{}}:{cols['logits']}"] + (["--domains", f"{{}}:{cols['domains']}"] if side else [])
        code_l, warn_l = _cli(capsys, "apply", "--calibrator", man_d, *[s.format(src_l) for s in a],
                              "-o", tmp_path / "p.npy")
        code_d, warn_d = _cli(capsys, "apply", "--calibrator", man_d, *[s.format(src_d) for s in a],
                              "-o", tmp_path / "p.parquet", *sched)
        assert code_l == code_d == 0
        assert warn_l == warn_d
        if src_l != npz:
            assert any("differs from the calibration data" in w for w in warn_d), warn_d


def test_spread_ranges_rule():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.integers(0, 10**9))
    def check(n):
        r = passes.spread_ranges(n)
        if n <= passes.SPREAD_ROWS:
            assert r == [(0, n)]
            return
        per = passes.SPREAD_ROWS // passes.SPREAD_BLOCKS
        assert len(r) == passes.SPREAD_BLOCKS and r[0][0] == 0 and r[-1][1] == n
        assert all(b - a == per for a, b in r)
        assert all(r[i][1] <= r[i + 1][0] for i in range(len(r) - 1))  # increasing, disjoint

    check()


def test_clipped_box_score_summary_equal_on_both_engines(dask_client, tmp_path, capsys):
    """det-ts with clip_scores=True on KITTI's raw scores (152 above 1): both engines record the summary of
    the clipped scores, which their own loader accepts (it was rejected: quantiles above 1 as probabilities)."""
    from tests.conftest import require_shared_data

    d = np.load(require_shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    arrays = {"score": d["score"].astype(np.float64), "correct": d["label"].astype(np.int64)}
    assert (arrays["score"] > 1).sum() > 100
    npz, folder = tmp_path / "k.npz", tmp_path / "k.parquet"
    np.savez(npz, **arrays)
    write_dataset(folder, arrays, n_parts=5)
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    fit = ["fit", "--method", "det-ts", "--param", "clip_scores=true"]
    man_l, man_d = tmp_path / "local.json", tmp_path / "dask.json"
    assert _cli(capsys, *fit, "--logits", f"{npz}:score", "--labels", f"{npz}:correct", "-o", man_l) == (0, [])
    assert _cli(capsys, *fit, "--logits", f"{folder}:score", "--labels", f"{folder}:correct", "-o", man_d,
                *sched)[0] == 0
    want = json.loads(man_l.read_text())["fit"]["data_summary"]
    got = json.loads(man_d.read_text())["fit"]["data_summary"]
    assert want["clip_scores"] is True and max(want["confidence_quantiles"]) == 1.0
    _same(got, want)
    code, said = _cli(capsys, "apply", "--calibrator", man_d, "--logits", f"{npz}:score", "-o", tmp_path / "p.npy")
    assert code == 0 and said == []
