"""Box-constrained softmax operators: BCSoftmax, UBSoftmax and LBSoftmax.

Source: Atarashi et al., "Probability Bounding: Post-Hoc Calibration via
Box-Constrained Softmax", arXiv 2506.10572 (section 3.2, appendices A.1, D, E).

``bcsoftmax(g; a, b, tau)`` is the maximiser of ``g.p + tau * H(p)`` over the
probability simplex intersected with the box ``a <= p <= b`` (eq. 8, 19).  Its
KKT conditions say that there is one scalar ``nu`` per row with

    p_i = clip(exp(g_i / tau - nu), a_i, b_i),     sum_i p_i = 1,

so every coordinate is ``a_i``, ``b_i`` or ``exp(g_i / tau) * s / Z_F`` with
``s = 1 - (sum of the clamped bounds)`` and ``Z_F`` the sum of ``exp(g_j / tau)``
over the free coordinates ``F`` (eq. 24).  ``nu`` is the root of the monotone
piecewise function ``f(nu) = sum_i clip(exp(x_i - nu), a_i, b_i) - 1``, found
by one of two exact solvers:

- up to ``_SORT_MAX_K`` classes, a sort-based one in the spirit of the paper's
  Algorithms 1-2: sort the 2K breakpoints once, evaluate f at all of them with
  cumulative sums, and read off the piece holding the root - a fixed number
  of batched ops, whatever the data (small shapes are bound by per-op cost);
- above that (``torch.sort`` is slow on CPU), a safeguarded Newton iteration:
  a Newton step *is* the closed form of eq. 24 for the current clamped sets,
  so it stops, exactly, as soon as the sets stop changing; its last few slow
  rows are handed to the sort-based solver.

Both finish by applying eq. 24 to the final clamped sets, with the free set
renormalised exactly.  Memory is O(N K), there is no Python loop over rows
(the sort-based solver walks blocks of rows to bound its temporaries), and
the backward pass is the O(K) vector-Jacobian product of eq. 43-45.

On CPU, float32/float64 inputs go to a compiled kernel instead (numba,
:mod:`._bcsoftmax_kernel`): the same breakpoint rule without the sort, in
float64, and the same backward, one row at a time in one dispatch instead of
about 50 torch calls per pass.  A batch with a row it does not handle (NaN,
infeasible, masked, a wide spread) goes to the torch solvers, which raise or
solve as before; so do other devices and torch.func transforms.

The code: argument checks in :mod:`._bcsoftmax_checks`, the sort-based
solver in :mod:`._bcsoftmax_sort`, Newton in :mod:`._bcsoftmax_newton`,
dispatch and autograd in :mod:`._bcsoftmax_dispatch`.
"""

from __future__ import annotations

from ._bcsoftmax_dispatch import _apply

__all__ = ["bcsoftmax", "ubsoftmax", "lbsoftmax"]


def bcsoftmax(logits, lower, upper, *, tau=1.0, dim=-1, check=True):
    """Box-constrained softmax (BCSoftmax, eq. 8 of Atarashi et al. 2025).

    Returns ``argmax_{p in simplex, lower <= p <= upper} (logits / tau).p + H(p)``
    along ``dim``, computed exactly (to rounding) and differentiably.

    Args:
        logits: float tensor of any shape with ``K = logits.shape[dim] >= 1``
            classes; any float dtype (float16/bfloat16 are computed in float32
            and returned in the input dtype) and any device.  ``-inf`` marks a
            masked class, whose probability is its lower bound.
        lower, upper: the box.  A Python float or 0-d tensor (the same bound for
            every class; this is the fast path), a 1-D tensor of length ``K``
            (one bound per class, laid along ``dim``), or a tensor broadcastable
            to ``logits`` in its original layout.  Feasible bounds satisfy
            ``0 <= lower <= upper <= 1`` and ``sum(lower) <= 1 <= sum(upper)``
            per row.
        tau: temperature > 0: a Python float or a tensor of the same kinds as
            the bounds (e.g. shape ``(N, 1)`` for one temperature per sample).
        dim: the class dimension.
        check: validate inputs (on by default).  With ``check=False``
            infeasible inputs give unspecified (but finite for finite inputs)
            results; use it only in hot loops whose bounds are feasible by
            construction.

    Returns:
        Tensor of the shape and dtype of ``logits``; each slice along ``dim``
        lies in the box and sums to one.

    Raises:
        TypeError: ``logits`` is not a floating-point tensor.
        ValueError: NaN or ``+inf`` logits; a bound below 0 or above 1;
            ``lower > upper``; ``sum(lower) > 1`` or ``sum(upper) < 1`` beyond
            a tolerance of ``max(K, 4) * eps`` of the working dtype (bounds
            that are feasible up to rounding are accepted); a row whose
            unmasked classes cannot reach total probability 1; a shape that
            does not broadcast; ``tau <= 0``.  Messages name the row (index into
            the batch dimensions) and the class.

    Gradients flow to ``logits``, ``lower``, ``upper`` and ``tau`` through a
    custom autograd function whose backward is the O(K) product with the
    Jacobians of eq. 43-45.  ``torch.func.vmap`` is not supported (the forward
    iterates with data-dependent stopping); ``torch.func.grad`` works.

    On CPU, float32/float64 inputs are solved (in float64) by a numba-compiled
    kernel, compiled on the first call (a few seconds, once: the machine code
    is cached on disk); other devices use batched torch ops.  Both give the
    exact answer.
    """
    return _apply("bcsoftmax", logits, lower, upper, tau, dim, check)


def ubsoftmax(logits, upper, *, tau=1.0, dim=-1, check=True):
    """Upper-bounded softmax (UBSoftmax): :func:`bcsoftmax` with ``lower = 0``.

    Atarashi et al. 2025, eq. 19 and Algorithm 1.  ``upper`` may be a Python
    float, a 0-d tensor, a length-``K`` tensor or a tensor broadcastable to
    ``logits``; feasibility needs ``0 <= upper <= 1`` and ``sum(upper) >= 1``.
    Shapes, dtypes, gradients and errors as in :func:`bcsoftmax`.
    """
    return _apply("ubsoftmax", logits, 0.0, upper, tau, dim, check)


def lbsoftmax(logits, lower, *, tau=1.0, dim=-1, check=True):
    """Lower-bounded softmax (LBSoftmax): :func:`bcsoftmax` with ``upper = 1``.

    Atarashi et al. 2025, eq. 19 and Algorithm 2.  ``lower`` may be a Python
    float, a 0-d tensor, a length-``K`` tensor or a tensor broadcastable to
    ``logits``; feasibility needs ``0 <= lower <= 1`` and ``sum(lower) <= 1``.
    Shapes, dtypes, gradients and errors as in :func:`bcsoftmax`.
    """
    return _apply("lbsoftmax", logits, lower, 1.0, tau, dim, check)
