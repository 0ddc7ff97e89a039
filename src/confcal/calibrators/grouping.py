"""Per-group calibration with a pooled fallback: one composition for per-domain, per-class and
per-cluster fits.

The rules, the same wherever groups are used (``grouped-ts``, the box-score
calibrators ``det-ts`` / ``det-platt`` per class and/or domain, the cluster
temperatures of ``cluster-ts`` and its relatives):

* a pooled fit on all rows is always made; it is the fallback;
* a group with fewer than ``min_samples`` rows, with a single label where both
  labels are needed (binary box scores), or whose own fit the caller rejects
  (e.g. a temperature on its search bound), uses the pooled fit; one
  :class:`CalibrationWarning` at fit time lists those groups with their reason;
* warnings raised by a group's own fit are re-issued prefixed with the group;
* at predict time a group unseen at fit time uses the pooled fit, with one
  :class:`CalibrationWarning` per call listing the unseen groups. Groups seen at
  fit time that fell back do not warn again.

:func:`fit_groups` is the loop; :class:`GroupedCalibrator` wraps any registered
calibrator in it, keyed by a side input (``domains``, ``category_ids`` or both
crossed).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np

from confcal.calibrators.protocol.constraints import Choice, Fields, GroupKey, GroupsAgree, Int, ListOf, Nullable, Opt, Pairs, \
    Text, group_keys_of
from confcal.calibrators._fit.tsfit import CalibrationWarning
from confcal.calibrators.protocol.base import METHODS, Calibrator, register
from confcal.calibrators.protocol.group_keys import group_key

__all__ = ["GroupFits", "fit_groups", "group_rows", "route_groups", "GroupedCalibrator", "grouped_fields", "base_rules"]


def _plain(v):
    """A group id as its key (:func:`confcal.calibrators.group_key`: JSON-ready, hashes like it)."""
    return group_key(v)


def _sorted(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # mixed types: a stable order all the same
        return sorted(keys, key=repr)


def group_rows(keys, expected=()) -> dict[Hashable, np.ndarray]:
    """``{key: row indices}`` for a sequence of hashable keys (plus ``expected`` keys with no rows),
    keys sorted.

    Examples
    --------
    >>> group_rows(["b", "a", "b"], expected=["c"])
    {'a': array([1]), 'b': array([0, 2]), 'c': array([], dtype=int64)}
    """
    index: dict[Hashable, list[int]] = {k: [] for k in expected}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    return {k: np.asarray(index[k], dtype=np.int64) for k in _sorted(index)}


@dataclass
class GroupFits:
    """Result of :func:`fit_groups`: the pooled fit, each group's own fit, counts and fallbacks."""

    pooled: Any
    fits: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    fallback: dict = field(default_factory=dict)  # key -> reason

    def fit_for(self, key):
        """The fit a row of group ``key`` uses (its own, else the pooled one)."""
        return self.fits.get(key, self.pooled)


