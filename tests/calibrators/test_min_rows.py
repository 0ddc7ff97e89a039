"""Issue 21: the fewest rows a fit takes. Every registered method fits on 2 calibration rows (valid
input: bbq and platt-ovr once crashed there, ms / dirichlet refused their default 3 folds); on 1 row
a method either fits or refuses with the one documented line naming the same minimum
(:data:`confcal._validation.MIN_SPLIT_ROWS`), or, one-vs-rest, refuses labels of a single class."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from confcal._validation import MIN_SPLIT_ROWS
from confcal.calibrators import METHODS
from confcal.cli import main

#: the methods whose fit splits the rows (and so has a minimum of 2); ms / dirichlet (and their +pb) split
#: them with reg="cv" only (:data:`CV_SPLITTING`), their default reg="auto" fits once
SPLITTING = {"scaling-binning", "scaling-binning-platt", "scaling-binning-marginal", "scaling-binning-marginal-platt"}
CV_SPLITTING = {"ms": {"reg": "cv"}, "dirichlet": {"reg": "cv"}, "ms+pb": {"base_params": {"reg": "cv"}},
                "dirichlet+pb": {"base_params": {"reg": "cv"}}}


def _inputs(method: str, n: int):
    """``(x, y, side)`` valid for ``method`` on ``n`` rows: box scores for det-*, multi-hot labels for
    the multilabel heads, domains / features where the method needs them."""
    rng = np.random.default_rng(0)
    side = {}
    if method.startswith("det-"):
        x = np.array([0.8, 0.3, 0.6])[:n]
        y = np.array([1, 0, 1])[:n]
        if method.endswith("-geo"):
            side["features"] = rng.normal(size=(n, 2))
        return x, y, side
    x = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [0.3, 0.1, 2.0]])[:n]
    y = np.array([0, 1, 2])[:n]
    if method.endswith("multilabel"):
        y = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]])[:n]
    for _ in range(3):  # add the side inputs the method asks for, one refusal at a time
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                METHODS[method](**HYPER.get(method, {})).fit(x, y, **side)
            break
        except ValueError as exc:
            text = str(exc)
            if "domains=" in text and "domains" not in side:
                side["domains"] = np.arange(n) % 2
            elif "features=" in text and "features" not in side:
                side["features"] = rng.normal(size=(n, 2))
            else:
                break
    return x, y, side


#: the one-vs-rest methods: one row holds one class, which they refuse (a map per class on 1[label = k] would make
#: every row that class with probability ~1; :func:`confcal.calibrators._fit.jobs.reduce.check_label_classes`)
ONE_VS_REST = {"bbq", "beta", "histogram-binning", "isotonic", "platt-ovr", "scaling-binning-marginal"}
#: the linear maps with per-class parameters (and X+PB on them) follow the same rule (their biases of the absent
#: classes would go toward -inf): one row is refused as labels of one class
PER_CLASS = {"vs", "ms", "dirichlet", "vs+pb", "ms+pb", "dirichlet+pb"}

#: hyper-parameters without a default
HYPER = {"source-gated-ts": {"source_domain": 0}}


def _fit(method, n):
    x, y, side = _inputs(method, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny fits warn (search bounds, pooled fallbacks): not the point
        cal = METHODS[method](**HYPER.get(method, {})).fit(x, y, **side)
        try:
            return cal, cal.predict_proba(x, **side)
        except (ValueError, TypeError):  # a side input needed at fit time only (source-gated-ts's domains)
            return cal, cal.predict_proba(x, **{k: v for k, v in side.items() if k != "domains"})


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_fits_two_rows(method):
    cal, p = _fit(method, 2)
    assert np.all(np.isfinite(p)), method
    if p.ndim == 2 and not method.endswith("multilabel"):
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    if method in ("ms", "dirichlet"):  # the default reg="auto" fits once; reg="cv" folds
        cv = METHODS[method](reg="cv").fit(*_inputs(method, 2)[:2])
        assert cv.cv_results_["n_folds"] == 2  # leave-one-out: the default 3 folds capped at the rows


@pytest.mark.parametrize("method", sorted(METHODS))
def test_one_row_fits_or_names_the_minimum(method):
    if method == "source-gated-ts":  # needs a source row and a calibration-domain row: a domain rule
        with pytest.raises(ValueError, match=r"^domains: only the source domain 0 is present"):
            _fit(method, 1)
        return
    if method.startswith("det-"):  # one box is one label value: a binary detection map refuses it
        with pytest.raises(ValueError, match=r"^labels: all 1 box labels are 1 \(true positives"):
            _fit(method, 1)
        return
    if method in ONE_VS_REST | PER_CLASS:
        with pytest.raises(ValueError, match=r"^labels: only class 0 occurs in the 1 calibration labels; "):
            _fit(method, 1)
        return
    if method not in SPLITTING:
        _, p = _fit(method, 1)
        assert np.all(np.isfinite(p))
        return
    with pytest.raises(ValueError, match=rf"^logits: \S+ needs at least {MIN_SPLIT_ROWS} calibration rows "
                                         r"\([^)]*\), got 1$"):
        _fit(method, 1)


@pytest.mark.parametrize("method", sorted(CV_SPLITTING))
def test_one_row_refused_by_cross_validated_odir(method):
    """One row is one class: the per-class label rule answers before the folds' minimum (which
    test_every_method_fits_two_rows checks: 2 rows, 2 folds)."""
    x, y, _ = _inputs(method, 1)
    with pytest.raises(ValueError, match=r"^labels: only class 0 occurs in the 1 calibration labels; "):
        METHODS[method](**CV_SPLITTING[method]).fit(x, y)


def test_cli_one_row_refusal_is_one_line_with_exit_2(tmp_path, capsys):
    np.save(tmp_path / "z.npy", np.array([[2.0, 0.0, -1.0]]))
    np.save(tmp_path / "y.npy", np.array([0]))
    for method in ("scaling-binning",):
        code = main(["fit", "--logits", f"{tmp_path}/z.npy", "--labels", f"{tmp_path}/y.npy", "--method", method,
                     "-o", f"{tmp_path}/c.json", "-q"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err and re.search(r"needs at least 2 calibration rows", err), err
        assert not (tmp_path / "c.json").exists()
