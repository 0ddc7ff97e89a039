"""Calibration for domain generalization: set-level and cluster-level temperature scaling.

Source: Y. Gong, X. Lin, Y. Yao, T. G. Dietterich, A. Divakaran, M. Gervasio,
"Confidence Calibration for Domain Generalization under Covariate Shift",
ICCV 2021, sections 4-5.

Setting: a classifier trained on a source domain; labelled held-out data from
several *calibration domains*; a target domain never seen in training or
calibration. Pooling several calibration domains reduces the disparity between
the calibration and target distributions (the paper's section 4), so a
temperature fitted on the pool transfers better than one fitted on the source.

* :class:`SetLevelTemperatureScaling` (``"set-ts"``, eq. 15): one temperature on
  the union of the calibration domains.
* :class:`ClusterTemperatureScaling` (``"cluster-ts"``, eq. 16): k-means on the
  (standardised) calibration features, one temperature per cluster; a test
  sample takes the temperature of its nearest centroid.
* :class:`ClusterRegressionTemperatureScaling` (``"cluster-ts-regression"``,
  eq. 18): a linear map from a cluster's mean feature to its log temperature,
  applied to each test sample's feature.
* :class:`DomainEnsembleTemperatureScaling` (``"domain-ensemble"``, sec. 5.2):
  the mean of the three methods' calibrated logits, then softmax.

All four divide each row of logits by a positive per-sample temperature, so the
arg-max (and accuracy) is unchanged. None of them looks up a domain id at
predict time: an unseen target domain needs no fallback rule.
"""

from __future__ import annotations

import abc
import math
import warnings

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.constraints import SEED, T_BOUNDS, T_RULE, TEMPERATURE, Array, Bool, Choice, Fields, \
    GroupKey, Int, Nullable, Opt, Pairs, Real, optional_value, without_missing
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, CalibrationWarning, fit_temperature
from confcal.calibrators.protocol.base import Calibrator, register
from confcal.calibrators.protocol.temperature_bounds import temperatures_within_bounds
from confcal.calibrators.grouping import fit_groups

__all__ = [
    "SetLevelTemperatureScaling",
    "ClusterTemperatureScaling",
    "ClusterRegressionTemperatureScaling",
    "DomainEnsembleTemperatureScaling",
    "domain_sample_weight",
    "DEFAULT_RIDGE_ALPHAS",
]

DOMAIN_WEIGHTINGS = ("sample", "domain")

#: Ridge penalties tried by leave-one-out in the regression variant. Features are
#: standardised, so the Gram matrix of d features scales like d: the grid spans
#: from almost-OLS to an almost-constant model for d up to a few thousand.
DEFAULT_RIDGE_ALPHAS = tuple(float(a) for a in np.logspace(-3, 7, 41))


# --------------------------------------------------------------------------- helpers
def domain_sample_weight(domains, weighting: str, sample_weight=None) -> np.ndarray | None:
    """Per-sample weights for a pooled fit over several domains.

    ``weighting="sample"`` returns ``sample_weight`` (``None``: every sample
    counts once, the paper's eq. 15 over the union). ``"domain"`` gives each
    domain the same total weight, ``1 / (n_domains * n_d)`` per sample of domain
    ``d``, so a large calibration domain does not drown a small one; with
    ``sample_weight`` ``w``, ``w_i / (n_domains * W_d)`` with ``W_d`` the weight
    of domain ``d`` (domains of weight 0 do not count).

    Raises ``ValueError`` for an unknown ``weighting`` or for ``"domain"``
    without ``domains``.
    """
    if weighting not in DOMAIN_WEIGHTINGS:
        raise ValueError(f"domain_weighting: expected one of {DOMAIN_WEIGHTINGS}, got {weighting!r}")
    if weighting == "sample":
        return sample_weight
    if domains is None:
        raise ValueError("domains: domain_weighting='domain' needs domains= (one id per "
                         "calibration sample) at fit time")
    _, inverse, counts = np.unique(np.asarray(domains), return_inverse=True, return_counts=True)
    if sample_weight is None:
        return 1.0 / (counts.size * counts[inverse].astype(np.float64))
    w = np.asarray(sample_weight, dtype=np.float64)
    totals = np.bincount(inverse.reshape(-1), weights=w)
    return w / (np.count_nonzero(totals) * np.where(totals > 0, totals, 1.0)[inverse])


