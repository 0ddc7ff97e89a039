"""confcal: post-hoc confidence calibration of classifiers and object detectors.

Layers (imports point downwards): ``confcal.ops`` and ``confcal.metrics`` (pure
functions), ``confcal.calibrators`` (estimators), ``confcal.io`` and
``confcal.cli`` (files and the command line).
"""

from confcal._version import __version__


def load_calibrator(manifest, *, n_classes=None):
    """A fitted calibrator from a manifest: a dict or the path of a manifest JSON file.

    A manifest is what ``Calibrator.to_dict()`` returns and ``confcal fit``
    writes: top-level keys ``format, format_version, method,
    hyperparameters, parameters, n_classes, fit``.

    Parameters
    ----------
    manifest : dict, str or os.PathLike
        The manifest, or the path of a JSON file holding one.
    n_classes : int or None, default=None
        If given, the number of classes the caller will pass; a manifest for
        another number is refused.

    Returns
    -------
    Calibrator
        The fitted calibrator of the manifest's ``method`` (an entry of
        :data:`confcal.calibrators.METHODS`), ready for ``predict_proba``.

    Raises
    ------
    ValueError
        Unknown format or method, invalid fields, or ``n_classes`` differing
        from the manifest's.
    OSError
        The file cannot be read.

    See Also
    --------
    confcal.io.load_calibrator, confcal.io.save_manifest

    Examples
    --------
    Three samples with logits ``[2, 0]`` of which two are class 0: the
    fitted temperature makes ``sigmoid(2 / T) = 2/3``, so ``T = 2 / ln 2``;
    the calibrator read back from its manifest predicts the same:

    >>> import numpy as np
    >>> from confcal import load_calibrator
    >>> from confcal.calibrators import TemperatureScaling
    >>> logits = np.array([[2.0, 0.0]] * 3)
    >>> ts = TemperatureScaling().fit(logits, [0, 0, 1])
    >>> round(ts.temperature_, 6), round(2 / float(np.log(2)), 6)
    (2.88539, 2.88539)
    >>> restored = load_calibrator(ts.to_dict())
    >>> type(restored).__name__, restored.predict_proba(logits)[0].round(4).tolist()
    ('TemperatureScaling', [0.6667, 0.3333])
    >>> load_calibrator(ts.to_dict(), n_classes=3)
    Traceback (most recent call last):
    ...
    ValueError: ...
    """
    from confcal.io import load_calibrator as _load

    return _load(manifest, n_classes=n_classes)


# Re-exported lazily: `import confcal` must not pull in torch, scipy or the estimators
# (the CLI starts faster, and a subpackage imports without the whole library).
_LAZY = {"TemperatureScaling": "confcal.calibrators", "GroupedTemperatureScaling": "confcal.calibrators",
         "METHODS": "confcal.calibrators"}
# subpackages and modules reachable as attributes once imported (``confcal.metrics.ece``)
_SUBMODULES = ("active", "calibrators", "demo", "detection", "evaluation", "io", "metrics", "ops", "plots",
               "report", "sources")

__all__ = ["__version__", "load_calibrator", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"confcal.{name}")
    raise AttributeError(f"module 'confcal' has no attribute {name!r}")


def __dir__():
    # what tab completion and dir() show: the public names, lazy ones included
    return sorted({*globals(), *__all__, *_SUBMODULES})
