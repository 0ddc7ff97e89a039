"""Decisions at archive scale: a decision manifest applied blockwise to Dask arrays.

The rule travels to the workers as its JSON text (never a pickle) and is rebuilt and validated once per
worker process (cached by the text's sha256); each block is then exactly the single-process
:meth:`confcal.decisions.DecisionRule.decide` (or :meth:`~confcal.decisions.ConformalSets.predict`) of its rows.
With a calibrator, each block is first mapped by the calibrator's ``predict_proba`` (its manifest travels
the same way) and the score taken as the manifest's input kind says (binary: the positive column;
top-label: the maximum, the group per predicted class if the rule is per class).

Fitting is not distributed: a rule is fitted on a calibration slice in one process
(:func:`confcal.decisions.fit_decisions`), which is small by design.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np

__all__ = ["decide", "predict_sets"]

_CACHE: dict = {}
_LOCK = threading.Lock()


def _cached(kind: str, text: str, cal_text: str | None):
    key = hashlib.sha256(f"{kind}\0{text}\0{cal_text}".encode()).hexdigest()
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            from confcal.decisions import load_decision_manifest

            cal_dict = None if cal_text is None else json.loads(cal_text)
            rule = load_decision_manifest(json.loads(text), calibrator=cal_dict)
            cal = None
            if cal_dict is not None:
                from confcal.calibrators import calibrator_from_dict

                cal = calibrator_from_dict(cal_dict)
            hit = _CACHE[key] = (rule, cal)
    return hit


def _texts(manifest, calibrator):
    """Canonical texts, validated on the client (a bad manifest fails here, not on every worker)."""
    if not isinstance(manifest, dict):
        raise TypeError(f"manifest: expected a decision manifest dict, got {type(manifest).__name__}")
    cal_dict = None if calibrator is None else (calibrator if isinstance(calibrator, dict) else calibrator.to_dict())
    text = json.dumps(manifest, sort_keys=True, allow_nan=False)
    cal_text = None if cal_dict is None else json.dumps(cal_dict, sort_keys=True, allow_nan=False)
    _cached("client", text, cal_text)
    return text, cal_text


def _block_scores(m, cal, x):
    """(scores, predicted class or None) of one block under the manifest's input kind."""
    kind = m["input"]["kind"]
    if cal is not None:
        p = cal.predict_proba(x)
        return (p[:, -1], None) if kind == "binary" else (p.max(1), p.argmax(1))
    if kind == "top_label":
        return x.max(1), x.argmax(1)
    return x, None


def _decide_block(text, cal_text, x, g):
    rule, cal = _cached("worker", text, cal_text)
    m = json.loads(text)
    s, pred = _block_scores(m, cal, np.asarray(x))
    per = m["input"]["per"]
    if per == "class":
        g = pred.astype(str)
    elif per == "domain+class":
        g = np.char.add(np.char.add(np.asarray(g).astype(str), "/"), pred.astype(str))
    return rule.decide(s, None if per == "none" else g)


def decide(manifest: dict, scores, groups=None, *, calibrator=None):
    """Decisions (int8: 1 accept, 0 review, -1 reject) of a three-way decision manifest, block by block.

    Parameters
    ----------
    manifest : dict
        A decision manifest (``kind: "three_way"``) from :func:`confcal.decisions.decision_manifest`.
    scores : dask.array.Array, shape (n_samples,) or (n_samples, n_classes)
        1-D scores on the rule's scale; with ``calibrator`` (or a top-label rule), the model output the
        score is taken from (chunked along rows only).
    groups : dask.array.Array, shape (n_samples,), optional
        Domain ids with the same row chunks; needed for a per-domain rule.
    calibrator : dict or Calibrator, optional
        The calibrator the manifest names (checked by digest on the client).

    Returns
    -------
    dask.array.Array of int8, shape (n_samples,)

    Raises
    ------
    ValueError
        A damaged manifest, a missing or different calibrator, conformal sets passed here, or groups
        missing for a per-domain rule.
    """
    import dask.array as da

    text, cal_text = _texts(manifest, calibrator)
    if manifest.get("kind") != "three_way":
        raise ValueError("manifest: expected accept / review / reject decisions (kind 'three_way'); use "
                         "predict_sets for conformal sets")
    per = manifest["input"]["per"]
    if "domain" in per and groups is None:
        raise ValueError(f"groups: the rule is per {per}: pass the domain id of every row")
    if scores.ndim == 2 and scores.chunks[1] != (scores.shape[1],):
        scores = scores.rechunk({1: -1})
    if groups is None:
        groups = da.zeros(scores.shape[0], dtype=np.int8, chunks=(scores.chunks[0],))
    elif groups.chunks[0] != scores.chunks[0]:
        groups = groups.rechunk({0: scores.chunks[0]})
    if scores.ndim == 2:
        return da.map_blocks(lambda x, g: _decide_block(text, cal_text, x, g), scores, groups[:, None],
                             dtype=np.int8, drop_axis=1)
    return da.map_blocks(lambda x, g: _decide_block(text, cal_text, x, g), scores, groups, dtype=np.int8)


def predict_sets(manifest: dict, probs, groups=None, *, calibrator=None):
    """Conformal prediction sets (bool, ``(n_samples, n_classes)``) of a ``kind: "conformal"`` manifest,
    block by block; ``probs`` are the probabilities of the fit's scale (or logits with ``calibrator``)."""
    import dask.array as da

    text, cal_text = _texts(manifest, calibrator)
    if manifest.get("kind") != "conformal":
        raise ValueError("manifest: expected conformal sets (kind 'conformal')")
    if probs.chunks[1] != (probs.shape[1],):
        probs = probs.rechunk({1: -1})

    def block(x, g=None):
        sets, cal = _cached("worker", text, cal_text)
        p = np.asarray(x) if cal is None else cal.predict_proba(np.asarray(x))
        return sets.predict(p, None if g is None else np.asarray(g)[:, 0])

    if groups is None:
        return da.map_blocks(block, probs, dtype=bool)
    if groups.chunks[0] != probs.chunks[0]:
        groups = groups.rechunk({0: probs.chunks[0]})
    return da.map_blocks(block, probs, groups[:, None], dtype=bool)
