"""The calibrator protocol (scikit-learn conventions) and the method registry.

Every calibrator:

* ``fit(logits, labels, **side) -> self`` validates its inputs in one place
  (:mod:`confcal._validation`), calls ``_fit`` on a float ``(n, K)`` array and
  int64 labels, and records a ``fit_record_`` (n samples, sha256 of the data,
  metrics before/after on the calibration set, library version, UTC time).
* ``predict_proba(logits, **side)`` returns float64 ``(n, K)`` rows summing to 1.
* fitted attributes end in ``_``; using an unfitted calibrator raises
  :class:`NotFittedError`.
* ``to_dict()`` gives a JSON-ready manifest; :func:`calibrator_from_dict`
  rebuilds an identical calibrator (floats survive JSON exactly).

``side`` inputs are the per-sample extras a method needs: ``domains``
``(n_samples,)`` ids and/or ``features`` ``(n_samples, n_features)``.
Subclasses declare them in ``side_inputs`` (required) and
``optional_side_inputs``.
"""

from __future__ import annotations

import abc
import datetime as _dt
import inspect
from typing import Any, ClassVar

import numpy as np

from confcal._digest import data_sha256
from confcal._numeric import softmax
from confcal._validation import check_domains, check_features, check_labels, check_logits
from confcal.metrics import accuracy, brier_score, ece, nll

__all__ = ["Calibrator", "NotFittedError", "register", "calibrator_from_dict", "make_calibrator", "METHODS",
           "MANIFEST_FORMAT", "MANIFEST_VERSION", "summary_metrics"]

MANIFEST_FORMAT = "confcal.calibrator"
MANIFEST_VERSION = 1

#: method name -> calibrator class; filled by :func:`register`.
METHODS: dict[str, type["Calibrator"]] = {}


class NotFittedError(RuntimeError):
    """A calibrator was used before ``fit`` (or loaded from an incomplete manifest)."""


def register(cls):
    """Class decorator: make ``cls`` loadable from manifests and selectable by ``cls.method``."""
    if not cls.method:
        raise TypeError(f"{cls.__name__} needs a non-empty 'method' name to be registered")
    if cls.method in METHODS and METHODS[cls.method] is not cls:
        raise TypeError(f"method name {cls.method!r} already registered by {METHODS[cls.method].__name__}")
    METHODS[cls.method] = cls
    return cls


def _library_version() -> str:
    from confcal import __version__

    return __version__


def _sha256(*arrays) -> str:
    return data_sha256(*arrays)


