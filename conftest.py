"""Collection rules for the whole repository (``pytest`` runs ``tests/`` and
the doctests of ``src/confcal``; see ``[tool.pytest.ini_options]``).

A module whose optional dependency is not installed is left out of the
doctest collection instead of failing to import.
"""

from __future__ import annotations

import importlib.util

# module path (relative to this file) -> the optional package it imports
_OPTIONAL = {
    "src/confcal/dask.py": "dask",
    "src/confcal/dask": "dask",
}

collect_ignore = [path for path, package in _OPTIONAL.items() if importlib.util.find_spec(package) is None]
