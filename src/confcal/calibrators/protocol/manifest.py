"""Manifests: a fitted calibrator as JSON-ready data, the fit record, and the way back.

A manifest (what ``Calibrator.to_dict()`` returns and ``confcal fit`` writes) has the keys
``format, format_version, method, hyperparameters, parameters, n_classes, fit``; every
field is checked against the method's constraint tables on load (:mod:`._constraints`).
:func:`fit_record` is the one place that builds the ``fit`` block.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from confcal.calibrators.protocol.constraints import check_hyperparameters, check_manifest_top, check_parameters
from confcal.calibrators.protocol.fit_record import damaged_fit_fields
from confcal.calibrators.protocol.registry import METHODS, Preset, make_calibrator

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "INPUT_KINDS", "fit_record", "summary_metrics",
           "to_manifest", "calibrator_from_dict"]

MANIFEST_FORMAT = "confcal.calibrator"
MANIFEST_VERSION = 1
INPUT_KINDS = ("logits", "probs")


def _library_version() -> str:
    from confcal._version import __version__

    return __version__


def summary_metrics(probs: np.ndarray, labels: np.ndarray, *, checked: bool = False, pred=None) -> dict[str, float]:
    """Accuracy, ECE (15 equal-width bins), NLL and Brier score of ``probs``
    (:func:`confcal.metrics.summary.record_metrics`: one validation for the four; ``checked`` and
    ``pred`` as there: a fit's own probabilities, their arg-max)."""
    from confcal.metrics.summary import record_metrics

    return record_metrics(probs, labels, checked=checked, pred=pred)


def fit_record(*, n_samples: int, data_sha256: str, input_kind: str, metrics_before: dict,
               metrics_after: dict, sample_weight: bool = False, extra: dict | None = None) -> dict:
    """The manifest's ``fit`` block: n samples, sha256 of the data, input kind, calibration-set
    metrics before/after, library version and UTC time (seconds); ``sample_weight: True`` when
    the fit was weighted; ``extra`` entries replace or add to these (e.g. box-score metrics)."""
    record = {
        "n_samples": int(n_samples),
        "data_sha256": data_sha256,
        "input_kind": input_kind,
        "metrics_before": metrics_before,
        "metrics_after": metrics_after,
        "library_version": _library_version(),
        "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    record.update(extra or {})
    if sample_weight:
        record["sample_weight"] = True
    return record


def _plain(value):
    """``value`` with numpy scalars and arrays as Python numbers and lists (JSON has no int64: a
    hyper-parameter given as ``np.int64(3)`` or ``np.array([...])`` must still save)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def to_manifest(cal) -> dict[str, Any]:
    """The JSON-ready manifest of a fitted calibrator (see :meth:`Calibrator.to_dict`)."""
    cal._check_fitted()
    # hyper-parameters changed by set_params after fit are checked here, so a manifest written is one
    # that loads (the loader applies the same table)
    try:
        cal._check_hyperparameters()
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"to_dict: {exc} (set after fit; the manifest would not load)") from None
    return {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "method": cal.method,
        "hyperparameters": _plain(cal.get_params(deep=False)),
        "parameters": cal._get_fitted(),
        "n_classes": cal.n_classes_,
        "fit": getattr(cal, "fit_record_", None),
    }


#: hyper-parameter names of older manifests -> today's name (one name per idea: a seed is
#: ``random_state`` everywhere, as in scikit-learn)
LEGACY_HYPERPARAMETERS = {"seed": "random_state"}


def _renamed_hyperparameters(hyper, names) -> dict:
    """``hyper`` with the legacy names of :data:`LEGACY_HYPERPARAMETERS` renamed where the method
    takes the new name and not the old one (a manifest that names both keeps both, and is refused)."""
    if not isinstance(hyper, dict):
        return hyper
    out = dict(hyper)
    for old, new in LEGACY_HYPERPARAMETERS.items():
        if old in out and old not in names and new in names and new not in out:
            out[new] = out.pop(old)
    return out


def calibrator_from_dict(manifest: dict[str, Any], *, n_classes: int | None = None, source: str | None = None):
    """Rebuild a fitted calibrator from :meth:`Calibrator.to_dict` output.

    Every field is checked against the method's constraint tables
    (:mod:`confcal.calibrators.protocol.constraints`) before anything is built. Only the module of
    the manifest's method is imported.

    Raises ``ValueError`` (one line naming the field path) for a manifest of another
    format or a newer version, an unknown method or key, a value of the wrong type,
    shape or range, or (when ``n_classes`` is given) a class-count mismatch;
    :class:`~confcal.calibrators.protocol.registry.MissingExtraError` (an ``ImportError``) when the
    method needs an extra that is not installed.

    The fit record (``fit``) is checked field by field too (:data:`confcal.calibrators.protocol.fit_record.FIT_RECORD`), but a
    damaged one never blocks: one ``UserWarning`` names every damaged field (path, expected, found) and
    ``source`` (the manifest's file, when given); ``fit_record_damage_`` holds ``{field: message}``, so
    a command that needs one of them (``drift``: ``data_summary``, ``input_kind``) refuses naming it.

    With ``source`` (the file the manifest was read from), every refusal names it too:
    ``manifest cal.json: parameters.nll: expected a finite number >= -1e-09, got -5``; the calibrator
    keeps it as ``manifest_source_`` (None without ``source``).
    """
    try:
        return _from_dict(manifest, n_classes=n_classes, source=source)
    except ValueError as exc:
        text = str(exc)
        if source and type(exc) is ValueError and text.startswith("manifest: "):
            raise ValueError(f"manifest {source}: {text[len('manifest: '):]}") from None
        raise


def _from_dict(manifest, *, n_classes, source):
    check_manifest_top(manifest, fmt=MANIFEST_FORMAT, version=MANIFEST_VERSION)
    method = manifest["method"]
    if method not in METHODS:
        raise ValueError(f"manifest: method: unknown {method!r}; known: {sorted(METHODS)}")
    k = manifest["n_classes"]
    if n_classes is not None and int(n_classes) != k and not (int(n_classes) == 1 and k == 2):  # (n, 1): one logit
        raise ValueError(f"manifest: calibrator was fitted on n_classes={k}, but the logits have "
                         f"{n_classes} classes")
    cls = METHODS[method]
    target = cls.cls if isinstance(cls, Preset) else cls
    hyper = _renamed_hyperparameters(manifest["hyperparameters"], cls._param_names())
    unknown = sorted(set(hyper) - set(cls._param_names()))
    if unknown:
        raise ValueError(f"manifest: hyperparameters.{unknown[0]}: unknown hyper-parameter of {method!r} "
                         f"(it takes {cls._param_names()})")
    if "input_kind" not in hyper:
        # manifests before input_kind became a hyper-parameter recorded it in the fit record only
        kind = (manifest.get("fit") or {}).get("input_kind")
        hyper = {**hyper, "input_kind": kind} if kind in INPUT_KINDS else hyper
    env = check_hyperparameters(target, hyper, where="manifest", env={"n_classes": k}, path="hyperparameters")
    parameters = target._upgrade_parameters(manifest["parameters"])
    check_parameters(target, parameters, env=env, hyper=hyper)
    cal = make_calibrator(method, hyper)
    try:
        cal._set_fitted(parameters)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:  # a relation the table does not state
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        head = text.split(":", 1)[0]
        if isinstance(exc, ValueError) and head.replace(".", "").replace("_", "").isalnum():
            raise ValueError(f"manifest: parameters.{text}") from None  # the message starts with the field
        raise ValueError(f"manifest: parameters of method {method!r} are invalid "
                         f"({type(exc).__name__}: {text})") from None
    cal.n_classes_ = int(k)
    cal.fit_record_ = manifest.get("fit")
    cal.fit_record_damage_ = {}
    cal.manifest_source_ = source  # the file it was read from (named by later refusals), or None
    if cal.fit_record_ is not None:
        where = f"manifest {source}" if source else "manifest"
        bad = damaged_fit_fields(cal.fit_record_, where=where, n_classes=cal.n_classes_)
        if isinstance(cal.fit_record_, dict) and "selection" in cal.fit_record_ and "selection" not in bad:
            from confcal.calibrators.protocol.selection_record import selection_damage

            why = selection_damage(cal.fit_record_["selection"], method, hyper, where=where)
            if why:
                bad["selection"] = why
        if bad:  # the record describes the fit; the map above is checked and usable
            import warnings

            cal.fit_record_damage_ = bad
            said = "; ".join(m[len(where) + 2:] if m.startswith(where + ": ") else m for m in bad.values())
            skipped = "; drift check skipped" if {"data_summary", "input_kind"} & set(bad) else ""
            warnings.warn(f"{where}: {said}: the fit record is damaged (kept for reference; the fitted map is "
                          f"used as is{skipped})", UserWarning, stacklevel=3)
    cal._load_fit_record(cal.fit_record_, cal.fit_record_damage_)
    return cal