def summary_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, ECE (15 equal-width bins), NLL and Brier score of ``probs``."""
    return {
        "accuracy": accuracy(probs, labels),
        "ece": ece(probs, labels, n_bins=15),
        "nll": nll(probs, labels),
        "brier": brier_score(probs, labels),
    }


class Calibrator(abc.ABC):
    """Base class of all calibrators. See the module docstring for the protocol."""

    method: ClassVar[str] = ""
    side_inputs: ClassVar[tuple[str, ...]] = ()
    optional_side_inputs: ClassVar[tuple[str, ...]] = ()

    # ----------------------------------------------------------- hyper-parameters
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def get_params(self) -> dict[str, Any]:
        """Hyper-parameters as given to ``__init__`` (JSON-ready)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------ protocol
    def fit(self, logits, labels, *, input_kind: str = "logits", progress=False, **side) -> "Calibrator":
        """Fit on a calibration set.

        Parameters
        ----------
        logits : float array ``(n_samples, n_classes)`` (numpy or torch), a
            :class:`confcal.sources.Source` or a spec such as ``"val.parquet:logit_*"``
        labels : int array ``(n_samples,)`` in ``[0, n_classes)`` (or one-hot rows), or a source/spec
        input_kind : ``"logits"`` or ``"probs"`` (probabilities; their log is used)
        progress : progress bars on stderr for fits that stream their data (``None``: when a terminal)
        **side : ``domains=`` / ``features=`` where the method uses them

        Raises
        ------
        ValueError, TypeError
            Invalid inputs (the message names the argument and what was wrong).
        """
        if self._fit_source(logits, labels, input_kind=input_kind, progress=progress, **side) is not NotImplemented:
            return self
        logits, labels = _materialise(logits, "logits"), _materialise(labels, "labels")
        side = {k: _materialise(v, k) for k, v in side.items()}
        x = check_logits(logits, input_kind=input_kind)
        y = check_labels(labels, x.shape[0], x.shape[1])
        side = self._check_side(side, x.shape[0])
        self._fit(x, y, **side)
        self.n_classes_ = int(x.shape[1])
        after = self._predict_proba(x, **side)
        self.fit_record_ = self._fit_record(
            n_samples=x.shape[0], data_sha256=_sha256(x, y, *[side[k] for k in sorted(side)]),
            input_kind=input_kind, metrics_before=summary_metrics(softmax(x), y),
            metrics_after=summary_metrics(after, y))
        return self

    def _fit_source(self, logits, labels, *, input_kind, progress, **side):
        """Hook for fits that are sums over row batches: stream ``logits``/``labels`` (arrays,
        sources or specs), set the fitted attributes, ``n_classes_`` and ``fit_record_``
        (metrics from the fit's own passes) and return ``self``; the default returns
        ``NotImplemented`` and :meth:`fit` loads the arrays."""
        return NotImplemented

    @staticmethod
    def _fit_record(*, n_samples, data_sha256, input_kind, metrics_before, metrics_after) -> dict:
        return {
            "n_samples": int(n_samples),
            "data_sha256": data_sha256,
            "input_kind": input_kind,
            "metrics_before": metrics_before,
            "metrics_after": metrics_after,
            "library_version": _library_version(),
            "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }

    def predict_proba(self, logits, *, input_kind: str = "logits", progress=False, **side) -> np.ndarray:
        """Calibrated probabilities, float64 ``(n_samples, n_classes)``, rows summing to 1.

        ``logits`` may be an array, a :class:`confcal.sources.Source` or a spec. Raises
        :class:`NotFittedError` before ``fit`` and ``ValueError`` when the number of classes
        differs from the one seen at fit time.
        """
        self._check_fitted()
        out = self._predict_source(logits, input_kind=input_kind, progress=progress, **side)
        if out is not NotImplemented:
            return out
        logits = _materialise(logits, "logits")
        side = {k: _materialise(v, k) for k, v in side.items()}
        x = check_logits(logits, input_kind=input_kind)
        if x.shape[1] != self.n_classes_:
            raise ValueError(f"logits: calibrator was fitted on {self.n_classes_} classes, "
                             f"got shape {x.shape}")
        side = self._check_side(side, x.shape[0])
        return self._predict_proba(x, **side)

    def _predict_source(self, logits, *, input_kind, progress, **side):
        """Hook for maps that predict batch by batch (:func:`confcal.calibrators._stream.predict_into`);
        the default returns ``NotImplemented`` and :meth:`predict_proba` loads the arrays."""
        return NotImplemented

    def _predict_batch(self, logits, *, input_kind, first_row, **side):
        """``(probs, every row in [0, 1])`` for one raw batch (validated here); used by the
        batch-by-batch paths of ``apply`` / ``evaluate``."""
        from confcal.calibrators._stream import default_predict_batch

        return default_predict_batch(self, logits, input_kind=input_kind, first_row=first_row, **side)

    def predict(self, logits, **kw) -> np.ndarray:
        """Arg-max class of the calibrated probabilities (lowest index wins ties)."""
        return np.argmax(self.predict_proba(logits, **kw), axis=1)

    # --------------------------------------------------------------- manifests
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready manifest: format, method, hyper-parameters, fitted parameters,
        ``n_classes`` and the fit record. Round-trips through :func:`calibrator_from_dict`."""
        self._check_fitted()
        return {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "method": self.method,
            "hyperparameters": self.get_params(),
            "parameters": self._get_fitted(),
            "n_classes": self.n_classes_,
            "fit": getattr(self, "fit_record_", None),
        }

    # ---------------------------------------------------------- for subclasses
    @abc.abstractmethod
    def _fit(self, logits: np.ndarray, labels: np.ndarray, **side) -> None:
        """Fit on validated float ``(n, K)`` logits and int64 labels; set attributes ending in ``_``."""

    @abc.abstractmethod
    def _predict_proba(self, logits: np.ndarray, **side) -> np.ndarray:
        """Calibrated float64 probabilities for validated logits."""

    @abc.abstractmethod
    def _get_fitted(self) -> dict[str, Any]:
        """Fitted parameters as JSON-ready values (lists, floats, strings)."""

    @abc.abstractmethod
    def _set_fitted(self, params: dict[str, Any]) -> None:
        """Inverse of :meth:`_get_fitted`."""

    # ------------------------------------------------------------------ helpers
    def _is_fitted(self) -> bool:
        return hasattr(self, "n_classes_")

    def _check_fitted(self) -> None:
        if not self._is_fitted():
            raise NotFittedError(f"{type(self).__name__} is not fitted yet; call fit(logits, labels) first")

    def _check_side(self, side: dict, n: int) -> dict:
        allowed = set(self.side_inputs) | set(self.optional_side_inputs)
        unknown = set(side) - allowed
        if unknown:
            raise TypeError(f"{type(self).__name__} does not take {sorted(unknown)}; "
                            f"it takes {sorted(allowed) or 'no side inputs'}")
        out = {}
        for key in sorted(allowed):
            value = side.get(key)
            if value is None:
                if key in self.side_inputs:
                    raise ValueError(f"{key}: {type(self).__name__} requires {key}= at fit and predict time")
                continue
            if key == "domains":
                out[key] = check_domains(value, n)
            elif key == "features":
                out[key] = check_features(value, n)
            else:
                out[key] = value
        return out


def _materialise(value, name):
    """Arrays pass through; a :class:`confcal.sources.Source` or a spec string is read whole."""
    import os

    from confcal.sources import Source, open_source

    if isinstance(value, (Source, str, os.PathLike)):
        return open_source(value, name=name).to_numpy()
    return value


def calibrator_from_dict(manifest: dict[str, Any], *, n_classes: int | None = None) -> Calibrator:
    """Rebuild a fitted calibrator from :meth:`Calibrator.to_dict` output.

    Raises ``ValueError`` for a manifest of another format or a newer version, an
    unknown method, or (when ``n_classes`` is given) a class-count mismatch.
    """
    if not isinstance(manifest, dict):
        raise TypeError(f"manifest: expected a dict, got {type(manifest).__name__}")
    fmt = manifest.get("format")
    if fmt != MANIFEST_FORMAT:
        raise ValueError(f"manifest: expected format {MANIFEST_FORMAT!r}, got {fmt!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > MANIFEST_VERSION or version < 1:
        raise ValueError(f"manifest: format_version {version!r} is not supported "
                         f"(this confcal reads 1..{MANIFEST_VERSION})")
    for key in ("method", "hyperparameters", "parameters", "n_classes"):
        if key not in manifest:
            raise ValueError(f"manifest: missing key {key!r}")
    method = manifest["method"]
    if method not in METHODS:
        raise ValueError(f"manifest: unknown method {method!r}; known: {sorted(METHODS)}")
    k = manifest["n_classes"]
    if n_classes is not None and int(n_classes) != k:
        raise ValueError(f"manifest: calibrator was fitted on n_classes={k}, but the logits have "
                         f"{n_classes} classes")
    bad = _first_non_finite(manifest["parameters"])
    if bad is not None:
        raise ValueError(f"manifest: parameters{bad} is not a finite number; the file is damaged")
    cal = make_calibrator(method, manifest["hyperparameters"])
    try:
        cal._set_fitted(manifest["parameters"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"manifest: parameters of method {method!r} are invalid "
                         f"({type(exc).__name__}: {exc})") from None
    cal.n_classes_ = int(k)
    cal.fit_record_ = manifest.get("fit")
    return cal


def make_calibrator(method: str, params: dict | None = None) -> Calibrator:
    """``METHODS[method](**params)`` with errors that name the method and its hyper-parameters."""
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; known: {sorted(METHODS)}")
    cls = METHODS[method]
    params = dict(params or {})
    unknown = sorted(set(params) - set(cls._param_names()))
    if unknown:
        raise ValueError(f"{method}: unknown hyper-parameter(s) {unknown}; it takes {cls._param_names()}")
    defaults = {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()}
    for name, value in params.items():
        default = defaults.get(name)
        # a number where the method expects one (bool is not a number here)
        if (isinstance(default, (int, float)) and not isinstance(default, bool) and value is not None
                and (isinstance(value, bool) or not isinstance(value, (int, float)))):
            raise ValueError(f"{method}: hyper-parameter {name} expects a number (default {default!r}), "
                             f"got {value!r}")
    return cls(**params)


def _first_non_finite(obj, where: str = ""):
    """Path of the first NaN/inf float (or NaN-like string) inside nested lists/dicts, else None."""
    if isinstance(obj, float):
        return None if np.isfinite(obj) else where
    if isinstance(obj, str) and obj.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return where
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        found = _first_non_finite(v, f"{where}[{k!r}]")
        if found is not None:
            return found
    return None