def _scaled_softmax(logits: np.ndarray, temperature) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf / T stays -inf
        return softmax(np.asarray(logits, dtype=np.float64) / temperature)


def _fit_quiet(logits, labels, sample_weight, bounds):
    """fit_temperature with its bound warning captured (callers aggregate them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return fit_temperature(logits, labels, sample_weight=sample_weight, t_bounds=bounds, warn=False)


def _floats(a) -> list:
    """An array as nested lists of Python floats (JSON keeps every bit of a float64)."""
    return np.asarray(a, dtype=np.float64).tolist()


# --------------------------------------------------------------------------- set level
@register
class SetLevelTemperatureScaling(Calibrator):
    """One temperature fitted on the union of several calibration domains.

    ``T* = argmin_T sum_{(z, y) in C_1 u ... u C_m} w(z) NLL(softmax(z / T), y)``
    (Gong et al. 2021, eq. 15), then ``p = softmax(z / T*)``.

    Parameters
    ----------
    domain_weighting
        ``"sample"`` (default, the paper's eq. 15: every
        calibration sample counts once) or ``"domain"`` (every calibration
        domain gets the same total weight; needs ``domains=`` at fit time)
    t_min, t_max
        Search range of ``T`` (default ``[1e-2, 1e2]``)

    Attributes
    ----------
    temperature_ : float
    domain_counts_ : dict
        ``{domain id: n calibration samples}`` (empty without domains)
    at_bound_ : bool
        Whether ``T`` ended on a search bound

    Notes
    -----
    Side inputs: ``domains`` ``(n_samples,)`` (used only at fit time, only for
    ``domain_weighting="domain"``); ``features`` is accepted and ignored so all
    four domain-generalization methods take the same call.

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> domains = rng.integers(0, 2, size=300)
    >>> from confcal.calibrators import SetLevelTemperatureScaling
    >>> sts = SetLevelTemperatureScaling().fit(logits, labels, domains=domains)
    >>> round(sts.temperature_, 3), sts.domain_counts_, np.bincount(domains).tolist()
    (4.579, {0: 136, 1: 164}, [136, 164])
    >>> round(nll(sts.predict_proba(logits), labels), 3)
    0.877
    """

    method = "set-ts"
    optional_side_inputs = ("domains", "features")
    hyper_constraints = {"domain_weighting": Choice(*DOMAIN_WEIGHTINGS), **T_BOUNDS}
    hyper_rules = (T_RULE,)
    hyper_parameter_rules = (temperatures_within_bounds("temperature"),)  # as ts: T inside its [t_min, t_max]
    fitted_constraints = Fields({"temperature": TEMPERATURE, "at_bound": Opt(Bool()),
                                 "domain_counts": Opt(Pairs(GroupKey(), Int(ge=0)))})

    def __init__(self, domain_weighting: str = "sample", t_min: float = DEFAULT_T_BOUNDS[0],
                 t_max: float = DEFAULT_T_BOUNDS[1], input_kind: str = "logits"):
        self.input_kind = input_kind
        self.domain_weighting = domain_weighting
        self.t_min = t_min
        self.t_max = t_max

    def _fit(self, logits, labels, domains=None, features=None, sample_weight=None):
        bounds = (self.t_min, self.t_max)
        weight = domain_sample_weight(domains, self.domain_weighting, sample_weight)
        res = fit_temperature(logits, labels, sample_weight=weight, t_bounds=bounds)
        self.temperature_ = res.temperature
        self.at_bound_ = res.at_bound
        self.domain_counts_ = {}
        if domains is not None:
            ids, counts = np.unique(domains, return_counts=True)
            self.domain_counts_ = {i.item(): int(c) for i, c in zip(ids, counts)}

    def temperatures_for(self, logits, features=None) -> np.ndarray:
        """Per-sample temperatures ``(n_samples,)``: all equal to ``temperature_``."""
        self._check_fitted()
        return np.full(np.asarray(logits).shape[0], self.temperature_, dtype=np.float64)

    def _predict_proba(self, logits, domains=None, features=None):
        return _scaled_softmax(logits, self.temperature_)

    def _get_fitted(self):
        return without_missing({"temperature": self.temperature_, "at_bound": self.at_bound_,
                                "domain_counts": [[k, v] for k, v in self.domain_counts_.items()]})

    def _set_fitted(self, params):
        self.temperature_ = float(params["temperature"])
        self.at_bound_ = optional_value(params, "at_bound", bool)  # None: the manifest has none
        self.domain_counts_ = {k: int(v) for k, v in params.get("domain_counts", [])}


# ----------------------------------------------------------------------- cluster level
class _ClusterBase(Calibrator):
    """Shared fit of the cluster-level methods: scaler, k-means, per-cluster temperatures.

    Fit steps (Gong et al. 2021, sec. 4.2):

    1. standardise the calibration features (scikit-learn ``StandardScaler``,
       fitted on the calibration set; zero-variance columns get scale 1), so raw
       penultimate activations can be passed;
    2. k-means (scikit-learn ``KMeans``, k-means++ init, ``n_init`` restarts,
       seeded by ``random_state``) with ``min(n_clusters, n_samples)`` clusters
       (with fewer distinct rows than clusters, duplicate centroids get no
       samples and fall back as in step 4);
    3. each calibration sample joins its nearest centroid (Euclidean, lowest
       index on ties — the same rule as at predict time);
    4. the set-level temperature on all calibration samples (eq. 15, weighted as
       ``domain_weighting`` says), and one temperature per cluster (eq. 16).
       A cluster with fewer than ``min_cluster_size`` samples, or (with
       ``bound_fallback``) whose optimum lies on a search bound — a perfectly
       separated or uninformative cluster, whose extreme temperature would not
       transfer — takes the set-level temperature instead, with one
       :class:`CalibrationWarning` listing those clusters.
    """

    side_inputs = ("features",)
    optional_side_inputs = ("domains",)
    hyper_constraints = {"n_clusters": Int(ge=1), "random_state": SEED, "n_init": Int(ge=1),
                         "min_cluster_size": Int(ge=1), "bound_fallback": Bool(),
                         "domain_weighting": Choice(*DOMAIN_WEIGHTINGS), **T_BOUNDS}
    hyper_rules = (T_RULE,)
    # "k": clusters actually fitted (min(n_clusters, n_samples))
    fitted_constraints = Fields({
        "n_features": Int(ge=1, bind="n_features"),
        "scaler_mean": Array(("n_features",)),
        "scaler_scale": Array(("n_features",), Real(gt=0)),
        "centroids": Array(("k", "n_features")),
        "set_temperature": TEMPERATURE,
        "cluster_temperatures": Array(("k",), TEMPERATURE),
        "cluster_sizes": Array(("k",), Int(ge=0)),
        "cluster_fallback": Array(("k",), Bool()),
    })

    def __init__(self, n_clusters: int = 8, random_state: int = 0, n_init: int = 10,
                 min_cluster_size: int = 20, bound_fallback: bool = True,
                 domain_weighting: str = "sample", t_min: float = DEFAULT_T_BOUNDS[0],
                 t_max: float = DEFAULT_T_BOUNDS[1], input_kind: str = "logits"):
        self.input_kind = input_kind
        self.n_clusters = n_clusters
        self.random_state = random_state
        self.n_init = n_init
        self.min_cluster_size = min_cluster_size
        self.bound_fallback = bound_fallback
        self.domain_weighting = domain_weighting
        self.t_min = t_min
        self.t_max = t_max

    # ------------------------------------------------------------------ fitting
    def _fit_clusters(self, logits, labels, features, domains, sample_weight=None):
        from sklearn.cluster import KMeans
        from sklearn.preprocessing import StandardScaler
        from threadpoolctl import threadpool_limits

        k_max, min_size = int(self.n_clusters), int(self.min_cluster_size)
        bounds = (float(self.t_min), float(self.t_max))
        weight = domain_sample_weight(domains, self.domain_weighting, sample_weight)

        scaler = StandardScaler().fit(features, sample_weight=sample_weight)
        self.scaler_mean_ = np.asarray(scaler.mean_, dtype=np.float64)
        self.scaler_scale_ = np.asarray(scaler.scale_, dtype=np.float64)
        z = self._standardize(features)

        k = min(k_max, z.shape[0])
        if k < k_max:
            warnings.warn(f"n_clusters={k_max} but there are only {z.shape[0]} calibration samples; "
                          f"using {k} clusters", CalibrationWarning, stacklevel=4)
        # One thread: k = 8 on calibration-set sizes gains nothing from threads, while torch's and
        # scikit-learn's two OpenMP runtimes in one process oversubscribe the cores (measured on
        # 1400 x 128 features, 2 busy cores: 0.5 s single-threaded vs 7-12 s by default).
        with threadpool_limits(limits=1):
            km = KMeans(n_clusters=k, n_init=self.n_init, random_state=self.random_state).fit(
                z, sample_weight=sample_weight)
        self.centroids_ = np.asarray(km.cluster_centers_, dtype=np.float64)
        assign = self._nearest(z)

        set_fit = _fit_quiet(logits, labels, weight, bounds)
        self.set_temperature_ = set_fit.temperature
        if set_fit.at_bound:
            warnings.warn(f"set-level temperature stopped at the search bound T = {set_fit.temperature:g}",
                          CalibrationWarning, stacklevel=4)

        def fit_cluster(rows):
            return _fit_quiet(logits[rows], labels[rows], None if weight is None else weight[rows], bounds)

        def on_bound(res):
            if self.bound_fallback and res.at_bound:
                return (f"their optimal temperature on the search bound {bounds} (perfectly separated or "
                        "uninformative)")
            return None

        # a cluster's size is its weight (an integer weight counts as repeated rows)
        fits = fit_groups(fit_cluster, assign.tolist(), min_samples=min_size, pooled=set_fit, reject=on_bound,
                          sample_weight=sample_weight,
                          expected=range(k), what="cluster", min_name="min_cluster_size", stacklevel=5,
                          pooled_name=f"the set-level temperature T = {self.set_temperature_:.6g}")
        temps = np.array([fits.fit_for(c).temperature for c in range(k)], dtype=np.float64)
        sizes = np.array([fits.counts[c] for c in range(k)], dtype=np.int64)
        fallback = np.array([c in fits.fallback for c in range(k)], dtype=bool)
        self.cluster_temperatures_ = temps
        self.cluster_sizes_ = sizes.astype(np.int64)
        self.cluster_fallback_ = fallback
        self.n_features_ = int(features.shape[1])

    # -------------------------------------------------------------- prediction
    def _standardize(self, features: np.ndarray) -> np.ndarray:
        return (features - self.scaler_mean_) / self.scaler_scale_

    def _nearest(self, z: np.ndarray) -> np.ndarray:
        # ||z - c||^2 = ||z||^2 - 2 z.c + ||c||^2; ||z||^2 is constant per row.
        d = (self.centroids_ ** 2).sum(axis=1)[None, :] - 2.0 * (z @ self.centroids_.T)
        return np.argmin(d, axis=1)

    def _checked_features(self, features) -> np.ndarray:
        self._check_fitted()
        if features is None:
            raise ValueError(f"features: {type(self).__name__} requires features= "
                             f"(n_samples, {self.n_features_})")
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.n_features_:
            raise ValueError(f"features: calibrator was fitted on {self.n_features_} features, "
                             f"got shape {f.shape}")
        return f

    def predict_cluster(self, features) -> np.ndarray:
        """Index of the nearest centroid (Euclidean, in the standardised space) ``(n_samples,)``."""
        f = self._checked_features(features)
        return self._nearest(self._standardize(f))

    def _predict_proba(self, logits, features, domains=None):
        return _scaled_softmax(logits, self.temperatures_for(features)[:, None])

    def temperatures_for(self, features) -> np.ndarray:
        """Per-sample temperatures ``(n_samples,)``, all ``> 0``, for features ``(n_samples, n_features)``."""
        f = self._checked_features(features)
        return self._temperatures(self._standardize(f))

    @abc.abstractmethod
    def _temperatures(self, z: np.ndarray) -> np.ndarray:
        """Per-sample temperatures for standardised features ``z``."""

    # ----------------------------------------------------------------- manifest
    def _get_fitted(self):
        return {
            "n_features": self.n_features_,
            "scaler_mean": _floats(self.scaler_mean_),
            "scaler_scale": _floats(self.scaler_scale_),
            "centroids": _floats(self.centroids_),
            "set_temperature": float(self.set_temperature_),
            "cluster_temperatures": _floats(self.cluster_temperatures_),
            "cluster_sizes": [int(s) for s in self.cluster_sizes_],
            "cluster_fallback": [bool(b) for b in self.cluster_fallback_],
        }

    def _set_fitted(self, params):
        self.n_features_ = int(params["n_features"])
        self.scaler_mean_ = np.asarray(params["scaler_mean"], dtype=np.float64)
        self.scaler_scale_ = np.asarray(params["scaler_scale"], dtype=np.float64)
        self.centroids_ = np.asarray(params["centroids"], dtype=np.float64).reshape(-1, self.n_features_)
        self.set_temperature_ = float(params["set_temperature"])
        self.cluster_temperatures_ = np.asarray(params["cluster_temperatures"], dtype=np.float64)
        self.cluster_sizes_ = np.asarray(params["cluster_sizes"], dtype=np.int64)
        self.cluster_fallback_ = np.asarray(params["cluster_fallback"], dtype=bool)


# the numpydoc sections the cluster-level classes share, composed into their docstrings
_CLUSTER_PARAMS = """
    Parameters
    ----------
    n_clusters : int
        Number of k-means clusters (default 8, as in the paper)
    random_state : int
        Seed of k-means (the fit is deterministic for a given seed)
    n_init : int
        k-means restarts (best inertia kept)
    min_cluster_size : int
        Clusters with fewer calibration samples use the set-level temperature
    bound_fallback : bool
        Clusters whose optimal temperature lies on a search bound use the set-level temperature too
    domain_weighting : str
        ``"sample"`` or ``"domain"``, how the calibration samples are weighted in every temperature
        fit (see :class:`SetLevelTemperatureScaling`)
    t_min, t_max : float
        Search range of every temperature
