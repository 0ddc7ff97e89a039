"""Fitted temperatures inside the manifest's own ``[t_min, t_max]``, for every method that has them.

``ts`` and ``det-ts`` check their ``temperature`` on load (:func:`._constraints.temperature_within_bounds`);
``set-ts`` (``temperature``), ``source-gated-ts`` (``source_temperature``) and ``ts-multilabel``
(``label_temperatures``, one per label) hold temperatures from the same bounded search, so a manifest with
one outside its bounds was edited, not fitted: refused on load, naming the field.
"""

from __future__ import annotations

import math
from typing import Callable
from confcal._validation import plain

__all__ = ["temperatures_within_bounds"]


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def temperatures_within_bounds(key: str) -> Callable[[dict, dict], "str | None"]:
    """A ``hyper_parameter_rules`` entry: ``parameters[key]`` (a number or a list of numbers) inside
    ``[t_min, t_max]`` of the same manifest (relative slack 1e-9 for the JSON round trip)."""
    def rule(hyper: dict, params: dict) -> "str | None":
        lo, hi, value = hyper.get("t_min"), hyper.get("t_max"), params.get(key)
        if not (_real(lo) and _real(hi)):
            return None  # the hyper-parameter table names a bad bound itself
        values = value if isinstance(value, list) else [value]
        for i, t in enumerate(values):
            if _real(t) and not lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9):
                at = f"{key}[{i}]" if isinstance(value, list) else key
                return f"{at}: expected a number in [t_min, t_max] = [{lo:g}, {hi:g}], got {plain(t)}"
        return None

    return rule
