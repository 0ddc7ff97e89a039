"""The merge protocol shared by the mergeable accumulators."""

from __future__ import annotations


class _Mergeable:
    def merge(self, other):
        if type(other) is not type(self):
            raise TypeError(f"merge: expected a {type(self).__name__}, got {type(other).__name__}")
        self._merge(other)
        return self

    def _check_seen(self, n):
        if n == 0:
            raise ValueError(f"{type(self).__name__}: no samples seen; call update() first")
