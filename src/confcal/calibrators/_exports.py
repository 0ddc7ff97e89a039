"""Lazy re-exports for the family packages and the old flat module paths.

A family package (``confcal.calibrators.temperature``) names its public classes without importing
their modules, so ``load_calibrator`` of a TS manifest never imports torch. The calibrators of
releases before the family layout lived in flat modules (``confcal.calibrators.scaling``); those
paths are served by :class:`MovedModules` as the module at its new place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

#: old flat module -> its module in the family layout (public modules only; private ones moved freely)
MOVED = {
    "confcal.calibrators.base": "confcal.calibrators.protocol.base",
    "confcal.calibrators.registry": "confcal.calibrators.protocol.registry",
    "confcal.calibrators.manifest": "confcal.calibrators.protocol.manifest",
    "confcal.calibrators.ensemble": "confcal.calibrators.temperature.ensemble",
    "confcal.calibrators.parametric": "confcal.calibrators.temperature.parametric",
    "confcal.calibrators.scaling": "confcal.calibrators.linear.scaling",
    "confcal.calibrators.beta": "confcal.calibrators.logistic.beta",
    "confcal.calibrators.platt": "confcal.calibrators.logistic.platt",
    "confcal.calibrators.feature_clipping": "confcal.calibrators.bounding.feature_clipping",
    "confcal.calibrators.source_gated": "confcal.calibrators.domain.source_gated",
    "confcal.calibrators.detection_geometry": "confcal.calibrators.detection.geometry",
}

#: names a flat module defined that now live in another family's module (read through the old path only)
ELSEWHERE = {
    "confcal.calibrators.beta": {"DetectionBetaCalibration": "confcal.calibrators.detection.beta"},
}


def lazy_exports(package: str, names: dict[str, str], compat: dict[str, str] | None = None):
    """``(__getattr__, __dir__, __all__)`` for ``package`` whose ``names`` map to submodule names; ``compat``:
    names the flat module of earlier releases exported, served the same way but left out of ``__all__`` (the
    API pages document them at their own module)."""
    names = {**names, **(compat or {})}
    public = sorted(set(names) - set(compat or {}))
    def __getattr__(name):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted([*vars(sys.modules[package]), *names])

    return __getattr__, __dir__, public


class _OldPath(types.ModuleType):
    """An old flat module path: every attribute is read from the module at its new place (and, for the few
    names that went to another family, from there), so ``from confcal.calibrators.beta import X`` works for
    every ``X`` the flat module exported."""

    def __init__(self, name: str, target, elsewhere: dict[str, str]):
        super().__init__(name, target.__doc__)
        self.__dict__["_target"] = target
        self.__dict__["_elsewhere"] = elsewhere

    def __getattr__(self, name):
        where = self.__dict__["_elsewhere"].get(name)
        if where is not None:
            return getattr(importlib.import_module(where), name)
        return getattr(self.__dict__["_target"], name)

    def __dir__(self):
        return sorted({*dir(self.__dict__["_target"]), *self.__dict__["_elsewhere"]})


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves each old flat path in :data:`MOVED` as a view of the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return _OldPath(spec.name, importlib.import_module(MOVED[spec.name]), ELSEWHERE.get(spec.name, {}))

    def exec_module(self, module):
        pass  # the module at its new path is already executed


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