"""

_CLUSTER_ATTRS = """
    Attributes
    ----------
    scaler_mean_, scaler_scale_ : ndarray
        ``(n_features,)``, the standardisation
    centroids_ : ndarray
        ``(k, n_features)`` k-means centroids in the standardised space
    set_temperature_ : float
        Set-level temperature (the fallback)
    cluster_temperatures_ : ndarray
        ``(k,)``, ``> 0``
    cluster_sizes_ : ndarray
        ``(k,)`` calibration samples per cluster
    cluster_fallback_ : ndarray
        ``(k,)`` bool, which clusters use the set-level temperature
"""

_CLUSTER_NOTES = """
    Notes
    -----
    Side inputs: ``features`` ``(n_samples, n_features)`` at fit and predict time
    (raw penultimate activations are fine: they are standardised inside);
    ``domains`` ``(n_samples,)``, optional, used only at fit time for
    ``domain_weighting="domain"``.
"""


@register
class ClusterTemperatureScaling(_ClusterBase):
    __doc__ = """Cluster-level temperature scaling, nearest-neighbour variant (Gong et al. 2021, eq. 16).

    Each test sample uses the temperature of the nearest k-means centroid:
    ``p = softmax(z / T_{c(x)})``, ``c(x) = argmin_c ||x - mu_c||``.
    """ + _CLUSTER_PARAMS + _CLUSTER_ATTRS + _CLUSTER_NOTES + """
    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> domains = rng.integers(0, 2, size=300)
    >>> features = rng.normal(size=(300, 4)) + labels[:, None]
    >>> from confcal.calibrators import ClusterTemperatureScaling
    >>> cts = ClusterTemperatureScaling(n_clusters=2, n_init=1)
    >>> cts = cts.fit(logits, labels, features=features, domains=domains)
    >>> len(cts.cluster_temperatures_), int(sum(cts.cluster_sizes_))
    (2, 300)
    >>> round(nll(cts.predict_proba(logits, features=features), labels), 2)
    0.88
    """

    method = "cluster-ts"

    def _fit(self, logits, labels, features, domains=None, sample_weight=None):
        self._fit_clusters(logits, labels, features, domains, sample_weight)

    def _temperatures(self, z):
        return self.cluster_temperatures_[self._nearest(z)]


class _RegressionMixin:
    """Ridge regression of log cluster temperature on the cluster centroid (eq. 18).

    With ``k = 8`` points in hundreds of dimensions, least squares is
    under-determined, so the map is a ridge regression whose penalty is chosen
    by exact leave-one-out error over ``alphas`` (scikit-learn ``RidgeCV``,
    ``cv=None``). The target is ``log T``: the prediction ``exp(w.x + b)`` is
    positive for every input, and a multiplicative error in ``T`` costs the same
    whether ``T`` is 0.5 or 2. Predicted ``log T`` is clipped to
    ``[log t_min, log t_max]``, the range any fitted temperature can take.
    Only clusters with an own temperature fit are regression points; with fewer
    than 3 of them (leave-one-out needs at least 2 points per fold) the map is
    the constant set-level temperature, with a warning.
    """

    def _fit_regression(self):
        from sklearn.linear_model import RidgeCV

        own = ~self.cluster_fallback_
        alphas = np.asarray(self.alphas if self.alphas is not None else DEFAULT_RIDGE_ALPHAS,
                            dtype=np.float64)
        if own.sum() < 3:
            warnings.warn(f"only {int(own.sum())} clusters have their own temperature; the regression "
                          f"needs at least 3, so it predicts the set-level temperature "
                          f"T = {self.set_temperature_:.6g}", CalibrationWarning, stacklevel=4)
            self.reg_coef_ = np.zeros(self.n_features_)
            self.reg_intercept_ = math.log(self.set_temperature_)
            self.reg_alpha_ = float("inf")
            return
        ridge = RidgeCV(alphas=alphas, fit_intercept=True).fit(
            self.centroids_[own], np.log(self.cluster_temperatures_[own]))
        self.reg_coef_ = np.asarray(ridge.coef_, dtype=np.float64).ravel()
        self.reg_intercept_ = float(ridge.intercept_)
        self.reg_alpha_ = float(ridge.alpha_)

    def _regression_temperatures(self, z):
        log_t = z @ self.reg_coef_ + self.reg_intercept_
        t = np.exp(np.clip(log_t, math.log(self.t_min), math.log(self.t_max)))
        return np.clip(t, self.t_min, self.t_max)  # exp(log(b)) can exceed b by an ulp

    def _get_regression(self):
        return {"reg_coef": _floats(self.reg_coef_), "reg_intercept": float(self.reg_intercept_),
                # inf marks the constant fallback; JSON has no inf, so store null
                "reg_alpha": None if math.isinf(self.reg_alpha_) else float(self.reg_alpha_)}

    def _set_regression(self, params):
        self.reg_coef_ = np.asarray(params["reg_coef"], dtype=np.float64)
        self.reg_intercept_ = float(params["reg_intercept"])
        alpha = params.get("reg_alpha")
        self.reg_alpha_ = float("inf") if alpha is None else float(alpha)


_REG_PARAMS = """    alphas : list of float or None
        Ridge penalties tried by leave-one-out (default :data:`DEFAULT_RIDGE_ALPHAS`,
        ``10**-3 .. 10**7``)
