"""Sizes and counts the CLI checks before working (as a subprocess): truncated .npy files, row counts
that differ, empty arrays, absurd bin counts, probabilities passed to apply."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.calibrators import TemperatureScaling
from tests.cli._subprocess import confcal


def _data(tmp_path, n, k=10):
    rng = np.random.default_rng(0)
    y = rng.integers(0, k, size=n)
    x = (rng.normal(size=(n, k)) * 3 + 2 * np.eye(k)[y]).astype(np.float32)
    return x, y


def test_truncated_npy_names_the_option_the_file_and_the_sizes(tmp_path):
    x, y = _data(tmp_path, 3000)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[:50_000])
    for argv in (["fit", "--method", "ts", "--logits", tmp_path / "t.npy", "--labels", tmp_path / "y.npy",
                  "-o", tmp_path / "m.json"],
                 ["evaluate", "--logits", tmp_path / "t.npy", "--labels", tmp_path / "y.npy"]):
        proc = confcal(*argv)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line and line.startswith("confcal: error: --logits:"), line
        assert "t.npy is truncated" in line and "(3000, 10) float32 (120000 bytes of data)" in line, line
        assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("n_labels", [59_999, 5_000])
def test_ts_fit_row_mismatch_is_counted_on_the_whole_files(tmp_path, n_labels):
    """Above the warm-start size (50k rows) the fit read row blocks before checking alignment and
    reported 'expected 6250 labels ... got 6249'."""
    x, y = _data(tmp_path, 60_000)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y[:n_labels])
    proc = confcal("fit", "--method", "ts", "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"confcal: error: --labels: expected 60000 labels (one per sample of logits in "
                                   f"{tmp_path / 'x.npy'}), got {n_labels} in {tmp_path / 'y.npy'}")
    with pytest.raises(ValueError, match=f"labels: expected 60000 labels .*got {n_labels}"):
        TemperatureScaling().fit(x, y[:n_labels])
    from confcal.calibrators import METHODS

    d = np.array(["a", "b"])[np.arange(60_000) % 2]
    with pytest.raises(ValueError, match=f"labels: expected 60000 labels .*got {n_labels}"):
        METHODS["grouped-ts"]().fit(x, y[:n_labels], domains=d)


def test_evaluate_on_empty_arrays_says_so(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((0, 10), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(0, np.int64))
    proc = confcal("evaluate", "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "confcal: error: --logits: expected at least 1 sample, got shape (0, 10)"


def test_absurd_bin_counts_are_refused_in_the_flags_words(tmp_path):
    x, y = _data(tmp_path, 500)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    for bins, why in (("0", "expected a positive integer, got 0"),
                      ("100000000", "expected an integer in [1, 100,000], got 100,000,000")):
        proc = confcal("evaluate", "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy", "--n-bins", bins)
        assert proc.returncode == 2
        assert proc.stderr.strip().startswith(f"confcal: error: --n-bins: {why}"), proc.stderr


def test_probabilities_to_apply_give_one_line_and_no_drift_warning_first(tmp_path):
    x, y = _data(tmp_path, 3000)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    e = np.exp(x - x.max(1, keepdims=True))
    np.save(tmp_path / "p.npy", (e / e.sum(1, keepdims=True)).astype(np.float32))
    assert confcal("fit", "--method", "ts", "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json").returncode == 0
    proc = confcal("apply", "--calibrator", tmp_path / "m.json", "--logits", tmp_path / "p.npy",
                   "-o", tmp_path / "o.npy")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "look like probabilities" in proc.stderr, proc.stderr
    assert not (tmp_path / "o.npy").exists()
    # drift on a good run is still reported (after the output is written)
    proc = confcal("apply", "--calibrator", tmp_path / "m.json", "--logits", tmp_path / "x.npy", "-o",
                   tmp_path / "o.npy")
    assert proc.returncode == 0 and (tmp_path / "o.npy").exists()
