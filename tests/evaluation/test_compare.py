"""compare_methods: per-split values against direct computation, failures recorded, renderings."""

import csv
import io
import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal._numeric import softmax
from confcal.calibrators import METHODS, Calibrator, TemperatureScaling
from confcal.evaluation import compare_methods
from confcal.evaluation.compare import METRICS, UNCALIBRATED, split_indices
from confcal.evaluation.compare_tables import format_cell
from confcal.metrics import accuracy, brier_score, ece, nll, smooth_ece
from tests.conftest import require_shared_data


# ------------------------------------------------------------------ fake calibrators
class FixedTemperature(Calibrator):
    """Test double: softmax(x / temperature) with a temperature given, not fitted."""

    method = "test-fixed-t"

    def __init__(self, temperature: float = 2.0, progress: bool = True):
        self.temperature = temperature
        self.progress = progress

    def _fit(self, logits, labels):
        if self.progress:  # compare_methods must switch per-fit progress bars off
            raise AssertionError("progress should be False inside compare_methods")
        warnings.warn("fake fit warning", UserWarning)
        self.temperature_ = float(self.temperature)

    def _predict_proba(self, logits):
        return softmax(logits / self.temperature_)

    def _get_fitted(self):
        return {"temperature": self.temperature_}

    def _set_fitted(self, d):
        self.temperature_ = d["temperature"]


class FailsOnOddFirstLabel(FixedTemperature):
    """Raises in fit when the first calibration label is odd: fails on some splits only."""

    method = "test-flaky"

    def _fit(self, logits, labels):
        if labels[0] % 2 == 1:
            raise RuntimeError("odd first label")
        self.temperature_ = float(self.temperature)


class PredictsNaN(FixedTemperature):
    method = "test-nan"

    def _fit(self, logits, labels):
        self.temperature_ = 1.0

    def _predict_proba(self, logits):
        return np.full(logits.shape, np.nan)


@pytest.fixture(autouse=True)
def fake_methods():
    added = [FixedTemperature, FailsOnOddFirstLabel, PredictsNaN]
    for cls in added:
        METHODS[cls.method] = cls
    yield
    for cls in added:
        METHODS.pop(cls.method, None)


def make_data(seed=0, n=400, k=5, scale=3.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k)) * scale
    p = softmax(logits / 2.5)  # labels from a softer model: the logits are over-confident
    labels = np.array([rng.choice(k, p=row) for row in p])
    return logits, labels


def _uncertainty_oracle(probs, labels):
    """The issue-42 columns from their public functions on the top-label pairs."""
    from confcal.metrics import bias_corrected_ece, ece_bounds, kuiper_test
    from confcal.metrics._binning import bin_sums

    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    c, s, h, _ = bin_sums(conf, correct, 15, "equal_width")
    return {"ece_bc": bias_corrected_ece(c, s, h), "ece_lower": ece_bounds(c, s, h, 0.05)[0],
            "kuiper_reject": float(kuiper_test(conf, correct).p_value <= 0.05)}


def direct_metrics(probs, labels):
    return {
        "error": 1.0 - accuracy(probs, labels),
        "smece": smooth_ece(probs, labels),
        "ece_em": ece(probs, labels, 15, "equal_mass"),
        "ece_ew": ece(probs, labels, 15, "equal_width"),
        **_uncertainty_oracle(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier_score(probs, labels),
    }


# ------------------------------------------------------------------ the protocol
def test_split_indices_partition_and_determinism():
    splits = split_indices(50, 4, 20, random_state=3)
    assert len(splits) == 4
    for cal, test in splits:
        assert len(cal) == 20 and len(test) == 30
        assert np.array_equal(np.sort(np.r_[cal, test]), np.arange(50))
    assert not np.array_equal(splits[0][0], splits[1][0])
    again = split_indices(50, 4, 20, random_state=3)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(splits, again))
    # documented rule: default_rng([seed, s]).permutation
    assert np.array_equal(splits[2][0], np.random.default_rng([3, 2]).permutation(50)[:20])


