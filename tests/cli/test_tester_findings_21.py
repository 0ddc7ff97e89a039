"""The fresh tester's findings of issue 21 (``/tmp/tester/findings.md``, T1...), one test each, in
process through ``main(argv)``: the command's exit status, its one-line error and no output file."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from confcal.cli import main


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("confcal: error: ") and "Traceback" not in "\n".join(err)
    assert sum(line.startswith("confcal: error:") for line in err) == 1
    return err[-1]


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 2
    y = np.where(rng.random(300) < 0.8, z.argmax(1), rng.integers(0, 3, 300))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "v.npz", logits=z, labels=y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--logits", f"{tmp_path}/z.npy", "--labels", f"{tmp_path}/y.npy", "--method", "ts",
                     "-o", f"{tmp_path}/cal.json"]) == 0
    return tmp_path, z, y


@pytest.mark.parametrize("suffix, column", [(".parquet", "probs"), (".csv", "probs_1")])
def test_t1_kept_column_named_like_an_output_column_is_refused(files, capsys, suffix, column):
    """T1: --keep-columns probs wrote a Parquet file with two 'probs' columns (unreadable by name)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    d, z, _ = files
    pq.write_table(pa.table({**{f"logit_{j}": z[:, j] for j in range(3)}, column: np.arange(300)}), d / "x.parquet")
    capsys.readouterr()
    out = d / f"p{suffix}"
    code = main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/x.parquet:logit_*",
                 "--keep-columns", column, "-o", str(out)])
    err = _err(capsys)
    assert code == 2 and err.startswith(f"confcal: error: --keep-columns: {column!r} is the name of an output column")
    assert not out.exists() and not [p for p in os.listdir(d) if p.endswith(".tmp")]
    # another kept column is still copied
    assert main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/x.parquet:logit_*",
                 "--keep-columns", "logit_0", "-o", str(out)]) == 0


def test_t2_compare_default_cal_size_falls_back_to_half_the_rows(files, capsys):
    """T2: compare on 300 rows refused the default --cal-size 5000 the user never gave."""
    d, _, _ = files
    capsys.readouterr()
    assert main(["compare", "-q", "--json", "--logits", f"{d}/v.npz:logits", "--labels", f"{d}/v.npz:labels",
                 "--methods", "ts", "--splits", "1"]) == 0
    cap = capsys.readouterr()
    assert "calibrating on half (150)" in cap.err
    import json

    assert json.loads(cap.out)["protocol"]["cal_size"] == 150
    # an explicit size >= n is still the user's mistake
    code = main(["compare", "-q", "--logits", f"{d}/v.npz:logits", "--labels", f"{d}/v.npz:labels",
                 "--methods", "ts", "--splits", "1", "--cal-size", "300"])
    assert code == 2 and _err(capsys).startswith("confcal: error: --cal-size: ")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_t3_output_that_is_a_fifo_is_refused(files, capsys):
    """T3: apply -o FIFO replaced the pipe with a regular file (a reader never got the data)."""
    d, _, _ = files
    os.mkfifo(d / "f.npy")
    capsys.readouterr()
    code = main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/z.npy", "-o", f"{d}/f.npy"])
    err = _err(capsys)
    assert code == 2 and "--output: " in err and "FIFO" in err
    import stat

    assert stat.S_ISFIFO(os.stat(d / "f.npy").st_mode)  # still the pipe


@pytest.mark.parametrize("flag", [["--sample-rows", "-1"], ["--sample-rows", "0"], ["--sample-rows", "5"],
                                  ["--seed", "3"]])
def test_t4_dask_sample_options_without_the_dask_engine_are_refused(files, capsys, flag):
    """T4: --sample-rows -1 (or 0) was silently ignored by the local engine; --workers is refused there."""
    d, _, _ = files
    capsys.readouterr()
    code = main(["fit", "-q", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--method", "ts",
                 "-o", f"{d}/o.json", *flag])
    err = _err(capsys)
    assert code == 2 and err == f"confcal: error: {flag[0]}: only with --engine dask", err
    assert not (d / "o.json").exists()
