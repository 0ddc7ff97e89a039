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
import hashlib
import inspect
from typing import Any, ClassVar

import numpy as np

from confcal._numeric import softmax
from confcal._validation import check_domains, check_features, check_labels, check_logits
from confcal.calibrators._constraints import check_hyperparameters, check_manifest_top, check_parameters
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
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())
    return h.hexdigest()


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
    #: ``{hyper-parameter: spec}`` and cross-field rules, checked by ``fit`` and the loader
    hyper_constraints: ClassVar[dict] = {}
    hyper_rules: ClassVar[tuple] = ()
    #: spec of the manifest's ``parameters`` block (see :mod:`._constraints`); None: not loadable
    fitted_constraints: ClassVar[Any] = None

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
    def fit(self, logits, labels, *, input_kind: str = "logits", **side) -> "Calibrator":
        """Fit on a calibration set.

        Parameters
        ----------
        logits : float array ``(n_samples, n_classes)`` (numpy or torch)
        labels : int array ``(n_samples,)`` in ``[0, n_classes)`` (or one-hot rows)
        input_kind : ``"logits"`` or ``"probs"`` (probabilities; their log is used)
        **side : ``domains=`` / ``features=`` where the method uses them

        Raises
        ------
        ValueError, TypeError
            Invalid inputs (the message names the argument and what was wrong).
        """
        self._check_hyperparameters()
        x = check_logits(logits, input_kind=input_kind)
        y = check_labels(labels, x.shape[0], x.shape[1])
        side = self._check_side(side, x.shape[0])
        self._fit(x, y, **side)
        self.n_classes_ = int(x.shape[1])
        after = self._predict_proba(x, **side)
        self.fit_record_ = {
            "n_samples": int(x.shape[0]),
            "data_sha256": _sha256(x, y, *[side[k] for k in sorted(side)]),
            "input_kind": input_kind,
            "metrics_before": summary_metrics(softmax(x), y),
            "metrics_after": summary_metrics(after, y),
            "library_version": _library_version(),
            "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        return self

    def predict_proba(self, logits, *, input_kind: str = "logits", **side) -> np.ndarray:
        """Calibrated probabilities, float64 ``(n_samples, n_classes)``, rows summing to 1.

        Raises :class:`NotFittedError` before ``fit`` and ``ValueError`` when the
        number of classes differs from the one seen at fit time.
        """
        self._check_fitted()
        x = check_logits(logits, input_kind=input_kind)
        if x.shape[1] != self.n_classes_:
            raise ValueError(f"logits: calibrator was fitted on {self.n_classes_} classes, "
                             f"got shape {x.shape}")
        side = self._check_side(side, x.shape[0])
        return self._predict_proba(x, **side)

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
    def _check_hyperparameters(self) -> None:
        """The class's ``hyper_constraints`` table applied to ``get_params()`` (called by ``fit``)."""
        check_hyperparameters(type(self), self.get_params(), where=type(self).__name__)

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


def calibrator_from_dict(manifest: dict[str, Any], *, n_classes: int | None = None) -> Calibrator:
    """Rebuild a fitted calibrator from :meth:`Calibrator.to_dict` output.

    Every field is checked against the method's constraint tables
    (:mod:`confcal.calibrators._constraints`) before anything is built.

    Raises ``ValueError`` (one line naming the field path) for a manifest of another
    format or a newer version, an unknown method or key, a value of the wrong type,
    shape or range, or (when ``n_classes`` is given) a class-count mismatch.
    """
    check_manifest_top(manifest, fmt=MANIFEST_FORMAT, version=MANIFEST_VERSION)
    method = manifest["method"]
    if method not in METHODS:
        raise ValueError(f"manifest: method: unknown {method!r}; known: {sorted(METHODS)}")
    k = manifest["n_classes"]
    if n_classes is not None and int(n_classes) != k:
        raise ValueError(f"manifest: calibrator was fitted on n_classes={k}, but the logits have "
                         f"{n_classes} classes")
    cls = METHODS[method]
    hyper = manifest["hyperparameters"]
    unknown = sorted(set(hyper) - set(cls._param_names()))
    if unknown:
        raise ValueError(f"manifest: hyperparameters.{unknown[0]}: unknown hyper-parameter of {method!r} "
                         f"(it takes {cls._param_names()})")
    env = check_hyperparameters(cls, hyper, where="manifest", env={"n_classes": k}, path="hyperparameters")
    check_parameters(cls, manifest["parameters"], env=env)
    cal = make_calibrator(method, hyper)
    try:
        cal._set_fitted(manifest["parameters"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # a gap in the method's table
        raise ValueError(f"manifest: parameters of method {method!r} are invalid "
                         f"({type(exc).__name__}: {exc})") from None
    cal.n_classes_ = int(k)
    cal.fit_record_ = manifest.get("fit")
    return cal


def make_calibrator(method: str, params: dict | None = None) -> Calibrator:
    """``METHODS[method](**params)`` with errors that name the method and its hyper-parameters
    (checked against the method's ``hyper_constraints``)."""
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; known: {sorted(METHODS)}")
    cls = METHODS[method]
    params = dict(params or {})
    unknown = sorted(set(params) - set(cls._param_names()))
    if unknown:
        raise ValueError(f"{method}: unknown hyper-parameter(s) {unknown}; it takes {cls._param_names()}")
    check_hyperparameters(cls, params, where=method)  # early and named, before any data is read
    return cls(**params)