def test_per_split_values_match_direct_computation():
    x, y = make_data()
    res = compare_methods(x, y, ["test-fixed-t", "ts"], n_splits=3, cal_size=150, random_state=7)
    assert [r.label for r in res.rows] == [UNCALIBRATED, "test-fixed-t", "ts"]
    for s, (cal, test) in enumerate(split_indices(len(y), 3, 150, random_state=7)):
        expected = {
            UNCALIBRATED: softmax(x[test]),
            "test-fixed-t": softmax(x[test] / 2.0),
            "ts": TemperatureScaling().fit(x[cal], y[cal]).predict_proba(x[test]),
        }
        for label, probs in expected.items():
            for m, v in direct_metrics(probs, y[test]).items():
                assert res[label].values[m][s] == pytest.approx(v, rel=1e-12, abs=1e-15), (label, m)
        assert res["test-fixed-t"].values["cal_nll"][s] == pytest.approx(nll(softmax(x[cal] / 2.0), y[cal]))
        assert res[UNCALIBRATED].values["cal_nll"][s] == pytest.approx(nll(softmax(x[cal]), y[cal]))
        assert res[UNCALIBRATED].values["fit_seconds"][s] is None
        assert res["ts"].values["fit_seconds"][s] > 0
    row = res["ts"]
    v = np.array(row.values["smece"])
    assert row.mean("smece") == pytest.approx(v.mean())
    assert row.se("smece") == pytest.approx(v.std(ddof=1) / np.sqrt(3))
    assert row.n_ok == 3 and row.error is None
    assert res["test-fixed-t"].warnings == ["UserWarning: fake fit warning"]


def test_deterministic_and_seed_dependent():
    x, y = make_data(1)
    a = compare_methods(x, y, ["ts"], n_splits=2, cal_size=200, random_state=0).to_dict()
    b = compare_methods(x, y, ["ts"], n_splits=2, cal_size=200, random_state=0).to_dict()
    c = compare_methods(x, y, ["ts"], n_splits=2, cal_size=200, random_state=1).to_dict()
    for d in (a, b, c):
        for row in d["per_split"].values():
            row["values"].pop("fit_seconds")
        for row in d["summary"]:
            row.pop("fit_seconds_mean"), row.pop("fit_seconds_se")
    assert a == b and a != c


def test_fixed_test_set_is_one_split():
    x, y = make_data(2)
    xt, yt = make_data(3, n=300)
    res = compare_methods(x, y, ["ts"], test_logits=xt, test_labels=yt, n_splits=10, cal_size=5000)
    assert res.fixed_sets and res.n_splits == 1 and res.cal_size == 400 and res.test_size == 300
    probs = TemperatureScaling().fit(x, y).predict_proba(xt)
    assert res["ts"].values["nll"] == [pytest.approx(nll(probs, yt), rel=1e-12)]
    assert res["ts"].se("nll") is None
    assert "fixed calibration/test sets" in res.to_text()


def test_probs_input_is_log_of_probs():
    x, y = make_data(4)
    p = softmax(x)
    a = compare_methods(np.log(p), y, ["ts"], n_splits=2, cal_size=200)
    b = compare_methods(p, y, ["ts"], n_splits=2, cal_size=200, input_kind="probs")
    for m in ("error", "smece", "nll", "brier"):
        assert a["ts"].values[m] == pytest.approx(b["ts"].values[m], rel=1e-9)
    with pytest.raises(ValueError, match="input_kind='probs'"):
        compare_methods(p, y, ["ts"], n_splits=1, cal_size=200)


# ------------------------------------------------------------------ failures are results
def test_failing_methods_are_recorded_not_raised():
    x, y = make_data(5)
    splits = split_indices(len(y), 6, 150, random_state=0)
    odd = [bool(y[cal][0] % 2) for cal, _ in splits]
    assert any(odd) and not all(odd)  # the data exercises partial failure
    res = compare_methods(x, y, ["test-flaky", "test-nan", "grouped-ts", "ts"], n_splits=6, cal_size=150)
    flaky = res["test-flaky"]
    assert flaky.n_ok == odd.count(False)
    assert [e is not None for e in flaky.errors] == odd
    assert flaky.error.startswith(f"failed on {odd.count(True)}/6 splits: RuntimeError: odd first label")
    ok_values = [v for v, bad in zip(flaky.values["nll"], odd) if not bad]
    assert flaky.mean("nll") == pytest.approx(np.mean(ok_values))
    nan_row = res["test-nan"]
    assert nan_row.n_ok == 0 and "NaN" in nan_row.error and nan_row.mean("nll") is None
    assert "domains" in res["grouped-ts"].error
    assert res["ts"].n_ok == 6
    text = res.to_text()
    assert f"test-flaky [{odd.count(False)}/6]" in text and "! test-nan: failed on 6/6" in text
    # no NaN anywhere in the machine-readable outputs
    d = json.loads(res.to_json())
    assert d["per_split"]["test-nan"]["values"]["nll"] == [None] * 6
    rows = list(csv.DictReader(io.StringIO(res.to_csv())))
    assert [r["method"] for r in rows] == [UNCALIBRATED, "test-flaky", "test-nan", "grouped-ts", "ts"]
    assert rows[2]["nll_mean"] == "" and "NaN" in rows[2]["error"]
    assert float(rows[4]["nll_mean"]) == pytest.approx(res["ts"].mean("nll"), rel=1e-15)


