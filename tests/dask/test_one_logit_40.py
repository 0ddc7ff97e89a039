"""Issue 40, defect 4 on the Dask engine: ``evaluate --engine dask`` of a one-logit model's ``(n, 1)``
logits with a classifier's manifest gives the single-process document (the two-class rows [0, z]);
before, the class count was read as 1 and the labels were refused ("expected values in [0, 1)")."""

from __future__ import annotations

import json

import numpy as np

from tests.dask._documents import run_cli, same_document
from tests.dask.conftest import write_dataset


def test_dask_evaluate_of_one_logit_equals_single_process(dask_client, tmp_path, capsys):
    rng = np.random.default_rng(4)
    z = rng.normal(0, 3, (500, 1))
    y = (rng.random(500) < 1 / (1 + np.exp(-z[:, 0] / 2))).astype(np.int64)
    folder = tmp_path / "one.parquet"
    write_dataset(folder, {"logit_0": z[:, 0], "label": y}, n_parts=3)
    x = ["--logits", f"{folder}:logit_*", "--labels", f"{folder}:label"]
    code, _, err = run_cli(capsys, "fit", "--method", "ts", *x, "-o", tmp_path / "ts.json")
    assert code == 0, err
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    loc = run_cli(capsys, "evaluate", *x, "--calibrator", tmp_path / "ts.json", "--json")
    dsk = run_cli(capsys, "evaluate", *x, "--calibrator", tmp_path / "ts.json", "--json", *sched)
    assert loc[0] == dsk[0] == 0, (loc[2], dsk[2])
    doc_l, doc_d = json.loads(loc[1]), json.loads(dsk[1])
    assert doc_l["n_classes"] == 2 and "ts" in doc_l["metrics"]
    same_document(doc_l, doc_d)
