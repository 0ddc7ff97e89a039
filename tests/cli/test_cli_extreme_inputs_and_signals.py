"""The CLI as a subprocess on extreme inputs: absurd logit scales, +inf logits, boolean labels and
parameters, bad scheduler addresses, and a signal in the middle of apply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_shared_data
from tests.calibrators.test_extreme_logits import _extreme_rows  # the same 4 x 100 rows

from tests.cli._subprocess import REPO, _env, confcal  # noqa: F401 - re-used by the tests below


def _assert_sound_fit_or_scale_error(proc, manifest: Path, logits: np.ndarray):
    """The contract for absurd logit scales: a manifest that loads and predicts finite rows, or a
    one-line ``--logits:`` error that names the scale and says to rescale (and no manifest)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        from confcal.io import load_calibrator

        params = json.loads(manifest.read_text())["parameters"]
        assert "Infinity" not in json.dumps(params) and "NaN" not in json.dumps(params)
        p = load_calibrator(manifest).predict_proba(logits)
        assert np.isfinite(p).all()
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
    else:
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("confcal: error: --logits: "), lines[0]
        assert "largest |logit| = " in lines[0] and "rescale" in lines[0], lines[0]
        assert not manifest.exists()




@pytest.mark.parametrize("method", ["pts", "lb", "pb"])
def test_extreme_finite_logits_fit_soundly_or_say_rescale(tmp_path, method):
    z, y = _extreme_rows()
    np.save(tmp_path / "x.npy", z)
    np.save(tmp_path / "y.npy", y)
    proc = confcal("fit", "--method", method, "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json", "-q")
    _assert_sound_fit_or_scale_error(proc, tmp_path / "m.json", z)


@pytest.mark.parametrize("method", ["pts", "lb"])
def test_cifar_logits_at_1e300_fit_soundly_or_say_rescale(tmp_path, method):
    data = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    with np.errstate(divide="ignore"):
        z = np.log(data["predictions"][:1000].astype(np.float64))
    z = np.where(np.isfinite(z), z, np.nan)
    z = np.nan_to_num(z / np.nanmax(np.abs(z)) * 1e300, nan=-1e300)  # max |logit| = 1e300, all finite
    np.save(tmp_path / "x.npy", z)
    np.save(tmp_path / "y.npy", data["ground_truth"][:1000].astype(np.int64))
    proc = confcal("fit", "--method", method, "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json", "-q")
    _assert_sound_fit_or_scale_error(proc, tmp_path / "m.json", z)
    if method == "pts":  # its input standardisation overflows: refused, never written non-finite
        assert proc.returncode == 2 and "non-finite parameter" in proc.stderr, proc.stderr


@pytest.mark.parametrize("method", ["ts", "vs"])
def test_plus_inf_logit_is_reported_as_bad_logits_not_a_masked_label(tmp_path, method):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(10, 100))
    z[0, 5] = np.inf
    np.save(tmp_path / "x.npy", z)
    np.save(tmp_path / "y.npy", np.full(10, 49))
    proc = confcal("fit", "--method", method, "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json", "-q")
    assert proc.returncode == 2
    assert proc.stderr.startswith("confcal: error: --logits: ") and "found NaN/+inf in row 0" in proc.stderr, \
        proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_boolean_labels_are_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(10, 2)))
    np.save(tmp_path / "y.npy", np.array([True, False] * 5))
    proc = confcal("fit", "--method", "ts", "--logits", tmp_path / "x.npy", "--labels", tmp_path / "y.npy",
                   "-o", tmp_path / "m.json", "-q")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "confcal: error: --labels: expected integer class indices, got dtype bool"
    assert not (tmp_path / "m.json").exists()


@pytest.fixture(scope="module")
def big_apply(tmp_path_factory):
    """A TS manifest and 200k x 100 float32 logits: apply takes seconds, long enough to be signalled."""
    tmp = tmp_path_factory.mktemp("apply")
    rng = np.random.default_rng(0)
    np.save(tmp / "z.npy", rng.normal(size=(500, 100)))
    np.save(tmp / "y.npy", rng.integers(0, 100, 500))
    assert confcal("fit", "--method", "ts", "--logits", tmp / "z.npy", "--labels", tmp / "y.npy",
                   "-o", tmp / "ts.json", "-q").returncode == 0
    big = np.lib.format.open_memmap(tmp / "big.npy", mode="w+", dtype=np.float32, shape=(200_000, 100))
    for a in range(0, 200_000, 20_000):  # the fit's distribution: no drift warning on stderr
        big[a:a + 20_000] = rng.standard_normal((20_000, 100), dtype=np.float32)
    big.flush()
    del big
    return tmp


