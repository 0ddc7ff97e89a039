"""``torch``, imported on first use: modules whose torch code runs only on some paths import
this instead, so importing them (and the paths without torch) works without the extra."""

from __future__ import annotations

import importlib
import importlib.util

from confcal.catalog import TORCH_EXTRA_HINT, MissingExtraError

__all__ = ["torch", "torch_available"]


class _LazyTorch:
    """Stands for the ``torch`` module: the first attribute access imports it (or raises
    :class:`~confcal.catalog.MissingExtraError` naming the extra)."""

    __slots__ = ("_module",)

    def __init__(self):
        self._module = None

    def __getattr__(self, name):
        if self._module is None:
            try:
                self._module = importlib.import_module("torch")
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] != "torch":
                    raise
                raise MissingExtraError(f"this needs PyTorch, which is not installed: {TORCH_EXTRA_HINT}") from None
        return getattr(self._module, name)

    def __repr__(self) -> str:
        return f"<lazy torch ({'loaded' if self._module is not None else 'not imported yet'})>"


torch = _LazyTorch()


def torch_available() -> bool:
    """Whether torch can be imported here (imports nothing when it already is)."""
    import sys

    if "torch" in sys.modules:
        return True
    return importlib.util.find_spec("torch") is not None
