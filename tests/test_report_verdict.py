"""The report opens with a verdict (issue 21): pass / fail per group against --max-ece, the same groups
and exit status as `confcal evaluate`; numbers rounded (full value on hover); tables in their own
scroll box; provenance and fit record folded."""

from __future__ import annotations

import re

import numpy as np
import pytest

from confcal.cli import main


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    n = 600
    dom = np.where(np.arange(n) < 300, "a", "b")
    s = rng.random(n)
    y = (rng.random(n) < np.where(dom == "a", s, s ** 3)).astype(int)  # domain b over-confident
    np.savez(tmp_path / "m.npz", score=s, correct=y, domain=dom)
    assert main(["fit", "--method", "det-platt", "--logits", f"{tmp_path}/m.npz:score", "--labels",
                 f"{tmp_path}/m.npz:correct", "-o", str(tmp_path / "c.json"), "-q"]) == 0
    return tmp_path


def _args(t, *extra):
    return ["--logits", f"{t}/m.npz:score", "--labels", f"{t}/m.npz:correct", "--domains", f"{t}/m.npz:domain",
            "--calibrator", str(t / "c.json"), *extra]


@pytest.mark.parametrize("limit", ["0.0", "0.08", "1.0"])
def test_verdict_matches_evaluate(files, limit, capsys):
    code_eval = main(["evaluate", *_args(files, "--max-ece", limit)])
    code_rep = main(["report", *_args(files, "--max-ece", limit, "--bootstrap", "20", "-o", str(files / "r.html"))])
    assert code_rep == code_eval and code_eval in (0, 3)
    text = (files / "r.html").read_text()
    head = text[:text.index("<h2>Metrics</h2>")]
    verdict = re.search(r"class='verdict (pass|fail)'>(PASS|FAIL): (\d+) of 3 groups", head)
    assert verdict and (verdict.group(2) == "FAIL") == (code_eval == 3)
    err = capsys.readouterr().err
    n_bad = int(verdict.group(3))
    assert (n_bad > 0) == (code_eval == 3)
    if code_eval == 3:  # the same groups fail in both
        line_eval, line_rep = [ln for ln in err.splitlines() if "above --max-ece" in ln]
        assert line_eval.split(": ", 2)[-1] == line_rep.split(": ", 2)[-1]


def test_layout_rounded_folded(files):
    assert main(["report", *_args(files, "--bootstrap", "20", "-o", str(files / "r.html"))]) == 0
    text = (files / "r.html").read_text()
    assert "no verdict" in text
    assert "<details><summary>Provenance</summary>" in text and "<details><summary>Fit record" in text
    tables = re.findall(r"<table>.*?</table>", text, flags=re.S)
    assert tables and text.count("<div class=scroll><table>") == len(tables)
    cells = re.findall(r'<td[^>]*title="([^"]+)"[^>]*>([^<]+)</td>', text)
    assert cells
    for full, shown in cells:  # shown = the full value to 4 significant digits
        assert float(shown) == pytest.approx(float(full), rel=5e-4, abs=1e-12) and len(shown) <= 10


def test_json_side_file_holds_the_numbers_at_full_precision(files, capsys):
    """The HTML rounds to 4 digits; the JSON side-file beside it holds each number as the metric
    functions give it (oracle: ``detection_ece`` / ``binary_brier`` on the same calibrated scores)."""
    import json

    from confcal.io import load_calibrator
    from confcal.metrics.detection import detection_ece

    assert main(["report", *_args(files, "--max-ece", "0.08", "--bootstrap", "5", "-o", str(files / "r.html"))]) in (0, 3)
    numbers = json.loads((files / "r.numbers.json").read_text())
    assert numbers["metric"] == "d_ece" and numbers["max_ece"] == 0.08 and numbers["n_draws"] == 5
    z = np.load(files / "m.npz")
    p = load_calibrator(str(files / "c.json")).predict_proba(z["score"])[:, 1]
    row = next(r for r in numbers["metrics"] if r["stage"] == "det-platt" and r["domain"] == "b")
    b = z["domain"] == "b"
    assert row["d_ece"] == pytest.approx(detection_ece(p[b], z["correct"][b], 15), rel=1e-12)
    assert row["brier"] == pytest.approx(np.mean((p[b] - z["correct"][b]) ** 2), rel=1e-12)
    assert row["d_ece_interval"][0] <= row["d_ece_interval"][1]
    html = (files / "r.html").read_text()
    assert f"{row['d_ece']:.4f}" in html and repr(row["d_ece"]) not in html.split("title=")[0]
    # the default rule (confident): a group fails when its lower bound is above the limit
    assert all(v["rule"] == "confident" for v in numbers["verdict"])
    assert [v["pass"] for v in numbers["verdict"]] == [v["ece_lower"] <= 0.08 for v in numbers["verdict"]]
    assert all(v["ece_lower"] <= v["value"] <= v["ece_upper"] for v in numbers["verdict"])


def test_json_side_file_never_replaces_an_input(files, capsys):
    """The side-file is ``<stem>.numbers.json``, so ``-o c.html`` beside ``--calibrator c.json`` works; a
    calibrator that is named like the side-file is refused before any work."""
    before = (files / "c.json").read_bytes()
    assert main(["report", *_args(files, "--bootstrap", "5", "-o", str(files / "c.html"))]) == 0
    assert (files / "c.json").read_bytes() == before and (files / "c.numbers.json").exists()
    (files / "d.numbers.json").write_bytes(before)
    args = [a.replace("c.json", "d.numbers.json") for a in _args(files, "-o", str(files / "d.html"))]
    capsys.readouterr()
    assert main(["report", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error: --output (its JSON side-file):") and "--calibrator" in err
    assert (files / "d.numbers.json").read_bytes() == before and not (files / "d.html").exists()


@pytest.mark.parametrize("name", ["cost $5", "$x_1^2$", "a_b^c"])
def test_mathtext_characters_in_a_domain_name_are_drawn_as_text(name):
    """A '$' alone made matplotlib's mathtext parser raise; '$x_1^2$' was drawn as a formula."""
    import matplotlib

    from confcal.report import build_report

    rng = np.random.default_rng(2)
    s = rng.random(200)
    y = (rng.random(200) < s).astype(int)
    dom = np.where(np.arange(200) < 100, name, "plain")
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as <text>, so the literal can be found
        page = build_report({"uncalibrated": s, "det-platt": s}, y, domains=dom, n_draws=2)
    import html
    import re

    drawn = re.findall(r"<text[^>]*>([^<]*)</text>", page)  # the drawn texts (not the SVG's comments)
    assert html.escape(f"domain {name}", quote=False) in drawn  # the chart title, literally