def fit_groups(fit_one: Callable[[np.ndarray | None], Any], keys, *, min_samples: int = 1, labels=None,
               reject: Callable[[Any], str | None] | None = None, pooled=None, expected=(),
               sample_weight=None,
               what: str = "group", pooled_name: str = "the pooled fit", min_name: str = "min_samples",
               stacklevel: int = 3) -> GroupFits:
    """Fit ``fit_one(rows)`` on all rows (``rows=None``, unless ``pooled`` is given) and on each group.

    Parameters
    ----------
    fit_one : callable taking row indices (``None`` = all rows) and returning a fit
    keys : sequence ``(n_samples,)`` of hashable group keys
    min_samples : groups with fewer rows fall back to the pooled fit
    labels : if given, a group holding one label only falls back (binary targets)
    reject : if given, ``reject(fit)`` returns None to keep a group's own fit, or the
        reason (a phrase) why the group falls back
    pooled : an already made pooled fit (skips the pooled call)
    expected : keys that are groups even without rows (they count 0 and fall back)
    sample_weight : optional ``(n_samples,)`` weights: a row of weight 0 is absent (a group
        with no other rows is left out, unless ``expected``), and a group's size for
        ``min_samples`` is its total weight (an integer weight counts as repeated rows)
    what, pooled_name, min_name : words for the warnings ("domain", "the pooled temperature",
        the hyper-parameter that holds ``min_samples``)

    Returns
    -------
    GroupFits

    Examples
    --------
    >>> import warnings
    >>> keys = ["a", "a", "a", "a", "b", "b"]
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     fits = fit_groups(lambda rows: "pooled" if rows is None else len(rows), keys, min_samples=3)
    >>> fits.fits, fits.fallback, fits.fit_for("b")
    ({'a': 4}, {'b': 'fewer than min_samples=3 calibration samples'}, 'pooled')
    """
    if pooled is None:
        pooled = fit_one(None)
    out = GroupFits(pooled=pooled)
    reasons: dict[str, list] = {}
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    mass = {}
    expected = set(expected)
    for key, rows in group_rows(keys, expected).items():
        if w is not None:
            rows = rows[w[rows] > 0]
            if rows.size == 0 and key not in expected:
                continue
        size = rows.size if w is None else float(w[rows].sum())
        out.counts[key] = int(rows.size)
        mass[key] = size
        reason = None
        if size < min_samples:
            reason = f"fewer than {min_name}={min_samples} calibration samples"
        elif labels is not None and np.unique(np.asarray(labels)[rows]).size < 2:
            reason = "one label only"
        if reason is None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CalibrationWarning)
                fit = fit_one(rows)
            reason = reject(fit) if reject is not None else None
            if reason is None:
                out.fits[key] = fit
                for caught_warning in caught:
                    warnings.warn(f"{what} {key!r}: {caught_warning.message}", CalibrationWarning,
                                  stacklevel=stacklevel)
        if reason is not None:
            out.fallback[key] = reason
            reasons.setdefault(reason, []).append(key)
    for reason, group in reasons.items():
        sizes = [mass[k] if w is None or not float(mass[k]).is_integer() else int(mass[k]) for k in group]
        warnings.warn(f"{what}s {group} have {reason} (sizes {sizes}); they use {pooled_name}",
                      CalibrationWarning, stacklevel=stacklevel)
    return out


def route_groups(keys, known, *, what: str = "group", pooled_name: str = "the pooled fit",
                 stacklevel: int = 3) -> dict[Hashable, np.ndarray]:
    """``{key: row indices}`` at predict time; keys not in ``known`` (unseen at fit time) get one warning.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     rows = route_groups(["a", "z", "a"], known={"a": 10}, what="domain")
    >>> rows["z"], str(caught[0].message)
    (array([1]), "domains ['z'] were not seen at fit time; they use the pooled fit")
    """
    rows = group_rows(keys)
    unseen = [k for k in rows if k not in known]
    if unseen:
        warnings.warn(f"{what}s {unseen} were not seen at fit time; they use {pooled_name}", CalibrationWarning,
                      stacklevel=stacklevel)
    return rows


def grouped_fields(group: Fields) -> Fields:
    """Manifest spec of a grouped fit whose pooled and per-group parameters follow ``group``.

    Examples
    --------
    >>> from confcal.calibrators import TemperatureScaling
    >>> sorted(grouped_fields(TemperatureScaling.fitted_constraints).fields)
    ['fallback_groups', 'group_counts', 'groups', 'pooled']
    """
    return Fields({"pooled": group, "groups": Pairs(GroupKey(), group),
                   "group_counts": Opt(Pairs(GroupKey(), Int(ge=0))), "fallback_groups": Opt(ListOf(GroupKey()))},
                  rules=(GroupsAgree(),))


def base_rules(base_of: Callable[[dict], tuple]) -> Callable[[dict, dict], str | None]:
    """A ``hyper_parameter_rules`` entry: the base method's own rules (a temperature inside its
    ``[t_min, t_max]``, ...) on the pooled map and on every group's map.

    ``base_of(hyper)`` gives ``(base class, the base's hyper-parameters)`` for the grouped manifest's
    ``hyper``. Before, only the base's tables were applied per group, not its rules: a grouped-ts group
    with ``T = 500`` outside ``[0.01, 100]`` loaded (a plain ts manifest with it is refused)."""
    def rule(hyper: dict, params: dict) -> str | None:
        try:
            base_cls, base_hyper = base_of(hyper)
        except (KeyError, TypeError, ValueError):  # the base itself is refused by the tables
            return None
        maps = [("pooled.", params.get("pooled"))]
        maps += [(f"groups[{i}][1].", g[1]) for i, g in enumerate(params.get("groups") or [])
                 if isinstance(g, (list, tuple)) and len(g) == 2]
        for check in getattr(base_cls, "hyper_parameter_rules", ()):
            for at, sub in maps:
                msg = check(base_hyper, sub) if isinstance(sub, dict) else None
                if msg:
                    return at + msg
        return None

    return rule


