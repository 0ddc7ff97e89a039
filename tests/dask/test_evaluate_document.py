"""T9 (issue 21): ``confcal evaluate --json`` prints ONE document on both engines (one builder,
:func:`confcal.evaluation.document.evaluation_document`): the same keys, recursively, and values within
1e-12 relative, for logits, probabilities and box scores, each with domains, a calibrator and a limit.
Before, only the in-process document had ``n_classes`` and only the Dask one ``reliability``, ``kind``,
``n_passes`` and ``n_outside``; per-domain entries differed (``mce``, ``ece_equal_mass``, ``n``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import require_shared_data
from tests.dask._documents import key_paths, run_cli, same_document
from tests.dask.conftest import write_dataset

N = 240


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaldoc")
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    probs = d["predictions"][:N].astype(np.float64)
    probs /= probs.sum(axis=1, keepdims=True)
    cls = {"logits": np.log(probs).astype(np.float32), "probs": probs,
           "label": d["ground_truth"][:N].astype(np.int64), "domain": np.array(["s0", "s1", "s2"])[np.arange(N) % 3]}
    k = np.load(require_shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    box = {"score": np.clip(k["score"][:N], 1e-6, 1 - 1e-6), "correct": k["label"][:N].astype(np.int64),
           "domain": np.where(k["image_id"][:N] % 2 == 0, "even", "odd")}
    for name, cols in (("cls", cls), ("box", box)):
        np.savez(root / f"{name}.npz", **cols)
        write_dataset(root / f"{name}.parquet", cols, n_parts=3)
    return root


def _cli(*argv, capsys):
    return run_cli(capsys, *argv, ignore_warnings=True)


#: (data, --logits column, --labels column, fit method, extra flags)
CASES = {"logits": ("cls", "logits", "label", "grouped-ts", []),
         "probs": ("cls", "probs", "label", "ts", ["--input-kind", "probs"]),
         "box": ("box", "score", "correct", "det-platt", [])}


@pytest.mark.parametrize("limit", [None, "0.01"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_evaluate_json_is_one_document_on_both_engines(case, limit, data, dask_client, tmp_path, capsys):
    name, x, y, method, extra = CASES[case]
    npz, pq = data / f"{name}.npz", data / f"{name}.parquet"
    man = tmp_path / "cal.json"
    fit_domains = ["--domains", f"{npz}:domain"] if method == "grouped-ts" else []
    code, _, err = _cli("fit", "--method", method, "--logits", f"{npz}:{x}", "--labels", f"{npz}:{y}",
                        *fit_domains, *extra, "-o", man, capsys=capsys)
    assert code == 0, err
    gate = ["--max-ece", limit, "--gate-rule", "point"] if limit else []
    docs, codes = {}, {}
    for where, src, more in (("local", npz, []),
                             ("dask", pq, ["--engine", "dask", "--scheduler", dask_client.scheduler.address])):
        code, out, err = _cli("evaluate", "--logits", f"{src}:{x}", "--labels", f"{src}:{y}", "--domains",
                              f"{src}:domain", "--calibrator", man, *extra, *gate, "--json", *more, capsys=capsys)
        assert out, err
        codes[where], docs[where] = code, json.loads(out)
    assert codes["local"] == codes["dask"] == (3 if limit else 0)
    same_document(docs["local"], docs["dask"])
    doc = docs["local"]
    # the documented key set (confcal.evaluation.document)
    assert set(doc) == {"n_samples", "kind", "n_classes", "n_bins", "metrics", "reliability", "calibration",
                        "per_domain", "n_outside", "geometry_d_ece", "limits", "engine"}
    assert list(doc["metrics"]) == ["uncalibrated", method] and len(doc["per_domain"]) >= 2
    want = {"precision", "d_ece", "nll", "brier"} if case == "box" else {
        "accuracy", "ece", "ece_equal_mass", "mce", "nll", "brier"}
    for g in doc["per_domain"].values():
        assert set(g) == {"n_samples", "metrics", "reliability", "calibration", "parameters"}
        assert all(set(m) == want for m in g["metrics"].values())
    assert (doc["limits"] is None) == (limit is None)
    if limit:
        assert doc["limits"]["verdict"] == "fail" and "(all)" in doc["limits"]["exceeded"]
        assert doc["limits"]["rule"] == "point"
        for r in doc["limits"]["groups"].values():  # the interval the verdict shows holds the estimate
            assert r["ece_lower"] <= r["value"] <= r["ece_upper"]
