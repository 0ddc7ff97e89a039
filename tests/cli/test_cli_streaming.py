"""CLI fit / apply / evaluate read in batches: same results as in memory, Parquet == .npy, and the
bad input of issue 10 (each a one-line error, exit 2, no partial file)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confcal import load_calibrator
from confcal.calibrators import TemperatureScaling, fit_temperature
from confcal.cli import main
from confcal.metrics import calibration_summary
from tests.conftest import REPO, require_shared_data


@pytest.fixture
def cifar_files(tmp_path):
    z = np.load(require_shared_data("cifar", "wideresnet-16-4-cifar-10.npz"))
    x = np.log(np.maximum(z["predictions"], np.float32(1e-30)))
    y = z["ground_truth"]
    cal, test = slice(0, 5000), slice(5000, None)
    np.save(tmp_path / "val.npy", x[cal])
    np.save(tmp_path / "val_y.npy", y[cal])
    np.save(tmp_path / "test.npy", x[test])
    np.save(tmp_path / "test_y.npy", y[test])
    for name, part in (("val", cal), ("test", test)):
        ids = np.arange(len(y))[part]
        pq.write_table(pa.table({"image_id": ids, "label": y[part],
                                 "logits": pa.FixedSizeListArray.from_arrays(pa.array(x[part].ravel()), 10)}),
                       tmp_path / f"{name}.parquet", row_group_size=777)
    return tmp_path, x, y


def run(*args):
    return main([str(a) for a in args])


def test_fit_apply_evaluate_parquet_equal_npy_and_in_memory(cifar_files, capsys):
    d, x, y = cifar_files
    assert run("fit", "--logits", d / "val.npy", "--labels", d / "val_y.npy", "--method", "ts", "-o", d / "a.json") == 0
    assert run("fit", "--logits", f"{d}/val.parquet:logits", "--labels", f"{d}/val.parquet:label", "--method", "ts",
               "-o", d / "b.json", "-q") == 0
    a, b = load_calibrator(d / "a.json"), load_calibrator(d / "b.json")
    ref = fit_temperature(x[:5000], y[:5000])
    assert a.temperature_ == b.temperature_
    assert abs(math.log(a.temperature_) - math.log(ref.temperature)) < 1e-9
    assert a.fit_record_["metrics_after"] == b.fit_record_["metrics_after"]
    capsys.readouterr()
    # apply: .npy input -> .npy output, Parquet input -> Parquet output with ids; bit-identical float64
    assert run("apply", "--calibrator", d / "a.json", "--logits", d / "test.npy", "-o", d / "p.npy") == 0
    assert run("apply", "--calibrator", d / "a.json", "--logits", f"{d}/test.parquet:logits", "-o",
               d / "p.parquet", "--keep-columns", "image_id") == 0
    p_mem = TemperatureScaling().fit(x[:5000], y[:5000]).predict_proba(x[5000:], dtype=np.float64)  # apply writes float64 by default
    p_npy = np.load(d / "p.npy")
    table = pq.read_table(d / "p.parquet")
    p_pq = np.asarray(table.column("probs").combine_chunks().flatten()).reshape(-1, 10)
    assert np.array_equal(p_npy, p_mem) and np.array_equal(p_pq, p_mem)
    assert table.column("image_id").to_pylist() == list(range(5000, 10000))
    assert run("apply", "--calibrator", d / "a.json", "--logits", d / "test.npy", "-o", d / "p32.npy",
               "--dtype", "float32") == 0
    assert np.load(d / "p32.npy").dtype == np.float32 and np.array_equal(np.load(d / "p32.npy"),
                                                                          p_mem.astype(np.float32))
    # evaluate: streamed (two passes) == one-shot metrics
    capsys.readouterr()
    assert run("evaluate", "--logits", f"{d}/test.parquet:logits", "--labels", f"{d}/test.parquet:label",
               "--calibrator", d / "a.json", "--json") == 0
    got = json.loads(capsys.readouterr().out)["metrics"]
    ref_after = calibration_summary(p_mem, y[5000:])
    for key, value in ref_after.items():
        assert got["ts"][key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_evaluate_on_the_fit_data_warns(cifar_files, capsys):
    d, _, _ = cifar_files
    assert run("fit", "--logits", f"{d}/val.parquet:logits", "--labels", f"{d}/val.parquet:label", "--method", "ts",
               "-o", d / "b.json") == 0
    capsys.readouterr()
    assert run("evaluate", "--logits", d / "val.npy", "--labels", d / "val_y.npy", "--calibrator", d / "b.json") == 0
    assert "warning: these are the arrays the calibrator was fitted on" in capsys.readouterr().err
    assert run("evaluate", "--logits", d / "test.npy", "--labels", d / "test_y.npy", "--calibrator", d / "b.json") == 0
    assert "fitted on" not in capsys.readouterr().err


def test_output_equal_to_input_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "io.npz", logits=rng.normal(size=(30, 3)), labels=rng.integers(0, 3, 30),
             other=np.arange(5))
    assert run("fit", "--logits", f"{tmp_path}/io.npz:logits", "--labels", f"{tmp_path}/io.npz:labels",
               "--method", "ts", "-o", tmp_path / "c.json") == 0
    before = (tmp_path / "io.npz").read_bytes()
    assert run("apply", "--calibrator", tmp_path / "c.json", "--logits", f"{tmp_path}/io.npz:logits",
               "-o", tmp_path / "io.npz") == 2
    assert "--output" in capsys.readouterr().err and (tmp_path / "io.npz").read_bytes() == before


def test_csv_bad_input(tmp_path, capsys):
    (tmp_path / "c.json").write_text("{}")
    (tmp_path / "nohead.csv").write_text("1,2,3,4\n0.5,1,2,3\n2,1,0,1\n")
    np.save(tmp_path / "y.npy", np.array([0, 1, 2]))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(3, 4)))
    assert run("fit", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy", "--method", "ts",
               "-o", tmp_path / "ts.json") == 0
    capsys.readouterr()
    assert run("apply", "--calibrator", tmp_path / "ts.json", "--logits", tmp_path / "nohead.csv",
               "-o", tmp_path / "p.npy") == 2
    err = capsys.readouterr().err
    assert "looks like data, not a header" in err and "--csv-header none" in err and len(err.splitlines()) == 1
    assert run("apply", "--calibrator", tmp_path / "ts.json", "--logits", tmp_path / "nohead.csv",
               "--csv-header", "none", "-o", tmp_path / "p.npy") == 0
    assert "wrote 3 x 4" in capsys.readouterr().out
    (tmp_path / "empty.csv").write_text("a,b,c,d\n1,2,3,4\n1,,3,4\n")
    assert run("apply", "--calibrator", tmp_path / "ts.json", "--logits", tmp_path / "empty.csv",
               "-o", tmp_path / "q.npy") == 2
    assert "column 'b' of" in capsys.readouterr().err
    (tmp_path / "latin.csv").write_bytes("d\ncaf\xe9\nb\nc\n".encode("latin-1"))
    assert run("evaluate", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy",
               "--domains", tmp_path / "latin.csv") == 2
    err = capsys.readouterr().err
    assert "latin.csv is not UTF-8" in err and "domains" in err
    (tmp_path / "labels.csv").write_text("label\n0\n1\n2\n")
    assert run("evaluate", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "labels.csv") == 0
    assert not (tmp_path / "q.npy").exists()


def test_object_member_in_npz_names_file_key_and_argument(tmp_path, capsys):
    np.savez(tmp_path / "o.npz", logits=np.random.default_rng(0).normal(size=(4, 3)),
             labels=np.array([0, 1, 2, 0]), meta=np.array([None, {}, 1, "a"], dtype=object))
    assert run("evaluate", "--logits", f"{tmp_path}/o.npz:logits", "--labels", f"{tmp_path}/o.npz:labels") == 0
    capsys.readouterr()
    assert run("evaluate", "--logits", f"{tmp_path}/o.npz:logits", "--labels", f"{tmp_path}/o.npz:meta") == 2
    err = capsys.readouterr().err
    assert "labels:" in err and "o.npz:meta holds an object array" in err


SIGTERM_SCRIPT = """
import os, signal, sys, time
from confcal._signals import handling_signals
from confcal.io import atomic_write
with handling_signals(), atomic_write(sys.argv[1]) as fh:
    fh.write(b"partial")
    fh.flush()
    print("writing", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_sigterm_during_a_write_leaves_no_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / "out.npy")], env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and b"writing" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_sigterm_of_a_running_apply_leaves_no_file(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "z.npy", rng.normal(size=(2000, 4)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 2000))
    assert run("fit", "--logits", tmp_path / "z.npy", "--labels", tmp_path / "y.npy", "--method", "ts",
               "-o", tmp_path / "ts.json") == 0
    big = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(3_000_000, 4))
    big[:] = rng.normal(size=(1, 4))
    big.flush()
    del big
    out = tmp_path / "out" / "p.csv"  # CSV is slow to write: the command is still writing when signalled
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "confcal", "apply", "--calibrator", str(tmp_path / "ts.json"),
                             "--logits", str(tmp_path / "big.npy"), "-o", str(out), "-q"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not list(out.parent.iterdir()) and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "apply ended before its temporary file appeared"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(out.parent.iterdir()) == []
