"""``fit --dataset-version``: a blank value is refused (as --domain-name, --box-features and --methods refuse
theirs) instead of being dropped from the fit record; any other text is stored as given."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from confcal.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    t = tmp_path_factory.mktemp("dv")
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 2
    np.save(t / "z.npy", z)
    np.save(t / "y.npy", (z + rng.normal(size=z.shape)).argmax(1))
    return t


def _fit(t, version, *more):
    return main(["fit", "--logits", f"{t}/z.npy", "--labels", f"{t}/y.npy", "-o", f"{t}/cal.json",
                 "--dataset-version", version, *more])


@pytest.mark.parametrize("version", ["", " ", "\t", "  \n"])
@pytest.mark.parametrize("method", ["ts", "auto"])
def test_blank_is_refused_with_no_output(data, capsys, version, method):
    (data / "cal.json").unlink(missing_ok=True)
    capsys.readouterr()
    assert _fit(data, version, "--method", method) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("confcal: error: --dataset-version: expected a non-empty version or tag such as v1.2 or "
                   f"2024-06-01, got {version!r}")
    assert not (data / "cal.json").exists()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.text(min_size=1, max_size=30).filter(lambda v: v.strip() and "\x00" not in v
                                                       and not v.startswith("-")))
def test_other_text_is_recorded_as_given(data, capsys, version):
    assert _fit(data, version, "--method", "ts") == 0
    capsys.readouterr()
    m = json.loads((data / "cal.json").read_text())
    assert m["fit"]["provenance"]["dataset_version"] == version
