"""Column groups are read in class order (numeric suffix), whatever order the file keeps them in,
or refused with one line when the names do not fix the order (issue 21)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.cli import main
from confcal.sources import open_source
from confcal.sources._columns import order_column_group


def _lexicographic_file(path, x):
    """Columns logit_0..logit_{K-1} stored in string order (logit_0, logit_1, logit_10, ...)."""
    names = sorted(f"logit_{j}" for j in range(x.shape[1]))
    pq.write_table(pa.table({"label": x.argmax(1), **{n: x[:, int(n[6:])] for n in names}}), path)
    assert pq.read_schema(path).names[3] == "logit_10"


def test_glob_in_class_order_not_file_order(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 12)) * 5
    _lexicographic_file(tmp_path / "s.parquet", x)
    got = open_source(f"{tmp_path}/s.parquet:logit_*", name="logits").to_numpy()
    np.testing.assert_array_equal(got, x)  # a copy of the same float64 values: exact
    got = open_source(f"{tmp_path}/s.parquet:logit_10,logit_0,logit_1,logit_2,logit_3,logit_4,logit_5,"
                      "logit_6,logit_7,logit_8,logit_9,logit_11", name="logits").to_numpy()
    np.testing.assert_array_equal(got, x)


def test_csv_list_in_class_order(tmp_path):
    (tmp_path / "s.csv").write_text("s_1,s_0,label\n1.5,0.5,0\n2.5,3.5,1\n")
    got = open_source(f"{tmp_path}/s.csv:s_1,s_0", name="logits").to_numpy()
    np.testing.assert_array_equal(got, [[0.5, 1.5], [3.5, 2.5]])
    # names without class numbers: the typed order is the order
    (tmp_path / "t.csv").write_text("cat,dog\n1.5,0.5\n")
    assert open_source(f"{tmp_path}/t.csv:dog,cat", name="logits").to_numpy().tolist() == [[0.5, 1.5]]


@pytest.mark.parametrize("names, what", [(["logit_a", "logit_b"], "do not name their class order"),
                                         (["logit_1", "logit_01"], "repeat a class number"),
                                         (["logit_0", "logit_2"], "skip class number"),
                                         (["logit_0", "score_1"], "do not name their class order")])
def test_ambiguous_glob_refused_in_one_line(tmp_path, names, what):
    pq.write_table(pa.table({n: np.zeros(3) for n in names}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=what) as err:
        open_source(f"{tmp_path}/a.parquet:*", name="logits")
    assert "\n" not in str(err.value) and str(err.value).startswith("logits:")


def test_list_column_taken_as_is(tmp_path):
    x = np.arange(6.0).reshape(2, 3)
    pq.write_table(pa.table({"logits": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 3)}),
                   tmp_path / "l.parquet")
    np.testing.assert_array_equal(open_source(f"{tmp_path}/l.parquet:logits").to_numpy(), x)


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(13))), st.integers(0, 3), st.sampled_from(["logit_", "c", "p_q"]))
def test_any_permutation_any_offset_sorts_back(perm, start, prefix):
    names = [f"{prefix}{start + k}" for k in perm]
    assert order_column_group(names, spec="*") == [f"{prefix}{start + k}" for k in range(13)]


def test_fit_records_the_order_and_is_right(tmp_path, capsys):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 12, 600)
    x = rng.normal(size=(600, 12)) + 6 * np.eye(12)[y]
    pq.write_table(pa.table({"label": y, **{n: x[:, int(n[6:])] for n in sorted(f"logit_{j}" for j in range(12))}}),
                   tmp_path / "v.parquet")
    assert main(["fit", "--logits", f"{tmp_path}/v.parquet:logit_*", "--labels", f"{tmp_path}/v.parquet:label",
                 "--method", "ts", "-o", str(tmp_path / "cal.json"), "-q"]) == 0
    m = json.loads((tmp_path / "cal.json").read_text())
    assert m["fit"]["provenance"]["inputs"]["logits"]["columns"] == [f"logit_{j}" for j in range(12)]
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{tmp_path}/v.parquet:logit_*", "--labels", f"{tmp_path}/v.parquet:label",
                 "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    acc = out["metrics"]["uncalibrated"]["accuracy"]
    assert acc == pytest.approx(np.mean(x.argmax(1) == y), rel=1e-12)


def test_dask_reader_uses_the_same_order(tmp_path):
    pytest.importorskip("fsspec", reason="the dask extra is not installed")
    from confcal.dask._data import column_matrix, read_parquet, resolve_columns

    x = np.random.default_rng(2).normal(size=(20, 11))
    _lexicographic_file(tmp_path / "s.parquet", x)
    ds = read_parquet(tmp_path / "s.parquet")
    spec = resolve_columns(ds, "logit_*", name="logits")
    assert spec.columns == [f"logit_{j}" for j in range(11)]
    np.testing.assert_array_equal(column_matrix(ds.pieces[0], spec, name="logits"), x)
    with pytest.raises(ValueError, match="skip class number"):
        resolve_columns(ds, "logit_0,logit_2", name="logits")
