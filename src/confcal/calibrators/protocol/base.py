"""The calibrator protocol (a scikit-learn estimator).

Every calibrator is a scikit-learn-compatible classifier (:mod:`.estimator`: the protocol
without importing scikit-learn) whose ``X`` is logits:

* ``__init__`` only stores hyper-parameters (``get_params`` / ``set_params`` /
  :func:`sklearn.base.clone` / pickle work); they are checked at ``fit``.
  ``input_kind`` (``"logits"`` or ``"probs"``) is one of them and applies at
  fit and predict time alike.
* ``fit(logits, labels, sample_weight=None, **side) -> self`` validates its
  inputs in one place (:mod:`confcal._validation`), calls ``_fit`` on a float
  ``(n, K)`` array and int64 labels (and ``sample_weight=`` when given and the
  method's objective is a weighted mean), and records a ``fit_record_`` (n
  samples, sha256 of the data, metrics before/after on the calibration set,
  library version, UTC time).
* a one-logit binary head, logits ``(n,)`` or ``(n, 1)`` (a sigmoid model),
  is read as the two-class logits ``[0, z]``: ``softmax([0, z] / T)[1] =
  sigmoid(z / T)``; ``predict_proba`` then returns ``(n, 2)``.
* ``predict_proba(logits, **side)`` returns ``(n, K)`` rows summing to 1, float32 for
  float32 input and float64 for every other input unless ``dtype=`` asks otherwise
  (:func:`_result_dtype`);
  ``predict`` the arg-max, ``score`` minus the mean NLL (nats), ``classes_`` is
  ``arange(K)`` for integer labels; string labels are mapped to the logit columns in sorted
  order, as scikit-learn's ``classes_`` (:func:`confcal.calibrators.protocol.class_labels.encode_class_labels`),
  ``classes_`` then holds them and ``predict`` returns them.
* fitted attributes end in ``_``; using an unfitted calibrator raises
  :class:`NotFittedError` (a scikit-learn ``NotFittedError``).
* ``to_dict()`` gives a JSON-ready manifest; :func:`calibrator_from_dict`
  rebuilds an identical calibrator (floats survive JSON exactly).

The registry (:mod:`confcal.calibrators.protocol.registry`) and manifests
(:mod:`confcal.calibrators.protocol.manifest`) have their own modules;
their names are re-exported here. ``METHODS`` maps a method name to a calibrator class, or to a :class:`Preset`
(a class with some hyper-parameters fixed, e.g. ``ts+pb``); either is called
with hyper-parameters to make an estimator.

``side`` inputs are the per-sample extras a method needs: ``domains``
``(n_samples,)`` ids and/or ``features`` ``(n_samples, n_features)``.
Subclasses declare them in ``side_inputs`` (required) and
``optional_side_inputs``.
"""

from __future__ import annotations

import abc
import inspect
import sys
import warnings
from typing import Any, ClassVar

import numpy as np

from confcal._digest import data_sha256
from confcal._numeric import cast_probabilities, softmax
from confcal._validation import as_numpy, check_domains, check_features, check_labels, check_logits, \
    one_logit_scores_note
from confcal.calibrators.protocol.constraints import check_hyperparameters
from confcal.calibrators.protocol.estimator import Estimator
from confcal.calibrators.protocol.stream import _one_logit_as_two
# the registry and the manifest code live in their own modules; their names stay importable from here
from confcal.calibrators.protocol.manifest import (  # noqa: F401
    INPUT_KINDS,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    _library_version,
    calibrator_from_dict,
    fit_record,
    summary_metrics,
    to_manifest,
)
from confcal.calibrators.protocol.registry import (  # noqa: F401
    METHODS,
    MissingExtraError,
    Preset,
    _registered,
    make_calibrator,
    register,
    register_preset,
)
from confcal.calibrators.protocol.registry import preset_for as _preset_for  # noqa: F401
from confcal._validation import plain

__all__ = ["Calibrator", "NotFittedError", "Preset", "register", "register_preset", "calibrator_from_dict",
           "make_calibrator", "METHODS", "MANIFEST_FORMAT", "MANIFEST_VERSION", "summary_metrics",
           "INPUT_KINDS", "not_fitted_error"]


