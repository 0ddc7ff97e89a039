"""Source-gated temperature scaling: per sample, between source-only TS and a domain-generalization method.

Why: a temperature learned on several calibration domains (Gong et al., ICCV
2021) transfers badly to test samples that resemble the classifier's source
domain when the calibration domains do not (measured on the domain benchmark:
4-5 of 24 splits end > 2 ECE points worse than plain source-only TS). The gate
asks each test sample how source-like its features are and moves its log
temperature between the two:

``log T(x) = g(x) log T_source + (1 - g(x)) log T_base(x)``

where ``T_source`` is fitted on held-out source rows, ``T_base`` is any of the
four domain-generalization calibrators of :mod:`confcal.calibrators.domain.methods`
fitted on the calibration domains, and ``g(x)`` is the k-nearest-neighbour
probability that ``x`` comes from the source under equal domain priors: with
``k_d`` of the ``k`` nearest reference-pool rows in domain ``d`` (pool size
``n_d``), ``g = (k_0 / n_0) / sum_d (k_d / n_d)`` (``k_d / (n_d V)`` is the kNN estimate
of domain ``d``'s density in the ball ``V`` holding the ``k`` neighbours, Duda,
Hart & Stork, *Pattern Classification*, 2nd ed., sec. 4.5; equal priors, so
that the pool sizes do not decide). No target labels are used, and only the
test sample's own features, as cluster-level TS already does.

The floor: with a tiny source set (63 rows) one stray source neighbour is
worth ``1/63`` against ``1/1000`` for a calibration row, so samples that are
not source-like keep ``g`` around 0.2-0.4. By default the gate is rescaled as
``(g - f) / (1 - f)``, clipped to ``[0, 1]``, with ``f`` the median
leave-one-out gate of the calibration domains' own pool rows: the value a
sample that is certainly not from the source gets (label-free; domain ids only).

Measured on ``benchmarks/domain_generalization.py`` (seeds 0 and 1, see
``benchmarks/results/domain_generalization.md``); gate variants that lost
there are listed in that file.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from confcal._numeric import softmax
from confcal.calibrators.protocol.constraints import SEED, T_BOUNDS, T_RULE, TEMPERATURE, Array, Choice, Fields, GroupKey, \
    Int, Nullable, Real, Spec, check_hyperparameters, check_parameters
from confcal.calibrators._fit.tsfit import DEFAULT_T_BOUNDS, CalibrationWarning, fit_temperature
from confcal.calibrators.protocol.base import METHODS, Calibrator, calibrator_from_dict, register
from confcal.calibrators.protocol.temperature_bounds import temperatures_within_bounds
from confcal._validation import plain

__all__ = ["SourceGatedTemperatureScaling", "source_gate", "neighbour_counts", "pool_allocation",
           "BASE_METHODS"]

#: the domain-generalization calibrators a gate can sit on (Gong et al. 2021)
BASE_METHODS = ("set-ts", "cluster-ts", "cluster-ts-regression", "domain-ensemble")
FLOORS = ("loo-median", "none")

_CHUNK_ROWS = 2048  # query rows per kneighbors call: bounds the distance block to 2048 x pool


# --------------------------------------------------------------------------- pure pieces
def source_gate(counts, pool_sizes) -> np.ndarray:
    """kNN probability of the source domain under equal domain priors.

    ``g = (k_0 / n_0) / sum_d (k_d / n_d)``: ``k_d / (k n_d)`` is the kNN
    estimate of domain ``d``'s density at the query (up to the common ball
    volume), so ``g`` is Bayes' rule with equal priors on those estimates.

    Parameters
    ----------
    counts : int array ``(n_samples, n_domains)``, neighbours per domain; column 0 is the source
    pool_sizes : ``(n_domains,)``, reference-pool rows per domain, all ``>= 1``

    Returns
    -------
    ``(n_samples,)`` float64 in ``[0, 1]``; 1 where every neighbour is a source row.

    Raises
    ------
    ValueError
        Shapes disagree, a pool size is below 1, or a row has no neighbours.

    Examples
    --------
    >>> source_gate([[2, 18], [0, 20], [20, 0]], [100, 1000]).round(4).tolist()
    [0.5263, 0.0, 1.0]
    """
    c = np.asarray(counts, dtype=np.float64)
    n = np.asarray(pool_sizes, dtype=np.float64)
    if c.ndim != 2 or n.shape != (c.shape[1],):
        raise ValueError(f"counts, pool_sizes: expected (n_samples, n_domains) and (n_domains,), "
                         f"got {c.shape} and {n.shape}")
    if not np.all(n >= 1):
        raise ValueError(f"pool_sizes: expected every domain to have >= 1 row, got {n.tolist()}")
    rate = c / n
    total = rate.sum(axis=1)
    if not np.all(total > 0):
        raise ValueError("counts: every row needs at least one neighbour")
    return np.clip(rate[:, 0] / total, 0.0, 1.0)


def neighbour_counts(pool, pool_domains, queries, n_neighbors: int, n_domains: int, *,
                     chunk_rows: int = _CHUNK_ROWS, index=None) -> np.ndarray:
    """Neighbours per domain among the ``n_neighbors`` nearest pool rows of each query.

    Euclidean k-nearest neighbours from scikit-learn (``NearestNeighbors``),
    queried in chunks of ``chunk_rows`` rows so memory stays bounded.

    Parameters
    ----------
    pool : float ``(n_pool, n_features)``
    pool_domains : int ``(n_pool,)`` in ``[0, n_domains)``
    queries : float ``(n_samples, n_features)``
    n_neighbors : ``k``, ``1 <= k <= n_pool``
    index : an already fitted ``NearestNeighbors`` on ``pool`` (else one is built)

    Returns
    -------
    int64 ``(n_samples, n_domains)``, rows summing to ``k``.

    Examples
    --------
    >>> pool = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> neighbour_counts(pool, np.array([0, 0, 1, 1]), np.array([[0.4], [10.2]]), 3, 2).tolist()
    [[2, 1], [1, 2]]
    """
    from sklearn.neighbors import NearestNeighbors

    if index is None:
        index = NearestNeighbors().fit(pool)
    codes = np.asarray(pool_domains, dtype=np.int64)
    out = np.zeros((queries.shape[0], n_domains), dtype=np.int64)
    for start in range(0, queries.shape[0], chunk_rows):
        idx = index.kneighbors(queries[start:start + chunk_rows], n_neighbors=n_neighbors,
                               return_distance=False)
        dom = codes[idx]
        for d in range(n_domains):
            out[start:start + chunk_rows, d] = (dom == d).sum(axis=1)
    return out


def pool_allocation(sizes, max_pool_size: int | None) -> np.ndarray:
    """Rows kept per domain when the pool is capped at ``max_pool_size`` rows.

    Small domains are kept whole; the cap is shared by "water filling": every
    domain keeps ``min(n_d, c)`` rows with the largest ``c`` that fits. Each
    domain is then subsampled uniformly, so ``k_d / n_d`` stays an unbiased
    density estimate and :func:`source_gate` needs no correction.

    Examples
    --------
    >>> pool_allocation([63, 900, 1200], 1000).tolist()
    [63, 468, 469]
    >>> pool_allocation([63, 900], None).tolist()
    [63, 900]
    """
    n = np.asarray(sizes, dtype=np.int64)
    if max_pool_size is None or n.sum() <= max_pool_size:
        return n.copy()
    lo, hi = 0, int(n.max())
    while lo < hi:  # largest per-domain cap c with sum(min(n, c)) <= max_pool_size
        mid = (lo + hi + 1) // 2
        if np.minimum(n, mid).sum() <= max_pool_size:
            lo = mid
        else:
            hi = mid - 1
    keep = np.minimum(n, lo)
    spare = int(max_pool_size - keep.sum())
    for d in np.argsort(-n, kind="stable"):  # hand out the remainder one row at a time
        if spare == 0:
            break
        if keep[d] < n[d]:
            keep[d] += 1
            spare -= 1
    return keep


# --------------------------------------------------------------------------- calibrator
class _BaseManifest(Spec):
    """The embedded manifest of the base method, checked with that method's own tables."""

    def check(self, value, path, ctx):
        Fields({"method": Choice(*BASE_METHODS), "hyperparameters": Fields({}, extra_ok=True),
                "parameters": Fields({}, extra_ok=True), "n_classes": Int(ge=2, bind="n_classes")}
               ).check(value, path, ctx)
        cls = METHODS[value["method"]]
        env = check_hyperparameters(cls, value["hyperparameters"], where=ctx.where, env=dict(ctx.env),
                                    path=f"{path}.hyperparameters")
        check_parameters(cls, value["parameters"], env={"n_classes": env["n_classes"]}, where=ctx.where,
                         path=f"{path}.parameters")
        return value