def test_bad_arguments_raise_clear_errors():
    x, y = make_data(6, n=60)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        compare_methods(x, y, ["ts", "nope"], n_splits=1, cal_size=30)
    with pytest.raises(ValueError, match="duplicates"):
        compare_methods(x, y, ["ts", "ts"], n_splits=1, cal_size=30)
    with pytest.raises(ValueError, match="cal_size"):
        compare_methods(x, y, ["ts"], n_splits=1, cal_size=60)
    with pytest.raises(ValueError, match="n_splits"):
        compare_methods(x, y, ["ts"], n_splits=0, cal_size=30)
    with pytest.raises(ValueError, match="test_logits, test_labels"):
        compare_methods(x, y, ["ts"], test_logits=x)
    with pytest.raises(ValueError, match="test_logits: expected 5 classes"):
        compare_methods(x, y, ["ts"], test_logits=x[:, :3], test_labels=y % 3)
    with pytest.raises(ValueError, match="labels"):
        compare_methods(x, y[:-1], ["ts"], n_splits=1, cal_size=30)
    with pytest.raises(TypeError, match="methods"):
        compare_methods(x, y, [3], n_splits=1, cal_size=30)


def test_labels_params_and_comma_string():
    x, y = make_data(7, n=100)
    res = compare_methods(x, y, [("t3", "test-fixed-t", {"temperature": 3.0}), "ts"], n_splits=1, cal_size=50)
    assert res["t3"].params == {"temperature": 3.0}
    cal, test = split_indices(100, 1, 50)[0]
    assert res["t3"].values["nll"][0] == pytest.approx(nll(softmax(x[test] / 3.0), y[test]))
    res2 = compare_methods(x, y, "ts,uncalibrated", n_splits=1, cal_size=50)
    assert [r.label for r in res2.rows] == [UNCALIBRATED, "ts"]


def test_format_cell():
    assert format_cell(0.12345, 0.0011, percent=True, digits=2) == "12.35 ± 0.11"
    assert format_cell(1.5, None) == "1.5000"
    assert format_cell(None, None) == "–"
    assert set(METRICS) == {"error", "acc_change", "smece", "ece_em", "ece_ew", "ece_bc", "ece_lower",
                            "kuiper_reject", "nll", "brier", "cal_nll", "fit_seconds"}


# ------------------------------------------------------------------ invariants
@given(seed=st.integers(0, 10_000), n_splits=st.integers(1, 3), frac=st.floats(0.2, 0.8))
@settings(max_examples=10)
def test_temperature_scaling_rows_obey_their_invariants(seed, n_splits, frac):
    """TS keeps the arg-max (error rate equal to uncalibrated on every split) and contains
    T = 1, so its fitted calibration-set NLL is never above the uncalibrated one."""
    x, y = make_data(seed, n=120, k=3)
    cal_size = int(frac * 120)
    res = compare_methods(x, y, ["ts"], n_splits=n_splits, cal_size=cal_size, random_state=seed)
    base, ts = res[UNCALIBRATED], res["ts"]
    assert ts.values["error"] == base.values["error"]
    assert all(a <= b + 1e-9 for a, b in zip(ts.values["cal_nll"], base.values["cal_nll"]))
    for row in (base, ts):
        for m in ("smece", "ece_em", "ece_ew"):
            assert all(0.0 <= v <= 1.0 for v in row.values[m])
        se = row.se("nll")
        assert (se is None) == (n_splits == 1) and (se is None or se >= 0)


