"""Input conventions a scikit-learn user expects (issue 44): string class labels are mapped through
``classes_`` in sorted order, as a scikit-learn classifier orders its columns; integer labels stay
column indices exactly as before; a float32 DataFrame gives float32 probabilities (the output dtype
follows the input)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal import load_calibrator
from confcal.calibrators import METHODS, TemperatureScaling

NAMES = np.array(["cat", "dog", "frog", "horse"])  # sorted, as np.unique (and classes_) orders them


def _data(n=400, k=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % k)  # every class present
    z = rng.normal(size=(n, k)) + 2.5 * np.eye(k)[y]
    return z, y


def _fit(method, z, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fit warnings on small data are not the subject here
        return METHODS[method]().fit(z, y)


@pytest.mark.parametrize("method", ["ts", "isotonic", "histogram-binning", "beta", "vs"])
def test_string_labels_are_column_indices_in_sorted_order(method):
    if method == "vs":
        pytest.importorskip("torch")
    z, y = _data()
    by_index, by_name = _fit(method, z, y), _fit(method, z, NAMES[y])
    assert by_index.classes_.tolist() == [0, 1, 2, 3]
    assert by_name.classes_.tolist() == NAMES.tolist()
    # the same fit: the names only relabel the columns (same arithmetic, so equal to rounding)
    np.testing.assert_allclose(by_name.predict_proba(z), by_index.predict_proba(z), rtol=1e-12, atol=1e-15)
    assert by_name.predict(z).tolist() == NAMES[by_index.predict(z)].tolist()
    assert by_name.score(z, NAMES[y]) == pytest.approx(by_index.score(z, y), rel=1e-12)
    assert "classes" not in by_index.fit_record_ and by_name.fit_record_["classes"] == NAMES.tolist()


def test_against_a_scikit_learn_classifier():
    """The oracle: a scikit-learn classifier trained on string labels orders its decision_function
    columns by its classes_; TS fitted on those logits with the same strings agrees with it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import LabelEncoder

    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 5))
    names = np.array(["zebra", "ant", "moose"])  # not in sorted order: classes_ sorts them
    y = names[np.argmax(X[:, :3] + 0.8 * rng.normal(size=(600, 3)), axis=1)]
    clf = LogisticRegression().fit(X[:300], y[:300])
    logits = clf.decision_function(X)
    cal = TemperatureScaling().fit(logits[:300], y[:300])
    assert cal.classes_.tolist() == clf.classes_.tolist() == ["ant", "moose", "zebra"]
    assert cal.predict(logits[300:]).tolist() == clf.predict(X[300:]).tolist()  # TS keeps the arg-max
    codes = LabelEncoder().fit(clf.classes_).transform(y)
    ref = TemperatureScaling().fit(logits[:300], codes[:300])
    assert cal.temperature_ == pytest.approx(ref.temperature_, rel=1e-12)
    assert cal.score(logits[300:], y[300:]) == pytest.approx(ref.score(logits[300:], codes[300:]), rel=1e-12)


@pytest.mark.parametrize("as_", ["list", "object", "bytes", "series"])
def test_string_label_containers(as_):
    z, y = _data()
    labels = {"list": lambda: NAMES[y].tolist(), "object": lambda: NAMES[y].astype(object),
              "bytes": lambda: NAMES[y].astype("S"),
              "series": lambda: pytest.importorskip("pandas").Series(NAMES[y])}[as_]()
    cal = TemperatureScaling().fit(z, labels)
    assert cal.classes_.tolist() == NAMES.tolist()
    assert cal.temperature_ == pytest.approx(TemperatureScaling().fit(z, y).temperature_, rel=1e-12)


def test_string_labels_survive_the_manifest():
    z, y = _data()
    cal = TemperatureScaling().fit(z, NAMES[y])
    back = load_calibrator(cal.to_dict())
    assert back.classes_.tolist() == NAMES.tolist()
    assert back.predict(z).tolist() == cal.predict(z).tolist()
    assert back.score(z, NAMES[y]) == pytest.approx(cal.score(z, NAMES[y]), rel=1e-12)


@pytest.mark.parametrize("bad,why", [(["cat", "dog", "frog"], "4 class labels"),
                                     (["dog", "cat", "frog", "horse"], "sorted order"),
                                     (["cat", "cat", "frog", "horse"], "sorted order")])
def test_damaged_classes_in_a_manifest_are_named(bad, why):
    z, y = _data()
    d = TemperatureScaling().fit(z, NAMES[y]).to_dict()
    d["fit"]["classes"] = bad
    with pytest.warns(UserWarning, match=r"fit\.classes.*" + why):
        back = load_calibrator(d)
    assert back.classes_.tolist() == [0, 1, 2, 3]  # a damaged record is not used


def test_missing_class_is_refused_naming_the_counts():
    z, y = _data()
    y = np.where(y == 3, 2, y)  # "horse" never appears: which column would it be?
    with pytest.raises(ValueError, match=r"^labels: .*expected 4 distinct labels .*got 3 \('cat', 'dog', 'frog'\)"):
        TemperatureScaling().fit(z, NAMES[y])


