"""The method registry: method name -> calibrator class or :class:`Preset`.

``METHODS`` knows every name of the light catalogue (:mod:`confcal.catalog`) from the
start and imports a method's module the first time its name is looked up, so loading a
temperature-scaling manifest imports temperature scaling and nothing else (no torch,
no scikit-learn isotonic). A method whose module needs an extra that is not installed
raises :class:`MissingExtraError` (an ``ImportError``) with one line naming the extra.
"""

from __future__ import annotations

import importlib
from typing import Any

from confcal.catalog import CATALOG, TORCH_EXTRA_HINT, MissingExtraError

__all__ = ["METHODS", "MethodRegistry", "MissingExtraError", "Preset", "register", "register_preset",
           "make_calibrator", "preset_for", "FULL_DATA_JOBS", "fit_job_of"]


class MethodRegistry(dict):
    """``dict`` of the registered entries, plus the catalogue's names loaded on first lookup.

    ``name in METHODS``, ``sorted(METHODS)`` and ``len(METHODS)`` cover every catalogued name
    without importing anything; ``METHODS[name]`` (and ``get``) import the module that registers
    ``name``. ``items()`` / ``values()`` load every module and skip the methods whose extra is
    missing (``available()`` lists those that load).
    """

    def __missing__(self, name):
        info = CATALOG.get(name) if isinstance(name, str) else None
        if info is None:
            raise KeyError(name)
        try:
            importlib.import_module(info.module)
        except ModuleNotFoundError as exc:
            if exc.name != "torch" and not (exc.name or "").startswith("torch."):
                raise
            raise MissingExtraError(f"method {name!r} needs PyTorch, which is not installed: "
                                    f"{TORCH_EXTRA_HINT}") from None
        if not dict.__contains__(self, name):
            raise KeyError(f"{info.module} did not register method {name!r}")
        return dict.__getitem__(self, name)

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or (isinstance(name, str) and name in CATALOG)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> list[str]:
        extra = [k for k in dict.keys(self) if k not in CATALOG]  # registered at run time (e.g. a user preset)
        return [*CATALOG, *extra]

    def keys(self):
        return self._names()

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def available(self) -> list[str]:
        """Names whose module imports here (every catalogued name when all extras are installed)."""
        out = []
        for name in self._names():
            try:
                self[name]
            except MissingExtraError:
                continue
            out.append(name)
        return out

    def values(self):
        return [self[k] for k in self.available()]

    def items(self):
        return [(k, self[k]) for k in self.available()]

    def __reduce__(self):  # pickled as the one registry
        return (_the_registry, ())


def _the_registry():
    return METHODS


#: method name -> calibrator class or :class:`Preset`; filled by :func:`register` / :func:`register_preset`.
METHODS: MethodRegistry = MethodRegistry()


def _registered_entry(name: str):
    """The entry registered under ``name`` so far (no import), or None."""
    return dict.get(METHODS, name)


def register(cls=None, *, name: str | None = None):
    """Class decorator: make ``cls`` loadable from manifests and selectable by ``cls.method``
    (or by ``name``, for a class whose ``method`` depends on its hyper-parameters)."""
    if cls is None:
        return lambda c: register(c, name=name)
    name = name if name is not None else getattr(cls, "method", "")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a non-empty 'method' name to be registered")
    old = _registered_entry(name)
    if old is not None and old is not cls:
        raise TypeError(f"method name {name!r} already registered by {old!r}")
    dict.__setitem__(METHODS, name, cls)
    return cls


class Preset:
    """A registry entry: a calibrator class with some hyper-parameters fixed.

    ``Preset("ts+pb", ProbabilityBounding, base="ts")(**params)`` is
    ``ProbabilityBounding(base="ts", **params)``: the estimator is an ordinary
    instance of the class (so ``clone``, ``get_params`` and pickle need nothing
    special); its ``method`` is the preset's name. A fixed hyper-parameter may be
    passed again only with the same value (as manifests do).

    Examples
    --------
    >>> from confcal.calibrators import METHODS
    >>> est = METHODS["ts+pb"](max_iter=50)
    >>> type(est).__name__, est.method, est.base, est.max_iter
    ('ProbabilityBounding', 'ts+pb', 'ts', 50)
    """

    def __init__(self, name: str, cls: type, fixed: dict[str, Any]):
        self.name = name
        self.cls = cls
        self.fixed = dict(fixed)
        self.__doc__ = (f"Preset {name!r}: {cls.__name__} with "
                        + ", ".join(f"{k}={v!r}" for k, v in self.fixed.items()) + ".")

    @property
    def method(self) -> str:
        return self.name

    @property
    def __name__(self) -> str:  # noqa: A003  messages and docs name it like a class
        return self.cls.__name__

    @property
    def side_inputs(self):
        return self.cls.side_inputs

    @property
    def optional_side_inputs(self):
        return self.cls.optional_side_inputs

    def _param_names(self) -> list[str]:
        return self.cls._param_names()

    def __call__(self, **params):
        for key, value in self.fixed.items():
            if key in params and params[key] != value:
                other = preset_for(self.cls, {**self.fixed, key: params[key]})
                hint = f"; use the method {other!r} instead" if other else ""
                raise ValueError(f"{key}: method {self.name!r} has {key}={value!r}, got {params[key]!r}{hint}")
        return self.cls(**{**params, **self.fixed})

    def __repr__(self) -> str:
        return f"Preset({self.name!r}, {self.cls.__name__}, {self.fixed!r})"

    def __reduce__(self):  # pickled by name: the registry holds the one instance
        return (_registered, (self.name,))


