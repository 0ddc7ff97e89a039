"""Top-label and sets decisions remember the class count of their fit; apply / rank / evaluate refuse
another count in one line, before any check of the values (tester report on 2dedd61)."""

import json

import numpy as np
import pytest

from confcal.cli import main
from confcal.decisions.manifest import canonical_sha256


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(3)
    for k in (3, 4, 5, 6):
        z = rng.normal(size=(3000, k)) * 2
        y = (z + rng.normal(size=z.shape)).argmax(1)
        np.save(tmp_path / f"z{k}.npy", z)
        np.save(tmp_path / f"p{k}.npy", _softmax(z))
        np.save(tmp_path / f"y{k}.npy", y)
    assert main(["decide", "fit", "--input", "top-label", "--input-kind", "probs", "--logits", str(tmp_path / "p4.npy"),
                 "--labels", str(tmp_path / "y4.npy"), "--alpha-accept", "0.1", "--alpha-reject", "none",
                 "-o", str(tmp_path / "d.json")]) == 0
    assert main(["decide", "fit", "--input", "top-label", "--logits", str(tmp_path / "z4.npy"),
                 "--labels", str(tmp_path / "y4.npy"), "--alpha-accept", "0.1", "--alpha-reject", "none",
                 "-o", str(tmp_path / "dz.json")]) == 0
    return tmp_path


def test_the_manifest_records_the_class_count(files):
    assert json.loads((files / "d.json").read_text())["input"]["n_classes"] == 4
    assert json.loads((files / "dz.json").read_text())["input"]["n_classes"] == 4


@pytest.mark.parametrize("k", [3, 5, 6])
@pytest.mark.parametrize("kind", ["probs", "logits"])
@pytest.mark.parametrize("command", ["apply", "rank", "evaluate"])
def test_another_class_count_is_refused_in_one_line(files, capsys, k, kind, command):
    t = files
    dec = t / ("d.json" if kind == "probs" else "dz.json")
    x = t / (f"p{k}.npy" if kind == "probs" else f"z{k}.npy")
    out = t / ("o.csv" if command == "rank" else "o.npy")
    argv = ["decide", command, "--decisions", str(dec), "--logits", str(x)]
    argv += {"apply": ["-o", str(out)], "rank": ["-o", str(out)],
             "evaluate": ["--labels", str(t / f"y{k}.npy")]}[command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"confcal: error: --logits: expected 4 classes as at fit (the decisions were fitted on (n, 4) " \
                  f"scores), got {k} columns\n"
    assert not out.exists()


def test_the_same_count_still_applies(files):
    t = files
    assert main(["decide", "apply", "--decisions", str(t / "d.json"), "--logits", str(t / "p4.npy"),
                 "-o", str(t / "a.npy")]) == 0
    assert np.load(t / "a.npy").shape == (3000,)


def test_a_manifest_without_n_classes_loads_and_skips_the_check(files):
    t = files
    m = json.loads((t / "d.json").read_text())
    del m["input"]["n_classes"]
    m["sha256"] = canonical_sha256({k: v for k, v in m.items() if k != "sha256"})
    (t / "old.json").write_text(json.dumps(m))
    assert main(["decide", "apply", "--decisions", str(t / "old.json"), "--logits", str(t / "p6.npy"),
                 "-o", str(t / "b.npy")]) == 0  # as before: nothing to check against
    assert np.load(t / "b.npy").shape == (3000,)


def test_a_bad_recorded_count_is_refused(files, capsys):
    t = files
    m = json.loads((t / "d.json").read_text())
    m["input"]["n_classes"] = 1
    m["sha256"] = canonical_sha256({k: v for k, v in m.items() if k != "sha256"})
    (t / "bad.json").write_text(json.dumps(m))
    assert main(["decide", "apply", "--decisions", str(t / "bad.json"), "--logits", str(t / "p4.npy"),
                 "-o", str(t / "c.npy")]) == 2
    assert "input.n_classes" in capsys.readouterr().err