@register
class SourceGatedTemperatureScaling(Calibrator):
    """Per-sample gate between source-only TS and a domain-generalization calibrator.

    ``p = softmax(z / T(x))`` with ``log T(x) = g(x) log T_source + (1 - g(x)) log T_base(x)``
    and ``g`` the kNN probability of the source under equal domain priors
    (:func:`source_gate`). ``T(x)`` is positive, so the arg-max is unchanged.

    Fit steps:

    1. ``T_source``: temperature scaling (Guo et al. 2017) on the rows whose
       domain is ``source_domain`` (held-out source rows, not the classifier's
       training rows);
    2. the base calibrator (``base``, one of :data:`BASE_METHODS`, Gong et al.
       2021 eqs. 15-18 and sec. 5.2) on all other rows, with their domain ids;
    3. the reference pool: source and calibration rows, standardised on the
       pool (zero-variance columns get scale 1), capped at ``max_pool_size``
       rows by :func:`pool_allocation` (seeded uniform subsample per domain;
       small domains kept whole) and stored as float32 — what the manifest
       holds: ``n_pool x n_features`` numbers plus one domain code per row.

    Parameters
    ----------
    source_domain : int or str
        The id (in ``domains=`` at fit time) of the source domain's rows;
        required (``None``, the default, raises at fit).
    base : str
        Default ``"domain-ensemble"``
        Method name of the base calibrator.
    base_params : dict or None
        Hyper-parameters of the base calibrator (``n_clusters``, ``domain_weighting``, ...).
    n_neighbors : int, default 20
        ``k``; at most the pool size (smaller pools use all rows).
    floor
        ``"loo-median"`` (default) or ``"none"``
        Subtract the median leave-one-out gate of the calibration rows (see
        the module docstring) or use the raw kNN probability.
    max_pool_size : int or None, default 2000
        Cap on the stored reference pool (rows); ``None`` keeps every row.
    random_state : int, default 0
        Seed of the pool subsample.
    t_min, t_max : float
        Search range of ``T_source`` (default ``[1e-2, 1e2]``).
    input_kind
        ``"logits"`` (default) or ``"probs"`` (probabilities; their log is used)

    Attributes
    ----------
    source_temperature_ : float
    base_
        The fitted base calibrator
    domains_ : list
        Domain ids with the source first
    domain_sizes_
        ``(n_domains,)`` fit rows per domain
    pool_ : float32
        ``(n_pool, n_features)``, standardised reference pool
    pool_domains_ : int
        ``(n_pool,)``, index into ``domains_``
    pool_sizes_
        ``(n_domains,)`` pool rows per domain
    scaler_mean_, scaler_scale_
        ``(n_features,)``
    n_neighbors_ : int
        The ``k`` used
    neighbors_
        scikit-learn ``NearestNeighbors`` on ``pool_`` (rebuilt from the manifest on load)
    gate_floor_
        float in ``[0, 1)``, ``f`` (0 with ``floor="none"``)

    Raises
    ------
    ValueError
        At fit: no ``domains``, ``source_domain`` not among them, no rows of
        another domain, unknown ``base``; at predict: features of another width.

    Notes
    -----
    Side inputs: ``features`` ``(n_samples, n_features)`` at fit and predict
    time; ``domains`` ``(n_samples,)`` at fit time (ignored at predict time).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(0, 3, (600, 3)); y = z.argmax(1)
    >>> f = np.r_[rng.normal(0, 1, (200, 2)), rng.normal(5, 1, (400, 2))]
    >>> dom = np.repeat(["src", "a", "b"], 200)
    >>> cal = SourceGatedTemperatureScaling(source_domain="src", base="set-ts").fit(
    ...     z, y, features=f, domains=dom)
    >>> cal.gate(np.array([[0.0, 0.0], [5.0, 5.0]])).round(2).tolist()
    [1.0, 0.0]
    >>> cal.predict_proba(z[:2], features=f[:2]).shape
    (2, 3)
    """

    method = "source-gated-ts"
    side_inputs = ("features",)
    optional_side_inputs = ("domains",)
    hyper_constraints = {"source_domain": Nullable(GroupKey()), "base": Choice(*BASE_METHODS),
                         "base_params": Nullable(Fields({}, extra_ok=True)), "n_neighbors": Int(ge=1),
                         "floor": Choice(*FLOORS), "max_pool_size": Nullable(Int(ge=2)), "random_state": SEED,
                         **T_BOUNDS}
    hyper_rules = (T_RULE,)
    hyper_parameter_rules = (temperatures_within_bounds("source_temperature"),)  # as ts, on load
    fitted_constraints = Fields({
        "source_temperature": TEMPERATURE,
        "domains": Array(("n_domains",), GroupKey()),
        "domain_sizes": Array(("n_domains",), Int(ge=1)),
        "pool_sizes": Array(("n_domains",), Int(ge=1)),
        "n_features": Int(ge=1, bind="n_features"),
        "n_neighbors": Int(ge=1),
        "gate_floor": Real(ge=0, lt=1),
        "scaler_mean": Array(("n_features",)),
        "scaler_scale": Array(("n_features",), Real(gt=0)),
        "pool": Array(("n_pool", "n_features")),
        "pool_domains": Array(("n_pool",), Int(ge=0)),
        "base": _BaseManifest(),
    })

    def __init__(self, source_domain=None, base: str = "domain-ensemble", base_params: dict | None = None,
                 n_neighbors: int = 20, floor: str = "loo-median", max_pool_size: int | None = 2000,
                 random_state: int = 0, t_min: float = DEFAULT_T_BOUNDS[0], t_max: float = DEFAULT_T_BOUNDS[1],
                 input_kind: str = "logits"):
        self.source_domain = source_domain
        self.base = base
        self.base_params = base_params
        self.n_neighbors = n_neighbors
        self.floor = floor
        self.max_pool_size = max_pool_size
        self.random_state = random_state
        self.t_min = t_min
        self.t_max = t_max
        self.input_kind = input_kind

    def _sample_weight_refusal(self) -> str:
        return "the kNN gate counts reference-pool rows, so a weight is not the same as repeating a row"

    # ------------------------------------------------------------------ checks
    def _check_hyperparameters(self):
        if self.base not in BASE_METHODS:
            raise ValueError(f"base: expected one of {BASE_METHODS}, got {self.base!r}")
        if self.base_params is not None and not isinstance(self.base_params, dict):
            raise ValueError(f"base_params: expected a dict or None, got {type(self.base_params).__name__}")
        k = self.n_neighbors
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"n_neighbors: expected an integer >= 1, got {plain(k)}")
        if self.floor not in FLOORS:
            raise ValueError(f"floor: expected one of {FLOORS}, got {self.floor!r}")
        m = self.max_pool_size
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 2):
            raise ValueError(f"max_pool_size: expected None or an integer >= 2, got {plain(m)}")
        t_min, t_max = float(self.t_min), float(self.t_max)
        if not (0 < t_min < t_max and math.isfinite(t_max)):
            raise ValueError(f"t_min, t_max: expected 0 < t_min < t_max < inf, got ({t_min}, {t_max})")
        return t_min, t_max

    # ------------------------------------------------------------------ fitting
    def _fit(self, logits, labels, features, domains=None):
        t_bounds = self._check_hyperparameters()
        if domains is None:
            raise ValueError("domains: SourceGatedTemperatureScaling needs domains= at fit time "
                             "(one id per row; the source rows have id source_domain)")
        ids = np.unique(domains).tolist()
        src = self.source_domain
        if src is None:
            raise ValueError(f"source_domain: required, the id of the source rows among the fit domains {ids}")
        if src not in ids and str(src) in map(str, ids):  # "--param source_domain=0" for ids "0", "1"
            src = next(i for i in ids if str(i) == str(src))
        if src not in ids:
            raise ValueError(f"source_domain: {src!r} is not among the fit domains {ids}")
        is_src = domains == src
        others = [d for d in ids if d != src]
        if not others:
            raise ValueError(f"domains: only the source domain {src!r} is present; the base calibrator "
                             "needs rows of at least one calibration domain")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            res = fit_temperature(logits[is_src], labels[is_src], t_bounds=t_bounds, warn=False)
        if res.at_bound:
            warnings.warn(f"source temperature stopped at the search bound T = {res.temperature:g} "
                          f"({int(is_src.sum())} source rows)", CalibrationWarning, stacklevel=3)
        self.source_temperature_ = res.temperature

        base = METHODS[self.base](**dict(self.base_params or {}))
        base.fit(logits[~is_src], labels[~is_src], features=features[~is_src], domains=domains[~is_src])
        self.base_ = base

        self.domains_ = [src, *others]
        codes = np.zeros(domains.shape[0], dtype=np.int64)
        for i, d in enumerate(others, start=1):
            codes[domains == d] = i
        sizes = np.bincount(codes, minlength=len(self.domains_))
        keep = pool_allocation(sizes, self.max_pool_size)
        rng = np.random.default_rng(self.random_state)
        rows = np.sort(np.concatenate([
            rng.choice(np.flatnonzero(codes == d), size=int(keep[d]), replace=False)
            if keep[d] < sizes[d] else np.flatnonzero(codes == d) for d in range(len(sizes))]))
        from sklearn.preprocessing import StandardScaler

        scaler = StandardScaler().fit(features[rows])
        self.scaler_mean_ = np.asarray(scaler.mean_, dtype=np.float64)
        self.scaler_scale_ = np.asarray(scaler.scale_, dtype=np.float64)
        self.pool_ = self._standardize(features[rows])
        self.pool_domains_ = codes[rows]
        self.pool_sizes_ = keep.astype(np.int64)
        self.domain_sizes_ = sizes.astype(np.int64)
        self.n_features_ = int(features.shape[1])
        self.n_neighbors_ = int(min(self.n_neighbors, rows.size))
        self.neighbors_ = _index(self.pool_)
        self.gate_floor_ = self._loo_floor() if self.floor == "loo-median" else 0.0

    def _loo_floor(self) -> float:
        """Median leave-one-out gate of the calibration domains' pool rows (each row's own
        neighbours, itself excluded), so a sample that is surely not a source row maps to 0."""
        k = min(self.n_neighbors_, self.pool_.shape[0] - 1)
        if k < 1:
            return 0.0
        idx = self.neighbors_.kneighbors(None, n_neighbors=k, return_distance=False)
        dom = self.pool_domains_[idx]
        counts = np.stack([(dom == d).sum(axis=1) for d in range(len(self.domains_))], axis=1)
        g = source_gate(counts, self.pool_sizes_)[self.pool_domains_ > 0]
        f = float(np.median(g))
        return f if f < 1.0 else 0.0  # no information to rescale with

    # -------------------------------------------------------------- prediction
    def _standardize(self, features) -> np.ndarray:
        # float32: half the manifest, and the kNN order is insensitive to it
        return ((features - self.scaler_mean_) / self.scaler_scale_).astype(np.float32)

    def _checked_features(self, features) -> np.ndarray:
        self._check_fitted()
        if features is None:
            raise ValueError(f"features: {type(self).__name__} requires features= (n_samples, "
                             f"{self.n_features_})")
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.n_features_:
            raise ValueError(f"features: calibrator was fitted on {self.n_features_} features, "
                             f"got shape {f.shape}")
        return f

    def gate(self, features) -> np.ndarray:
        """``g(x)`` in ``[0, 1]`` for features ``(n_samples, n_features)``: the weight of ``T_source``
        (the kNN source probability, rescaled by the floor)."""
        q = self._standardize(self._checked_features(features))
        counts = neighbour_counts(self.pool_, self.pool_domains_, q, self.n_neighbors_,
                                  len(self.domains_), index=self.neighbors_)
        g = source_gate(counts, self.pool_sizes_)
        f = self.gate_floor_
        return g if f == 0.0 else np.clip((g - f) / (1.0 - f), 0.0, 1.0)

    def _base_temperatures(self, logits, features) -> np.ndarray:
        if self.base == "set-ts":
            return self.base_.temperatures_for(logits)
        return self.base_.temperatures_for(features)

    def temperatures_for(self, logits, features) -> np.ndarray:
        """Per-sample temperatures ``(n_samples,)``, all ``> 0``."""
        g = self.gate(features)
        t_base = self._base_temperatures(np.asarray(logits), features)
        return np.exp(g * math.log(self.source_temperature_) + (1.0 - g) * np.log(t_base))

    def _predict_proba(self, logits, features, domains=None):
        t = self.temperatures_for(logits, features)
        with np.errstate(invalid="ignore"):  # -inf / T stays -inf
            return softmax(logits / t[:, None])

    # ----------------------------------------------------------------- manifest
    def _get_fitted(self):
        base = self.base_.to_dict()
        return {
            "source_temperature": float(self.source_temperature_),
            "domains": list(self.domains_),
            "domain_sizes": [int(v) for v in self.domain_sizes_],
            "pool_sizes": [int(v) for v in self.pool_sizes_],
            "n_features": self.n_features_,
            "n_neighbors": self.n_neighbors_,
            "gate_floor": float(self.gate_floor_),
            "scaler_mean": self.scaler_mean_.tolist(),
            "scaler_scale": self.scaler_scale_.tolist(),
            # shortest float32 repr: exact on reload, ~2x shorter than float64 text
            "pool": _float32_lists(self.pool_),
            "pool_domains": self.pool_domains_.tolist(),
            "base": {k: base[k] for k in ("method", "hyperparameters", "parameters", "n_classes")},
        }

    def _set_fitted(self, params):
        self.source_temperature_ = float(params["source_temperature"])
        self.domains_ = list(params["domains"])
        n_dom = len(self.domains_)
        self.domain_sizes_ = np.asarray(params["domain_sizes"], dtype=np.int64)
        self.pool_sizes_ = np.asarray(params["pool_sizes"], dtype=np.int64)
        self.n_features_ = int(params["n_features"])
        self.n_neighbors_ = int(params["n_neighbors"])
        self.gate_floor_ = float(params["gate_floor"])
        self.scaler_mean_ = np.asarray(params["scaler_mean"], dtype=np.float64)
        self.scaler_scale_ = np.asarray(params["scaler_scale"], dtype=np.float64)
        self.pool_ = np.asarray(params["pool"], dtype=np.float32).reshape(-1, self.n_features_)
        self.pool_domains_ = np.asarray(params["pool_domains"], dtype=np.int64)
        # types, ranges and shapes: fitted_constraints; the relations between fields below
        if n_dom < 2 or not np.array_equal(np.bincount(self.pool_domains_, minlength=n_dom), self.pool_sizes_) \
                or self.pool_domains_.min() < 0 or self.pool_domains_.max() >= n_dom:
            raise ValueError("pool_domains: expected codes in [0, n_domains) whose counts equal pool_sizes, "
                             "with >= 2 domains")
        if not np.all(self.pool_sizes_ >= 1) or np.any(self.pool_sizes_ > self.domain_sizes_):
            raise ValueError("pool_sizes: expected 1 <= pool_sizes <= domain_sizes per domain")
        if not 1 <= self.n_neighbors_ <= self.pool_.shape[0]:
            raise ValueError(f"n_neighbors: expected 1..{self.pool_.shape[0]} (the pool size), "
                             f"got {self.n_neighbors_}")
        base = dict(params["base"])
        if base.get("method") != self.base:
            raise ValueError(f"base.method: expected {self.base!r} (the hyper-parameter), got {base.get('method')!r}")
        from confcal.calibrators.protocol.base import MANIFEST_FORMAT, MANIFEST_VERSION

        self.base_ = calibrator_from_dict({"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
                                           **base})
        self.neighbors_ = _index(self.pool_)


def _index(pool: np.ndarray):
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors().fit(pool)


def _float32_lists(a: np.ndarray) -> list:
    """float32 rows as Python floats printed with float32's shortest repr (exact on reload as float32)."""
    return [[float(str(v)) for v in row] for row in np.asarray(a, dtype=np.float32)]
