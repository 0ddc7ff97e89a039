"""Real network outputs: temperature scaling on DenseNet-BC-100 / CIFAR-100 (netcal's records)."""

import numpy as np
import pytest

from confcal.calibrators import TemperatureScaling
from confcal.metrics import accuracy, ece
from tests.conftest import require_shared_data


@pytest.fixture(scope="module")
def densenet():
    path = require_shared_data("cifar", "densenet-bc-100-cifar-100.npz")
    with np.load(path) as d:
        return d["predictions"], d["ground_truth"]


@pytest.mark.slow  # a fit on real data (../shared/data)
def test_temperature_scaling_densenet_cifar100(densenet):
    probs, labels = densenet
    cal_p, cal_y, test_p, test_y = probs[:5000], labels[:5000], probs[5000:], labels[5000:]
    ts = TemperatureScaling(input_kind="probs").fit(cal_p, cal_y)
    calibrated = ts.predict_proba(test_p)
    before, after = ece(test_p, test_y, n_bins=15), ece(calibrated, test_y, n_bins=15)
    assert 0.13 < before < 0.155  # about 14% uncalibrated
    assert after < 0.025
    assert ts.temperature_ == pytest.approx(2.1, abs=0.1)
    # accuracy byte-for-byte unchanged: the very same arg-max for every sample
    np.testing.assert_array_equal(calibrated.argmax(axis=1), test_p.argmax(axis=1))
    assert accuracy(calibrated, test_y) == accuracy(test_p, test_y)


@pytest.mark.slow  # a fit on real data (../shared/data)
def test_cli_on_cifar(densenet, tmp_path, capsys):
    """The CIFAR example of docs/guide/cifar.md: npz keys and --input-kind probs through fit and evaluate."""
    import json

    from confcal.cli import main

    path = require_shared_data("cifar", "densenet-bc-100-cifar-100.npz")
    probs, labels = densenet
    np.savez(tmp_path / "cal.npz", probs=probs[:5000], labels=labels[:5000])
    np.savez(tmp_path / "test.npz", probs=probs[5000:], labels=labels[5000:])
    assert main(["fit", "--logits", f"{tmp_path}/cal.npz:probs", "--labels", f"{tmp_path}/cal.npz:labels",
                 "--input-kind", "probs", "--method", "ts", "-o", str(tmp_path / "ts.json")]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{tmp_path}/test.npz:probs", "--labels", f"{tmp_path}/test.npz:labels",
                 "--input-kind", "probs", "--calibrator", str(tmp_path / "ts.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metrics"]["uncalibrated"]["ece"] > 0.13
    assert report["metrics"]["ts"]["ece"] < 0.025
    assert report["metrics"]["ts"]["accuracy"] == report["metrics"]["uncalibrated"]["accuracy"]
    assert path.exists()
