"""Top-label maps on tiny calibration sets warn (:func:`confcal.calibrators._fit.jobs.reduce.warn_few_top_label_rows`).

Tester: ``isotonic-top`` / ``histogram-binning-top`` fitted on 1 row made every test confidence 1.0
(NLL 13.2) without a warning, and the CLI said "fitted isotonic-top on 1 samples"."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.calibrators._fit.jobs.reduce import MIN_TOP_LABEL_ROWS
from confcal.cli import main
from tests.conftest import require_shared_data

TOP = ["isotonic-top", "histogram-binning-top", "bbq-top"]


def _data(n, k=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    return rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y], y


@pytest.mark.parametrize("method", TOP)
@pytest.mark.parametrize("n", [1, 2, MIN_TOP_LABEL_ROWS - 1])
def test_fewer_rows_than_the_minimum_warn_with_the_reason(method, n):
    z, y = _data(n)
    rows = "1 calibration row" if n == 1 else f"{n} calibration rows"
    with pytest.warns(CalibrationWarning, match=rf"^logits: '{method}' fitted on {rows} \(fewer than "
                                                rf"{MIN_TOP_LABEL_ROWS}\): its confidence levels are the accuracy") as rec:
        METHODS[method]().fit(z, y)
    assert [r.filename for r in rec if "calibration row" in str(r.message)] == [__file__]


@pytest.mark.parametrize("method", TOP)
def test_the_minimum_itself_gives_no_warning(method):
    z, y = _data(MIN_TOP_LABEL_ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        METHODS[method]().fit(z, y)


def test_rows_of_weight_zero_do_not_count():
    z, y = _data(2 * MIN_TOP_LABEL_ROWS)
    w = np.zeros(z.shape[0])
    w[:10] = 1.0
    with pytest.warns(CalibrationWarning, match=r"fitted on 10 calibration rows"):
        METHODS["isotonic-top"]().fit(z, y, sample_weight=w)


def test_the_warning_is_about_what_happens_on_one_row():
    """The warning's claim on real data: 1 right row makes every LeNet CIFAR-10 test confidence 1.0."""
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    p, y = d["predictions"], d["ground_truth"]
    i = int(np.flatnonzero(p.argmax(1) == y)[0])
    with pytest.warns(CalibrationWarning, match="fitted on 1 calibration row"):
        cal = METHODS["isotonic-top"](input_kind="probs").fit(p[i:i + 1], y[i:i + 1])
    q = cal.predict_proba(p[5000:])
    assert np.all(q.max(axis=1) == 1.0)


@pytest.mark.parametrize("method", ["isotonic-top", "histogram-binning-top"])
def test_cli_warns_and_says_1_sample(tmp_path, capsys, method):
    """histogram-binning-top fits from files by passes (binning_job): the same warning, once."""
    z, y = _data(1)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--method", method, "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "m.json")]) == 0
    out, err = capsys.readouterr()
    assert f"fitted {method} on 1 sample, 4 classes -> " in out, out
    assert err.count(f"warning: logits: '{method}' fitted on 1 calibration row (fewer than 50)") == 1, err


def test_cli_plural_is_unchanged(tmp_path, capsys):
    z, y = _data(60)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--method", "ts", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "m.json")]) == 0
    assert "fitted ts on 60 samples, 4 classes -> " in capsys.readouterr().out


def test_streamed_job_warns_too():
    from confcal.calibrators._fit.jobs.binning_job import histogram_fit_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    z, y = _data(5)
    eng = LocalEngine({"logits": open_source(z, name="logits"), "labels": open_source(y, name="labels")},
                      reference="logits")
    with pytest.warns(CalibrationWarning, match="'histogram-binning-top' fitted on 5 calibration rows"):
        run_job(histogram_fit_job(METHODS["histogram-binning-top"]()), eng)


def test_scaling_binning_refuses_one_row_without_the_warning_first():
    """scaling-binning (top-label too) refuses 1 row itself; the few-rows warning is for maps that fit."""
    z, y = _data(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        with pytest.raises(ValueError, match="needs at least 2 calibration rows"):
            METHODS["scaling-binning"]().fit(z, y)
    with pytest.warns(CalibrationWarning, match="'scaling-binning' fitted on 10 calibration rows"):
        METHODS["scaling-binning"]().fit(*_data(10))
