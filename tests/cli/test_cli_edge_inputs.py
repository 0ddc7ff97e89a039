"""Edge inputs of drift, evaluate and dask apply: NaN logits to drift, a per-domain table with a
calibrator fitted without domains, an output folder inside the input dataset."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.cli import main


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 4)) * 3).astype(np.float32)
    y = rng.integers(0, 4, 300)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", np.array(["a", "b", "c"])[y % 3])
    assert main(["fit", "--method", "ts", "--logits", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "ts.json"), "-q"]) == 0
    return tmp_path, x


def test_drift_refuses_nan_logits(files, capsys):
    tmp, x = files
    bad = x.copy()
    bad[5, 1] = np.nan
    np.save(tmp / "nan.npy", bad)
    capsys.readouterr()
    assert main(["drift", "--calibrator", str(tmp / "ts.json"), "--logits", str(tmp / "nan.npy"),
                 "--fail-on-drift"]) == 2
    assert "row 5" in capsys.readouterr().err


def test_evaluate_domains_table_with_a_calibrator_that_takes_none(files, capsys):
    tmp, _ = files
    assert main(["evaluate", "--calibrator", str(tmp / "ts.json"), "--logits", str(tmp / "x.npy"), "--labels",
                 str(tmp / "y.npy"), "--domains", str(tmp / "d.npy"), "--json"]) == 0


def test_dask_apply_refuses_output_inside_its_input(files, capsys):
    pytest.importorskip("distributed")
    tmp, _ = files
    (tmp / "ds").mkdir()
    # refused before any cluster starts or any file is touched
    assert main(["apply", "--engine", "dask", "--workers", "1", "--calibrator", str(tmp / "ts.json"), "--logits",
                 f"{tmp / 'ds'}/:logits", "-o", str(tmp / "ds")]) == 2
    assert "would destroy the input" in capsys.readouterr().err
