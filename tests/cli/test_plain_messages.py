"""Messages name the option the user typed and print numbers as numbers: ``--per-class`` (not
``--param ... ['per_class']``) and ``1.5`` (not numpy 2's ``np.float64(1.5)``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal._validation import plain
from confcal.cli import main
from confcal.cli._shared.errors import plain_numbers


def test_per_class_names_itself(tmp_path, capsys):
    rng = np.random.default_rng(3)
    np.save(tmp_path / "z.npy", rng.normal(size=(200, 3)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 200))
    assert main(["fit", "--method", "ts", "--per-class", "--logits", str(tmp_path / "z.npy"), "--labels",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err == (
        "confcal: error: --per-class: only for the methods with one map per category (det-beta, det-beta-geo, "
        "det-hist-geo, det-platt, det-platt-geo, det-ts), got --method ts\n")
    assert not (tmp_path / "x.json").exists()


def test_a_numpy_scalar_in_a_cli_message_is_a_plain_number(tmp_path, capsys):
    # drift's check of 1-D box scores formatted the bad value with !r: "(np.float64(nan))" under numpy 2
    from confcal.calibrators import DetectionPlattScaling
    from confcal.io import save_manifest

    rng = np.random.default_rng(0)
    s = rng.random(300)
    save_manifest(DetectionPlattScaling().fit(s, rng.random(300) < s), tmp_path / "dp.json")
    s[7] = np.nan
    np.save(tmp_path / "s.npy", s)
    assert main(["drift", "--calibrator", str(tmp_path / "dp.json"), "--logits", str(tmp_path / "s.npy")]) == 2
    assert capsys.readouterr().err == "confcal: error: --logits: score 7 is not finite (nan)\n"


@pytest.mark.parametrize("value, text", [
    (np.float64(1.0587560904884674), "1.0587560904884674"), (np.float32(0.5), "0.5"), (np.int64(-3), "-3"),
    (np.bool_(True), "True"), (np.str_("a"), "'a'"), (np.array([1.5, 2.0]), "[1.5, 2.0]"),
    ([np.float64(0.25), 1], "[0.25, 1]"), ((np.int8(1),), "(1,)"), ("text", "'text'"), (None, "None"),
])
def test_plain_shows_the_python_value(value, text):
    assert plain(value) == text


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_plain_of_a_float64_is_the_repr_of_the_float(x):
    assert plain(np.float64(x)) == repr(x)
    assert plain_numbers(f"a: got {np.float64(x)!r} at row 3") == f"a: got {x!r} at row 3"


def test_plain_numbers_in_library_messages():
    from confcal.decisions.pvalues import check_level

    with pytest.raises(ValueError) as e:
        check_level(np.float64(1.0587560904884674), "delta")
    assert str(e.value) == "delta: expected a number in (0, 1), got 1.0587560904884674"
    assert plain_numbers("x: np.int64(3) of np.uint8(4), np.True_ / np.False_, np.str_('s')") == \
        "x: 3 of 4, True / False, 's'"
