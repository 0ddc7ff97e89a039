"""Temperature scaling: TS and grouped TS (Guo et al. 2017), BCTS (Alexandari et al. 2020), ETS (Zhang et al. 2020), PTS (Tomani et al. 2022).

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "BiasCorrectedTemperatureScaling": "bcts",
    "EnsembleTemperatureScaling": "ensemble",
    "GroupedTemperatureScaling": "ts",
    "ParameterizedTemperatureScaling": "parametric",
    "TemperatureScaling": "ts",
})
