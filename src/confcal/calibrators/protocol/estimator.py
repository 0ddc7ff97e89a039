"""The scikit-learn estimator protocol (``get_params`` / ``set_params`` / ``clone`` / tags)
without importing scikit-learn.

``import sklearn`` costs about 2.7 s here (``sklearn.base`` pulls in ``scipy.stats`` and
pandas), which every ``confcal apply`` / ``evaluate`` would pay for a class it never calls.
scikit-learn works with any object that follows its conventions: ``clone`` rebuilds an
estimator from ``get_params(deep=False)``, and ``get_tags`` reads ``__sklearn_tags__``, which
imports scikit-learn only when scikit-learn itself asks (it is then already loaded).
"""

from __future__ import annotations

import inspect

__all__ = ["Estimator"]


class Estimator:
    """Hyper-parameters are the ``__init__`` arguments, stored under their own names."""

    _estimator_type = "classifier"  # scikit-learn < 1.6 reads this; newer ones read the tags

    @classmethod
    def _param_names(cls) -> list[str]:
        """Hyper-parameter names, in ``__init__`` order."""
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    @classmethod
    def _get_param_names(cls) -> list[str]:  # scikit-learn's name for it (sorted there too)
        return sorted(cls._param_names())

    def get_params(self, deep: bool = True) -> dict:
        """``{name: value}`` of the hyper-parameters; with ``deep``, also ``name__sub`` of nested estimators."""
        out = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            out[name] = value
        return out

    def set_params(self, **params):
        """Set hyper-parameters (``name__sub`` reaches into nested estimators); returns ``self``.

        Raises ``ValueError`` naming an unknown hyper-parameter."""
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, sep, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"{name}: not a hyper-parameter of {type(self).__name__} "
                                 f"(it takes {self._param_names()})")
            if sep:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub in nested.items():
            valid[name].set_params(**sub)
        return self

    def __repr__(self) -> str:
        sig = inspect.signature(type(self).__init__)
        shown = []
        for name in self._param_names():
            value = getattr(self, name, None)
            default = sig.parameters[name].default
            try:
                same = default is not inspect.Parameter.empty and bool(value == default)
            except (TypeError, ValueError):  # arrays and the like: show them
                same = False
            if not same:
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def __sklearn_tags__(self):
        # called by scikit-learn (so it is imported already): a classifier of 2-D float input
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags(), input_tags=InputTags(two_d_array=True, allow_nan=False))
