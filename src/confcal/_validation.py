"""Input validation shared by every public entry point (bottom layer: numpy/torch only).

Each check raises ``ValueError``/``TypeError`` naming the argument, what was
expected and what was found, so a user can fix the call without reading code.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "renamed_seed",
    "as_numpy",
    "check_logits",
    "one_logit_rows",
    "one_logit_scores_note",
    "check_probs",
    "check_labels",
    "check_domains",
    "check_features",
    "MIN_SPLIT_ROWS",
    "min_rows_message",
]

#: the fewest calibration rows a method that splits them (scaling-binning's two halves, ms / dirichlet's
#: cross-validated regularisation) fits on; every other method fits on 1 row. The same minimum for all
#: of them, and the same message (:func:`min_rows_message`).
MIN_SPLIT_ROWS = 2


def plain(value) -> str:
    """``repr(value)`` for messages, numpy scalars and arrays shown as the Python numbers they hold
    (numpy 2 prints ``np.float64(1.5)`` where a user should read ``1.5``)."""
    if isinstance(value, np.generic):
        value = value.item()
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, (list, tuple)) and any(isinstance(v, np.generic) for v in value):
        value = type(value)(v.item() if isinstance(v, np.generic) else v for v in value)
    return repr(value)


def min_rows_message(method: str, n_rows: int, why: str) -> str:
    """The one-line refusal of a fit on fewer than :data:`MIN_SPLIT_ROWS` rows, e.g.
    ``logits: scaling-binning needs at least 2 calibration rows (two halves), got 1``."""
    return f"logits: {method} needs at least {MIN_SPLIT_ROWS} calibration rows ({why}), got {n_rows}"


def as_numpy(x, name: str) -> np.ndarray:
    """Return ``x`` as a numpy array (torch tensors are detached and moved to CPU)."""
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor without importing torch here
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16",):
            x = x.float()
        x = x.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name}: could not convert {type(x).__name__} to an array ({exc})") from None


def _first_bad_row(mask_rows: np.ndarray) -> int:
    return int(np.flatnonzero(mask_rows)[0])


def _looks_like_probs(x: np.ndarray) -> bool:
    """Rows all in [0, 1] that sum to 1, with some entry strictly inside (0, 1): almost surely
    probabilities. Rows made only of 0s and 1s (e.g. logits ``[1, 0]``) are valid logits and pass."""
    if x.shape[1] < 2 or not np.all((x >= 0) & (x <= 1)):
        return False
    if np.all((x == 0) | (x == 1)):
        return False
    tol = 1e-3 if x.dtype in (np.float16,) else 1e-4
    return bool(np.all(np.abs(x.sum(axis=1, dtype=np.float64) - 1.0) <= tol))


def one_logit_scores_note(z: np.ndarray, name: str = "logits", *, sign_preserving: str | None = None) -> str | None:
    """The one-line warning for a one-logit binary head ``z`` ``(n,)`` read as logits that are
    not likely logits, else None.

    Scores all in [0, 1] with some strictly inside (0, 1) look like positive-class probabilities
    (the 1-D counterpart of the 2-D rows that sum to 1, which :func:`check_logits` refuses; a
    warning, not an error: a weak model's logits may all fall in [0, 1], and a one-logit head has
    no row sum to tell). With ``sign_preserving`` (the method's name, for a map ``sigmoid(z / T)``,
    ``T > 0``), scores all ``>= 0`` (or all ``<= 0``) also get a note: every calibrated
    probability is then ``>= 1/2`` (``<= 1/2``) whatever the fit, as on detector scores in [0, 1.24]."""
    z = np.asarray(z)
    if z.size == 0 or not np.issubdtype(z.dtype, np.floating) or not np.all(np.isfinite(z)):
        return None  # integer 0/1 logits are valid; non-finite values get check_logits' error
    lo, hi = float(z.min()), float(z.max())
    if lo >= 0 and hi <= 1 and not np.all((z == 0) | (z == 1)):
        return (f"{name}: every one of the {z.size} one-logit scores is in [0, 1], so these look like "
                "positive-class probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                "to use their log-odds as logits")
    if sign_preserving is not None and (lo >= 0 or hi <= 0):
        side, half = (">= 0", ">= 1/2") if lo >= 0 else ("<= 0", "<= 1/2")
        return (f"{name}: every one of the {z.size} one-logit scores is {side}, so {sign_preserving} "
                f"(sigmoid(z / T)) gives every sample a probability {half} whatever T; fit det-platt on raw "
                "detector scores, or pass probabilities with input_kind='probs' (CLI: --input-kind probs)")
    return None


def one_logit_rows(x: np.ndarray, input_kind: str = "logits") -> np.ndarray:
    """A one-logit binary model's ``(n, 1)`` (or ``(n,)``) output as the two-class rows that
    ``predict_proba`` and every metric read: logits ``[0, z]`` (``softmax([0, z])[:, 1] = sigmoid(z)``),
    probabilities ``[1 - p, p]``; float16 and integers are widened first, as :func:`check_logits` does."""
    z = np.asarray(x).reshape(-1)
    if not np.issubdtype(z.dtype, np.floating) or z.dtype == np.float16:
        z = z.astype(np.float32 if z.dtype == np.float16 else np.float64)
    if input_kind == "probs":
        return np.stack([1 - z, z], axis=1)
    return np.stack([np.zeros_like(z), z], axis=1)


def check_logits(logits, *, name: str = "logits", input_kind: str = "logits",
                 copy: bool = False, first_row: int = 0, whole: bool = True) -> np.ndarray:
    """Validate logits of shape ``(n_samples, n_classes)`` and return a float array.

    ``input_kind="probs"`` accepts probabilities instead and returns their
    natural log (zeros become ``-inf``: a masked class), which are logits up to
    a per-row constant. float16/bfloat16 inputs are returned as float32; float32
    and float64 keep their dtype (accumulations elsewhere are in float64).

    ``first_row`` (row index of ``logits[0]`` in the whole data) and ``whole=False`` are for
    checking one batch of a larger array: rows are named by their index in the whole data,
    and the probabilities-as-logits check, which needs every row, is left to the caller.

    Raises
    ------
    ValueError
        Not 2-D, fewer than 2 classes, no rows, NaN or ``+inf`` entries (the first
        bad row is named), a row that is entirely ``-inf``, or rows that look like
        probabilities while ``input_kind="logits"``.
    TypeError
        Non-numeric input.
    """
    if input_kind not in ("logits", "probs"):
        raise ValueError(f"input_kind: expected 'logits' or 'probs', got {input_kind!r}")
    x = as_numpy(logits, name)
    if x.dtype == bool or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise TypeError(f"{name}: expected a float array of shape (n_samples, n_classes), got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected shape (n_samples, n_classes), got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"{name}: expected at least 1 sample, got shape {x.shape}")
    if x.shape[1] == 1:  # a one-logit binary model (sigmoid head): the two-class rows of predict_proba
        x = one_logit_rows(x, input_kind)
    if x.shape[1] < 2:
        raise ValueError(f"{name}: expected n_classes >= 2, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating) or x.dtype == np.float16:
        x = x.astype(np.float32 if x.dtype == np.float16 else np.float64)
    elif copy:
        x = x.copy()
    bad = np.isnan(x) | np.isposinf(x)
    if bad.any():
        row = _first_bad_row(bad.any(axis=1))
        raise ValueError(f"{name}: expected finite values (or -inf for a masked class), "
                         f"found NaN/+inf in row {first_row + row}: {x[row][:8].tolist()}")
    if input_kind == "probs":
        if np.any(x < 0) or np.any(x > 1 + 1e-6):
            row = _first_bad_row(((x < 0) | (x > 1 + 1e-6)).any(axis=1))
            raise ValueError(f"{name}: input_kind='probs' expects values in [0, 1], row {first_row + row} has "
                             f"min {x[row].min():g}, max {x[row].max():g}")
        sums = x.sum(axis=1, dtype=np.float64)
        off = np.abs(sums - 1.0) > 1e-3
        if off.any():
            row = _first_bad_row(off)
            raise ValueError(f"{name}: input_kind='probs' expects rows summing to 1, row {first_row + row} sums to "
                             f"{sums[row]:.6g}")
        with np.errstate(divide="ignore"):
            x = np.log(x)
    elif whole:
        if _looks_like_probs(x):
            raise ValueError(f"{name}: every row is in [0, 1] and sums to 1, so these look like "
                             "probabilities, not logits; pass input_kind='probs' (CLI: --input-kind probs) "
                             "to use their log as logits")
    masked = np.isneginf(x)
    all_masked = masked.all(axis=1) if masked.any() else masked[:, 0]  # no -inf: skip the row-wise test
    if all_masked.any():
        row = _first_bad_row(all_masked)
        raise ValueError(f"{name}: row {first_row + row} is entirely -inf (or all-zero probabilities); "
                         "at least one class must have a finite logit")
    return x


def check_probs(probs, *, name: str = "probs", keep_dtype: bool = False) -> np.ndarray:
    """Validate probabilities and return float64 ``(n_samples, n_classes)``.

    A 1-D array is read as positive-class probabilities of a binary problem and
    returned as the two columns ``[1 - p, p]``. ``keep_dtype=True`` returns a float32 input
    as float32 (no float64 copy; for metrics that only read it).

    The checks run in float32 for a float32 input (in float64 otherwise): one min/max pass decides for
    the common valid input; only an input that fails it gets the row-by-row checks that
    name the first bad row.

    Raises
    ------
    ValueError
        Wrong rank, empty, NaN/inf, values outside [0, 1], or rows not summing to 1
        (tolerance 1e-3, so float32/float16 rounding passes).
    """
    p = as_numpy(probs, name)
    if p.dtype == bool or not (np.issubdtype(p.dtype, np.floating) or np.issubdtype(p.dtype, np.integer)):
        raise TypeError(f"{name}: expected a float array, got dtype {p.dtype}")
    if p.dtype != np.float32 or p.ndim == 1:  # 1 - p of a 1-D input is formed in float64, as always
        p = p.astype(np.float64, copy=False)  # validation only reads it
    if p.ndim == 1 or (p.ndim == 2 and p.shape[1] == 1):  # a sigmoid model's positive-class probability
        p = np.stack([1.0 - p.reshape(-1), p.reshape(-1)], axis=1)
    if p.ndim != 2:
        raise ValueError(f"{name}: expected shape (n_samples, n_classes) or (n_samples,), got {p.shape}")
    if p.shape[0] == 0:
        raise ValueError(f"{name}: expected at least 1 sample, got shape {p.shape}")
    if p.shape[1] < 2:
        raise ValueError(f"{name}: expected n_classes >= 2, got shape {p.shape}")
    lo, hi = p.min(), p.max()  # NaN propagates: a NaN anywhere fails the comparison below
    if not (lo >= 0 and hi <= 1):
        finite = np.isfinite(p)
        if not finite.all():
            row = _first_bad_row(~finite.all(axis=1))
            raise ValueError(f"{name}: expected finite probabilities, found NaN/inf in row {row}")
        out = (p < 0) | (p > 1)
        row = _first_bad_row(out.any(axis=1))
        raise ValueError(f"{name}: expected values in [0, 1], row {row} has min {p[row].min():g}, "
                         f"max {p[row].max():g} (pass probabilities, not logits)")
    sums = p.sum(axis=1)  # float32 rounding of a row sum is far below the 1e-3 tolerance
    off = np.abs(sums - 1.0) > 1e-3
    if off.any():
        row = _first_bad_row(off)
        raise ValueError(f"{name}: expected rows summing to 1, row {row} sums to {sums[row]:.6g}")
    return p if keep_dtype or p.dtype == np.float64 else p.astype(np.float64)


def unique_json_keys(pairs: list) -> dict:
    """``object_pairs_hook`` for ``json.load``: the object as a dict, or ``ValueError`` naming a key given
    twice (Python keeps the last value, other JSON readers the first: the file means two things)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {key!r} given twice in one JSON object")
    return out