class NotFittedError(ValueError, AttributeError):
    """A calibrator was used before ``fit`` (or loaded from an incomplete manifest).

    A ``ValueError`` and an ``AttributeError``, as scikit-learn's ``NotFittedError``. When
    scikit-learn is loaded, the error raised is also an instance of scikit-learn's class
    (see :func:`_not_fitted`), so ``except sklearn.exceptions.NotFittedError`` and the
    estimator checks catch it; ``check_is_fitted`` reads ``__sklearn_is_fitted__``.
    """


_SKLEARN_FLAVOURED: dict[type, type] = {}


def _not_fitted(message: str) -> NotFittedError:
    """The error to raise: a :class:`NotFittedError`, which also subclasses scikit-learn's
    ``NotFittedError`` when scikit-learn is loaded. Code that catches scikit-learn's class has
    imported it, so this covers every such handler without importing scikit-learn here
    (~2.7 s, paid by every ``confcal apply``)."""
    sk = sys.modules.get("sklearn.exceptions")
    if sk is None:
        return NotFittedError(message)
    cls = _SKLEARN_FLAVOURED.get(sk.NotFittedError)
    if cls is None:
        cls = type("NotFittedError", (NotFittedError, sk.NotFittedError), {"__module__": __name__})
        _SKLEARN_FLAVOURED[sk.NotFittedError] = cls
    return cls(message)


def not_fitted_error(message: str) -> NotFittedError:
    """The :class:`NotFittedError` a calibrator raises before ``fit`` (also scikit-learn's class when
    scikit-learn is loaded), for estimators that wrap calibrators (``AutoCalibrator``) to raise alike."""
    return _not_fitted(message)


def _sha256(*arrays) -> str:
    return data_sha256(*arrays)


def _first_non_finite(value, path: str = "") -> str | None:
    """``"name = value"`` of the first non-finite float inside nested fitted parameters, else None."""
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple, np.ndarray)):
        try:  # fast path for numeric arrays, e.g. a big weight matrix
            if np.isfinite(np.asarray(value, dtype=np.float64)).all():
                return None
        except (TypeError, ValueError, OverflowError):  # ragged, non-numeric or beyond float64: walk the items
            pass
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, (float, np.floating)) and not np.isfinite(value):
        return f"{path} = {float(value)}"
    else:
        return None
    for p, v in items:
        found = _first_non_finite(v, p)
        if found is not None:
            return found
    return None


