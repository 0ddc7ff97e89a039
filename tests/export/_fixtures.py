"""Calibrators fitted on the real CIFAR-100 outputs and KITTI box scores, and test inputs with
the hard rows (-inf, +-1e4, batch of 1, empty batch), shared by the export tests."""

from __future__ import annotations

import functools
import warnings

import numpy as np

from tests.conftest import require_shared_data
from tests.detection._data import paths

#: tolerances of issue 23: float32 graphs / float64 graphs against predict_proba
ATOL32 = 1e-6
ATOL64 = 1e-12
N_CAL = 1500

#: method -> (hyper-parameters, side input kind); small iteration budgets: equality, not optimality
CLASSIFIERS = {
    "ts": ({}, None),
    "bcts": ({}, None),
    "grouped-ts": ({}, "domains"),
    "vs": ({"max_iter": 50}, None),
    "ms": ({"max_iter": 15}, None),
    "dirichlet": ({"reg": "fixed", "max_iter": 15}, None),
    "ets": ({"max_iter": 50}, None),
    "pts": ({"epochs": 2, "progress": False}, None),
    "grouped": ({"base": "vs", "base_params": {"max_iter": 30}, "min_samples": 400}, "domains"),
    "set-ts": ({}, "fit-domains"),  # one T over the calibration domains; none needed to apply it
    "lb": ({"max_iter": 50}, None),
    "dpb": ({"max_iter": 50}, None),
    "isotonic": ({}, None),
    "histogram-binning": ({}, None),
    "histogram-binning-uniform": ({"strategy": "uniform", "n_bins": 10}, None),
    "bbq": ({}, None),
    "scaling-binning-marginal": ({"scaler": "ts"}, None),
    "scaling-binning-marginal-platt": ({"scaler": "platt"}, None),
    "platt-ovr": ({"score_space": "log-odds"}, None),
    "platt-ovr-log-prob": ({"score_space": "log-prob"}, None),  # the log-softmax score of the export's space 3
    "beta": ({}, None),
    "isotonic-top": ({}, None),
    "histogram-binning-top": ({}, None),
    "histogram-binning-top-uniform": ({"strategy": "uniform"}, None),
    "bbq-top": ({}, None),
    "scaling-binning": ({"scaler": "ts"}, None),
    "scaling-binning-platt": ({"scaler": "platt"}, None),
}
BOXES = {
    "det-ts": {"clip_scores": True, "min_samples": 20},
    "det-ts-bias-domains": {"clip_scores": True, "bias": True, "min_samples": 20},
    "det-platt": {"min_samples": 20},
    "det-platt-class-domains": {"per_class": True, "min_samples": 20},
    "det-beta": {"clip_scores": True, "min_samples": 20},
    "det-beta-class": {"clip_scores": True, "per_class": True, "min_samples": 20},
}


@functools.lru_cache(maxsize=None)
def cifar():
    """(cal logits, cal labels, cal domains, test logits, test domains): log of the DenseNet's
    probabilities; test rows 0-2 hold a -inf logit, +-1e4 logits and a -inf plus 1e4 logit;
    test domains include 7, unseen at fit time."""
    d = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    with np.errstate(divide="ignore"):
        x = np.log(d["predictions"].astype(np.float64))
    y = d["ground_truth"].astype(np.int64)
    cal, test = x[:N_CAL], x[5000:5400].copy()
    test[0, 3] = -np.inf
    test[1, :50], test[1, 50:] = 1e4, -1e4
    test[2, 10], test[2, 20] = -np.inf, 1e4
    dom_cal = np.arange(N_CAL) % 3
    dom_test = np.where(np.arange(test.shape[0]) % 5 == 0, 7, np.arange(test.shape[0]) % 3)
    return cal, y[:N_CAL], dom_cal, test, dom_test


@functools.lru_cache(maxsize=None)
def fitted_classifier(method):
    from confcal.calibrators import METHODS

    params, side = CLASSIFIERS[method]
    x, y, dom, _, _ = cifar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return METHODS[method.removesuffix("-platt").removesuffix("-log-prob").removesuffix("-uniform")](**params).fit(x, y, **({"domains": dom} if side else {}))


@functools.lru_cache(maxsize=None)
def kitti():
    """(scores, labels, domains, category ids) of the KITTI BEV car boxes matched at IoU 0.5;
    domains: image id mod 3 (a stand-in sensor id), categories all 0 (one class of cars)."""
    _, _, matched = paths("kitti_bev_cars")
    d = np.load(matched)
    return (d["score"].astype(np.float64), d["label"].astype(np.int64), d["image_id"] % 3,
            np.zeros(d["score"].shape[0], dtype=np.int64))


@functools.lru_cache(maxsize=None)
def fitted_box(name):
    from confcal.calibrators import METHODS

    params = BOXES[name]
    s, y, dom, cat = kitti()
    side = {}
    if name.endswith("domains"):
        side["domains"] = dom
    if params.get("per_class"):
        side["category_ids"] = cat
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        method = "-".join(name.split("-")[:2])  # "det-ts-bias-domains" -> "det-ts"
        return METHODS[method](**params).fit(s, y, **side), side


def box_test_inputs():
    """Scores (incl. 0, 1 and a score above 1, clipped by clip_scores) and side inputs with
    unseen ids (domain 5, category 9)."""
    s, _, dom, cat = kitti()
    scores = np.concatenate([s[:300], [0.0, 1.0, 1.2, 0.5]])
    n = scores.shape[0]
    domains = np.concatenate([dom[:300], [5, 0, 1, 2]])
    cats = np.where(np.arange(n) % 7 == 0, 9, 0)
    return scores, domains, cats
