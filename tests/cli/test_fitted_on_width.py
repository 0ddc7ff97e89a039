"""``evaluate`` recognises its calibrator's own calibration set when the logits are read at another float width
(float32 written to CSV is read back as float64): the data digest keeps its dtype (manifests carry it), and a
second digest at the other width, asked for when a text file is involved, says "the same values"."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal._digest import data_sha256
from confcal.cli import main
from confcal.evaluation.streamed import evaluate_stats, other_width

SAME = "(the same values: the logits are read here at another float width"
FITTED = "these are the arrays the calibrator was fitted on"


def _csv(path, z, y, names):
    with open(path, "w") as fh:
        fh.write(",".join([*names, "label"]) + "\n")
        for row, lab in zip(z, y):
            fh.write(",".join(repr(float(v)) for v in np.atleast_1d(row)) + f",{lab}\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    t = tmp_path_factory.mktemp("width")
    rng = np.random.default_rng(5)
    z = (rng.normal(size=(2500, 3)) * 2).astype(np.float32)
    y = (z + rng.normal(size=z.shape)).argmax(1)
    np.save(t / "z.npy", z)
    np.save(t / "y.npy", y)
    _csv(t / "z.csv", z, y, [f"logit_{j}" for j in range(3)])
    bumped = z.copy()
    bumped[1234, 1] = np.nextafter(bumped[1234, 1], np.float32(np.inf))  # one float32 ulp: other data
    _csv(t / "bumped.csv", bumped, y, [f"logit_{j}" for j in range(3)])
    s = rng.random(1500).astype(np.float32)
    b = (rng.random(1500) < s).astype(np.int64)
    np.save(t / "s.npy", s)
    np.save(t / "b.npy", b)
    _csv(t / "s.csv", s, b, ["score"])
    for argv in (["--logits", f"{t}/z.npy", "--labels", f"{t}/y.npy", "-o", f"{t}/npy.json"],
                 ["--logits", f"{t}/z.csv:logit_*", "--labels", f"{t}/z.csv:label", "-o", f"{t}/csv.json"],
                 ["--logits", f"{t}/s.npy", "--labels", f"{t}/b.npy", "--method", "det-platt", "--input-kind",
                  "probs", "-o", f"{t}/box.json"]):
        assert main(["fit", *argv] + ([] if "--method" in argv else ["--method", "ts"])) == 0
    return t


def _warnings(capsys, *argv):
    capsys.readouterr()
    assert main(["evaluate", *map(str, argv)]) == 0
    return [ln for ln in capsys.readouterr().err.splitlines() if FITTED in ln]


@pytest.mark.parametrize("cal, x, y, same", [
    ("npy", "z.npy", "y.npy", False),                        # the same file: the plain warning
    ("npy", "z.csv:logit_*", "z.csv:label", True),           # float32 -> CSV -> float64
    ("csv", "z.npy", "y.npy", True),                         # fitted from CSV, evaluated on the float32 file
    ("csv", "z.csv:logit_*", "z.csv:label", False),
])
def test_the_calibration_set_is_recognised_at_either_width(files, capsys, cal, x, y, same):
    lines = _warnings(capsys, "--calibrator", files / f"{cal}.json", "--logits", f"{files}/{x}",
                      "--labels", f"{files}/{y}")
    assert len(lines) == 1 and (SAME in lines[0]) == same, lines


@pytest.mark.parametrize("cal", ["npy", "csv"])
def test_other_values_are_not_recognised(files, capsys, cal):
    """One logit moved by one float32 ulp is other data: no warning at either width."""
    assert _warnings(capsys, "--calibrator", files / f"{cal}.json", "--logits", f"{files}/bumped.csv:logit_*",
                     "--labels", f"{files}/bumped.csv:label") == []


def test_box_scores_too(files, capsys):
    lines = _warnings(capsys, "--calibrator", files / "box.json", "--logits", f"{files}/s.csv:score",
                      "--labels", f"{files}/s.csv:label")
    assert len(lines) == 1 and SAME in lines[0]


def test_the_digest_itself_keeps_its_dtype(files):
    """The definition is unchanged: the float64 read of the CSV has another data_sha256 than the fit's."""
    import json

    fitted = json.loads((files / "npy.json").read_text())["fit"]["data_sha256"]
    z, y = np.load(files / "z.npy"), np.load(files / "y.npy")
    assert data_sha256(z, y.astype(np.int64)) == fitted
    assert data_sha256(z.astype(np.float64), y.astype(np.int64)) != fitted


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(2, 4), rows=st.integers(1, 64), seed=st.integers(0, 2**31),
       wide=st.booleans())
def test_other_width_digest_is_the_one_shot_digest_at_any_batching(n, k, rows, seed, wide):
    """Oracle: data_sha256 of the whole arrays cast by hand; the streamed job batches them in ``rows``."""
    rng = np.random.default_rng(seed)
    z32 = (rng.normal(size=(n, k)) * 3).astype(np.float32)
    y = rng.integers(0, k, n)
    x = z32.astype(np.float64) if wide else z32
    stats, digest = evaluate_stats(x, y, batch_rows=rows, other_width=True)
    assert digest == data_sha256(x, y.astype(np.int64))
    assert stats.data_sha256_other_width == data_sha256(z32 if wide else z32.astype(np.float64), y.astype(np.int64))
    if wide and n > 1:  # one value that is no float32: no other-width digest
        x = x.copy()
        x[n // 2, 0] += 1e-12 * max(1.0, abs(x[n // 2, 0]))
        if x[n // 2, 0] != np.float32(x[n // 2, 0]):
            stats, _ = evaluate_stats(x, y, batch_rows=rows, other_width=True)
            assert stats.data_sha256_other_width is None


def test_other_width_rules():
    a = np.array([[0.1, 1e30], [-2.5, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(other_width(a.astype(np.float64)), a)
    assert other_width(a.astype(np.float64)).dtype == np.float32
    assert other_width(a).dtype == np.float64
    assert other_width(np.array([0.1])) is None  # 0.1 as float64 is no float32
    assert other_width(np.array([1, 2])) is None
