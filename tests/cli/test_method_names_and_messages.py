"""One-line messages for a fresh user's slips: an empty name in ``compare --methods`` (``ts,,beta`` was
accepted, the empty name dropped), ``predict_proba(dtype="bogus")`` (numpy's TypeError named no argument),
and ``fit --method auto`` on too few rows (it printed "5-fold cross-validation on 1 rows" and ran none)."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.cli import main


@pytest.mark.parametrize("names, bad", [("ts,,beta", "name 2 of 3"), ("ts,", "name 2 of 2"), (",ts", "name 1 of 2"),
                                        ("ts, ,beta", "name 2 of 3")])
def test_compare_refuses_an_empty_method_name(tmp_path, capsys, names, bad):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(200, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 200))
    code = main(["compare", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--methods", names])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert f"--methods: expected comma-separated method names with none empty, got {names!r} ({bad} is empty)" in err


@pytest.mark.parametrize("method", ["ts", "isotonic-top", "vs"])
@pytest.mark.parametrize("dtype, shown", [("bogus", "'bogus'"), (np.int32, "int32"), ("float16", "float16"),
                                          (3, "3")])
def test_predict_proba_names_the_dtype_argument(method, dtype, shown):
    rng = np.random.default_rng(0)
    cal = METHODS[method]().fit(rng.normal(size=(100, 3)), rng.integers(0, 3, 100))
    with pytest.raises(ValueError, match=rf"^dtype: expected float32 or float64, got {shown}$"):
        cal.predict_proba(np.zeros((2, 3)), dtype=dtype)
    for ok in ("float32", np.float64, np.dtype("float32")):
        assert cal.predict_proba(np.zeros((2, 3)), dtype=ok).dtype == np.dtype(ok)


@pytest.mark.parametrize("n", [1, 2, 49])
def test_auto_on_too_few_rows_says_no_cross_validation_ran(tmp_path, capsys, n):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(n, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, n))
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "auto",
                 "-o", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    rows = "row" if n == 1 else "rows"
    assert f"auto: no cross-validation on {n} {rows} of class vectors: too few for 5 folds; the reference ts is chosen " \
           "without comparison" in out
    assert "fold cross-validation on" not in out and "(classes)" not in out
    assert f"{n} {rows}: too few for 5-fold cross-validation (needs 50)" in out


def test_auto_with_enough_rows_still_says_k_fold():
    from confcal.evaluation.selection import select_calibrator
    from confcal.evaluation.selection_tables import render_selection

    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 2
    y = rng.integers(0, 3, 300)
    cal = select_calibrator(z, y, n_boot=100)
    assert render_selection(cal.fit_record_["selection"]).startswith("auto: 5-fold cross-validation on 300 rows")


def test_auto_on_one_row_warns_in_the_singular(tmp_path, capsys):
    np.save(tmp_path / "z.npy", np.array([[2.0, 0.0, -1.0]]))
    np.save(tmp_path / "y.npy", np.array([0]))
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "auto",
                 "-o", str(tmp_path / "a.json")]) == 0
    err = capsys.readouterr().err
    assert "logits: 1 row is too few for 5-fold cross-validation (needs 50), so auto fell back to the reference ts" \
        in err, err
