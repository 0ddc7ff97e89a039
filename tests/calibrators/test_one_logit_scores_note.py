"""A one-logit binary head ``(n_samples,)`` read as logits whose values are not likely logits: scores all
in [0, 1] (positive-class probabilities, the 1-D counterpart of the 2-D rows summing to 1 that
``check_logits`` refuses) and, for temperature scaling, scores all of one sign (every calibrated
probability on one side of 1/2 whatever T, as on KITTI's detector scores in [0.01, 1.235])."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, TemperatureScaling
from confcal.cli import main
from confcal.metrics import ece

PROBS_LIKE = "look like positive-class probabilities, not logits; pass input_kind='probs'"


def _no_warning(fn):
    """fn() without the one-logit note (other warnings, e.g. a temperature at its bound, may come)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = fn()
    assert not [w for w in said if "one-logit scores" in str(w.message)]
    return out


def _sigmoid_data(n=2000, seed=0):
    """Probabilities p of the positive class, labels drawn from p**2 (over-confident)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n)
    return p, (rng.uniform(size=n) < p ** 2).astype(int)


@pytest.mark.parametrize("name", ["ts", "vs", "isotonic"])
def test_scores_in_unit_interval_warn_at_fit_and_predict(name):
    p, y = _sigmoid_data()
    with pytest.warns(UserWarning, match=r"^logits: every one of the 2000 one-logit scores is in \[0, 1\], so these "
                      + PROBS_LIKE.replace("(", r"\(")):
        cal = METHODS[name]().fit(p, y)
    with pytest.warns(UserWarning, match=PROBS_LIKE):
        cal.predict_proba(p)


def test_the_suggested_fix_is_silent_and_calibrates():
    p, y = _sigmoid_data()
    as_logits = TemperatureScaling()
    with pytest.warns(UserWarning):
        as_logits.fit(p, y)
    as_probs = _no_warning(lambda: TemperatureScaling(input_kind="probs").fit(p, y))
    with pytest.warns(UserWarning, match=PROBS_LIKE):
        e_logits = ece(as_logits.predict_proba(p), y)
    e_probs = _no_warning(lambda: ece(as_probs.predict_proba(p), y))
    # read as logits, sigmoid(p / T) >= 1/2 for every sample while 1/3 of the labels are 1
    assert e_logits > 0.15 and e_probs < 0.05, (e_logits, e_probs)


def test_logits_of_both_signs_pass_silently():
    z, y = np.array([-2.0, 0.3, 1.5, -0.1]), np.array([0, 1, 1, 0])
    cal = _no_warning(lambda: TemperatureScaling().fit(z, y))
    _no_warning(lambda: cal.predict_proba(z))


@pytest.mark.parametrize("z", [np.array([0.0, 1.0, 1.0, 0.0]), np.array([0, 1, 1, 0])])
def test_zero_one_logits_are_not_probability_like(z):
    # as in 2-D (rows of 0s and 1s are valid logits); ts still says they all have one sign
    y = np.array([0, 1, 1, 0])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        TemperatureScaling().fit(z, y)
        METHODS["vs"]().fit(z, y).predict_proba(z)
    notes = [str(w.message) for w in said if "one-logit scores" in str(w.message)]
    assert len(notes) == 1 and "scores is >= 0, so ts" in notes[0]


def test_one_sign_is_said_only_by_sign_keeping_maps_at_fit():
    rng = np.random.default_rng(1)
    z = rng.uniform(0.01, 1.5, 500)
    z[0] = 1.2  # past 1: not probability-like, still all >= 0
    y = (rng.uniform(size=500) < 0.2).astype(int)
    with pytest.warns(UserWarning, match=r"logits: every one of the 500 one-logit scores is >= 0, so ts "
                      r"\(sigmoid\(z / T\)\) gives every sample a probability >= 1/2 whatever T; fit det-platt"):
        cal = TemperatureScaling().fit(z, y)
    _no_warning(lambda: cal.predict_proba(z))  # said once, at fit
    _no_warning(lambda: METHODS["vs"]().fit(z, y))  # a bias term can go below 1/2
    with pytest.warns(UserWarning, match=r"scores is <= 0, so ts .* probability <= 1/2"):
        TemperatureScaling().fit(-z, 1 - y)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-3, 50.0), min_size=2, max_size=40), st.integers(0, 2**31 - 1))
def test_what_the_one_sign_note_says_holds(z, seed):
    # the note's claim, checked on the fitted map: every probability of the positive class >= 1/2
    z = np.array(z)
    y = np.random.default_rng(seed).integers(0, 2, z.size)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cal = TemperatureScaling().fit(z, y)
    notes = [str(w.message) for w in said if "one-logit scores" in str(w.message)]
    assert len(notes) == 1
    probability_like = bool(z.max() <= 1) and not np.all(z == 1)  # then the probabilities note instead
    assert (">= 1/2" in notes[0]) != probability_like
    assert np.all(cal.predict_proba(z)[:, 1] >= 0.5)


def test_kitti_scores_are_said_and_det_platt_calibrates_them(shared_data):
    d = np.load(shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    s, y = d["score"], d["label"].astype(int)
    assert s.min() >= 0 and 1 < s.max() < 1.3  # raw scores: not probabilities, all >= 0
    with pytest.warns(UserWarning, match=r"scores is >= 0, so ts"):
        ts = TemperatureScaling().fit(s, y)
    assert ece(ts.predict_proba(s), y) > 0.3  # 0.39: every box at >= 1/2 while 26% are true positives
    platt = METHODS["det-platt"]().fit(s, y)
    assert ece(platt.predict_proba(s), y) < 0.05


def test_cli_fit_says_it_in_one_line(tmp_path, capsys):
    p, y = _sigmoid_data(500)
    np.save(tmp_path / "s.npy", p)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--method", "ts", "--logits", str(tmp_path / "s.npy"), "--labels", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "c.json")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "one-logit scores" in ln]
    assert lines and lines[0].startswith("confcal: warning: logits: every one of the 500 one-logit scores is in [0, 1]")
    assert "--input-kind probs" in lines[0]
    assert main(["fit", "--method", "ts", "--input-kind", "probs", "--logits", str(tmp_path / "s.npy"), "--labels",
                 str(tmp_path / "y.npy"), "-o", str(tmp_path / "c2.json")]) == 0
    assert "one-logit scores" not in capsys.readouterr().err