def check_box_labels(labels, n_boxes: int, *, name: str = "labels", first_row: int = 0) -> np.ndarray:
    """True-positive flags of 1-D box scores as int64 0/1 ``(n_boxes,)``.

    A bool column (``matched``: True = true positive) reads as 1/0, as do integer or float 0/1 labels
    (:func:`check_labels` with 2 classes). Class labels of class vectors stay strict (True/False are not
    class indices): this rule is for box scores only, and every reader of box labels (fit, evaluate,
    the Dask engine) uses it.

    Raises
    ------
    ValueError, TypeError
        As :func:`check_labels` with ``n_classes=2`` (shape, a value other than 0/1, another dtype).
    """
    y = as_numpy(labels, name)
    if y.dtype == bool:
        y = y.astype(np.int8)
    return check_labels(y, n_boxes, 2, name=name, first_row=first_row)


def check_labels(labels, n_samples: int, n_classes: int, *, name: str = "labels", first_row: int = 0) -> np.ndarray:
    """Validate class labels against ``n_samples`` and ``n_classes``; return int64 ``(n_samples,)``.

    Integer labels in ``[0, n_classes)`` are accepted, as are float arrays whose
    values are whole numbers. A 2-D ``(n_samples, n_classes)`` array is accepted
    only when every row is one-hot. ``n_classes`` always comes from the logits'
    width, never from the labels present. ``first_row`` is the index of ``labels[0]`` in the
    whole data when checking one batch (messages name whole-data indices).

    Raises
    ------
    ValueError
        Length mismatch, non-integer values, values outside ``[0, n_classes)``,
        or a 2-D array that is not one-hot.
    TypeError
        A dtype that is neither integer nor float (bool included: True/False are not class indices).
    """
    y = as_numpy(labels, name)
    if y.ndim == 2:
        if y.shape != (n_samples, n_classes):
            raise ValueError(f"{name}: one-hot labels must have shape ({n_samples}, {n_classes}), got {y.shape}")
        ok = np.all((y == 0) | (y == 1), axis=1) & (y.sum(axis=1) == 1)
        if not ok.all():
            row = _first_bad_row(~ok)
            raise ValueError(f"{name}: 2-D labels are accepted only when every row is one-hot; "
                             f"row {first_row + row} is {y[row][:8].tolist()}")
        return np.argmax(y, axis=1).astype(np.int64)
    if y.ndim != 1:
        raise ValueError(f"{name}: expected shape ({n_samples},), got {y.shape}")
    if y.shape[0] != n_samples:
        raise ValueError(f"{name}: expected {n_samples} labels (one per sample), got {y.shape[0]}")
    if y.dtype == bool:  # True/False are not class indices: refuse rather than guess 1/0
        raise TypeError(f"{name}: expected integer class indices, got dtype bool")
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            idx = int(np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))[0])
            raise ValueError(f"{name}: expected integer class indices in [0, {n_classes}), "
                             f"got non-integer value {y[idx].item()!r} at index {first_row + idx} "
                             "(did you swap probabilities and labels?)")
    elif not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{name}: expected integer class indices, got dtype {y.dtype}")
    # the range on the values as given: a cast first would wrap 2**64 - 1 to -1 and 1e20 to -2**63
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        idx = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: expected values in [0, {n_classes}) (n_classes from the width of the "
                         f"scores), got {y[idx].item()!r} at index {first_row + idx}; range seen "
                         f"[{y.min().item()!r}, {y.max().item()!r}]")
    return y.astype(np.int64)