@pytest.mark.parametrize("sig, suffix", [(signal.SIGINT, ".npz"), (signal.SIGTERM, ".npz"),
                                         (signal.SIGINT, ".parquet")])
def test_signalled_apply_says_one_line_and_leaves_nothing(big_apply, tmp_path, sig, suffix):
    out = tmp_path / "out" / f"p{suffix}"
    out.parent.mkdir()
    # the child gets the default SIGINT disposition (a background parent may have it ignored)
    proc = subprocess.Popen([sys.executable, "-m", "confcal", "apply", "--calibrator", str(big_apply / "ts.json"),
                             "--logits", str(big_apply / "big.npy"), "-o", str(out), "-q"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.parent.iterdir()) and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.2)  # inside the write loop, with the zip / Parquet writer open
    assert proc.poll() is None, "apply ended before it was signalled"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig
    assert err == f"confcal: interrupted by {signal.Signals(sig).name}\n", err
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("value, said", [("", "got ''"), ("127.0.0.1:99999", "PORT in 1..65535"),
                                         ("tcp://127.0.0.1:0", "PORT in 1..65535")])
def test_bad_scheduler_is_refused_before_any_cluster(tmp_path, value, said):
    pytest.importorskip("distributed")
    (tmp_path / "data").mkdir()  # the manifest goes beside the dataset folder, not into it (issue 21 guard)
    np.save(tmp_path / "data" / "x.npy", np.zeros((4, 2)))
    proc = confcal("fit", "--engine", "dask", "--scheduler", value, "--method", "ts", "--logits",
                   f"{tmp_path / 'data'}:logits", "--labels", f"{tmp_path / 'data'}:labels", "-o", tmp_path / "m.json")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("confcal: error: --scheduler: expected a scheduler address") and said in line, line
    assert "cannot reach" not in line  # refused on sight, not after a connection timeout


@pytest.mark.parametrize("value, expected", [("True", True), ("true", True), ("1", True),
                                             ("False", False), ("false", False), ("0", False)])
def test_boolean_param_spellings(tmp_path, value, expected):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    s = np.clip(0.3 + 0.4 * y + rng.normal(scale=0.2, size=400), 0.01, 0.99)
    s[:5] = 1.05  # outside [0, 1]: only clip_scores=True takes it
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "y.npy", y)
    proc = confcal("fit", "--method", "det-ts", "--logits", tmp_path / "s.npy", "--labels", tmp_path / "y.npy",
                   "--param", f"clip_scores={value}", "-o", tmp_path / "m.json", "-q")
    if expected:
        assert proc.returncode == 0, proc.stderr
        assert json.loads((tmp_path / "m.json").read_text())["hyperparameters"]["clip_scores"] is True
    else:
        assert proc.returncode == 2 and "clip_scores=True" in proc.stderr, proc.stderr
        assert "expected true or false" not in proc.stderr


def test_parse_params_reads_bool_spellings_only_for_boolean_hyperparameters():
    from confcal.cli._shared.common import parse_params

    items = ["clip_scores=True", "per_class=0", "bias=false", "min_samples=1"]
    assert parse_params(items, "det-ts") == {"clip_scores": True, "per_class": False, "bias": False,
                                            "min_samples": 1}
    assert parse_params(items) == {"clip_scores": "True", "per_class": 0, "bias": False, "min_samples": 1}
    assert parse_params(["clip_scores=yes"], "det-ts") == {"clip_scores": "yes"}  # left for the method's check
    assert parse_params(["t_min=1"], "no-such-method") == {"t_min": 1}


@pytest.mark.parametrize("address", ["", "tcp://127.0.0.1:65536", "127.0.0.1:0"])
def test_cluster_client_refuses_bad_addresses_without_starting_anything(monkeypatch, address):
    distributed = pytest.importorskip("distributed")
    from confcal.dask._cluster import cluster_client

    def never(*a, **k):
        raise AssertionError("a cluster or client was started")

    monkeypatch.setattr(distributed, "LocalCluster", never)
    monkeypatch.setattr(distributed, "Client", never)
    with pytest.raises(ValueError, match=r"^--scheduler: expected a scheduler address"):
        with cluster_client(address):
            pass