class Calibrator(Estimator, abc.ABC):
    """Base class of all calibrators. See the module docstring for the protocol.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.base import clone
    >>> from confcal.calibrators import TemperatureScaling
    >>> logits = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    >>> labels = np.array([0, 1, 1, 1])
    >>> cal = TemperatureScaling(t_max=10.0).fit(logits, labels)
    >>> round(cal.temperature_, 4), cal.classes_.tolist()
    (1.8205, [0, 1])
    >>> clone(cal).get_params() == cal.get_params()
    True
    >>> round(-cal.score(logits, labels), 4)  # mean NLL in nats
    0.5623
    """

    method: ClassVar[str] = ""
    side_inputs: ClassVar[tuple[str, ...]] = ()
    optional_side_inputs: ClassVar[tuple[str, ...]] = ()
    #: ``{hyper-parameter: spec}`` and cross-field rules, checked by ``fit`` and the loader
    hyper_constraints: ClassVar[dict] = {}
    hyper_rules: ClassVar[tuple] = ()
    #: spec of the manifest's ``parameters`` block (see :mod:`.constraints`); None: not loadable
    fitted_constraints: ClassVar[Any] = None
    #: False for methods that need K logits per row (they refuse a one-logit binary head)
    one_logit_head: ClassVar[bool] = True
    #: True for maps ``sigmoid(z / T)``, ``T > 0``, of a one-logit head: they keep the sign of the logit,
    #: so ``fit`` warns when every logit has one sign (every probability on one side of 1/2)
    one_logit_keeps_sign: ClassVar[bool] = False

    # ----------------------------------------------------------- hyper-parameters
    def __sklearn_is_fitted__(self) -> bool:
        return self._is_fitted()

    @property
    def classes_(self) -> np.ndarray:
        """Class labels: ``arange(n_classes)`` for integer labels (column indices of the logits), or the
        sorted string labels seen at fit, column ``j`` being ``classes_[j]`` (as scikit-learn's)."""
        self._check_fitted()
        names = self._class_names()
        return np.arange(self.n_classes_) if names is None else names

    def _class_names(self) -> np.ndarray | None:
        """The string ``classes_`` of a fit on string labels (also after loading its manifest), else None."""
        names = self.__dict__.get("_class_labels")
        if names is None:
            record = getattr(self, "fit_record_", None)
            damaged = getattr(self, "fit_record_damage_", None) or {}
            if isinstance(record, dict) and record.get("classes") is not None and "classes" not in damaged:
                names = np.asarray(record["classes"], dtype=str)
        return names

    def _label_indices(self, labels):
        """Column indices of ``labels`` for a calibrator fitted on string labels; other labels as given."""
        from confcal.calibrators.protocol.class_labels import is_string_labels, labels_to_indices

        names = self._class_names()
        return labels_to_indices(labels, names) if names is not None and is_string_labels(labels) else labels

    # ------------------------------------------------------------------ protocol
    def fit(self, logits, labels, *, sample_weight=None, progress=False, **side) -> "Calibrator":
        """Fit on a calibration set.

        Parameters
        ----------
        logits : float array ``(n_samples, n_classes)`` (numpy or torch), or a
            one-logit binary head ``(n_samples,)`` / ``(n_samples, 1)``; probabilities
            when the calibrator was made with ``input_kind="probs"`` (their log is used);
            or a :class:`confcal.sources.Source` (``open_source("val.parquet:logit_*")``)
        labels : int array ``(n_samples,)`` in ``[0, n_classes)`` (or one-hot rows), or a Source
        sample_weight : optional float ``(n_samples,)``, finite, >= 0, not all 0: the
            fit minimises the weighted mean of its objective (an integer weight is the
            same as repeating the row, weight 0 the same as leaving it out). Methods
            whose objective is not a weighted mean raise ``ValueError``.
        progress : progress bars on stderr for fits that stream their data (``None``: when a terminal)
        **side : ``domains=`` / ``features=`` where the method uses them

        Raises
        ------
        ValueError, TypeError
            Invalid inputs (the message names the argument and what was wrong); ``TypeError`` for
            a path or spec string (open it with :func:`confcal.sources.open_source`, or use the CLI).
        """
        _refuse_paths("fit", logits=logits, labels=labels, sample_weight=sample_weight, **side)
        self._check_hyperparameters()
        labels, names = _string_labels(labels, logits)  # string labels -> column indices, before any path
        self.__dict__.pop("_class_labels", None)
        if self._fit_source(logits, labels, sample_weight=sample_weight, progress=progress,
                            **side) is not NotImplemented:
            self._check_fitted_finite(None)
            return self._keep_class_names(names)
        logits, labels = _materialise(logits, "logits"), _materialise(labels, "labels")
        sample_weight = None if sample_weight is None else _materialise(sample_weight, "sample_weight")
        side = {k: _materialise(v, k) for k, v in side.items()}
        x, y, w, side, record = self._fit_inputs(logits, labels, sample_weight, side)
        if w is None:
            self._fit(x, y, **side)
        else:
            self._fit(x, y, sample_weight=w, **side)
        self.n_classes_ = int(x.shape[1])
        self._check_fitted_finite(x)
        before, after = self._fit_metrics(x, self._predict_proba(x, **side), y)
        self.fit_record_ = fit_record(
            n_samples=x.shape[0],
            data_sha256=_sha256(x, y, *[side[k] for k in sorted(side)], *([] if w is None else [w])),
            input_kind=self._input_kind(), metrics_before=before, metrics_after=after,
            sample_weight=w is not None, extra=record)
        return self._keep_class_names(names)

    def _keep_class_names(self, names) -> "Calibrator":
        """After a fit on string labels, ``classes_`` holds them, here and (via the fit record) after loading."""
        if names is not None:
            self._class_labels = names
            if isinstance(getattr(self, "fit_record_", None), dict):
                self.fit_record_["classes"] = names.tolist()
        return self

    def _fit_inputs(self, logits, labels, sample_weight, side):
        """Validated ``(x, y, sample_weight, side, record)`` for :meth:`_fit`: float ``(n, K)`` logits,
        int64 labels, float64 weights or None, checked side inputs, and entries that replace or add
        to the fit record's defaults (subclasses that read other inputs, e.g. box scores, override it)."""
        x = self._validate_logits(logits, fitting=True)
        try:
            y = check_labels(labels, x.shape[0], x.shape[1])
        except ValueError as exc:
            if not (np.ndim(logits) == 1 or (np.ndim(logits) == 2 and np.shape(logits)[1] == 1)):
                raise
            raise ValueError(f"{exc} (logits of shape {np.shape(logits)} are read as a binary model with one "
                             "logit, a sigmoid head: labels must be 0 or 1)") from None
        w = self._check_sample_weight(sample_weight, x.shape[0])
        return x, y, w, self._check_side(side, x.shape[0]), {}

    def _fit_metrics(self, logits, probs, labels) -> tuple[dict, dict]:
        """The fit record's metrics ``(before, after)`` on the calibration set."""
        return summary_metrics(softmax(logits), labels), summary_metrics(probs, labels)

    def _fit_source(self, logits, labels, *, sample_weight, progress, **side):
        """Hook for fits that are sums over row batches: stream ``logits``/``labels`` (arrays,
        sources or specs), set the fitted attributes, ``n_classes_`` and ``fit_record_``
        (metrics from the fit's own passes) and return ``self``. The default runs the full-data
        job the registry declares for this method (:data:`confcal.calibrators.protocol.registry.FULL_DATA_JOBS`,
        e.g. ``vs``) on sources or specs, the job ``--engine dask`` runs; otherwise (arrays, sample
        weights, side inputs, no such job) it returns ``NotImplemented`` and :meth:`fit` loads the arrays."""
        import os

        from confcal.calibrators.protocol.registry import FULL_DATA_JOBS, fit_job_of

        if getattr(self, "fit_job", None) is not None or self.method not in FULL_DATA_JOBS \
                or sample_weight is not None or any(v is not None for v in side.values()):
            return NotImplemented
        from confcal.sources import Source

        if not isinstance(logits, (Source, str, os.PathLike)):
            return NotImplemented
        job = fit_job_of(self, {"logits", "labels"})
        if job is None:
            return NotImplemented
        from confcal.passes import LocalEngine, run_job
        from confcal.sources import open_source

        xs = open_source(logits, name="logits")
        if xs.ndim not in (1, 2):
            return NotImplemented  # a shape error, which the in-memory path names (before the row counts)
        engine = LocalEngine({"logits": xs, "labels": open_source(labels, name="labels")}, progress=progress,
                             reference="logits")
        run_job(job, engine)
        return self

    @staticmethod
    def _fit_record(*, n_samples, data_sha256, input_kind, metrics_before, metrics_after,
                    sample_weight: bool = False) -> dict:
        """The fit record of a streamed fit (:func:`confcal.calibrators.protocol.manifest.fit_record`)."""
        return fit_record(n_samples=n_samples, data_sha256=data_sha256, input_kind=input_kind,
                          metrics_before=metrics_before, metrics_after=metrics_after, sample_weight=sample_weight)

    def predict_proba(self, logits, progress=False, *, dtype=None, **side) -> np.ndarray:
        """Calibrated probabilities ``(n_samples, n_classes)``, rows summing to 1.

        ``logits`` as at fit time (``input_kind`` is a hyper-parameter); a one-logit
        binary head ``(n_samples,)`` gives ``(n_samples, 2)``. ``logits`` may also be a
        :class:`confcal.sources.Source` (a path string raises ``TypeError``); ``progress`` as for :meth:`fit`.
        ``dtype``: the output dtype, float32 or float64. The default (``None``) follows the input:
        float32 logits (a numpy array, a torch tensor or a :class:`~confcal.sources.Source` of
        float32) give float32, every other input float64. Temperature scaling computes in the
        output dtype, chunk by chunk in cache, so the output is written to memory once (float32
        in, float32 out: 2 x 4 bytes per element); the other methods compute in float64 and cast
        (two passes over the output). Pass ``dtype=np.float64`` to compare with a float64
        reference at a tighter tolerance than float32's (about 1e-7 relative).

        Raises :class:`NotFittedError` before ``fit`` and ``ValueError`` when the
        number of classes differs from the one seen at fit time, or for another ``dtype``.
        """
        _refuse_paths("predict_proba", logits=logits, **side)
        self._check_fitted()
        want = _result_dtype(dtype, logits)
        out = self._predict_source(logits, progress=progress, dtype=want, **side)
        if out is not NotImplemented:
            return self._cast_proba(out, want)
        logits = _materialise(logits, "logits")
        side = {k: _materialise(v, k) for k, v in side.items()}
        given = np.shape(logits)
        x = self._validate_logits(logits)
        if x.shape[1] != self.n_classes_:
            # 1-D / one-column input is a one-logit binary head's scores, validated as (n, 2) logits
            how = (f" (a 1-D or one-column input is read as the scores of a one-logit binary head; for one "
                   f"sample of {self.n_classes_} classes pass shape (1, {self.n_classes_}))"
                   if len(given) == 1 or (len(given) == 2 and given[1] == 1) else "")
            raise ValueError(f"logits: calibrator was fitted on {self.n_classes_} classes, "
                             f"got shape {tuple(given)}{how}")
        side = self._check_side(side, x.shape[0])
        return self._cast_proba(self._predict_proba(x, **side), want)

    def _cast_proba(self, p: np.ndarray, dtype) -> np.ndarray:
        """``p`` in the output ``dtype``: a distribution per row keeps its strict arg-max through the
        cast (:func:`confcal._numeric.cast_probabilities`); independent label probabilities (multilabel
        heads) are cast as they are."""
        if getattr(self, "multilabel", False):
            return p if p.dtype == dtype else p.astype(dtype)
        return cast_probabilities(p, dtype)

    def _predict_source(self, logits, *, progress, dtype=None, **side):
        """Hook for maps that predict batch by batch (:func:`confcal.calibrators.protocol.stream.predict_into`);
        the default returns ``NotImplemented`` and :meth:`predict_proba` loads the arrays."""
        return NotImplemented

    def _predict_batch(self, logits, *, input_kind, first_row, **side):
        """``(probs, every row in [0, 1])`` for one raw batch (validated here); used by the
        batch-by-batch paths of ``apply`` / ``evaluate``."""
        from confcal.calibrators.protocol.stream import default_predict_batch

        return default_predict_batch(self, logits, input_kind=input_kind, first_row=first_row, **side)

    def predict(self, logits, **side) -> np.ndarray:
        """Arg-max class of the calibrated float64 probabilities (lowest index wins ties), as ``classes_[j]``:
        the column index for integer labels, the string label for a fit on string labels."""
        j = np.argmax(self.predict_proba(logits, dtype=np.float64, **side), axis=1)
        names = self._class_names()
        return j if names is None else names[j]

    def score(self, logits, labels, sample_weight=None, **side) -> float:
        """Minus the mean negative log-likelihood (nats) of ``labels``: higher is better.

        This is what ``scoring="neg_log_loss"`` measures, so model selection by
        ``GridSearchCV(calibrator, grid)`` without a scoring argument optimises NLL.
        """
        p = self.predict_proba(logits, dtype=np.float64, **side)
        y = check_labels(self._label_indices(labels), p.shape[0], p.shape[1])
        w = self._check_sample_weight(sample_weight, p.shape[0], fitting=False)
        with np.errstate(divide="ignore"):
            logp = np.log(p[np.arange(p.shape[0]), y])
        return float(np.average(logp, weights=w))

    def _input_kind(self) -> str:
        kind = getattr(self, "input_kind", "logits")
        if kind not in INPUT_KINDS:
            raise ValueError(f"input_kind: expected one of {INPUT_KINDS}, got {kind!r}")
        return kind

    def _validate_logits(self, logits, name: str = "logits", *, fitting: bool = False) -> np.ndarray:
        """``check_logits`` with ``self.input_kind``; a one-logit binary head becomes ``[0, z]``, with
        a warning where its logits look like probabilities (and, at fit, for a sign-keeping map,
        where they all have one sign: :func:`confcal._validation.one_logit_scores_note`)."""
        kind = self._input_kind()
        arr = as_numpy(logits, name)
        if arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1 and arr.shape[0] > 0):
            if not self.one_logit_head:
                raise ValueError(f"{name}: got shape {arr.shape}, a binary model with one logit (sigmoid head), "
                                 f"which {self.method!r} cannot take (it needs one logit per class); pass "
                                 "two columns [0, z] or use a temperature-scaling method")
            x = _one_logit_as_two(arr.reshape(-1), kind, name)
            if kind == "logits":
                note = one_logit_scores_note(x[:, 1], name,
                                             sign_preserving=self.method if fitting and self.one_logit_keeps_sign
                                             else None)
                if note is not None:
                    warnings.warn(note, UserWarning, stacklevel=4 if fitting else 3)
            return x
        return check_logits(arr, name=name, input_kind=kind)

    def _sample_weight_refusal(self) -> str | None:
        """Why this calibrator cannot use ``sample_weight`` (None: it can)."""
        if "sample_weight" in inspect.signature(self._fit).parameters:
            return None
        return "its objective is not a weighted mean over samples"

    def _check_sample_weight(self, sample_weight, n: int, *, fitting: bool = True) -> np.ndarray | None:
        if sample_weight is None:
            return None
        if fitting:
            why = self._sample_weight_refusal()
            if why is not None:
                raise ValueError(f"sample_weight: method {self.method!r} does not support sample weights ({why})")
        w = as_numpy(sample_weight, "sample_weight")
        if w.dtype == bool or not (np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer)):
            raise TypeError(f"sample_weight: expected a float array of shape ({n},), got dtype {w.dtype}")
        if w.shape != (n,):
            raise ValueError(f"sample_weight: expected shape ({n},) (one weight per sample), got {w.shape}")
        w = w.astype(np.float64)
        bad = ~np.isfinite(w) | (w < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sample_weight: expected finite weights >= 0, got {plain(w[i])} at index {i}")
        if not w.sum() > 0:
            raise ValueError("sample_weight: every weight is 0; at least one sample must count")
        return w

    # --------------------------------------------------------------- manifests
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready manifest: format, method, hyper-parameters, fitted parameters,
        ``n_classes`` and the fit record. Round-trips through :func:`calibrator_from_dict`."""
        return to_manifest(self)

    def to_torch(self, dtype: str = "float64"):
        """The fitted map as a TorchScript-able ``nn.Module`` equal to ``predict_proba``
        (:func:`confcal.export.to_torch`; raises ``confcal.export.ExportError`` naming why not)."""
        from confcal.export import to_torch  # the torch/onnx layer, imported only when asked for

        return to_torch(self, dtype=dtype)

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

    def _load_fit_record(self, record, damage: dict) -> None:
        """Set the fitted attributes that live in the manifest's fit record (``record``: the ``fit``
        block or None; ``damage``: its damaged fields, not to be used) on a calibrator loaded from a
        manifest. Most methods keep none there."""

    @abc.abstractmethod
    def _set_fitted(self, params: dict[str, Any]) -> None:
        """Inverse of :meth:`_get_fitted`."""

    @classmethod
    def _upgrade_parameters(cls, params):
        """Manifest parameters written by an earlier release, in today's layout (default: as they are)."""
        return params

    # ------------------------------------------------------------------ helpers
    def _check_fitted_finite(self, x) -> None:
        """A fit never keeps non-finite parameters (they would make a manifest that cannot be
        written or that predicts NaN): raise ``ValueError`` naming the logits' scale instead."""
        bad = _first_non_finite(self._get_fitted())
        if bad is None:
            return
        scale = ""
        if x is not None:
            finite = np.abs(np.asarray(x, dtype=np.float64)[np.isfinite(x)])
            scale = f" (largest |logit| = {finite.max() if finite.size else float('nan'):.3g})"
        for name in list(vars(self)):  # leave the estimator unfitted, not half-fitted
            if name.endswith("_") and not name.startswith("_"):
                delattr(self, name)
        raise ValueError(f"logits: the fit of {self.method!r} ended with a non-finite parameter {bad}{scale}; "
                         "logits of this magnitude overflow this method in float64: rescale them, or use 'ts'")

    def _check_hyperparameters(self) -> None:
        """The class's ``hyper_constraints`` table applied to ``get_params()`` (called by ``fit``)."""
        method = getattr(self, "method", None)  # the registry's name ("ms", "ts+pb"), as the CLI and manifests say
        check_hyperparameters(type(self), self.get_params(deep=False),
                              where=method if isinstance(method, str) and method else type(self).__name__)

    def _is_fitted(self) -> bool:
        return hasattr(self, "n_classes_")

    def _check_fitted(self) -> None:
        if not self._is_fitted():
            raise _not_fitted(f"{type(self).__name__} is not fitted yet; call fit(logits, labels) first")

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


