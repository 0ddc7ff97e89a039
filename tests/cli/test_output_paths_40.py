"""Issue 40, defect 2: the output guard compares resolved paths and never globs a path the user typed.
Before, ``fit -o 'run[1]/ts.json'`` was refused as "contains the input of --logits" (the output was
read as the glob ``run``'s folder ``.``), and so were apply, report and export into such folders."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.cli import main
from confcal.io import guard_outputs

FOLDERS = ["run[1]", "run*", "exp?", "a b", "x [y]*?"]


@pytest.fixture
def data(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 4)) * 2
    y = np.where(rng.random(300) < 0.8, z.argmax(1), rng.integers(0, 4, 300))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_writer_writes_into_a_folder_with_glob_characters(data, folder, capsys):
    (data / folder).mkdir()
    cal = f"{folder}/ts.json"
    assert main(["fit", "--logits", "z.npy", "--labels", "y.npy", "--method", "ts", "-o", cal, "-q"]) == 0
    assert main(["apply", "--calibrator", cal, "--logits", "z.npy", "-o", f"{folder}/p [1].npy", "-q"]) == 0
    assert main(["report", "--calibrator", cal, "--logits", "z.npy", "--labels", "y.npy",
                 "-o", f"{folder}/r*.html", "-q"]) == 0
    assert main(["export", "--calibrator", cal, "--format", "onnx", "-o", f"{folder}/h?.onnx"]) == 0
    names = sorted(p.name for p in (data / folder).iterdir())
    assert {"ts.json", "p [1].npy", "r*.html", "h?.onnx"} <= set(names), (names, capsys.readouterr().err)
    # inputs in such a folder are read as the literal paths they are
    assert main(["evaluate", "--logits", f"{folder}/p [1].npy", "--input-kind", "probs", "--labels", "y.npy"]) == 0


@pytest.mark.parametrize("folder", FOLDERS)
def test_an_input_with_glob_characters_is_still_protected(data, folder, capsys):
    (data / folder).mkdir()
    z = f"{folder}/z.npy"
    np.save(data / z, np.load(data / "z.npy"))
    before = (data / z).read_bytes()
    assert main(["fit", "--logits", z, "--labels", "y.npy", "--method", "ts", "-o", z]) == 2
    assert "is also the input of --logits" in capsys.readouterr().err
    assert (data / z).read_bytes() == before


def test_guard_outputs_never_globs_an_output(data):
    (data / "run[1]").mkdir()
    guard_outputs({"--output": "run[1]/ts.json"}, {"--logits": "z.npy"})  # '.' holds z.npy: not the output
    guard_outputs({"--output": "*.json"}, {"--logits": "z.npy"})
    with pytest.raises(ValueError, match="two outputs cannot share"):
        guard_outputs({"--output": "a[1].json", "--csv": "./a[1].json"}, {})
    # an input glob (the Dask engine's Parquet pieces) still protects its folder
    (data / "parts").mkdir()
    with pytest.raises(ValueError, match="lies inside the input"):
        guard_outputs({"--output": "parts/out.npy"}, {"--logits": "parts/*.parquet"})