def check_domains(domains, n_samples: int, *, name: str = "domains") -> np.ndarray:
    """Validate per-sample domain ids (str or int) of shape ``(n_samples,)``.

    Integral floats become int64; bool ids (a mask such as ``sensor == 0``) become the ints 0 / 1,
    so a manifest stores ids its loader accepts and a later bool or 0/1 array finds the same groups.
    """
    d = as_numpy(domains, name)
    if d.ndim != 1:
        raise ValueError(f"{name}: expected shape ({n_samples},), got {d.shape}")
    if d.shape[0] != n_samples:
        raise ValueError(f"{name}: expected {n_samples} domain ids (one per sample), got {d.shape[0]}")
    if np.issubdtype(d.dtype, np.floating):
        if not np.all(np.isfinite(d)) or not np.all(d == np.round(d)):
            raise ValueError(f"{name}: expected str or int ids, got non-integer floats")
        d = d.astype(np.int64)
    if d.dtype == bool:  # JSON would store true/false, which no id table takes: the ints 0 / 1
        d = d.astype(np.int64)
    if d.dtype == object:
        d = d.astype(str)
    if d.dtype.kind not in "iuUS":  # complex, datetime, void: no id a manifest could store and match
        raise TypeError(f"{name}: expected str or int ids, got dtype {d.dtype}")
    return d


