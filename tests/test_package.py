"""The top-level package: its public names, a light import, the licence a user receives."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import confcal

REPO = Path(__file__).resolve().parents[1]
# the limit for `import confcal` alone (interpreter start-up not counted)
IMPORT_LIMIT_S = 1.0


def test_every_name_in_all_resolves_and_is_listed_by_dir():
    listed = dir(confcal)
    for name in confcal.__all__:
        assert getattr(confcal, name) is not None, name
        assert name in listed, name
    assert "metrics" in listed and "calibrators" in listed


def test_unknown_attribute_names_the_module():
    try:
        confcal.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "confcal" in str(err) and "no_such_name" in str(err)
    else:  # pragma: no cover - the assertion is the test
        raise AssertionError("no AttributeError")


def test_import_is_light_and_fast():
    code = (
        "import sys, time; t = time.perf_counter(); import confcal; dt = time.perf_counter() - t; "
        "print(dt, int(any(m in sys.modules for m in ('torch', 'scipy', 'sklearn', 'matplotlib'))))"
    )
    # the best of three: one cold-cache start on a loaded machine is not the package's cost
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for _ in range(3)]
    assert min(float(dt) for dt, _ in runs) < IMPORT_LIMIT_S, runs
    assert all(heavy == "0" for _, heavy in runs), "import confcal pulled in a heavy dependency"


def test_lazy_names_are_the_calibrators_objects():
    from confcal import calibrators

    assert confcal.TemperatureScaling is calibrators.TemperatureScaling
    assert confcal.METHODS is calibrators.METHODS


def test_licence_file_matches_pyproject():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT"
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    assert meta["license-files"] == ["LICENSE"]


def test_package_description_does_not_point_at_the_shared_folder():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    text = (REPO / meta["readme"]["file"]).read_text()
    assert "../shared" not in text and "shared/data" not in text
