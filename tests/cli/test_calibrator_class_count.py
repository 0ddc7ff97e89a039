"""A calibrator fitted on another class count than the scores: every command (apply, evaluate, report,
adapt, drift, decide) refuses it with one line that
names both counts (``--calibrator: fitted on K classes ..., but --logits has M columns``), before any output."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from confcal.cli import main
from confcal.cli._shared.common import check_class_count

K = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    t = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(3)
    z = rng.normal(size=(400, K)) * 2
    np.save(t / "zk.npy", z)
    np.save(t / "yk.npy", (z + rng.normal(size=z.shape)).argmax(1))
    np.save(t / "z3.npy", rng.normal(size=(400, 3)))
    np.save(t / "y3.npy", rng.integers(0, 3, 400))
    s = rng.random(400)
    np.save(t / "s.npy", s)
    np.save(t / "b.npy", (rng.random(400) < s).astype(np.int64))
    z2 = rng.normal(size=(400, 2))
    np.save(t / "z2.npy", z2)
    np.save(t / "y2.npy", (z2 + rng.normal(size=z2.shape)).argmax(1))
    assert main(["fit", "--logits", str(t / "zk.npy"), "--labels", str(t / "yk.npy"), "--method", "ts",
                 "-o", str(t / "cal.json")]) == 0
    assert main(["decide", "fit", "--input", "top-label", "--logits", str(t / "zk.npy"), "--labels",
                 str(t / "yk.npy"), "--calibrator", str(t / "cal.json"), "-o", str(t / "dec.json")]) == 0
    return t


def _want(t, option, have):
    return (f"confcal: error: --calibrator: fitted on {K} classes (ts, {t}/cal.json), but {option} {have}; "
            "pass the scores of the model it was fitted for, or a calibrator fitted on classes like these")


def _commands(t, x, y):
    cal = ["--calibrator", f"{t}/cal.json"]
    dec = ["--decisions", f"{t}/dec.json", *cal]
    return {
        "apply": ["apply", *cal, "--logits", x, "-o", f"{t}/out.npy"],
        "evaluate": ["evaluate", *cal, "--logits", x, "--labels", y],
        "report": ["report", *cal, "--logits", x, "--labels", y, "-o", f"{t}/out.html"],
        "adapt": ["adapt", *cal, "--calibration-logits", f"{t}/zk.npy", "--calibration-labels", f"{t}/yk.npy",
                  "--logits", x, "-o", f"{t}/out.json"],
        "drift": ["drift", *cal, "--logits", x],
        "decide fit": ["decide", "fit", "--input", "top-label", *cal, "--logits", x, "--labels", y,
                       "-o", f"{t}/out.json"],
        "decide apply": ["decide", "apply", *dec, "--logits", x, "-o", f"{t}/out.csv"],
        "decide rank": ["decide", "rank", *dec, "--logits", x, "-o", f"{t}/out.csv"],
        "decide evaluate": ["decide", "evaluate", *dec, "--logits", x, "--labels", y],
    }


@pytest.mark.parametrize("command", ["apply", "evaluate", "report", "adapt", "drift", "decide fit", "decide apply",
                                     "decide rank", "decide evaluate"])
@pytest.mark.parametrize("scores", ["z3", "s", "z2"])
def test_every_command_names_both_counts(files, capsys, command, scores):
    t = files
    labels = {"z3": "y3", "s": "b", "z2": "y2"}[scores]
    argv = _commands(t, f"{t}/{scores}.npy", f"{t}/{labels}.npy")[command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    have = {"z3": "has 3 columns", "z2": "has 2 columns", "s": "holds 1-D scores (a binary model's)"}[scores]
    assert err.strip().splitlines()[-1] == _want(t, "--logits", have) and "Traceback" not in err
    assert not any((t / f"out{s}").exists() for s in (".npy", ".html", ".json", ".csv"))


def test_adapt_names_the_calibration_set(files, capsys):
    t = files
    capsys.readouterr()
    assert main(["adapt", "--calibrator", f"{t}/cal.json", "--calibration-logits", f"{t}/z3.npy",
                 "--calibration-labels", f"{t}/y3.npy", "--logits", f"{t}/zk.npy", "-o", f"{t}/out.json"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == _want(t, "--calibration-logits", "has 3 columns")


def test_a_two_class_calibrator_reads_one_logit_scores(files, capsys):
    """The refusal is only of a mismatch: a 2-class map takes (n,), (n, 1) and (n, 2) scores."""
    t = files
    assert main(["fit", "--logits", f"{t}/z2.npy", "--labels", f"{t}/y2.npy", "--method", "ts",
                 "-o", f"{t}/cal2.json"]) == 0
    np.save(t / "z2col.npy", np.load(t / "s.npy")[:, None] * 4 - 2)
    for x, y in (("z2", "y2"), ("z2col", "b")):
        assert main(["decide", "fit", "--input", "top-label", "--calibrator", f"{t}/cal2.json", "--logits",
                     f"{t}/{x}.npy", "--labels", f"{t}/{y}.npy", "-o", f"{t}/ok.json"]) == 0
        assert main(["apply", "--calibrator", f"{t}/cal2.json", "--logits", f"{t}/{x}.npy", "-o",
                     f"{t}/ok.npy"]) == 0
        assert np.load(t / "ok.npy").shape == (400, 2)


class _Cal:
    method = "ts"

    def __init__(self, k, box=False, multilabel=False):
        self.n_classes_, self.takes_box_scores, self.multilabel = k, box, multilabel


@given(k=st.integers(2, 6), shape=st.one_of(st.tuples(st.integers(0, 9)),
                                           st.tuples(st.integers(0, 9), st.integers(1, 8))),
       box=st.booleans())
def test_refused_exactly_on_a_mismatch(k, shape, box):
    """Oracle: accepted iff a box-score map, or width == K, or one-logit scores with K == 2."""
    one_logit = len(shape) == 1 or shape[1] == 1
    ok = box or (len(shape) == 2 and shape[1] == k) or (one_logit and k == 2)
    try:
        check_class_count(_Cal(k, box=box), shape, path="c.json")
    except ValueError as exc:
        assert not ok
        text = str(exc)
        assert text.startswith(f"--calibrator: fitted on {k} classes (ts, c.json), but --logits ")
        assert (f"has {shape[1]} column" in text) if len(shape) == 2 else ("1-D" in text)
    else:
        assert ok


def test_multilabel_maps_say_labels():
    with pytest.raises(ValueError, match=r"^--calibrator: fitted on 4 labels \(ts\), but --logits has 3 columns"):
        check_class_count(_Cal(4, multilabel=True), (10, 3))
