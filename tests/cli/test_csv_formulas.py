"""CSV cells a spreadsheet would run as formulas are neutralised in every CSV confcal writes (issue 21):
one rule (:func:`confcal.io.csv_cell`) for ``rank``'s queue, ``compare --csv`` and ``domain-eval --csv``."""

from __future__ import annotations

import csv
import warnings

import numpy as np

from confcal.cli import main
from confcal.io import csv_cell, neutralise_csv

EVIL = ["=HYPERLINK(\"http://x\")", "+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def test_the_rule():
    assert [csv_cell(v) for v in EVIL] == ["'" + v for v in EVIL]
    assert [csv_cell(v) for v in ("-0.25", "-inf", "+1e3", "ts", "", 3, -1.5)] == ["-0.25", "-inf", "+1e3", "ts",
                                                                                   "", 3, -1.5]
    text = 'a,b\n"=1+1",-0.5\n'
    assert list(csv.reader(neutralise_csv(text).splitlines())) == [["a", "b"], ["'=1+1", "-0.5"]]


def test_domain_eval_csv_neutralises_domain_names(tmp_path, capsys):
    rng = np.random.default_rng(0)
    names = ["src", "+HYPERLINK(\"http://evil\")", "b", "@c"]  # ('=' would end NAME in NAME=PATH)
    argv = ["domain-eval"]
    for i, name in enumerate(names):
        y = rng.integers(0, 3, 90)
        np.savez(tmp_path / f"d{i}.npz", logits=rng.normal(size=(90, 3)) * (1 + i) + 2 * np.eye(3)[y], labels=y,
                 features=rng.normal(i, 1, (90, 2)))
        argv += ["--domain", f"{name}={tmp_path}/d{i}.npz"]
    argv += ["--source", "src", "--target", names[1], "--n-calibration", "1", "--draws", "3", "--n-samples", "40",
             "--param", "n_clusters=2", "--csv", str(tmp_path / "rows.csv")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    rows = list(csv.reader((tmp_path / "rows.csv").open()))
    cells = [c for r in rows[1:] for c in r]
    assert "'" + names[1] in cells and not any(c[:1] and c[:1] in "=@+\t\r" for c in cells)
    numbers = [c for c in cells if c[:1] == "-"]  # negative numbers stay numbers
    assert all(float(c) < 0 for c in numbers)


def test_compare_csv_goes_through_the_rule(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 200)
    np.save(tmp_path / "z.npy", rng.normal(size=(200, 3)) + 2 * np.eye(3)[y])
    np.save(tmp_path / "y.npy", y)
    from confcal.evaluation.compare import ComparisonResult

    real = ComparisonResult.to_csv
    monkeypatch.setattr(ComparisonResult, "to_csv", lambda self: real(self).replace("\nts,", "\n=ts(),", 1))
    assert main(["compare", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--methods",
                 "ts", "--splits", "1", "--cal-size", "100", "--csv", str(tmp_path / "s.csv")]) == 0
    cells = [c for r in csv.reader((tmp_path / "s.csv").open()) for c in r]
    assert "'=ts()" in " ".join(cells) and not any(c.startswith("=") for c in cells)


def test_apply_csv_keep_columns_go_through_the_rule(tmp_path):
    """``apply -o p.csv --keep-columns name`` copied formula cells of the input verbatim (tester finding)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(len(EVIL), 3))
    with open(tmp_path / "x.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "logit_0", "logit_1", "logit_2", "label"])
        for i, name in enumerate(EVIL):
            w.writerow([name, *z[i], i % 3])
    assert main(["fit", "--logits", f"{tmp_path}/x.csv:logit_*", "--labels", f"{tmp_path}/x.csv:label",
                 "--method", "ts", "-q", "-o", str(tmp_path / "c.json")]) == 0
    assert main(["apply", "--calibrator", str(tmp_path / "c.json"), "--logits", f"{tmp_path}/x.csv:logit_*",
                 "--keep-columns", "name", "-q", "-o", str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "name" and len(rows) == len(EVIL) + 1
    assert [r[0] for r in rows[1:]] == [csv_cell(v) for v in EVIL]
    assert all(float(c) >= 0 for r in rows[1:] for c in r[1:])  # the probabilities stay numbers
