"""Issue 40, defect 11: ``report --n-bins 100000`` on 600 rows ran 505 s, took 6.5 GB and wrote 145 MB.
The bins are capped by what the rows support (one per row) and by REPORT_MAX_BINS, refused naming the
limit before any page is built."""

from __future__ import annotations

import time

import numpy as np
import pytest

from confcal.cli import main
from confcal.report import REPORT_MAX_BINS, build_report, check_report_bins


@pytest.fixture
def fitted(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(60, 3)) * 2
    y = np.where(rng.random(60) < 0.7, z.argmax(1), rng.integers(0, 3, 60))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "ts",
                 "-o", str(tmp_path / "ts.json"), "-q"]) == 0
    return tmp_path


@pytest.mark.parametrize("bins, limit", [(100_000, 60), (61, 60)])
def test_report_refuses_more_bins_than_rows(fitted, capsys, bins, limit):
    t0 = time.perf_counter()
    assert main(["report", "--logits", str(fitted / "z.npy"), "--labels", str(fitted / "y.npy"), "--calibrator",
                 str(fitted / "ts.json"), "--n-bins", str(bins), "-o", str(fitted / "r.html"), "-q"]) == 2
    assert time.perf_counter() - t0 < 30
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"confcal: error: --n-bins: expected an integer in [1, {limit}] (60 rows") and "\n" not in err
    assert not (fitted / "r.html").exists() and not (fitted / "r.numbers.json").exists()


def test_report_takes_one_bin_per_row(fitted):
    assert main(["report", "--logits", str(fitted / "z.npy"), "--labels", str(fitted / "y.npy"), "--calibrator",
                 str(fitted / "ts.json"), "--n-bins", "60", "-o", str(fitted / "r.html"), "-q"]) == 0


def test_library_limit():
    assert check_report_bins(15, 10_000) == 15
    with pytest.raises(ValueError, match=rf"n_bins: expected an integer in \[1, {REPORT_MAX_BINS}\]"):
        check_report_bins(REPORT_MAX_BINS + 1, 10 ** 6)
    with pytest.raises(ValueError, match=r"n_bins: expected an integer in \[1, 1\]"):
        build_report({"uncalibrated": np.array([[0.6, 0.4]])}, np.array([0]), n_bins=2)
