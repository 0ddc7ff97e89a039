"""``fit`` and ``predict_proba`` take arrays and ``Source`` objects; a path string is refused in one line.

Files are read by ``confcal.sources`` (and the CLI), not by the estimators: a path or spec string
raises ``TypeError`` naming the argument, ``confcal.sources.open_source`` and the command line.
Methods cover the three fit paths: the in-memory fit (``isotonic``), the reporting fit that may move
the arg-max (``vs``) and the streamed fits (``ts``, ``det-ts``).
"""
from pathlib import Path

import numpy as np
import pytest

from confcal.calibrators import METHODS
from confcal.sources import open_source

MESSAGE = r"^(logits|labels|sample_weight|domains): (fit|predict_proba) takes an array or a confcal\.sources\.Source, " \
          r"got the path .*confcal\.sources\.open_source\(.*command line \(confcal fit/apply\)$"


def _data(method):
    rng = np.random.default_rng(0)
    if method.startswith("det-"):
        s = rng.uniform(0.05, 0.95, 200)
        return s, (rng.random(200) < s).astype(np.int64), {"input_kind": "probs"}
    x = rng.normal(size=(200, 3)) * 2
    return x, np.where(rng.random(200) < 0.8, x.argmax(axis=1), rng.integers(0, 3, 200)), {}


@pytest.mark.parametrize("method", ["isotonic", "vs", "ts", "det-ts"])
@pytest.mark.parametrize("as_path", [str, Path, lambda p: str(p).encode()], ids=["str", "Path", "bytes"])
def test_path_strings_are_refused_and_sources_accepted(tmp_path, method, as_path):
    if method in ("vs", "ts"):
        pytest.importorskip("torch")
    x, y, kw = _data(method)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    px, py = as_path(tmp_path / "x.npy"), as_path(tmp_path / "y.npy")
    for args in ((px, y), (x, py), (px, py)):
        with pytest.raises(TypeError, match=MESSAGE):
            METHODS[method](**kw).fit(*args)
    with pytest.raises(TypeError, match=MESSAGE):
        METHODS[method](**kw).fit(x, y, sample_weight=as_path(tmp_path / "w.npy"))
    ref = METHODS[method](**kw).fit(x, y)
    with pytest.raises(TypeError, match=MESSAGE):
        ref.predict_proba(px)
    # the same files opened as sources fit the same map (another read path: relative tolerance). A source
    # fits vs by the full-data job (Newton on pass sums) and an array by the in-memory solver: both stop at
    # the optimum within their solver tolerance, not at the same last bits (the in-memory fit stops at
    # a largest gradient entry of 1e-7, here 7e-8; with VS's ridge the flattest direction has curvature
    # near 2 K / n = 0.03, so its probabilities sit up to ~3e-6 relative from the job's, gradient 1e-12)
    rtol = 1e-5 if method == "vs" else 1e-12
    cal = METHODS[method](**kw).fit(open_source(str(tmp_path / "x.npy")), open_source(str(tmp_path / "y.npy")))
    np.testing.assert_allclose(cal.predict_proba(open_source(str(tmp_path / "x.npy"))), ref.predict_proba(x),
                               rtol=rtol, atol=1e-15)