def _generic_base(hyper: dict) -> tuple:
    entry = METHODS[hyper.get("base", "ts")]
    base_cls = getattr(entry, "cls", entry)
    return base_cls, {**entry().get_params(), **(hyper.get("base_params") or {})}


class _GroupingColumns:
    """``side_inputs`` of a grouped calibrator: its ``by`` columns on an instance; on the class (the
    method registry, ``confcal compare``) those of the default ``by="domains"``."""

    def __get__(self, obj, owner):
        return ("domains",) if obj is None else obj._by()


@register
class GroupedCalibrator(Calibrator):
    """One ``base`` calibrator per group of rows, with the pooled fit as fallback.

    ``p(x) = base_g(x)`` for a row of group ``g`` (``g`` read from the side input(s)
    named by ``by``); rows of groups that were small, single-label or unseen at fit
    time use the base calibrator fitted on all rows (see the module docstring).

    Parameters
    ----------
    base : str, default "ts"
        A registered method name (``METHODS[base]``) that takes no side inputs.
    base_params : dict or None
        Hyper-parameters of the base calibrator.
    by : str or tuple of str, default "domains"
        Side input(s) whose values define the groups: ``"domains"``, ``"category_ids"``,
        or both (groups are then the crossed pairs).
    min_samples : int, default 1
        Groups with fewer calibration rows (total ``sample_weight``, when given) use the
        pooled fit; groups whose rows all have weight 0 are left out, as if absent.
    input_kind : {"logits", "probs"}, default "logits"
        What ``fit`` and ``predict_proba`` receive (see :class:`~confcal.calibrators.protocol.base.Calibrator`).

    Attributes
    ----------
    pooled_ : the base calibrator fitted on all rows
    groups_ : dict ``{group key: base calibrator}`` (groups with their own fit)
    group_counts_ : dict ``{group key: n calibration rows}``
    fallback_groups_ : list of group keys seen at fit time that use ``pooled_``

    Examples
    --------
    >>> import numpy as np
    >>> from confcal.calibrators.grouping import GroupedCalibrator
    >>> rng = np.random.default_rng(0)
    >>> z = rng.normal(size=(200, 3)) * 3
    >>> y = (z + rng.gumbel(size=z.shape)).argmax(axis=1)  # labels drawn from softmax(z)
    >>> d = np.where(np.arange(200) < 100, "cam", "lidar")
    >>> cal = GroupedCalibrator("ts", by="domains").fit(z, y, domains=d)
    >>> sorted(cal.groups_)
    ['cam', 'lidar']
    >>> cal.predict_proba(z[:2], domains=d[:2]).sum(axis=1)
    array([1., 1.])
    """

    method = "grouped"
    hyper_constraints = {"base": Text(), "base_params": Nullable(Fields({}, extra_ok=True)),
                         "by": Choice("domains", "category_ids", ("category_ids", "domains"),
                                      ["category_ids", "domains"]),
                         "min_samples": Int(ge=1)}  # + input_kind (COMMON_HYPER)

    #: a group key is one id for one ``by`` column, a list of ids for crossed columns
    hyper_parameter_rules = (group_keys_of(lambda h, p: None if isinstance(h.get("by", "domains"), str)
                                           else len(h["by"]), lambda h, p: f"hyper-parameter by={h.get('by', 'domains')!r}"),
                             base_rules(_generic_base))

    def __init__(self, base: str = "ts", base_params: dict | None = None, by="domains", min_samples: int = 1,
                 input_kind: str = "logits"):
        self.base = base
        self.base_params = base_params
        self.by = by
        self.min_samples = min_samples
        self.input_kind = input_kind

    @classmethod
    def fitted_spec(cls, hyper: dict, *, where: str = "manifest"):
        """The ``parameters`` table of a manifest: the base method's own table, per group and pooled."""
        base = hyper.get("base", "ts")
        if not isinstance(base, str) or base not in METHODS or base == cls.method:
            raise ValueError(f"{where}: hyperparameters.base: expected a registered method other than "
                             f"{cls.method!r}, got {base!r}")
        entry = METHODS[base]
        base_cls = getattr(entry, "cls", entry)  # a Preset names its class
        spec = getattr(base_cls, "fitted_constraints", None)
        if spec is None:
            raise ValueError(f"{where}: hyperparameters.base: method {base!r} cannot be loaded from a manifest "
                             "inside a grouped calibrator (its parameter table depends on more than its name)")
        return grouped_fields(spec)

    # ----------------------------------------------------------- for subclasses
    def _by(self) -> tuple[str, ...]:
        return (self.by,) if isinstance(self.by, str) else tuple(self.by)

    side_inputs = _GroupingColumns()  # the grouping columns are required at fit and predict time

    def _make_base(self) -> Calibrator:
        if self.base not in METHODS:
            raise ValueError(f"base: unknown method {self.base!r}; known: {sorted(METHODS)}")
        return METHODS[self.base](**(self.base_params or {}))

    def _keys(self, side) -> list:
        cols = [side[name] for name in self._by()]
        if len(cols) == 1:
            return [_plain(v) for v in cols[0]]
        return [group_key(tuple(c[i] for c in cols)) for i in range(len(cols[0]))]

    _what = "group"

    # ------------------------------------------------------------------ fit
    def _sample_weight_refusal(self):
        return self._make_base()._sample_weight_refusal()

    def _fit(self, logits, labels, sample_weight=None, **side):
        k = logits.shape[1]

        def fit_one(rows):
            cal = self._make_base()
            if rows is None:
                cal._check_hyperparameters()
                x, y, w = logits, labels, sample_weight
            else:
                x, y = logits[rows], labels[rows]
                w = None if sample_weight is None else sample_weight[rows]
            if w is None:
                cal._fit(x, y)
            else:
                cal._fit(x, y, sample_weight=w)
            cal.n_classes_ = k
            return cal

        fits = fit_groups(fit_one, self._keys(side), min_samples=self.min_samples, sample_weight=sample_weight,
                          what=self._what, pooled_name=f"the pooled {self._what} fit", stacklevel=5)
        self.pooled_ = fits.pooled
        self.groups_ = fits.fits
        self.group_counts_ = fits.counts
        self.fallback_groups_ = list(fits.fallback)

    def _predict_proba(self, logits, **side):
        out = np.empty((logits.shape[0], self.n_classes_), dtype=np.float64)
        rows = route_groups(self._keys(side), self.group_counts_, what=self._what,
                            pooled_name=f"the pooled {self._what} fit", stacklevel=5)
        for key, idx in rows.items():
            out[idx] = self.groups_.get(key, self.pooled_)._predict_proba(logits[idx])
        return out

    # ------------------------------------------------------------- manifests
    @staticmethod
    def _enc(key):
        return list(key) if isinstance(key, tuple) else key

    @staticmethod
    def _dec(key):
        return group_key(key, where="groups")

    def _get_fitted(self):
        return {"pooled": self.pooled_._get_fitted(),
                "groups": [[self._enc(k), c._get_fitted()] for k, c in self.groups_.items()],
                "group_counts": [[self._enc(k), n] for k, n in self.group_counts_.items()],
                "fallback_groups": [self._enc(k) for k in self.fallback_groups_]}

    def _set_fitted(self, params):
        def load(p):
            cal = self._make_base()
            cal._set_fitted(p)
            return cal

        self.pooled_ = load(params["pooled"])
        self.groups_ = {self._dec(k): load(p) for k, p in params["groups"]}
        self.group_counts_ = {self._dec(k): int(n) for k, n in params.get("group_counts", [])}
        self.group_counts_.update({k: self.group_counts_.get(k, 0) for k in self.groups_})
        self.fallback_groups_ = [self._dec(k) for k in params.get("fallback_groups", [])]
        for k in self.fallback_groups_:
            self.group_counts_.setdefault(k, 0)