def test_unknown_label_at_score_is_refused():
    z, y = _data()
    cal = TemperatureScaling().fit(z, NAMES[y])
    labels = NAMES[y].astype(object)
    labels[7] = "wolf"
    with pytest.raises(ValueError, match=r"^labels: expected one of the fitted classes_ .*got 'wolf' at index 7"):
        cal.score(z, labels)


def test_integer_labels_unchanged():
    """Integer labels keep their meaning (column indices): no sorting, absent classes allowed."""
    z, y = _data()
    y = np.where(y == 1, 3, y)  # class 1 absent: still 4 columns, classes_ arange(4)
    cal = TemperatureScaling().fit(z, y)
    assert cal.classes_.tolist() == [0, 1, 2, 3]
    assert cal.predict(z).dtype.kind == "i"
    assert "classes" not in cal.fit_record_ and "classes" not in load_calibrator(cal.to_dict()).fit_record_


@settings(max_examples=25, deadline=None)
@given(perm=st.permutations(range(4)), seed=st.integers(0, 2 ** 16))
def test_any_naming_is_the_sorted_encoding(perm, seed):
    """Property: whatever strings name the classes, the fit equals the integer fit on their ranks."""
    z, y = _data(n=120, seed=seed)
    names = np.array([f"c{p}" for p in perm])  # class i is named c{perm[i]}: it maps to column rank(name)
    ranks = np.argsort(np.argsort(names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small draw may end T on a search bound: the same for both fits
        cal = TemperatureScaling().fit(z, names[y])
        ref = TemperatureScaling().fit(z, ranks[y])
    assert cal.classes_.tolist() == sorted(names.tolist())
    assert cal.temperature_ == pytest.approx(ref.temperature_, rel=1e-12)


@pytest.mark.parametrize("dtypes,want", [(["float32"] * 4, np.float32), (["float64"] * 4, np.float64),
                                         (["float32", "float32", "float32", "float64"], np.float64)])
@pytest.mark.parametrize("method", ["ts", "isotonic"])
def test_dataframe_output_dtype_follows_the_input(dtypes, want, method):
    pd = pytest.importorskip("pandas")
    z, y = _data()
    cal = _fit(method, z, y)
    df = pd.DataFrame({f"logit_{j}": z[:, j].astype(dt) for j, dt in enumerate(dtypes)})
    out = cal.predict_proba(df)
    assert out.dtype == want
    tol = 1e-5 if want == np.float32 else 1e-12  # float32 arithmetic against the float64 reference
    np.testing.assert_allclose(out, cal.predict_proba(df.to_numpy(np.float64)), rtol=tol, atol=tol)
    assert cal.predict_proba(df, dtype=np.float64).dtype == np.float64


def _numbered(k=12, n=600, seed=3):
    z, y = _data(n=n, k=k, seed=seed)
    return z, y


def test_integer_strings_in_text_order_warn_naming_the_way_out():
    # regression: y.astype(str) sorts '10' before '2', so TS was fitted against the wrong columns in silence
    # (CIFAR-100 DenseNet: T = 17.79 and accuracy 0.0956 against T = 2.12 and 0.7544 with integer labels)
    z, y = _numbered()
    with pytest.warns(UserWarning, match=r"^labels: every string label is an integer.*'10' is column 2, before "
                                         r"'2'.*pass integer labels \(labels\.astype\(int\)\)") as rec:
        cal = TemperatureScaling().fit(z, y.astype(str))
    assert [w.filename for w in rec if "every string label" in str(w.message)] == [__file__]  # the fit's line
    assert cal.classes_.tolist()[:3] == ["0", "1", "10"]  # the documented order (scikit-learn's classes_) holds
    ref = TemperatureScaling().fit(z, y)
    assert not np.isclose(cal.temperature_, ref.temperature_, rtol=1e-3)  # what the warning is about


@pytest.mark.parametrize("names", [
    [str(i) for i in range(10)],                    # one digit: text order is numeric order
    [f"{i:02d}" for i in range(12)],                # zero-padded: the same
    [f"c{i}" for i in range(12)],                   # not all integers: the text is the name
    ["-1", "0", "3", "7"],                          # a negative integer, text order numeric here
])
def test_no_warning_when_the_text_order_is_the_numeric_order(names):
    k = len(names)
    z, y = _numbered(k=k, n=30 * k)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(bound|search).*")  # small draws: not the subject
        cal = TemperatureScaling().fit(z, np.array(names)[y])
    assert cal.classes_.tolist() == sorted(names)


@settings(max_examples=30, deadline=None)
@given(ints=st.lists(st.integers(-50, 150), min_size=2, max_size=12, unique=True))
def test_the_warning_fires_exactly_when_text_and_numeric_order_differ(ints):
    from confcal.calibrators.protocol.class_labels import encode_class_labels

    labels = np.array([str(v) for v in ints])
    differ = sorted(labels.tolist()) != [str(v) for v in sorted(ints)]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        idx, classes = encode_class_labels(labels, len(ints))
    assert any("every string label is an integer" in str(w.message) for w in rec) == differ
    assert classes.tolist() == sorted(labels.tolist()) and (classes[idx] == labels).all()
