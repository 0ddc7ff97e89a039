"""Scores outside [0, 1] for the probability-reading box maps: the error names the map that raised
it (det-beta said "det-ts expects ...") and the hyper-parameter in both forms (library
``clip_scores=True``, command line ``--param clip_scores=true``)."""

from __future__ import annotations

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.cli import main

HINT = "or set clip_scores=True (command line: --param clip_scores=true) to clip them into [0, 1]"


def _raw(n=200, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.uniform(0.05, 1.2, n)
    return s, (rng.uniform(size=n) < np.minimum(s, 1)).astype(np.int8)


@pytest.mark.parametrize("method", ["det-ts", "det-beta"])
def test_library_error_names_the_method(method):
    s, y = _raw()
    i = int(np.flatnonzero(s > 1)[0])
    with pytest.raises(ValueError) as exc:
        METHODS[method](input_kind="probs").fit(s, y)
    msg = str(exc.value)
    assert msg.startswith(f"scores: {method} expects probability scores in [0, 1], got {float(s[i])!r} at index {i} "
                          f"({int(np.sum(s > 1))} of 200 outside)"), msg
    assert msg.endswith(HINT), msg
    other = {"det-ts": "det-beta", "det-beta": "det-ts"}[method]
    assert other + " expects" not in msg


@pytest.mark.parametrize("method", ["det-ts", "det-beta"])
def test_cli_error_gives_the_param_form_and_the_hint_works(tmp_path, capsys, method):
    s, y = _raw()
    np.savez(tmp_path / "d.npz", score=s, correct=y)
    base = ["fit", "--method", method, "--logits", f"{tmp_path}/d.npz:score", "--labels", f"{tmp_path}/d.npz:correct",
            "-q"]
    assert main([*base, "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"confcal: error: --logits: {method} expects probability scores"), err
    assert "--param clip_scores=true" in err and not (tmp_path / "m.json").exists()
    # the command the message gives fits
    assert main([*base, "--param", "clip_scores=true", "-o", str(tmp_path / "m.json")]) == 0
    assert (tmp_path / "m.json").exists()