def _string_labels(labels, logits):
    """``(labels, None)`` for labels that are not strings (unchanged: integer labels stay column indices),
    ``(int64 column indices, sorted names)`` for string labels (:mod:`.class_labels`)."""
    from confcal.calibrators.protocol.class_labels import encode_class_labels, is_string_labels

    if not is_string_labels(labels):
        return labels, None
    shape = tuple(getattr(logits, "shape", None) or np.shape(logits))  # a Source has a shape: not read here
    width = 2 if len(shape) == 1 or (len(shape) == 2 and shape[1] == 1) else (shape[1] if len(shape) == 2 else 0)
    if width < 2:
        return labels, None  # the logits' own error comes first
    return encode_class_labels(labels, int(width), stacklevel=3)  # a warning names the line that called fit


def _result_dtype(dtype, logits=None) -> np.dtype:
    """The dtype ``predict_proba`` returns: ``dtype`` (float32 or float64) when given, else float32
    for float32 ``logits`` (numpy, torch, a source: anything whose ``dtype`` is float32, and a
    DataFrame whose columns all are) and float64 for every other input (float64, float16, integers,
    lists, a DataFrame with any other column).

    Callers that compare metrics with a float64 reference (the evaluation reports, the
    distributed engine) pass ``dtype=np.float64``."""
    if dtype is None:
        dt = getattr(logits, "dtype", None)
        if dt is None and getattr(logits, "dtypes", None) is not None:
            # a DataFrame (pandas, polars) has one dtype per column: float32 when every column is float32
            dts = [str(d).lower() for d in list(logits.dtypes)]
            dt = "float32" if dts and all(d == "float32" for d in dts) else None
        # torch.float32 is not a numpy dtype; its str() ends in "float32" as numpy's does
        return np.dtype(np.float32) if dt is not None and str(dt).endswith("float32") else np.dtype(np.float64)
    try:
        want = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy's "data type 'bogus' not understood" names no argument
        want = None
    if want is None or want not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {want if want is not None else plain(dtype)}")
    return want


def _refuse_paths(method: str, **inputs) -> None:
    """``TypeError`` (one line) when an input is a path or spec string: estimators take arrays and
    :class:`confcal.sources.Source` objects; reading files is the job of ``confcal.sources`` / the CLI."""
    import os

    for name, value in inputs.items():
        if isinstance(value, (str, bytes, os.PathLike)):
            raise TypeError(f"{name}: {method} takes an array or a confcal.sources.Source, got the path "
                            f"{os.fspath(value)!r}; open it with confcal.sources.open_source({os.fspath(value)!r}) "
                            "or use the command line (confcal fit/apply)")


def _materialise(value, name):
    """Arrays pass through; a :class:`confcal.sources.Source` is read whole; a path string is refused
    (:func:`_refuse_paths`)."""
    from confcal.sources import Source, open_source

    _refuse_paths("fit", **{name: value})
    if isinstance(value, Source):
        # a copy: read-only memory maps would make torch-based fits warn, and they need all rows anyway
        return np.array(open_source(value, name=name).to_numpy())
    return value
