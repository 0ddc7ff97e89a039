"""confcal: post-hoc confidence calibration of classifiers and object detectors.

Layers (imports point downwards): ``confcal.ops`` and ``confcal.metrics`` (pure
functions), ``confcal.calibrators`` (estimators), ``confcal.io`` and
``confcal.cli`` (files and the command line).
"""

__version__ = "0.1.0"


def load_calibrator(manifest, *, n_classes=None):
    """A fitted calibrator from a manifest dict or JSON path (see :func:`confcal.io.load_calibrator`)."""
    from confcal.io import load_calibrator as _load

    return _load(manifest, n_classes=n_classes)


def __getattr__(name):
    # Lazy re-exports keep `import confcal` light and avoid import cycles.
    if name in ("TemperatureScaling", "GroupedTemperatureScaling", "METHODS"):
        from confcal import calibrators

        return getattr(calibrators, name)
    raise AttributeError(f"module 'confcal' has no attribute {name!r}")
