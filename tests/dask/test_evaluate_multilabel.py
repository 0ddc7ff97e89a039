"""``confcal evaluate --engine dask`` of a sigmoid head (multi-hot labels) gives the single-process
document: chosen the same way (``--multilabel``, a ``*-multilabel`` calibrator, or 2-D labels that
are not one-hot, here a group of label columns without the flag), the same numbers within 1e-12
relative and the same ``--max-ece`` exit status. The parity matrix covers ``--multilabel`` with a
list column of labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import require_shared_data
from tests.dask._documents import run_cli, same_document
from tests.dask.conftest import write_dataset


@pytest.fixture(scope="module")
def sigmoid_head(tmp_path_factory):
    """CIFAR-10 (LeNet-5) log-probabilities as a 10-label sigmoid head's logits, 600 rows, multi-hot
    labels (the true class plus each other label with probability 0.15, seeded) as columns y_0..y_9,
    in 3 uneven Parquet files."""
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    n = 600
    logits = np.log(d["predictions"]).astype(np.float32)[:n]
    y = (np.random.default_rng(11).random((n, 10)) < 0.15).astype(np.int64)
    y[np.arange(n), d["ground_truth"][:n].astype(np.int64)] = 1
    folder = tmp_path_factory.mktemp("sigmoid") / "head.parquet"
    write_dataset(folder, {"logits": logits, "mlabel": y, **{f"y_{j}": y[:, j] for j in range(10)}}, n_parts=3)
    return folder


_cli = run_cli


def test_dask_evaluate_of_a_sigmoid_head_equals_single_process(dask_client, sigmoid_head, tmp_path, capsys):
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    man = tmp_path / "tsml.json"
    x = ["--logits", f"{sigmoid_head}:logits", "--labels", f"{sigmoid_head}:y_*"]
    code, _, err = _cli(capsys, "fit", "--method", "ts-multilabel", *x, "-o", man)
    assert code == 0, err
    for extra in ([], ["--calibrator", man], ["--calibrator", man, "--max-ece", "1e-4"]):
        loc = _cli(capsys, "evaluate", *x, *extra, "--json")
        dsk = _cli(capsys, "evaluate", *x, *extra, "--json", *sched)
        assert loc[0] == dsk[0] == (3 if "--max-ece" in extra else 0), (loc[2], dsk[2])
        doc_l, doc_d = json.loads(loc[1]), json.loads(dsk[1])
        assert doc_l["multilabel"] is True and doc_l["n_labels"] == 10
        same_document(doc_l, doc_d)
        if "--max-ece" in extra:  # the same gate line
            assert [line for line in loc[2].splitlines() if "--max-ece" in line] == \
                [line for line in dsk[2].splitlines() if "--max-ece" in line]
    # the text table too
    assert _cli(capsys, "evaluate", *x, "--calibrator", man)[1] == _cli(capsys, "evaluate", *x, "--calibrator", man,
                                                                        *sched)[1]


def test_dask_evaluate_refuses_labels_of_another_shape_as_in_one_process(dask_client, sigmoid_head, capsys):
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    x = ["--logits", f"{sigmoid_head}:logits", "--labels", f"{sigmoid_head}:y_0,y_1,y_2", "--multilabel"]
    loc, dsk = _cli(capsys, "evaluate", *x), _cli(capsys, "evaluate", *x, *sched)
    assert loc[0] == dsk[0] == 2
    assert "--labels: a sigmoid head needs multi-hot labels" in loc[2] and loc[2] == dsk[2]
