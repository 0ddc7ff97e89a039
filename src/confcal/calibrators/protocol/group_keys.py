"""The one rule that turns a group id into the key of its fitted map.

A grouped calibrator (``grouped-ts``, ``grouped``, the box maps with ``--domains`` / ``per_class``)
keeps one map per group; the same id must find the same map wherever it is looked up: at
``predict_proba`` / ``apply --domains``, in a manifest read back from JSON, and in the
``confcal.index_table`` of an exported ONNX or TorchScript head (:func:`confcal.export.group_index`).
Ids arrive as Python strings or ints, numpy scalars (``np.str_``, ``np.int64``), JSON lists, tuples
or rows of a 2-D id array, so every one of those paths calls :func:`group_key`.

The rule: a numpy scalar becomes the plain Python value (``np.int64(3)`` -> ``3``, ``np.str_("a")``
-> ``"a"``); a sequence (tuple, list, 1-D array) becomes a tuple of such values, one per grouping
column; a sequence of one value is that value (a one-column key is the id itself, so ``"kitti"``,
``("kitti",)`` and ``["kitti"]`` are one key). :func:`key_parts` is the inverse view: the key as a
tuple of its column values.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np

__all__ = ["group_key", "key_parts"]


def _part(v, where: str):
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, (list, tuple, np.ndarray, dict, set)):
        raise TypeError(f"{where}: expected a scalar id (str or int) per grouping column, got a nested "
                        f"{type(v).__name__}")
    if isinstance(v, np.generic) or (hasattr(v, "item") and hasattr(v, "dtype")):  # numpy / torch scalars
        v = v.item()
    try:
        hash(v)
    except TypeError:
        raise TypeError(f"{where}: expected a hashable id (str or int), got {type(v).__name__}") from None
    return v


def group_key(value, *, where: str = "group id") -> Hashable:
    """The lookup key of a group id (see the module docstring for the rule).

    Parameters
    ----------
    value : str, int, numpy scalar, or a tuple / list / 1-D array of those (one per grouping
        column, in the order the calibrator states: ``per_class`` box maps key ``(category id,
        domain)``; ``grouped`` with ``by=[...]`` keys in the order of ``by``)
    where : name used in the error message

    Returns
    -------
    The plain Python id for a one-column key, else a tuple of plain ids.

    Raises
    ------
    TypeError
        For an empty sequence, a nested one, or an unhashable id.
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (tuple, list, np.ndarray)):
        seq = list(value)
        if not seq:
            raise TypeError(f"{where}: expected an id or a non-empty tuple of ids, got an empty {type(value).__name__}")
        parts = tuple(_part(v, where) for v in seq)
        return parts[0] if len(parts) == 1 else parts
    return _part(value, where)


def key_parts(key) -> tuple:
    """The key of :func:`group_key` as a tuple of its column values (``"a"`` -> ``("a",)``)."""
    key = group_key(key)
    return key if isinstance(key, tuple) else (key,)
