"""Issue 40, defect 7: ``confcal demo --output-dir D`` silently replaced ``D/calibrator.json``. It now
replaces only files an earlier demo wrote (its fit record says so), else refuses naming --force."""

from __future__ import annotations

import json

from confcal.cli import main


def test_demo_refuses_a_manifest_it_did_not_write(tmp_path, capsys):
    d = tmp_path / "runs"
    d.mkdir()
    mine = d / "calibrator.json"
    mine.write_text('{"my": "manifest"}\n')
    assert main(["demo", "--output-dir", str(d), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error: --output-dir:") and "--force" in err and "\n" not in err
    assert mine.read_text() == '{"my": "manifest"}\n'
    png = tmp_path / "p"
    png.mkdir()
    (png / "reliability.png").write_bytes(b"not mine")
    assert main(["demo", "--output-dir", str(png)]) == 2
    assert (png / "reliability.png").read_bytes() == b"not mine" and not (png / "calibrator.json").exists()


def test_demo_replaces_its_own_files_and_anything_with_force(tmp_path, capsys):
    d = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(d), "--no-plot"]) == 0
    first = json.loads((d / "calibrator.json").read_text())
    assert first["fit"]["provenance"]["command"].startswith("confcal demo")
    assert main(["demo", "--output-dir", str(d), "--no-plot", "--seed", "1"]) == 0  # its own file: replaced
    (d / "calibrator.json").write_text("{}")
    assert main(["demo", "--output-dir", str(d), "--no-plot"]) == 2
    assert main(["demo", "--output-dir", str(d), "--no-plot", "--force"]) == 0
    assert json.loads((d / "calibrator.json").read_text())["method"] == "ts"
