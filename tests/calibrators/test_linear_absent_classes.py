"""vs, ms and dirichlet and classes missing from the calibration labels (the one-vs-rest rule of
:func:`confcal.calibrators._fit.jobs.reduce.check_label_classes`, worded for per-class parameters).

Tester (LeNet CIFAR-10): ``confcal fit --method vs`` on labels of one class exited 0, test accuracy
0.522 -> 0.101; dirichlet / ms fitted on labels < 5 never predicted classes 5-9 (0.522 -> 0.330),
without a warning. One class: refused; absent classes: a CalibrationWarning naming them, on the
in-memory fit, the streamed CLI fit and the full-data job (--engine dask)."""

from __future__ import annotations

import re
import warnings

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from confcal.calibrators import METHODS, CalibrationWarning  # noqa: E402
from tests.conftest import require_shared_data  # noqa: E402

LINEAR = ["vs", "ms", "dirichlet"]
ONE = r"^labels: only class {c} occurs in the {n} calibration labels; '{m}' fits per-class parameters by NLL"


def _data(n=600, k=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    z = rng.normal(size=(n, k)) + 3.0 * np.eye(k)[y]
    return z, y


@pytest.mark.parametrize("method", LINEAR)
@pytest.mark.parametrize("k", [2, 5])
def test_one_class_is_refused_naming_it(method, k):
    z, _ = _data(k=k)
    with pytest.raises(ValueError, match=ONE.format(c=k - 1, n=z.shape[0], m=re.escape(method))):
        METHODS[method]().fit(z, np.full(z.shape[0], k - 1))


@pytest.mark.parametrize("method", LINEAR)
def test_absent_classes_warn_and_are_what_the_warning_says(method):
    z, y = _data(k=5)
    keep = (y != 1) & (y != 3)
    with pytest.warns(CalibrationWarning, match=r"^labels: classes \[1, 3\] of 5 do not occur in the \d+ "
                                                rf"calibration labels; '{method}' fits per-class") as rec:
        cal = METHODS[method]().fit(z[keep], y[keep])
    assert all(r.filename == __file__ for r in rec if r.category is CalibrationWarning)  # points at the caller
    # the warning's claim: the absent classes' probability is pushed down (held only by the penalty):
    # on their own rows it is below that of the fit on every class (here 0.92 -> 0.83 vs, 0.93 -> 0.55 dirichlet)
    p, full = cal.predict_proba(z), METHODS[method]().fit(z, y).predict_proba(z)
    for c in (1, 3):
        assert float(np.mean(p[y == c][:, c])) < float(np.mean(full[y == c][:, c])) - 0.05


@pytest.mark.parametrize("method", LINEAR)
def test_every_class_present_gives_no_warning(method):
    z, y = _data(k=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        METHODS[method]().fit(z, y)


def test_weight_zero_class_counts_as_absent():
    z, y = _data(k=4)
    with pytest.warns(CalibrationWarning, match=r"class \[2\] of 4 does not occur in the [\d.]+ \(weighted\) "):
        METHODS["vs"]().fit(z, y, sample_weight=np.where(y == 2, 0.0, 1.0))


def test_ts_still_fits_one_class():
    z, _ = _data(k=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ts may stop at a search bound: not the point
        cal = METHODS["ts"]().fit(z, np.full(z.shape[0], 2))
    assert np.array_equal(cal.predict(z), np.argmax(z, axis=1))


@pytest.mark.parametrize("method", ["vs", "dirichlet"])
@pytest.mark.parametrize("k", [2, 5])
def test_full_data_job_has_the_same_rule(method, k):
    """linear_fit_job (the streamed CLI fit and --engine dask): the same refusal and warning."""
    from confcal.calibrators._fit.jobs.linear_job import linear_fit_job
    from confcal.passes import LocalEngine, run_job
    from confcal.sources import open_source

    z, y = _data(k=k)

    def run(labels):
        eng = LocalEngine({"logits": open_source(z, name="logits"), "labels": open_source(labels, name="labels")},
                          reference="logits")
        params = {"reg": "fixed"} if method != "vs" else {}
        run_job(linear_fit_job(METHODS[method](**params)), eng)

    with pytest.raises(ValueError, match=ONE.format(c=0, n=z.shape[0], m=method)):
        run(np.zeros_like(y))
    if k > 2:
        with pytest.warns(CalibrationWarning, match=r"^labels: class \[1\] of 5 does not occur"):
            run(np.where(y == 1, 0, y))


@pytest.mark.parametrize("method", LINEAR)
def test_cli_refuses_one_class_and_warns_on_absent(tmp_path, capsys, method):
    from confcal.cli import main

    z, y = _data(k=5)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "one.npy", np.full_like(y, 4))
    keep = y != 0
    np.save(tmp_path / "zk.npy", z[keep])
    np.save(tmp_path / "yk.npy", y[keep])
    code = main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "one.npy"),
                 "--method", method, "-o", str(tmp_path / "m.json"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "only class 4 occurs in the 600 calibration labels" in err, err
    assert not (tmp_path / "m.json").exists()
    assert main(["fit", "--logits", str(tmp_path / "zk.npy"), "--labels", str(tmp_path / "yk.npy"),
                 "--method", method, "-o", str(tmp_path / "m.json"), "-q"]) == 0
    assert "warning: labels: class [0] of 5 does not occur in the" in capsys.readouterr().err
    assert (tmp_path / "m.json").exists()


def test_real_data_lenet_one_class_refused_and_low_classes_warned():
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    z, y, kind = d["predictions"][:5000], d["ground_truth"][:5000], "probs"
    with pytest.raises(ValueError, match=r"^labels: only class 3 occurs in the 5000 calibration labels"):
        METHODS["vs"](input_kind=kind).fit(z, np.full(5000, 3))
    low = y < 5
    with pytest.warns(CalibrationWarning, match=r"classes \[5, 6, 7, 8, 9\] of 10 do not occur"):
        METHODS["dirichlet"](input_kind=kind).fit(z[low], y[low])


@pytest.mark.parametrize("method", ["vs+pb", "ms+pb", "dirichlet+pb"])
def test_probability_bounding_on_a_per_class_map_has_the_same_rule(method):
    z, y = _data(k=4, n=300)
    with pytest.raises(ValueError, match=ONE.format(c=1, n=300, m=re.escape(method))):
        METHODS[method](max_iter=20).fit(z, np.full(300, 1))
    with pytest.warns(CalibrationWarning, match=r"^labels: class \[3\] of 4 does not occur") as rec:
        METHODS[method](max_iter=20).fit(z, y % 3)
    assert [r.filename for r in rec if str(r.message).startswith("labels:")] == [__file__]


@pytest.mark.parametrize("method", ["ts+pb", "ets+pb"])
def test_probability_bounding_on_one_parameter_bases_fits_one_class(method):
    z, _ = _data(k=4, n=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # search bounds on one class: not the point
        METHODS[method](max_iter=20).fit(z, np.full(300, 1))


def test_dask_engine_cli_has_the_same_rule(tmp_path, capsys):
    """``fit --engine dask`` runs linear_fit_job on the workers: the same refusal and warning, exit 2 / 0."""
    pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    z, y = _data(k=3, n=300)
    cols = {f"logit_{i}": z[:, i] for i in range(3)}
    pq.write_table(pa.table({**cols, "one": np.full(300, 2), "some": np.where(y == 0, 1, y)}), tmp_path / "d.parquet")

    # a subprocess per run: a Dask cluster refused in-process left state behind that made a later in-process
    # Dask apply (tests/cli/test_signals_21.py) wait forever in Client.gather
    def fit(col):
        r = subprocess.run([sys.executable, "-m", "confcal", "fit", "--method", "vs", "--engine", "dask",
                            "--workers", "1", "--logits", f"{tmp_path}/d.parquet:logit_*", "--labels",
                            f"{tmp_path}/d.parquet:{col}", "-o", f"{tmp_path}/m_{col}.json", "-q"],
                           capture_output=True, text=True, timeout=300)
        return r.returncode, r.stderr

    code, err = fit("one")
    assert code == 2, err
    err = err.strip()
    assert "only class 2 occurs in the 300 calibration labels; 'vs' fits per-class" in err, err
    assert not (tmp_path / "m_one.json").exists()
    code, err = fit("some")
    assert code == 0, err
    assert "warning: labels: class [0] of 3 does not occur in the 300" in err