"""

_REG_ATTRS = """    reg_coef_ : ndarray
        ``(n_features,)``, the regression of ``log T`` on the standardised centroid
    reg_intercept_ : float
        Its intercept
    reg_alpha_ : float
        The chosen penalty (``inf`` when the map is constant)
"""


class _ClusterRegressionBase(_RegressionMixin, _ClusterBase):
    """Clusters plus the regression of their temperatures: the shared fit of
    cluster-TS-regression and the domain ensemble."""

    hyper_constraints = {**_ClusterBase.hyper_constraints, "alphas": Nullable(Array((None,), Real(gt=0)))}
    fitted_constraints = Fields({
        **_ClusterBase.fitted_constraints.fields,
        "reg_coef": Array(("n_features",)),
        "reg_intercept": Real(),
        "reg_alpha": Nullable(Real(gt=0)),  # null: the constant fallback (alpha = inf)
    })

    def __init__(self, n_clusters: int = 8, random_state: int = 0, n_init: int = 10,
                 min_cluster_size: int = 20, bound_fallback: bool = True,
                 domain_weighting: str = "sample", t_min: float = DEFAULT_T_BOUNDS[0],
                 t_max: float = DEFAULT_T_BOUNDS[1], alphas: list | None = None, input_kind: str = "logits"):
        super().__init__(n_clusters=n_clusters, random_state=random_state, n_init=n_init,
                         min_cluster_size=min_cluster_size, bound_fallback=bound_fallback,
                         domain_weighting=domain_weighting, t_min=t_min, t_max=t_max, input_kind=input_kind)
        self.alphas = alphas

    def _fit(self, logits, labels, features, domains=None, sample_weight=None):
        self._fit_clusters(logits, labels, features, domains, sample_weight)
        self._fit_regression()


@register
class ClusterRegressionTemperatureScaling(_ClusterRegressionBase):
    __doc__ = """Cluster-level temperature scaling, regression variant (Gong et al. 2021, eq. 18).

    Fits the clusters and their temperatures as :class:`ClusterTemperatureScaling`,
    then a linear map from a cluster's mean feature (its centroid) to its
    temperature; each test sample gets ``T(x) = exp(w . x_std + b)``.
    """ + _RegressionMixin.__doc__ + _CLUSTER_PARAMS + _REG_PARAMS + _CLUSTER_ATTRS + _REG_ATTRS + _CLUSTER_NOTES + """
    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> domains = rng.integers(0, 2, size=300)
    >>> features = rng.normal(size=(300, 4)) + labels[:, None]
    >>> import warnings
    >>> from confcal.calibrators import ClusterRegressionTemperatureScaling
    >>> crts = ClusterRegressionTemperatureScaling(n_clusters=2, n_init=1)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # 2 clusters are few points for the regression
    ...     crts = crts.fit(logits, labels, features=features, domains=domains)
    >>> len(crts.reg_coef_)  # one coefficient per feature
    4
    >>> round(nll(crts.predict_proba(logits, features=features), labels), 2)
    0.88
    """

    method = "cluster-ts-regression"

    def _temperatures(self, z):
        return self._regression_temperatures(z)

    def _get_fitted(self):
        return {**super()._get_fitted(), **self._get_regression()}

    def _set_fitted(self, params):
        super()._set_fitted(params)
        self._set_regression(params)


@register
class DomainEnsembleTemperatureScaling(_ClusterRegressionBase):
    __doc__ = """Ensemble of set-level, cluster-NN and cluster-regression TS (Gong et al. 2021, sec. 5.2).

    The calibrated logits of the three methods are averaged, then softmax:
    ``p = softmax(mean(z / T_set, z / T_nn(x), z / T_reg(x)))``, which is
    temperature scaling with the per-sample temperature
    ``T(x) = 3 / (1/T_set + 1/T_nn(x) + 1/T_reg(x))`` (harmonic mean).
    The three members share one scaler and one k-means fit, so they are
    exactly the members :class:`SetLevelTemperatureScaling`,
    :class:`ClusterTemperatureScaling` and
    :class:`ClusterRegressionTemperatureScaling` would fit with the same
    hyper-parameters.
    """ + _CLUSTER_PARAMS + _REG_PARAMS + _CLUSTER_ATTRS + _REG_ATTRS + _CLUSTER_NOTES + """
    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> domains = rng.integers(0, 2, size=300)
    >>> features = rng.normal(size=(300, 4)) + labels[:, None]
    >>> import warnings
    >>> from confcal.calibrators import DomainEnsembleTemperatureScaling
    >>> dets = DomainEnsembleTemperatureScaling(n_clusters=2, n_init=1)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # 2 clusters are few points for the regression
    ...     dets = dets.fit(logits, labels, features=features, domains=domains)
    >>> probs = dets.predict_proba(logits, features=features)
    >>> bool(np.allclose(probs.sum(axis=1), 1)), round(nll(probs, labels), 2)
    (True, 0.88)
    """

    method = "domain-ensemble"

    def member_temperatures(self, features) -> dict[str, np.ndarray]:
        """Per-sample temperatures ``(n_samples,)`` of each member: keys ``set``, ``nn``, ``regression``."""
        z = self._standardize(self._checked_features(features))
        return {"set": np.full(z.shape[0], self.set_temperature_),
                "nn": self.cluster_temperatures_[self._nearest(z)],
                "regression": self._regression_temperatures(z)}

    def _temperatures(self, z):
        inv = (1.0 / self.set_temperature_ + 1.0 / self.cluster_temperatures_[self._nearest(z)]
               + 1.0 / self._regression_temperatures(z)) / 3.0
        return 1.0 / inv

    def _get_fitted(self):
        return {**super()._get_fitted(), **self._get_regression()}

    def _set_fitted(self, params):
        super()._set_fitted(params)
        self._set_regression(params)
