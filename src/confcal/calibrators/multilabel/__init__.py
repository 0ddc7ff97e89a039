"""Sigmoid heads: one temperature or Platt map per label.

Each name is imported from its module on first access (a family module may need torch)."""

from confcal.calibrators._exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "MultilabelPlattScaling": "heads",
    "MultilabelTemperatureScaling": "heads",
})