def check_features(features, n_samples: int, *, name: str = "features") -> np.ndarray:
    """Validate features ``(n_samples, n_features)``; return float64."""
    f = as_numpy(features, name)
    if f.ndim != 2:
        raise ValueError(f"{name}: expected shape ({n_samples}, n_features), got {f.shape}")
    if f.shape[0] != n_samples:
        raise ValueError(f"{name}: expected {n_samples} rows (one per sample), got {f.shape[0]}")
    if not (np.issubdtype(f.dtype, np.floating) or np.issubdtype(f.dtype, np.integer)) or f.dtype == bool:
        raise TypeError(f"{name}: expected a numeric array, got dtype {f.dtype}")
    f = f.astype(np.float64)
    if not np.all(np.isfinite(f)):
        row = _first_bad_row(~np.isfinite(f).all(axis=1))
        raise ValueError(f"{name}: expected finite values, found NaN/inf in row {row}")
    return f


def renamed_seed(random_state, seed, where: str):
    """The seed of a function that took ``seed=`` before every seed became ``random_state``.

    ``seed`` is the old keyword (``None``: not given). Given, it wins and a ``FutureWarning``
    names the new keyword; both given with different values raise ``ValueError``.
    """
    if seed is None:
        return random_state
    import warnings

    if random_state not in (0, None) and random_state != seed:
        raise ValueError(f"{where}: give random_state= only (seed= is its old name), got random_state="
                         f"{random_state!r} and seed={seed!r}")
    warnings.warn(f"{where}: seed= is renamed random_state= (same meaning); seed= will be removed",
                  FutureWarning, stacklevel=3)
    return seed
