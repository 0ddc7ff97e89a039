"""Valid input accepted consistently (issue 21): every command that reads the same kind of input
accepts the same input flags (compared over the parsers), and they take effect in every command."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from confcal.cli import build_parser, main
from confcal.cli._shared.outputs import INPUT_DESTS

#: input options whose values are array specs (PATH or PATH:KEY of .npy/.npz/.csv/.parquet/...)
ARRAY_DESTS = set(INPUT_DESTS) - {"calibrator", "gt", "detections", "domain_map", "queue", "verify"} | {"domain"}
#: flags that say how array specs are read: every command reading array specs has each of them
READING_FLAGS = {"--csv-header"}
#: flags that say what logits mean: every command reading --logits has each of them
LOGITS_FLAGS = {"--input-kind"}


def _commands():
    out = {}

    def walk(p, prefix):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and prefix:
            out[" ".join(prefix)] = p
        for a in subs:
            for name, sp in a.choices.items():
                walk(sp, [*prefix, name])

    walk(build_parser(), [])
    return out


def test_every_command_reading_array_specs_takes_the_same_reading_flags():
    missing = {}
    for name, p in _commands().items():
        dests = {a.dest for a in p._actions}
        flags = {s for a in p._actions for s in a.option_strings}
        if dests & ARRAY_DESTS and not READING_FLAGS <= flags:
            missing[name] = sorted(READING_FLAGS - flags)
        if "logits" in dests and not LOGITS_FLAGS <= flags:
            missing[name] = sorted(LOGITS_FLAGS - flags)
    assert not missing, missing
    readers = [n for n, p in _commands().items() if {a.dest for a in p._actions} & ARRAY_DESTS]
    assert {"fit", "apply", "evaluate", "compare", "report", "drift", "rank", "domain-eval"} <= set(readers)


@pytest.fixture
def headerless(tmp_path):
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 150)
    z = rng.normal(size=(150, 3)) + 2 * np.eye(3)[y]
    np.savetxt(tmp_path / "z.csv", z, delimiter=",")
    np.savetxt(tmp_path / "y.csv", y, fmt="%d")
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"), "--method", "ts",
                 "-q", "-o", str(tmp_path / "c.json")]) == 0
    return tmp_path


@pytest.mark.parametrize("argv", [
    ["report", "--logits", "{d}/z.csv", "--labels", "{d}/y.csv", "--calibrator", "{d}/c.json", "--bootstrap", "2",
     "-o", "{d}/r.html"],
    ["drift", "--logits", "{d}/z.csv", "--calibrator", "{d}/c.json"],
    ["evaluate", "--logits", "{d}/z.csv", "--labels", "{d}/y.csv", "--calibrator", "{d}/c.json", "--max-ece", "1"],
    ["compare", "--logits", "{d}/z.csv", "--labels", "{d}/y.csv", "--methods", "ts", "--splits", "1",
     "--cal-size", "75"],
])
def test_csv_header_none_is_honoured_by_every_reader(headerless, argv, capsys):
    """Without --csv-header none the first data row is refused (it looks like data); with it, the command
    runs on the same numbers as the .npy files."""
    argv = [a.format(d=headerless) for a in argv]
    assert main(argv) == 2
    assert "--csv-header none" in capsys.readouterr().err
    assert main([*argv, "--csv-header", "none"]) == 0
    if argv[0] == "drift":  # the same statistic as on the .npy logits
        out_csv = capsys.readouterr().out
        assert main(["drift", "--logits", str(headerless / "z.npy"), "--calibrator", str(headerless / "c.json")]) == 0
        assert capsys.readouterr().out == out_csv


def test_csv_column_glob_in_class_order(tmp_path, capsys):
    """``file.csv:logit_*`` is a column group as on Parquet (the --help promise): stored in string order
    (logit_0, logit_1, logit_10, ...), it reads back in class order; a fit on it equals the .npy fit."""
    import json

    from confcal.sources import open_source

    rng = np.random.default_rng(5)
    y = rng.integers(0, 12, 400)
    z = rng.normal(size=(400, 12)) + 3 * np.eye(12)[y]
    order = sorted(range(12), key=lambda j: f"logit_{j}")
    lines = ["id,label," + ",".join(f"logit_{j}" for j in order)]
    lines += [f"{i},{y[i]}," + ",".join(repr(float(z[i, j])) for j in order) for i in range(len(y))]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    np.testing.assert_array_equal(open_source(f"{tmp_path}/s.csv:logit_*").to_numpy(), z)
    assert open_source(f"{tmp_path}/s.csv:logit_1?").shape == (400, 2)  # logit_10, logit_11
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    assert main(["fit", "-q", "--logits", f"{tmp_path}/s.csv:logit_*", "--labels", f"{tmp_path}/s.csv:label",
                 "--method", "ts", "-o", str(tmp_path / "a.json")]) == 0
    assert main(["fit", "-q", "--logits", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--method", "ts", "-o", str(tmp_path / "b.json")]) == 0
    t = [json.loads((tmp_path / f"{k}.json").read_text())["parameters"]["temperature"] for k in "ab"]
    assert t[0] == pytest.approx(t[1], rel=1e-10)
    assert main(["fit", "-q", "--logits", f"{tmp_path}/s.csv:nope_*", "--labels", f"{tmp_path}/s.csv:label",
                 "--method", "ts", "-o", str(tmp_path / "c.json")]) == 2
    assert "no column of" in capsys.readouterr().err


def test_report_domains_with_a_ts_manifest(headerless, capsys):
    """--domains with a calibrator that takes none (TS) is for the per-domain rows: accepted by report as
    by evaluate, with one row per domain in the JSON side-file; --features it cannot use is still refused."""
    import json

    d = headerless
    np.save(d / "dom.npy", np.where(np.arange(150) % 3 == 0, "x", "y"))
    args = ["--logits", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--calibrator", str(d / "c.json"),
            "--domains", str(d / "dom.npy")]
    assert main(["report", *args, "--bootstrap", "2", "-o", str(d / "r.html")]) == 0
    rows = json.loads((d / "r.numbers.json").read_text())["metrics"]
    assert sorted({r["domain"] for r in rows}) == sorted({"x", "y", next(r["domain"] for r in rows
                                                                         if r["domain"] not in ("x", "y"))})
    assert sum(r["n"] for r in rows if r["domain"] in ("x", "y") and r["stage"] == "ts") == 150
    assert main(["evaluate", *args]) == 0
    np.save(d / "f.npy", np.ones((150, 2)))
    capsys.readouterr()
    assert main(["report", *args, "--features", str(d / "f.npy"), "-o", str(d / "r2.html")]) == 2
    assert "--features" in capsys.readouterr().err


def test_evaluate_on_a_one_logit_head(tmp_path, capsys):
    """A binary sigmoid head: logits (n, 1), or (n,) with --input-kind logits, are evaluated as
    p = sigmoid(z) (they were refused, or clipped to [0, 1] as box scores). Oracle: closed forms."""
    import json

    from confcal.metrics.detection import detection_ece

    rng = np.random.default_rng(4)
    z = rng.normal(0, 3, 400)
    y = (rng.random(400) < 1 / (1 + np.exp(-z / 2))).astype(int)
    np.save(tmp_path / "z1.npy", z[:, None])
    np.save(tmp_path / "z0.npy", z)
    np.save(tmp_path / "y.npy", y)
    p = 1 / (1 + np.exp(-z))
    nll = np.mean(np.where(y == 1, np.logaddexp(0, -z), np.logaddexp(0, z)))
    results = []
    for argv in (["--logits", str(tmp_path / "z1.npy")], ["--logits", str(tmp_path / "z0.npy"), "--input-kind", "logits"]):
        assert main(["evaluate", *argv, "--labels", str(tmp_path / "y.npy"), "--json"]) == 0
        m = json.loads(capsys.readouterr().out)["metrics"]["uncalibrated"]
        assert m["nll"] == pytest.approx(nll, rel=1e-12)
        assert m["brier"] == pytest.approx(np.mean((p - y) ** 2), rel=1e-12)
        assert m["d_ece"] == pytest.approx(detection_ece(p, y, 15), rel=1e-12)
        results.append(m)
    assert results[0] == results[1]
