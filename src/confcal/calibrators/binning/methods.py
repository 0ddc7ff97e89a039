"""Non-parametric calibrators: isotonic regression, histogram binning, BBQ and scaling-binning.

Each comes as one-vs-rest (renormalised; may change the arg-max, the fit record
says by how much) and/or top-label (``-top``; keeps the arg-max exactly). The
reductions are in :mod:`confcal.calibrators._fit.jobs.reduce`, the 1-D maps in
:mod:`confcal.calibrators._fit.univariate`.

============================== ============== ======================================================
method                         keeps arg-max  source
============================== ============== ======================================================
``isotonic``                   no             Zadrozny & Elkan, KDD 2002 (scikit-learn's fit)
``isotonic-top``               yes            same map on the top-label confidence
``histogram-binning``          no             Zadrozny & Elkan, ICML 2001 (equal-mass or equal-width)
``histogram-binning-top``      yes            same, top-label
``bbq``                        no             Naeini, Cooper & Hauskrecht, AAAI 2015
``bbq-top``                    yes            same, top-label
``scaling-binning``            yes            Kumar, Liang & Ma, NeurIPS 2019 (top-label)
``scaling-binning-marginal``   no             same paper, marginal (one-vs-rest)
============================== ============== ======================================================
"""

from __future__ import annotations

import math

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.constraints import Choice, Fields, Int, ListOf, Opt, Real, Rule, per_class_maps
from confcal.calibrators._fit.jobs.reduce import (
    _named,
    OneVsRestCalibrator,
    TopLabelCalibrator,
    log_odds,
    predicted_class,
    spread_top_label,
    top_label_log_odds,
)
from confcal.calibrators._fit.histogram import (STRATEGIES, check_uniform_bins, fit_histograms, fit_uniform_histogram,
                                               uniform_edges)
from confcal.calibrators._fit.tsfit import fit_temperature
from confcal.calibrators._fit.univariate import (
    apply_bbq,
    apply_histogram,
    apply_isotonic,
    apply_platt,
    apply_step,
    fit_bbq,
    fit_bin_means,
    fit_histogram,
    fit_isotonic,
    fit_platt,
    random_halves,
)
from confcal.calibrators.protocol.base import register
from confcal._validation import plain

__all__ = ["IsotonicCalibration", "TopLabelIsotonicCalibration", "HistogramBinning", "TopLabelHistogramBinning",
           "BBQ", "TopLabelBBQ", "ScalingBinning", "MarginalScalingBinning"]


def _float_list(params: dict, key: str, *, lo=None, hi=None, increasing=False, min_len=0) -> list[float]:
    v = params[key]
    if not isinstance(v, list) or len(v) < min_len:
        raise ValueError(f"{key}: expected a list of at least {min_len} numbers, got {v!r:.60}")
    a = np.asarray(v, dtype=np.float64)
    if a.ndim != 1 or not np.all(np.isfinite(a)):
        raise ValueError(f"{key}: expected finite numbers")
    if lo is not None and np.any(a < lo) or hi is not None and np.any(a > hi):
        raise ValueError(f"{key}: expected values in [{lo}, {hi}]")
    if increasing and np.any(np.diff(a) <= 0):
        raise ValueError(f"{key}: expected strictly increasing values")
    return a.tolist()


def _check_step(params: dict) -> dict:
    out = dict(params)
    out["edges"] = _float_list(params, "edges", increasing=True)
    out["values"] = _float_list(params, "values", lo=0.0, hi=1.0, min_len=1)
    if len(out["values"]) != len(out["edges"]) + 1:
        raise ValueError(f"values: expected len(edges) + 1 = {len(out['edges']) + 1} bin values, "
                         f"got {len(out['values'])} (or parameters.<map>edges has the wrong length)")
    return out


