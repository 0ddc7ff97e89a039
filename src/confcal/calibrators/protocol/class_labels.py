"""Class labels that are not column indices: strings mapped through ``classes_``, as scikit-learn does.

A scikit-learn classifier orders its probability (and decision) columns by ``classes_``, the
sorted unique training labels (``np.unique``). A calibrator fitted on that classifier's logits with
the same string labels maps label ``classes_[j]`` to column ``j``: :func:`encode_class_labels`
sorts the distinct labels and needs exactly one per logit column, since a calibration set that
misses a class cannot say which column the missing class is. Integer labels are column indices and
pass through unchanged (``classes_`` is then ``arange(n_classes)``), as before.

The names are kept in the manifest's fit record (``fit.classes``), so a loaded calibrator has the
same ``classes_`` and ``predict`` returns the same labels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_string_labels", "encode_class_labels", "labels_to_indices"]


def is_string_labels(labels) -> bool:
    """True for a 1-D array-like of ``str`` (numpy ``U``/``S`` dtypes, or object arrays holding only str)."""
    if hasattr(labels, "read") and hasattr(labels, "n_rows"):
        return False  # a confcal Source: streamed as integer labels, never read whole here
    if hasattr(labels, "to_numpy"):  # a pandas Series / Index
        labels = labels.to_numpy()
    if isinstance(labels, np.ndarray):
        arr = labels
    elif isinstance(labels, (list, tuple)):
        arr = np.asarray(labels, dtype=object) if labels and isinstance(labels[0], str) else None
        if arr is None:
            return False
    else:
        return False
    if arr.ndim != 1 or arr.size == 0:
        return False
    if arr.dtype.kind in "US":
        return True
    return arr.dtype == object and all(isinstance(v, str) for v in arr.tolist())


def _as_str_array(labels) -> np.ndarray:
    if hasattr(labels, "to_numpy"):
        labels = labels.to_numpy()
    arr = np.asarray(labels)
    if arr.dtype.kind == "S":
        arr = arr.astype(str)
    return arr.astype(str) if arr.dtype == object else arr


def encode_class_labels(labels, n_classes: int, *, name: str = "labels",
                        stacklevel: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, classes)``: int64 column indices ``(n_samples,)`` of string ``labels`` and the
    sorted distinct labels ``classes`` ``(n_classes,)``, as scikit-learn's ``classes_``.

    Warns
    -----
    UserWarning
        When every label is an integer written as text and the text order differs from the numeric
        one (``'10'`` before ``'2'``): labels cast from column indices would land on other columns.
        ``stacklevel`` is that of :func:`warnings.warn` seen from the caller (2: the caller's caller).

    Raises
    ------
    ValueError
        When the number of distinct labels differs from ``n_classes`` (the logits' width): the
        message names both and the way out (integer column indices in the classifier's order).
    """
    arr = _as_str_array(labels)
    classes, idx = np.unique(arr, return_inverse=True)
    if classes.size != n_classes:
        shown = ", ".join(repr(str(c)) for c in classes[:6]) + (", ..." if classes.size > 6 else "")
        raise ValueError(f"{name}: string class labels are mapped to the logit columns in sorted order, as "
                         f"scikit-learn's classes_; expected {n_classes} distinct labels (one per column), "
                         f"got {classes.size} ({shown}); when the calibration set lacks a class, pass column "
                         "indices instead, e.g. np.searchsorted(clf.classes_, labels)")
    _warn_if_numbers_in_text_order(classes, name, stacklevel + 2)
    return idx.reshape(-1).astype(np.int64), classes


def _warn_if_numbers_in_text_order(classes: np.ndarray, name: str, stacklevel: int) -> None:
    """One ``UserWarning`` when every label is an integer written as text and the text order of
    ``classes`` (the columns they map to) is not the numeric order: ``'10'`` sorts before ``'2'``, so
    labels cast from integer column indices (``y.astype(str)``) would land on the wrong columns. Not an
    error: a scikit-learn classifier fitted on those strings orders its columns the same way."""
    try:
        numbers = np.array([int(c) for c in classes.tolist()], dtype=object)
    except ValueError:
        return  # some label is not an integer
    order = sorted(range(len(numbers)), key=lambda j: numbers[j])
    if order == list(range(len(numbers))):
        return
    j = next(i for i, o in enumerate(order) if o != i)
    import warnings

    warnings.warn(f"{name}: every string label is an integer, and string labels go to the logit columns in text "
                  f"order (scikit-learn's classes_): {str(classes[j])!r} is column {j}, before "
                  f"{str(classes[order[j]])!r}; if column j of the logits is class j, pass integer labels "
                  "(labels.astype(int)); if the logits come from a classifier fitted on these strings, its "
                  "columns follow this order and the fit is right", UserWarning, stacklevel=stacklevel)


def labels_to_indices(labels, classes: np.ndarray, *, name: str = "labels") -> np.ndarray:
    """int64 column indices of string ``labels`` in a fitted calibrator's ``classes_``.

    Raises
    ------
    ValueError
        Naming the first label that is not one of ``classes`` and its index.
    """
    arr = _as_str_array(labels)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected shape (n_samples,), got {arr.shape}")
    pos = np.searchsorted(classes, arr)
    pos_c = np.minimum(pos, classes.size - 1)
    bad = classes[pos_c] != arr
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected one of the fitted classes_ {classes.tolist()[:6]}"
                         f"{' ...' if classes.size > 6 else ''}, got {str(arr[i])!r} at index {i}")
    return pos.astype(np.int64)