def test_real_densenet_cifar100_two_splits():
    data = np.load(require_shared_data("cifar", "densenet-bc-100-cifar-100.npz"))
    res = compare_methods(data["predictions"], data["ground_truth"], ["ts"], n_splits=2, cal_size=5000,
                          input_kind="probs")
    base, ts = res[UNCALIBRATED], res["ts"]
    # the issue measured uncalibrated ECE ~ 14.2% on these outputs; TS brings it to a few %
    assert 0.12 < base.mean("ece_ew") < 0.16 and 0.12 < base.mean("smece") < 0.16
    assert ts.mean("smece") < 0.04 and ts.mean("nll") < base.mean("nll")
    assert ts.values["error"] == base.values["error"]


# ------------------------------------------------------------------ side inputs and parallel splits
def _without_times(res):
    d = res.to_dict()
    for row in d["per_split"].values():
        row["values"].pop("fit_seconds")
    for row in d["summary"]:
        row.pop("fit_seconds_mean"), row.pop("fit_seconds_se")
    return d


def test_jobs_give_results_identical_to_one_process():
    x, y = make_data(8, n=300, k=4)
    methods = ["ts", "vs", "pb", "ts+pb", "grouped-ts"]  # grouped-ts fails (no domains): errors too
    one = compare_methods(x, y, methods, n_splits=3, cal_size=150, random_state=2, jobs=1)
    two = compare_methods(x, y, methods, n_splits=3, cal_size=150, random_state=2, jobs=2)
    assert _without_times(one) == _without_times(two)
    assert two["ts+pb"].fallback == one["ts+pb"].fallback and len(one["ts+pb"].fallback) == 3
    assert all(f is None for f in one["ts"].fallback)
    with pytest.raises(ValueError, match="jobs"):
        compare_methods(x, y, ["ts"], n_splits=1, cal_size=150, jobs=0)


def test_domains_reach_grouped_methods_split_with_the_logits():
    from confcal.calibrators import GroupedTemperatureScaling

    x, y = make_data(9, n=300, k=4)
    dom = np.where(np.arange(300) % 3 == 0, "a", "b")
    x[dom == "a"] *= 3.0  # one domain much more over-confident
    res = compare_methods(x, y, ["grouped-ts", "ts"], n_splits=2, cal_size=150, domains=dom)
    assert res["grouped-ts"].n_ok == 2 and res["ts"].n_ok == 2  # ts does not take domains: not given them
    for s, (cal, test) in enumerate(split_indices(300, 2, 150)):
        probs = GroupedTemperatureScaling().fit(x[cal], y[cal], domains=dom[cal]).predict_proba(
            x[test], domains=dom[test])
        assert res["grouped-ts"].values["nll"][s] == pytest.approx(nll(probs, y[test]), rel=1e-12)


def test_features_reach_feature_clipping():
    from confcal.calibrators import FeatureClipping

    rng = np.random.default_rng(10)
    f = rng.normal(size=(300, 6)) * 2
    w, b = rng.normal(size=(4, 6)), rng.normal(size=4)
    x = f @ w.T + b
    y = np.array([rng.choice(4, p=row) for row in softmax(x / 2)])
    res = compare_methods(x, y, ["fc"], n_splits=2, cal_size=150, features=f)
    assert res["fc"].n_ok == 2
    cal, test = split_indices(300, 2, 150)[1]
    probs = FeatureClipping().fit(x[cal], y[cal], features=f[cal]).predict_proba(x[test], features=f[test])
    assert res["fc"].values["nll"][1] == pytest.approx(nll(probs, y[test]), rel=1e-12)
    # a fixed test set needs its own side inputs
    with pytest.raises(ValueError, match="test_features, features"):
        compare_methods(x, y, ["fc"], test_logits=x, test_labels=y, features=f)
    fixed = compare_methods(x[:150], y[:150], ["fc"], test_logits=x[150:], test_labels=y[150:], features=f[:150],
                            test_features=f[150:])
    assert fixed["fc"].n_ok == 1
    with pytest.raises(ValueError, match="test_features, test_domains: only with a fixed test set"):
        compare_methods(x, y, ["fc"], n_splits=1, cal_size=150, test_features=f)
    with pytest.raises(ValueError, match="features"):
        compare_methods(x, y, ["fc"], n_splits=1, cal_size=150, features=f[:10])
