"""Input validation: every bad input gets a clear error naming the argument and what was wrong."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import softmax

from confcal._validation import check_labels, check_logits, check_probs
from confcal.calibrators import TemperatureScaling


def test_nan_and_posinf_name_the_first_bad_row():
    z = np.zeros((5, 3))
    z[3, 1] = np.nan
    z[4, 0] = np.inf
    with pytest.raises(ValueError, match="row 3"):
        check_logits(z)
    with pytest.raises(ValueError, match="row 4"):
        check_logits(np.where(np.isnan(z), 0, z))


def test_all_minus_inf_row():
    with pytest.raises(ValueError, match="row 0"):
        check_logits(np.array([[-np.inf, -np.inf, -np.inf]]))
    # partially masked rows are fine
    assert check_logits(np.array([[2.0, 0.0, -np.inf]])).shape == (1, 3)


def test_probabilities_passed_as_logits():
    p = softmax(np.array([[3.0, 0.0, 0.0]]), axis=1)
    with pytest.raises(ValueError, match="look like probabilities.*input_kind='probs'"):
        TemperatureScaling().fit(p, [0])
    # ... and accepted with input_kind="probs" (their log)
    z = check_logits(p, input_kind="probs")
    np.testing.assert_allclose(z, np.log(p))
    # zero probabilities become masked classes
    assert np.isneginf(check_logits(np.array([[0.0, 1.0]]), input_kind="probs")[0, 0])


def test_probs_input_kind_rejects_non_probabilities():
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        check_logits(np.array([[2.0, -1.0]]), input_kind="probs")
    with pytest.raises(ValueError, match="sums to"):
        check_logits(np.array([[0.2, 0.2]]), input_kind="probs")
    with pytest.raises(ValueError, match="input_kind"):
        check_logits(np.zeros((2, 2)), input_kind="softmax")


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4)])
def test_wrong_rank(shape):
    with pytest.raises(ValueError, match=r"\(n_samples, n_classes\)"):
        check_logits(np.zeros(shape))


def test_empty_and_single_class():
    with pytest.raises(ValueError, match="at least 1 sample"):
        check_logits(np.zeros((0, 3)))
    # (n, 1) is a one-logit binary model (issue 40): the two-class rows [0, z] / [1 - p, p]
    z = np.array([[-2.0], [0.5]])
    np.testing.assert_array_equal(check_logits(z), [[0.0, -2.0], [0.0, 0.5]])
    np.testing.assert_allclose(np.exp(check_logits(np.array([[0.25]]), input_kind="probs")), [[0.75, 0.25]])
    with pytest.raises(ValueError, match="n_classes >= 2"):
        check_logits(np.zeros((4, 0)))


def test_non_numeric():
    with pytest.raises(TypeError, match="dtype"):
        check_logits(np.array([["a", "b"]]))


def test_labels_out_of_range_and_non_integer():
    with pytest.raises(ValueError, match=r"labels: expected values in \[0, 3\).*got 3 at index 1"):
        check_labels(np.array([0, 3]), 2, 3)
    with pytest.raises(ValueError, match="got -1"):
        check_labels(np.array([0, -1]), 2, 3)
    with pytest.raises(ValueError, match="non-integer"):
        check_labels(np.array([0.5, 1.0]), 2, 3)
    np.testing.assert_array_equal(check_labels(np.array([0.0, 2.0]), 2, 3), [0, 2])
    # the values as given, not after a cast to int64 (which wraps 2**64 - 1 to -1, 1e20 to -2**63)
    with pytest.raises(ValueError, match=r"got 18446744073709551615 at index 1; range seen \[0, 18446744073709551615\]"):
        check_labels(np.array([0, 2**64 - 1], dtype=np.uint64), 2, 3)
    with pytest.raises(ValueError, match=r"got 1e\+20 at index 0; range seen \[1.0, 1e\+20\]"):
        check_labels(np.array([1e20, 1.0]), 2, 3)
    with pytest.raises(ValueError, match=r"non-integer value 4.5 at index 0"):
        check_labels(np.array([4.5, 1.0]), 2, 3)


def test_n_classes_comes_from_logits_not_labels():
    # labels only use classes 0 and 1, the logits have 4 columns: fine, K = 4
    cal = TemperatureScaling().fit(np.random.default_rng(0).normal(size=(6, 4)), [0, 1, 0, 1, 0, 1])
    assert cal.n_classes_ == 4


def test_length_mismatch():
    with pytest.raises(ValueError, match="expected 3 labels"):
        TemperatureScaling().fit(np.zeros((3, 2)) + [[1, 0]], [0, 1])


def test_one_hot_labels():
    np.testing.assert_array_equal(check_labels(np.eye(3)[[2, 0]], 2, 3), [2, 0])
    with pytest.raises(ValueError, match="one-hot"):
        check_labels(np.array([[1, 1, 0], [0, 0, 1]]), 2, 3)
    with pytest.raises(ValueError, match="one-hot"):
        check_labels(np.array([[0.5, 0.5, 0], [0, 0, 1]]), 2, 3)


@pytest.mark.parametrize("name", ["ts", "grouped-ts"])
def test_one_hot_labels_fit_as_their_class_indices(name):
    """Temperature scaling's fit is a job over row batches (its later passes skip validation): one-hot
    labels once crashed there with an IndexError. The fit equals the fit on the class indices."""
    from confcal.calibrators import METHODS

    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 200)
    x = 3 * (rng.normal(size=(200, 5)) + np.eye(5)[y])
    side = {"domains": np.arange(200) % 2} if name == "grouped-ts" else {}
    a = METHODS[name]().fit(x, np.eye(5, dtype=int)[y], **side)
    b = METHODS[name]().fit(x, y, **side)
    np.testing.assert_allclose(a.predict_proba(x, **side), b.predict_proba(x, **side), rtol=1e-12)


def test_torch_inputs_any_float_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        z = check_logits(torch.tensor([[1.5, -2.0]], dtype=dtype))
        assert z.dtype in (np.float32, np.float64) and z.shape == (1, 2)


def test_check_probs_binary_and_errors():
    np.testing.assert_allclose(check_probs(np.array([0.2])), [[0.8, 0.2]])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        check_probs(np.array([1.2]))
    with pytest.raises(ValueError, match="NaN"):
        check_probs(np.array([[np.nan, 1.0]]))


@given(st.lists(st.integers(-5, 5), min_size=1, max_size=30), st.integers(2, 6))
def test_labels_property(labels, k):
    y = np.array(labels)
    if ((y >= 0) & (y < k)).all():
        np.testing.assert_array_equal(check_labels(y, len(y), k), y)
    else:
        with pytest.raises(ValueError, match="labels"):
            check_labels(y, len(y), k)


def test_boolean_labels_are_refused_naming_the_dtype():
    msg = r"^labels: expected integer class indices, got dtype bool$"
    with pytest.raises(TypeError, match=msg):
        check_labels(np.array([True, False]), 2, 2)
    with pytest.raises(TypeError, match=msg):
        check_labels(torch.tensor([True, False]), 2, 2)
    with pytest.raises(TypeError, match=msg):
        TemperatureScaling().fit(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([True, False]))
    # one-hot rows stored as bool are still one-hot rows
    np.testing.assert_array_equal(check_labels(np.eye(3, dtype=bool)[[2, 0]], 2, 3), [2, 0])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("method", ["ts", "vs"])
def test_posinf_logit_is_bad_logits_not_a_masked_label(method, weighted):
    from confcal.calibrators import METHODS

    rng = np.random.default_rng(0)
    z = rng.normal(size=(10, 100))
    z[7, 5] = np.inf
    w = np.ones(10) if weighted else None
    with pytest.raises(ValueError, match=r"^logits: .*found NaN/\+inf in row 7"):
        METHODS[method]().fit(z, np.full(10, 49), sample_weight=w)


@given(st.integers(2, 6), st.integers(1, 30), st.data())
def test_one_posinf_anywhere_names_its_row_in_the_streamed_fit(k, n, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    z = rng.normal(size=(n, k)) * 5
    row, col = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, k - 1))
    z[row, col] = np.inf
    labels = rng.integers(0, k, n)
    with pytest.raises(ValueError, match=rf"^logits: .*found NaN/\+inf in row {row}:"):
        TemperatureScaling().fit(z, labels)


def test_a_one_sample_1d_input_is_named_as_given():
    """predict_proba of one sample passed 1-D: the message names the shape the user passed (it once said
    (5, 2), the binary-head reading) and how to pass one sample."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 200)
    cal = TemperatureScaling().fit(3 * (rng.normal(size=(200, 5)) + np.eye(5)[y]), y)
    with pytest.raises(ValueError, match=r"fitted on 5 classes, got shape \(5,\) \(a 1-D .* pass shape \(1, 5\)\)"):
        cal.predict_proba(np.zeros(5))
