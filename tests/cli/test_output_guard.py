"""One output-path guard for every command that writes (issue 21): an output that is, contains or
lies inside an input, two outputs on one path, or an existing folder that is not a dataset of the
kind written is refused with exit 2 and one line, and the inputs are left byte for byte."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confcal.cli import main

def digest(root) -> str:
    h = hashlib.sha256()
    paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for p in paths:
        h.update(str(p.relative_to(root) if root.is_dir() else p.name).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 3
    y = np.where(rng.random(300) < 0.7, z.argmax(1), rng.integers(0, 3, 300))
    np.savez(tmp_path / "d.npz", logits=z, labels=y)
    np.save(tmp_path / "z.npy", z)
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"logits": pa.FixedSizeListArray.from_arrays(pa.array(z.ravel()), 3), "label": y}),
                   tmp_path / "ds" / "part-0.parquet")
    assert main(["fit", "--logits", f"{tmp_path}/d.npz:logits", "--labels", f"{tmp_path}/d.npz:labels",
                 "--method", "ts", "-o", str(tmp_path / "cal.json"), "-q"]) == 0
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("not a dataset")
    return tmp_path


def _cases(t):
    L, Y = f"{t}/d.npz:logits", f"{t}/d.npz:labels"
    return {
        "compare --csv = input": ["compare", "--logits", L, "--labels", Y, "--methods", "ts", "--splits", "2",
                                  "--cal-size", "100", "--csv", f"{t}/d.npz"],
        "report -o = calibrator": ["report", "--logits", L, "--labels", Y, "--calibrator", f"{t}/cal.json",
                                   "-o", f"{t}/cal.json"],
        "apply -o inside input dataset": ["apply", "--calibrator", f"{t}/cal.json", "--logits", f"{t}/ds:logits",
                                          "-o", f"{t}/ds/probs.parquet"],
        "apply -o is a link to the input": ["apply", "--calibrator", f"{t}/cal.json", "--logits", f"{t}/z.npy",
                                            "-o", f"{t}/link.npy"],
        "fit -o a folder": ["fit", "--logits", L, "--labels", Y, "--method", "ts", "-o", f"{t}/keep"],
        "domain-eval --csv = input": ["domain-eval", "--domain", f"a={t}/d.npz", "--domain", f"b={t}/d.npz",
                                      "--keys", "logits,labels,logits", "--source", "a", "--csv", f"{t}/d.npz"],
    }


@pytest.mark.parametrize("case", list(_cases("T")))
def test_inputs_never_overwritten(files, case, capsys):
    os.symlink(files / "z.npy", files / "link.npy")
    before = digest(files)
    argv = _cases(files)[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error: --") and "\n" not in err, err
    assert digest(files) == before


def test_dask_apply_does_not_delete_an_ordinary_folder(files, capsys):
    pytest.importorskip("distributed", reason="the dask extra is not installed")
    before = digest(files / "keep")
    # refused before a cluster is started: the guard runs before dispatch
    assert main(["apply", "--engine", "dask", "--workers", "1", "--calibrator", f"{files}/cal.json",
                 "--logits", f"{files}/ds:logits", "-o", f"{files}/keep"]) == 2
    assert "not a Parquet dataset" in capsys.readouterr().err
    assert digest(files / "keep") == before
    assert main(["apply", "--engine", "dask", "--workers", "1", "--calibrator", f"{files}/cal.json",
                 "--logits", f"{files}/ds:logits", "-o", f"{files}"]) == 2
    assert "contains the input" in capsys.readouterr().err


def test_holdout_output_equal_to_output_refused(tmp_path, capsys):
    from tests.conftest import require_shared_data

    kitti = require_shared_data("detection", "kitti_bev_cars")
    out = tmp_path / "m.npz"
    assert main(["detections", "match", "--gt", f"{kitti}/gt.json", "--detections",
                 f"{kitti}/detections.json", "--holdout", "0.3", "--holdout-output", str(out),
                 "-o", str(out)]) == 2
    assert "two outputs cannot share" in capsys.readouterr().err and not out.exists()


def test_a_fresh_output_is_still_written(files):
    assert main(["apply", "--calibrator", f"{files}/cal.json", "--logits", f"{files}/z.npy",
                 "-o", f"{files}/p.npy"]) == 0
    p = np.load(files / "p.npy")
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-12)
    assert json.loads((files / "cal.json").read_text())["method"] == "ts"