def _registered(name: str):
    return METHODS[name]


def register_preset(name: str, cls: type, **fixed) -> Preset:
    """Register ``name`` as ``cls`` with the hyper-parameters ``fixed``; returns the :class:`Preset`.

    Raises ``TypeError`` when ``name`` is taken or ``cls`` has no such hyper-parameter.

    Examples
    --------
    >>> from confcal.calibrators import METHODS, TemperatureScaling
    >>> from confcal.calibrators.protocol.base import register_preset
    >>> entry = register_preset("ts-wide", TemperatureScaling, t_max=1e4)
    >>> METHODS["ts-wide"]().t_max
    10000.0
    >>> del METHODS["ts-wide"]
    """
    old = _registered_entry(name)
    if old is not None:
        raise TypeError(f"method name {name!r} already registered by {old!r}")
    unknown = sorted(set(fixed) - set(cls._param_names()))
    if unknown:
        raise TypeError(f"preset {name!r}: {cls.__name__} has no hyper-parameter(s) {unknown}")
    entry = Preset(name, cls, fixed)
    dict.__setitem__(METHODS, name, entry)
    return entry


def preset_for(cls: type, params: dict[str, Any]) -> str | None:
    """Name of the most specific registered entry of ``cls`` whose fixed hyper-parameters ``params``
    match (only among the entries registered so far: ``cls``'s module registers all of its own)."""
    best, best_n = None, -1
    for name, entry in dict.items(METHODS):
        if entry is cls and best_n < 0:
            best, best_n = name, 0
        elif isinstance(entry, Preset) and entry.cls is cls and len(entry.fixed) > best_n \
                and all(params.get(k) == v for k, v in entry.fixed.items()):
            best, best_n = name, len(entry.fixed)
    return best


def make_calibrator(method: str, params: dict | None = None):
    """``METHODS[method](**params)`` with errors that name the method and its hyper-parameters
    (checked against the method's ``hyper_constraints``)."""
    from confcal.calibrators.protocol.constraints import check_hyperparameters

    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; known: {sorted(METHODS)}")
    cls = METHODS[method]
    params = dict(params or {})
    unknown = sorted(set(params) - set(cls._param_names()))
    if unknown:
        raise ValueError(f"params: {method}: unknown hyper-parameter(s) {unknown}; it takes {cls._param_names()}")
    target, checked = (cls.cls, {**params, **cls.fixed}) if isinstance(cls, Preset) else (cls, params)
    # early and named, before any data is read; a preset's fixed values are part of what is checked
    # (ms+pb's base_params are ms's: the rule reads base)
    check_hyperparameters(target, checked, where=method)
    return cls(**params)


#: Methods whose fit is a sum over rows, declared by a job of :mod:`confcal.passes` in a module of
#: their own (the estimator's class has no ``fit_job``): ``name -> ("module:function", conditions)``;
#: ``function(cal, inputs)`` returns the job or None, and ``conditions`` are the hyper-parameter
#: values under which the method fits on every row (``reg="fixed"``: cross-validated ODIR needs its
#: folds in one place). Every other method without its own ``fit_job`` fits on a seeded sample.
FULL_DATA_JOBS: dict[str, tuple[str, dict]] = {
    "vs": ("confcal.calibrators._fit.jobs.linear_job:fit_job", {}),
    "ms": ("confcal.calibrators._fit.jobs.linear_job:fit_job", {"reg": "fixed"}),
    "dirichlet": ("confcal.calibrators._fit.jobs.linear_job:fit_job", {"reg": "fixed"}),
    "histogram-binning": ("confcal.calibrators._fit.jobs.binning_job:fit_job", {}),
    "histogram-binning-top": ("confcal.calibrators._fit.jobs.binning_job:fit_job", {}),
}


def fit_job_of(cal, inputs):
    """The full-data job of the estimator ``cal`` over batches of ``inputs`` (column names: ``"logits"``,
    ``"labels"``, ``"domains"``, ...), or None when this method, these hyper-parameters or these inputs
    fit on a sample: the class's own ``fit_job``, else the one declared in :data:`FULL_DATA_JOBS`."""
    own = getattr(cal, "fit_job", None)
    if own is not None:
        return own(inputs)
    entry = FULL_DATA_JOBS.get(getattr(cal, "method", None))
    if entry is None or any(getattr(cal, k, None) != v for k, v in entry[1].items()):
        return None
    module, _, function = entry[0].partition(":")
    return getattr(importlib.import_module(module), function)(cal, inputs)
