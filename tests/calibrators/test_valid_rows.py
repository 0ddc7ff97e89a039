"""Valid rows never raise (issue 21): every registered method's predict_proba gives finite rows that
sum to 1 on every row input validation accepts: one-hot probabilities and exact zeros (-inf logits),
float32-limit values. For the PB family the value on an infeasible masked box is the limit as the
zero probabilities go to 0+, checked against the operator on finite logits far below the rest."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from confcal.calibrators import METHODS, CalibrationWarning
from confcal.calibrators._fit.links import box_probs
from confcal.ops import bcsoftmax, ubsoftmax
from tests.calibrators.test_common import BOX, GEO, ML, data, make

ALL = sorted(METHODS)
F32 = float(np.finfo(np.float32).max)
K = 3


@pytest.fixture(scope="module")
def fitted():
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ALL:
            x, y, side = data(name, k=K)
            out[name] = (make(name).fit(x, y, **side), side)
    return out


_entry = st.one_of(st.just(-np.inf), st.just(0.0), st.just(F32), st.just(-F32), st.just(1.2e-38),
                   st.floats(-50, 50))


@st.composite
def _logit_rows(draw):
    """(n, K) logits with at least one finite entry per row: one-hot log-probabilities, exact zeros
    (-inf), float32 limits, ordinary values."""
    n = draw(st.integers(1, 6))
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(["one-hot", "zeros", "mixed"]))
        if kind == "one-hot":
            row = [-np.inf] * K
            row[draw(st.integers(0, K - 1))] = 0.0
        elif kind == "zeros":
            row = [draw(st.floats(-5, 5)) if draw(st.booleans()) else -np.inf for _ in range(K)]
            if all(v == -np.inf for v in row):
                row[0] = 0.0
        else:
            row = [draw(_entry) for _ in range(K)]
            if all(v == -np.inf for v in row):
                row[-1] = 1.0
        rows.append(row)
    return np.array(rows, dtype=np.float64)


def _takes(cal) -> set:
    return set(cal.side_inputs) | set(getattr(cal, "optional_side_inputs", ()))


def _check(p, n, k):
    assert p.shape == (n, k) and np.all(np.isfinite(p)) and np.all(p >= 0) and np.all(p <= 1 + 1e-12)
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=0, atol=1e-9)


# sigmoid heads (ML) refuse non-finite logits by contract, so these draws are mostly outside their input
@pytest.mark.parametrize("name", [m for m in ALL if m not in BOX | GEO | ML])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(z=_logit_rows())
def test_every_method_gives_finite_rows_summing_to_one(fitted, name, z):
    cal, side = fitted[name]
    side = {k: v[:z.shape[0]] for k, v in side.items() if k in _takes(cal)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            p = cal.predict_proba(z, **side)
        except ValueError as exc:  # rows validation refuses are outside the claim (they look like probabilities)
            if "look like probabilities" in str(exc):
                reject()
            raise
    _check(p, z.shape[0], K)


@pytest.mark.parametrize("name", sorted(BOX | GEO))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.lists(st.sampled_from([0.0, 1.0, 1e-45, 1 - 2**-53, 0.5, 1.2e-38]), min_size=1, max_size=6))
def test_box_methods_on_scores_at_0_and_1(fitted, name, s):
    cal, side = fitted[name]
    s = np.array(s)
    side = {k: v[:s.shape[0]] for k, v in side.items() if k in _takes(cal)}
    _check(cal.predict_proba(s, **side), s.shape[0], 2)


@pytest.mark.parametrize("mode", ["upper", "both"])
@given(b=st.floats(0.34, 0.99), a=st.floats(0.0, 0.33), free=st.integers(1, 2), k=st.integers(3, 7),
       seed=st.integers(0, 2**16))
@settings(max_examples=80, deadline=None)
# the full masked box 0.34 + 2 * 0.33 == 1 with Python-float bounds: the op rounded the bounds of the masked
# classes to float32 (row sum 1 + 3e-8) and refused the row as "logits too far apart for exp"
@example(b=0.34, a=0.33, free=1, k=3, seed=0)
def test_masked_box_value_is_the_limit_of_finite_logits(mode, b, a, free, k, seed):
    """Oracle: the operator itself on finite logits whose 'zero' classes sit 60 nats below the
    others (all at one rate), where the box is feasible and the answer is exact."""
    b = max(b, 1.0 / k + 1e-3)
    a = 0.0 if mode == "upper" else min(a, (1.0 - 1e-3) / k)
    rng = np.random.default_rng(seed)
    g = torch.tensor(rng.normal(size=(1, k)))
    masked = torch.zeros(1, k, dtype=torch.bool)
    masked[0, free:] = True
    gi = g.masked_fill(masked, -torch.inf)
    near = g.masked_fill(masked, float(g.min()) - 60.0)
    near[0, free:] = float(g[0, :free].min()) - 60.0  # the zero classes at one rate
    op = (lambda x: ubsoftmax(x, b)) if mode == "upper" else (lambda x: bcsoftmax(x, a, b))
    got = box_probs(mode, gi, a, b, check=True)
    np.testing.assert_allclose(got.numpy(), op(near).numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(float(got.sum()), 1.0, rtol=1e-12)


def test_pb_upper_on_a_one_hot_probability_row():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 400)
    z = rng.normal(size=(400, 4)) + 3 * np.eye(4)[y]
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    cal = METHODS["pb-upper"](input_kind="probs").fit(p, y)
    q = cal.predict_proba(np.array([[1.0, 0.0, 0.0, 0.0]]))
    b = cal.upper_
    np.testing.assert_allclose(q, [[b, (1 - b) / 3, (1 - b) / 3, (1 - b) / 3]], rtol=1e-12)
