"""Numeric options have documented caps (issue 21): beyond them a one-line error naming the option and
exit 2, at once (no minutes of work, no MemoryError); at the cap edge the value is accepted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from confcal.cli import main
from confcal.cli._shared.caps import CAPS


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(200, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 200))
    return tmp_path


@pytest.mark.parametrize("argv, option", [
    (["report", "--bootstrap", "10000000"], "--bootstrap"),
    (["evaluate", "--n-bins", "1000000000"], "--n-bins"),
    (["compare", "--methods", "ts", "--splits", "100000"], "--splits"),
    (["compare", "--methods", "ts", "--jobs", "100000"], "--jobs"),
    (["evaluate", "--engine", "dask", "--workers", "100000"], "--workers"),
    (["compare", "--methods", "ts", "--seed", "-1"], "--seed"),
])
def test_numeric_flag_over_its_cap(files, argv, option, capsys):
    cmd, *rest = argv
    common = ["--logits", str(files / "z.npy"), "--labels", str(files / "y.npy")]
    if cmd == "report":
        common += ["--calibrator", str(files / "c.json"), "-o", str(files / "r.html")]
    t0 = time.perf_counter()
    assert main([cmd, *common, *rest]) == 2
    assert time.perf_counter() - t0 < 10
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"confcal: error: {option}: expected an integer in") and "\n" not in err
    assert not (files / "r.html").exists()


def test_cap_edge_accepted(files):
    lo, hi = CAPS["splits"]
    assert (lo, hi) == (1, 1_000)
    assert main(["compare", "--logits", str(files / "z.npy"), "--labels", str(files / "y.npy"), "--methods", "ts",
                 "--splits", "1", "--cal-size", "100"]) == 0