def _positive_temperature(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: expected a finite temperature > 0, got {plain(value)}")
    return float(value)


def _check_positive_int(value, name: str, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {plain(value)}")
    return int(value)


# constraint tables of the manifests (calibrators/protocol/constraints.py); _set_fitted checks the rest
# (lengths, monotone edges)
_PROB = Real(ge=0, le=1)
_ISO_MAP = Fields({"x": ListOf(Real()), "y": ListOf(_PROB)})
_STEP = {"edges": ListOf(Real()), "values": ListOf(_PROB)}
_STEP_MAP = Fields(_STEP)
#: the most bins a binning map takes: the metrics' own limit (confcal.metrics check_n_bins); beyond it
#: the bins' arrays alone exhaust memory long before the data could fill them
MAX_BINS = 100_000
# one weight per binning model (the bin counts tried), weights a distribution over the models (T34)
_BBQ_MAP = Fields({**_STEP, "n_bins": ListOf(Int(ge=1)), "model_weights": ListOf(_PROB)},
                  rules=(Rule(("model_weights", "n_bins"), lambda w, b: len(w) == len(b) > 0,
                              "as many entries as {at}.n_bins (one weight per binning model, at least one)",
                              lambda w, b: f"{len(w)} model_weights and {len(b)} n_bins"),
                         Rule(("model_weights",), lambda w: abs(math.fsum(w) - 1.0) <= 1e-6,
                              "model_weights summing to 1 (within 1e-6)",
                              lambda w: f"a sum of {math.fsum(w):.9g}")))
_SB_MAP = Fields({**_STEP, "a": Opt(Real()), "b": Opt(Real())})
_SB_HYPER = {"n_bins": Int(ge=1, le=MAX_BINS), "scaler": Choice("auto", "ts", "platt"), "random_state": Int(ge=0)}
_SB_SCALER = {"scaler": Choice("ts", "platt"), "temperature": Opt(Real(gt=0))}


# ------------------------------------------------------------------------ isotonic
class _Isotonic:
    space = "prob"

    def _fit_map(self, scores, targets, sample_weight):
        return fit_isotonic(scores, targets, sample_weight=sample_weight)

    def _apply_map(self, params, scores):
        return apply_isotonic(params, scores)

    def _check_map(self, params):
        x = _float_list(params, "x", min_len=1)
        y = _float_list(params, "y", lo=0.0, hi=1.0, min_len=1)
        if len(x) != len(y) or np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0):
            raise ValueError("x: expected x and parameters.<map>y equally long and non-decreasing")
        return {"x": x, "y": y}


@register
class IsotonicCalibration(_Isotonic, OneVsRestCalibrator):
    """Isotonic regression one-vs-rest, renormalised (``isotonic``).

    For each class ``k``, a non-decreasing map of ``p_k = softmax(logits)_k`` fitted to
    ``1[y = k]`` by scikit-learn's ``IsotonicRegression(y_min=0, y_max=1)``; the ``K``
    outputs are divided by their sum (all-zero rows get ``1/K``). Two classes: one map on
    ``p_1``, ``p_0 = 1 - p_1``. Out of range: a score below (above) the smallest (largest)
    calibration score gets the map's first (last) value (scikit-learn's
    ``out_of_bounds="clip"``); between thresholds the map is linear.

    May change the arg-max: ``fit_record_["accuracy_change"]`` and ``["argmax_changed"]``
    report it on the calibration set.

    Attributes
    ----------
    maps_
        list of ``{"x": thresholds, "y": values}``, one per class (one for two classes)

    Notes
    -----
    Source: B. Zadrozny and C. Elkan, "Transforming Classifier Scores into Accurate
    Multiclass Probability Estimates", KDD 2002, sec. 3-4.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits = rng.normal(size=(300, 3)) * 3
    >>> labels = rng.integers(0, 3, size=300)
    >>> probs = METHODS["isotonic"]().fit(logits, labels).predict_proba(logits)
    >>> probs.shape, bool(np.allclose(probs.sum(axis=1), 1.0))
    ((300, 3), True)
    """

    method = "isotonic"
    hyper_constraints: dict = {}
    fitted_constraints = Fields({"maps": ListOf(_ISO_MAP, length=per_class_maps)})

    def __init__(self, input_kind: str = "logits"):
        self.input_kind = input_kind


@register
class TopLabelIsotonicCalibration(_Isotonic, TopLabelCalibrator):
    """Isotonic regression of the top-label confidence (``isotonic-top``); keeps the arg-max.

    ``c = max_k p_k`` is mapped by an isotonic fit to "the arg-max is right"; the other
    classes share ``1 - c'`` in proportion (see :mod:`confcal.calibrators._fit.jobs.reduce` for the
    rule that keeps the arg-max, ties broken toward the original one). Out-of-range
    rule as in ``isotonic``.

    Attributes
    ----------
    map_
        ``{"x": thresholds, "y": values}``

    Notes
    -----
    Source: Zadrozny & Elkan, KDD 2002, applied top-label as in Kumar et al., NeurIPS 2019, sec. 3.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits = rng.normal(size=(300, 3)) * 3
    >>> labels = rng.integers(0, 3, size=300)
    >>> cal = METHODS["isotonic-top"]().fit(logits, labels)
    >>> bool((cal.predict(logits) == logits.argmax(axis=1)).all())
    True
    """

    method = "isotonic-top"
    hyper_constraints: dict = {}
    fitted_constraints = Fields({"map": _ISO_MAP})

    def __init__(self, input_kind: str = "logits"):
        self.input_kind = input_kind


# ------------------------------------------------------------------------ histogram
_HIST_HYPER = {"n_bins": Int(ge=1, le=MAX_BINS), "strategy": Choice(*STRATEGIES)}


def _histogram_edges_agree(hyper: dict, params: dict) -> str | None:
    """A ``hyper_parameter_rules`` entry: each stored map's edges are what a fit with the manifest's own
    ``n_bins`` / ``strategy`` writes. ``"uniform"``: exactly the ``n_bins - 1`` edges ``i / n_bins``;
    ``"quantile"`` (also a manifest without ``strategy``): at most ``n_bins - 1`` edges (tied ones are
    merged), and not the whole equal-width grid when ``n_bins >= 3`` (equal-mass edges lie halfway
    between calibration scores: all of them on ``i / n_bins`` is a uniform map relabelled). Edges bound
    probabilities, so they lie in ``[0, 1]``."""
    n_bins, strategy = hyper.get("n_bins", 15), hyper.get("strategy", "quantile")
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or strategy not in STRATEGIES:
        return None  # the hyper-parameter table refuses these
    maps = [("map", params.get("map"))] if "map" in params else \
        [(f"maps[{j}]", m) for j, m in enumerate(params.get("maps") or [])]
    grid = uniform_edges(n_bins)
    for at, m in maps:
        e = m.get("edges") if isinstance(m, dict) else None
        if not isinstance(e, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e):
            continue  # the fitted table refuses these
        a = np.asarray(e, dtype=np.float64)
        if a.size and not (a.min() >= 0.0 and a.max() <= 1.0):
            bad = a[(a < 0) | (a > 1)][0]
            return f"{at}.edges: expected bin edges of probabilities, in [0, 1], got {plain(bad)}"
        if strategy == "uniform" and (a.size != grid.size or not np.allclose(a, grid, rtol=0, atol=1e-12)):
            return (f"{at}.edges: expected the {grid.size} equal-width edges i / {n_bins} of strategy 'uniform' "
                    f"with n_bins = {n_bins} (hyperparameters.n_bins, hyperparameters.strategy), got "
                    f"{a.size} edges{'' if a.size != grid.size else f' not on i / {n_bins}'}")
        if strategy == "quantile" and a.size > n_bins - 1:
            return (f"{at}.edges: expected at most n_bins - 1 = {n_bins - 1} edges (hyperparameters.n_bins), "
                    f"got {a.size}")
        if strategy == "quantile" and n_bins >= 3 and a.size == grid.size and np.allclose(a, grid, rtol=0, atol=1e-12):
            return (f"{at}.edges: expected equal-mass edges of strategy 'quantile' (hyperparameters.strategy), "
                    f"got the {n_bins} equal-width bins of strategy 'uniform'")
    return None


class _Histogram:
    space = "prob"

    def _hist_settings(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {list(STRATEGIES)}, got {self.strategy!r}")
        n_bins = _check_positive_int(self.n_bins, "n_bins")
        check_uniform_bins(n_bins, self.strategy)
        return n_bins, self.strategy

    def _fit_map(self, scores, targets, sample_weight):
        n_bins, strategy = self._hist_settings()
        fit = fit_uniform_histogram if strategy == "uniform" else fit_histogram
        return fit(scores, targets, n_bins=n_bins, sample_weight=sample_weight)

    def _fit_maps(self, scores, labels, cols, sample_weight):
        """All one-vs-rest maps at once (:func:`confcal.calibrators._fit.histogram.fit_histograms`): the
        maps and their values at the calibration scores ``(n, len(cols))``."""
        n_bins, strategy = self._hist_settings()
        columns = scores if len(cols) == scores.shape[1] else scores[:, cols]
        return fit_histograms(columns, labels, cols, n_bins=n_bins, strategy=strategy, sample_weight=sample_weight)

    def _apply_map(self, params, scores):
        return apply_histogram(params, scores)

    def _check_map(self, params):
        return _check_step(params)


@register
class HistogramBinning(_Histogram, OneVsRestCalibrator):
    """Histogram binning one-vs-rest, renormalised (``histogram-binning``).

    Per class, the calibration scores ``p_k`` are cut into ``n_bins`` bins and a bin's value
    is the fraction of class-``k`` labels in it. The ``K`` outputs are divided by their row
    sum as in ``isotonic``; this may change the arg-max (the fit record reports it).

    * ``strategy="quantile"`` (default): equal-mass bins. Each edge lies halfway between two
      neighbouring calibration scores (see ``equal_mass_edges``); tied edges are merged, so no
      bin is empty and a constant score gives one bin.
    * ``strategy="uniform"``: ``n_bins`` equal-width bins on ``[0, 1]``, edges ``i / n_bins``.
      A bin that no calibration score falls in gets its midpoint ``(i + 1/2) / n_bins``:
      there is no evidence to move a score there.

    Parameters
    ----------
    n_bins : int, default 15
        Bins per class, 1 to 100,000 (at most 10,000 with ``"uniform"``: ``MAX_UNIFORM_BINS``).
    strategy : {"quantile", "uniform"}, default "quantile"
        Equal-mass or equal-width bins (scikit-learn's names).

    Attributes
    ----------
    maps_
        list of ``{"edges", "values"}``, one per class (one for two classes): ``len(values)
        == len(edges) + 1``

    Raises
    ------
    ValueError
        ``n_bins`` not an integer in ``[1, 100000]`` (``[1, 10000]`` for ``"uniform"``), or ``strategy``
        not one of the two.

    Notes
    -----
    Bins are ``(lo, hi]``, the outer ones open (a score equal to an edge falls in the lower bin;
    scores outside the calibration range, or outside ``[0, 1]``, in the first or last bin).

    Sources: B. Zadrozny and C. Elkan, "Obtaining calibrated probability estimates from
    decision trees and naive Bayesian classifiers", ICML 2001 (histogram binning, equal-mass
    bins); equal-width bins as in M. P. Naeini, G. F. Cooper and M. Hauskrecht, "Obtaining Well
    Calibrated Probabilities Using Bayesian Binning", AAAI 2015, and C. Guo et al., "On
    Calibration of Modern Neural Networks", ICML 2017, sec. 3.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(300, 3)), rng.integers(0, 3, size=300)
    >>> cal = METHODS["histogram-binning"](n_bins=5).fit(logits, labels)
    >>> len(cal.maps_), len(cal.maps_[0]["values"])
    (3, 5)
    >>> METHODS["histogram-binning"](n_bins=4, strategy="uniform").fit(logits, labels).maps_[0]["edges"]
    [0.25, 0.5, 0.75]
    """

    method = "histogram-binning"
    hyper_constraints = _HIST_HYPER
    hyper_parameter_rules = (_histogram_edges_agree,)  # the map's edges as n_bins / strategy write them
    fitted_constraints = Fields({"maps": ListOf(_STEP_MAP, length=per_class_maps)})

    def __init__(self, n_bins: int = 15, strategy: str = "quantile", input_kind: str = "logits"):
        self.n_bins = n_bins
        self.strategy = strategy
        self.input_kind = input_kind


@register
class TopLabelHistogramBinning(_Histogram, TopLabelCalibrator):
    """Histogram binning of the top-label confidence (``histogram-binning-top``); keeps the arg-max.

    The confidence ``c = max_k p_k`` is binned against "the arg-max is right"; bins and
    ``strategy`` as in ``histogram-binning`` (with ``"uniform"``, the bins below ``1/K`` hold
    no confidence and keep their midpoints). The other classes share ``1 - c'``
    (see :mod:`confcal.calibrators._fit.jobs.reduce`).

    Parameters
    ----------
    n_bins : int, default 15
        Bins, 1 to 100,000 (at most 10,000 with ``"uniform"``).
    strategy : {"quantile", "uniform"}, default "quantile"
        Equal-mass or equal-width bins.

    Attributes
    ----------
    map_
        ``{"edges", "values"}``

    Raises
    ------
    ValueError
        ``n_bins`` not an integer in ``[1, 100000]`` (``[1, 10000]`` for ``"uniform"``), or ``strategy``
        not one of the two.

    Notes
    -----
    Bins are ``(lo, hi]``, the outer ones open (a score equal to an edge falls in the lower bin;
    scores outside the calibration range, or outside ``[0, 1]``, in the first or last bin).

    Sources: B. Zadrozny and C. Elkan, "Obtaining calibrated probability estimates from
    decision trees and naive Bayesian classifiers", ICML 2001 (histogram binning, equal-mass
    bins); equal-width bins as in M. P. Naeini, G. F. Cooper and M. Hauskrecht, "Obtaining Well
    Calibrated Probabilities Using Bayesian Binning", AAAI 2015, and C. Guo et al., "On
    Calibration of Modern Neural Networks", ICML 2017, sec. 3.
    Top-label as in Gupta & Ramdas, ICLR 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(300, 3)) * 3, rng.integers(0, 3, size=300)
    >>> cal = METHODS["histogram-binning-top"](n_bins=5).fit(logits, labels)
    >>> cal.fit_record_["accuracy_change"]
    0.0
    """

    method = "histogram-binning-top"
    hyper_constraints = _HIST_HYPER
    hyper_parameter_rules = (_histogram_edges_agree,)  # the map's edges as n_bins / strategy write them
    fitted_constraints = Fields({"map": _STEP_MAP})

    def __init__(self, n_bins: int = 15, strategy: str = "quantile", input_kind: str = "logits"):
        self.n_bins = n_bins
        self.strategy = strategy
        self.input_kind = input_kind


# ------------------------------------------------------------------------------ BBQ
class _BBQ:
    space = "prob"

    def _fit_map(self, scores, targets, sample_weight):
        if not (isinstance(self.spread, (int, float)) and self.spread >= 1):
            raise ValueError(f"spread: expected a number >= 1, got {self.spread!r}")
        if not (isinstance(self.prior_strength, (int, float)) and self.prior_strength > 0):
            raise ValueError(f"prior_strength: expected a number > 0, got {self.prior_strength!r}")
        return fit_bbq(scores, targets, spread=float(self.spread), prior_strength=float(self.prior_strength),
                       sample_weight=sample_weight)

    def _apply_map(self, params, scores):
        return apply_bbq(params, scores)

    def _check_map(self, params):
        return _check_step(params)


@register
class BBQ(_BBQ, OneVsRestCalibrator):
    """Bayesian binning into quantiles one-vs-rest, renormalised (``bbq``).

    Per class: equal-mass binnings of ``p_k`` for every bin count ``B`` in
    ``floor(N^(1/3)/C) .. ceil(C N^(1/3))``, each weighted by its BDeu marginal likelihood
    (Beta prior per bin centred on the bin's midpoint, equivalent sample size ``N'``);
    the output is the weighted average of the binnings' posterior-mean bin values. May
    change the arg-max (reported in the fit record).

    Parameters
    ----------
    spread : float, default 10
        ``C``: bin counts from ``floor(N^(1/3)/C)`` to ``ceil(C N^(1/3))``.
    prior_strength : float, default 2
        ``N'``, the BDeu equivalent sample size.

    Notes
    -----
    Source: M. P. Naeini, G. F. Cooper and M. Hauskrecht, "Obtaining Well Calibrated
    Probabilities Using Bayesian Binning", AAAI 2015.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(200, 2)), rng.integers(0, 2, size=200)
    >>> cal = METHODS["bbq"]().fit(logits, labels)
    >>> w = cal.maps_[0]["model_weights"]
    >>> bool(abs(sum(w) - 1) < 1e-12)
    True
    """

    method = "bbq"
    hyper_constraints = {"spread": Real(ge=1), "prior_strength": Real(gt=0)}
    fitted_constraints = Fields({"maps": ListOf(_BBQ_MAP, length=per_class_maps)})

    def __init__(self, spread: float = 10.0, prior_strength: float = 2.0, input_kind: str = "logits"):
        self.spread = spread
        self.prior_strength = prior_strength
        self.input_kind = input_kind


@register
class TopLabelBBQ(_BBQ, TopLabelCalibrator):
    """BBQ on the top-label confidence (``bbq-top``); keeps the arg-max.

    Parameters
    ----------
    spread : float, default 10
    prior_strength : float, default 2

    Notes
    -----
    Source: Naeini et al., AAAI 2015; top-label reduction as in Kumar et al., NeurIPS 2019.

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits, labels = rng.normal(size=(200, 4)) * 2, rng.integers(0, 4, size=200)
    >>> cal = METHODS["bbq-top"]().fit(logits, labels)
    >>> bool((cal.predict(logits) == logits.argmax(axis=1)).all())
    True
    """

    method = "bbq-top"
    hyper_constraints = {"spread": Real(ge=1), "prior_strength": Real(gt=0)}
    fitted_constraints = Fields({"map": _BBQ_MAP})

    def __init__(self, spread: float = 10.0, prior_strength: float = 2.0, input_kind: str = "logits"):
        self.spread = spread
        self.prior_strength = prior_strength
        self.input_kind = input_kind


# ------------------------------------------------------------------- scaling-binning
def _binary_nll(g, t) -> float:
    g = np.clip(g, 1e-15, 1 - 1e-15)
    return float(-np.mean(t * np.log(g) + (1 - t) * np.log1p(-g)))


class _ScalingBinning:
    space = "logit"
    min_fit_rows = 2  # two halves (random_halves refuses fewer: no few-rows warning before that error)
    scalers = ("auto", "ts", "platt")

    def _check_hyper(self):
        n_bins = _check_positive_int(self.n_bins, "n_bins")
        random_state = _check_positive_int(self.random_state, "random_state", 0)
        if self.scaler not in self.scalers:
            raise ValueError(f"scaler: expected one of {list(self.scalers)}, got {self.scaler!r}")
        return n_bins, random_state

    def _sample_weight_refusal(self):
        # the two halves are drawn over rows: a weight of 2 is not the same as a repeated row
        return "its random split into halves is over rows, so a weight is not a repetition"

    def _candidates(self):
        return ("ts", "platt") if self.scaler == "auto" else (self.scaler,)

    def _check_map(self, params):
        out = _check_step(params)
        for key in ("a", "b"):
            if key in params:
                v = params[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                    raise ValueError(f"{key}: expected a finite number, got {plain(v)}")
                out[key] = float(v)
        return out

    def _get_scaler(self, out):
        out["scaler"] = self.scaler_
        if self.scaler_ == "ts":
            out["temperature"] = self.temperature_
        return out

    def _set_scaler(self, params):
        scaler = params["scaler"]
        if scaler not in ("ts", "platt") or (self.scaler != "auto" and scaler != self.scaler):
            raise ValueError(f"scaler: expected 'ts' or 'platt' (matching the hyper-parameter "
                             f"{self.scaler!r}), got {scaler!r}")
        self.scaler_ = scaler
        if scaler == "ts" and "temperature" not in params:
            raise ValueError("temperature: required with scaler 'ts'")
        if scaler == "ts":
            self.temperature_ = _positive_temperature(params["temperature"], "temperature")


@register
class ScalingBinning(_ScalingBinning, TopLabelCalibrator):
    """Scaling-binning calibrator, top-label (``scaling-binning``); keeps the arg-max.

    The calibration set is split in two halves at random (``random_state``). Step 1, on the first
    half: fit a scaling map -- temperature scaling (``"ts"``: one ``T`` by NLL, confidence
    ``g = max softmax(logits / T)``) or Platt scaling of the top-label confidence
    (``"platt"``: ``g = sigmoid(a logit(c) + b)`` against "the arg-max is right", the paper's
    top-label choice). With ``scaler="auto"`` (default) both are fitted and the one whose
    ``g`` has the lower NLL against "the arg-max is right" on the second half is kept.
    Steps 2-3, on the second half: cut ``g``'s outputs into ``n_bins`` equal-mass bins and
    give each bin the mean ``g`` of its members. At predict time the confidence is the value
    of the bin ``g`` falls in; the other classes share the rest in proportion (capped so the
    arg-max stays, see :mod:`confcal.calibrators._fit.jobs.reduce`).

    Parameters
    ----------
    n_bins : int
        Default 10 (the paper's ``B = 10``)
    scaler
        ``"auto"`` (default), ``"ts"`` or ``"platt"``
    random_state : int, default 0 -- the seed of the split into halves

    Attributes
    ----------
    scaler_
        ``"ts"`` or ``"platt"``, the scaler used
    map_
        ``{"edges", "values"}`` plus ``{"a", "b"}`` for Platt
    temperature_ : float
        The fitted ``T`` (when ``scaler_ == "ts"``)

    Notes
    -----
    Source: A. Kumar, P. Liang and T. Ma, "Verified Uncertainty Calibration", NeurIPS 2019,
    sec. 4 (steps 1-3), top-label calibration error (sec. 3).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits = rng.normal(size=(400, 5)) * 3
    >>> labels = np.where(rng.random(400) < 0.7, logits.argmax(axis=1), rng.integers(0, 5, size=400))
    >>> cal = METHODS["scaling-binning"]().fit(logits, labels)
    >>> len(cal.map_["values"]) <= 10, cal.fit_record_["accuracy_change"]
    (True, 0.0)
    """

    method = "scaling-binning"
    hyper_constraints = _SB_HYPER
    fitted_constraints = Fields({**_SB_SCALER, "map": _SB_MAP})

    def __init__(self, n_bins: int = 10, scaler: str = "auto", random_state: int = 0, input_kind: str = "logits"):
        self.n_bins = n_bins
        self.scaler = scaler
        self.random_state = random_state
        self.input_kind = input_kind

    def _scaled(self, logits, top, scaler, params):
        if scaler == "ts":
            return softmax(np.asarray(logits, dtype=np.float64) / params["temperature"])[np.arange(top.size), top]
        return apply_platt(params, top_label_log_odds(logits, top))

    def _fit(self, logits, labels, sample_weight=None, **side):
        n_bins, random_state = self._check_hyper()
        w = np.ones(labels.size) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        first, second = random_halves(labels.size, random_state)
        top = predicted_class(softmax(logits))
        correct = (labels == top).astype(np.float64)
        best = None
        for scaler in self._candidates():
            if scaler == "ts":
                params = {"temperature": fit_temperature(logits[first], labels[first],
                                                         sample_weight=w[first]).temperature}
            else:
                params = fit_platt(top_label_log_odds(logits[first], top[first]), correct[first],
                                   sample_weight=w[first])
            g = self._scaled(logits[second], top[second], scaler, params)
            score = _binary_nll(g, correct[second])
            if best is None or score < best[0]:
                best = (score, scaler, params, g)
        _, self.scaler_, params, g = best
        if self.scaler_ == "ts":
            self.temperature_ = params["temperature"]
            params = {}
        self.map_ = {**params, **fit_bin_means(g, n_bins=n_bins, sample_weight=w[second])}

    def _predict_proba(self, logits, **side):
        p = softmax(logits)
        top = predicted_class(p)
        params = {"temperature": self.temperature_} if self.scaler_ == "ts" else self.map_
        conf = apply_step(self.map_["edges"], self.map_["values"], self._scaled(logits, top, self.scaler_, params))
        return spread_top_label(p, top, conf, np.isneginf(logits))

    def _get_fitted(self):
        return self._get_scaler({"map": self.map_})

    def _set_fitted(self, params):
        self._set_scaler(params)
        self.map_ = _named(self._check_map, params["map"], "map.")
        if self.scaler_ == "platt" and not {"a", "b"} <= set(self.map_):
            raise ValueError("map: parameters.map.a and parameters.map.b are needed with scaler 'platt'")


@register
class MarginalScalingBinning(_ScalingBinning, OneVsRestCalibrator):
    """Scaling-binning per class (marginal), renormalised (``scaling-binning-marginal``).

    Step 1 on the first random half: temperature scaling (``"ts"``: class ``k``'s scaled
    output is ``softmax(logits / T)_k``) or one Platt map per class on ``logit(p_k)`` against
    ``1[y = k]`` (``"platt"``); ``scaler="auto"`` (default) keeps the one with the lower
    one-vs-rest NLL (mean over classes) on the second half. Steps 2-3 on the second half: per
    class, equal-mass bins of the scaled outputs, each bin's value their mean. The ``K``
    binned outputs are divided by their sum (two classes: class 1 binned, class 0 its
    complement). May change the arg-max (reported in the fit record).

    Parameters
    ----------
    n_bins : int, default 10
    scaler
        ``"auto"`` (default), ``"ts"`` or ``"platt"``
    random_state : int, default 0 -- the seed of the split into halves

    Notes
    -----
    Source: Kumar, Liang & Ma, NeurIPS 2019, sec. 4 (marginal calibration error, sec. 3).

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators import METHODS
    >>> rng = np.random.default_rng(0)
    >>> logits = rng.normal(size=(400, 3)) * 3
    >>> labels = np.where(rng.random(400) < 0.7, logits.argmax(axis=1), rng.integers(0, 3, size=400))
    >>> cal = METHODS["scaling-binning-marginal"]().fit(logits, labels)
    >>> len(cal.maps_)
    3
    """

    method = "scaling-binning-marginal"
    hyper_constraints = _SB_HYPER
    fitted_constraints = Fields({**_SB_SCALER, "maps": ListOf(_SB_MAP, length=per_class_maps)})

    def __init__(self, n_bins: int = 10, scaler: str = "auto", random_state: int = 0, input_kind: str = "logits"):
        self.n_bins = n_bins
        self.scaler = scaler
        self.random_state = random_state
        self.input_kind = input_kind

    def _scores(self, logits):
        if self.scaler_ == "ts":
            return softmax(np.asarray(logits, dtype=np.float64) / self.temperature_)
        return log_odds(logits)

    def _apply_map(self, params, scores):
        g = apply_platt(params, scores) if self.scaler_ == "platt" else scores
        return apply_step(params["edges"], params["values"], g)

    def _fit(self, logits, labels, sample_weight=None, **side):
        n_bins, random_state = self._check_hyper()
        w = np.ones(labels.size) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        first, second = random_halves(labels.size, random_state)
        classes = [1] if logits.shape[1] == 2 else list(range(logits.shape[1]))
        best = None
        for scaler in self._candidates():
            if scaler == "ts":
                t = fit_temperature(logits[first], labels[first], sample_weight=w[first]).temperature
                s = softmax(np.asarray(logits, dtype=np.float64) / t)
                platts = [None] * len(classes)
                g = [s[second, j] for j in classes]
            else:
                t = None
                s = log_odds(logits)
                platts = [fit_platt(s[first, j], (labels[first] == j).astype(np.float64), sample_weight=w[first])
                          for j in classes]
                g = [apply_platt(pl, s[second, j]) for pl, j in zip(platts, classes)]
            score = float(np.mean([_binary_nll(gj, (labels[second] == j).astype(np.float64))
                                   for gj, j in zip(g, classes)]))
            if best is None or score < best[0]:
                best = (score, scaler, t, platts, g)
        _, self.scaler_, t, platts, g = best
        if t is not None:
            self.temperature_ = t
        self.maps_ = [{**(pl or {}), **fit_bin_means(gj, n_bins=n_bins, sample_weight=w[second])}
                      for pl, gj in zip(platts, g)]

    def _get_fitted(self):
        return self._get_scaler(super()._get_fitted())

    def _set_fitted(self, params):
        self._set_scaler(params)
        super()._set_fitted(params)
