"""One-vs-rest fits and classes missing from the calibration labels
(:func:`confcal.calibrators._fit.jobs.reduce.check_label_classes`).

Labels of one class made every row that class with probability ~1 (WRN CIFAR-10, 5,000 labels of
class 3: accuracy 0.911 -> 0.101): refused. Some classes absent: a CalibrationWarning naming them."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from confcal.calibrators import METHODS, CalibrationWarning
from tests.conftest import require_shared_data

ONE_VS_REST = ["isotonic", "histogram-binning", "bbq", "beta", "platt-ovr", "scaling-binning-marginal"]
KEEPS = ["ts", "isotonic-top", "histogram-binning-top", "bbq-top"]


def _data(n=600, k=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    z = rng.normal(size=(n, k)) + 3.0 * np.eye(k)[y]
    return z, y


@pytest.mark.parametrize("method", ONE_VS_REST)
@pytest.mark.parametrize("k", [2, 5])
def test_one_class_is_refused_naming_it(method, k):
    z, _ = _data(k=k)
    y = np.full(z.shape[0], k - 1)
    with pytest.raises(ValueError, match=rf"^labels: only class {k - 1} occurs in the {z.shape[0]} calibration "
                                         rf"labels; '{re.escape(method)}' fits one map per class"):
        METHODS[method]().fit(z, y)


@pytest.mark.parametrize("method", ONE_VS_REST)
def test_absent_classes_warn_naming_them(method):
    z, y = _data(k=5)
    keep = (y != 1) & (y != 3)
    with pytest.warns(CalibrationWarning, match=r"^labels: classes \[1, 3\] of 5 do not occur in the \d+ "
                                                rf"calibration labels; '{re.escape(method)}' fits their maps on no positive "
                                                r"example"):
        cal = METHODS[method]().fit(z[keep], y[keep])
    if method not in ("isotonic", "histogram-binning"):
        return  # bbq's prior and the logistic maps give a value of their own
    p = cal.predict_proba(z)
    uniform = np.all(np.abs(p - 1 / 5) <= 1e-12, axis=1)  # every map 0 on the row: 1/K each (ties: one ulp)
    assert np.all(p[~uniform][:, [1, 3]] == 0)


@pytest.mark.parametrize("method", ONE_VS_REST)
def test_every_class_present_gives_no_warning(method):
    z, y = _data(k=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        METHODS[method]().fit(z, y)


def test_a_class_present_only_with_weight_zero_counts_as_absent():
    z, y = _data(k=4)
    w = np.where(y == 2, 0.0, 1.0)
    with pytest.warns(CalibrationWarning, match=r"class \[2\] of 4 does not occur in the [\d.]+ \(weighted\) "):
        METHODS["isotonic"]().fit(z, y, sample_weight=w)


@pytest.mark.parametrize("method", KEEPS)
def test_methods_that_keep_the_argmax_fit_one_class(method):
    """Top-label maps and TS fit "the arg-max is right" (or one temperature): one class is a valid set."""
    z, _ = _data(k=4)
    y = np.full(z.shape[0], 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ts may stop at a search bound: not the point
        cal = METHODS[method]().fit(z, y)
    assert np.array_equal(cal.predict(z), np.argmax(z, axis=1))


def test_streamed_histogram_fit_has_the_same_rule(tmp_path, capsys):
    """The CLI fits histogram-binning from files by passes (binning_job): the same refusal and warning."""
    from confcal.cli import main

    z, y = _data(k=5)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "one.npy", np.full_like(y, 4))
    keep = y != 0
    np.save(tmp_path / "zk.npy", z[keep])
    np.save(tmp_path / "yk.npy", y[keep])
    code = main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "one.npy"),
                 "--method", "histogram-binning", "-o", str(tmp_path / "m.json"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "only class 4 occurs in the 600 calibration labels" in err, err
    assert not (tmp_path / "m.json").exists()
    assert main(["fit", "--logits", str(tmp_path / "zk.npy"), "--labels", str(tmp_path / "yk.npy"),
                 "--method", "histogram-binning", "-o", str(tmp_path / "m.json"), "-q"]) == 0
    assert "warning: labels: class [0] of 5 does not occur in the" in capsys.readouterr().err
    assert (tmp_path / "m.json").exists()


def test_real_data_one_class_refused():
    d = np.load(require_shared_data("cifar", "wideresnet-16-4-cifar-10.npz"))
    p = d["predictions"][:5000]
    for method in ("isotonic", "beta", "histogram-binning"):
        with pytest.raises(ValueError, match=r"^labels: only class 3 occurs in the 5000 calibration labels"):
            METHODS[method](input_kind="probs").fit(p, np.full(5000, 3))


@pytest.mark.parametrize("k", [2, 5])
def test_full_data_job_has_the_same_rule(k):
    """The histogram-binning job (what --engine dask runs) refuses and warns as the in-memory fit."""
    from confcal.calibrators._fit.jobs.binning_job import histogram_fit_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    z, y = _data(k=k)

    def run(labels):
        eng = LocalEngine({"logits": open_source(z, name="logits"), "labels": open_source(labels, name="labels")},
                          reference="logits")
        cal = METHODS["histogram-binning"]()
        run_job(histogram_fit_job(cal), eng)
        return cal

    with pytest.raises(ValueError, match=rf"^labels: only class 0 occurs in the {z.shape[0]} calibration labels"):
        run(np.zeros_like(y))
    if k > 2:
        y2 = np.where(y == 1, 0, y)
        with pytest.warns(CalibrationWarning, match=r"^labels: class \[1\] of 5 does not occur"):
            cal = run(y2)
        assert cal.maps_[1]["values"] == [0.0] * len(cal.maps_[1]["values"])
