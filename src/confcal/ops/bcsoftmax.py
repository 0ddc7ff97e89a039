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
    """Box-constrained softmax (BCSoftmax).

    The probability vector that maximises ``(logits / tau) . p + H(p)`` over
    the simplex intersected with the box ``lower <= p <= upper``, along
    ``dim``; computed exactly (to rounding) and differentiably.  Its KKT
    conditions give ``p_i = clip(exp(logits_i / tau - nu), lower_i, upper_i)``
    with one scalar ``nu`` per row.

    Source: Atarashi et al., "Probability Bounding: Post-Hoc Calibration via
    Box-Constrained Softmax", arXiv 2506.10572 (2025), eq. 8; closed form on
    the clamped sets eq. 24; Jacobians eq. 43-45.

    Parameters
    ----------
    logits : torch.Tensor
        Floating-point tensor of any shape with ``K = logits.shape[dim] >= 1``
        classes, e.g. ``(n_samples, n_classes)``; any float dtype
        (float16/bfloat16 are computed in float32 and returned in the input
        dtype) and any device.  ``-inf`` marks a masked class, whose
        probability is its lower bound.
    lower, upper : float or torch.Tensor
        The box (probabilities, in ``[0, 1]``).  A Python float or 0-d tensor
        (the same bound for every class: the fast path), a 1-D tensor of
        length ``K`` (one bound per class, laid along ``dim``), or a tensor
        broadcastable to ``logits`` in its original layout.  Feasible bounds
        satisfy ``0 <= lower <= upper <= 1`` and
        ``sum(lower) <= 1 <= sum(upper)`` per row.
    tau : float or torch.Tensor, default=1.0
        Temperature ``> 0`` (the logits are divided by it): a Python float or
        a tensor of the same kinds as the bounds (e.g. shape
        ``(n_samples, 1)`` for one temperature per sample).
    dim : int, default=-1
        The class dimension.
    check : bool, default=True
        Validate the inputs.  With ``check=False`` infeasible inputs give
        unspecified (but finite for finite inputs) results; use it only in
        hot loops whose bounds are feasible by construction.

    Returns
    -------
    torch.Tensor
        The shape and dtype of ``logits``; each slice along ``dim`` lies in
        the box and sums to one.  A box with no room (``sum(lower) = 1`` or
        ``sum(upper) = 1`` up to the bounds' own rounding, ``2 * eps``) is the
        bound itself.

    Raises
    ------
    TypeError
        ``logits`` is not a floating-point tensor; a bound or ``tau`` is not a
        float or a tensor; ``dim`` is not an int.
    ValueError
        NaN or ``+inf`` logits; a bound below 0 or above 1;
        ``lower > upper``; ``sum(lower) > 1`` or ``sum(upper) < 1`` beyond a
        tolerance of ``max(K, 4) * eps`` of the working dtype (bounds that
        are feasible up to rounding are accepted); a row whose unmasked
        classes cannot reach total probability 1; a shape that does not
        broadcast; ``tau <= 0``; logits (divided by ``tau``) too far apart for
        ``exp`` to resolve in their dtype.  Messages name the row (index into
        the batch dimensions) and the class.

    See Also
    --------
    ubsoftmax : only an upper bound.
    lbsoftmax : only a lower bound.
    confcal.calibrators.ProbabilityBounding : fits the bounds.

    Notes
    -----
    Gradients flow to ``logits``, ``lower``, ``upper`` and ``tau`` through a
    custom autograd function whose backward is the O(K) product with the
    Jacobians of eq. 43-45.  ``torch.func.vmap`` is not supported (the
    forward iterates with data-dependent stopping); ``torch.func.grad``
    works.  On CPU, float32/float64 inputs are solved (in float64) by a
    numba-compiled kernel, compiled on the first call (a few seconds, once:
    the machine code is cached on disk); other devices use batched torch
    ops.  Both give the exact answer.

    Examples
    --------
    The softmax of ``[2, 0, 0]`` is ``[0.79, 0.11, 0.11]``; an upper bound of
    0.6 caps the first class and the other two share the remaining 0.4
    equally (their logits are equal):

    >>> import torch
    >>> from confcal.ops import bcsoftmax
    >>> bcsoftmax(torch.tensor([2.0, 0.0, 0.0]), 0.1, 0.6)
    tensor([0.6000, 0.2000, 0.2000])

    Per-class bounds and per-sample temperatures, on a batch; every row lies
    in its box and sums to one:

    >>> logits = torch.tensor([[3.0, 1.0, -2.0], [0.0, 0.0, 0.0]])
    >>> lower = torch.tensor([0.1, 0.0, 0.2])
    >>> p = bcsoftmax(logits, lower, 0.7, tau=torch.tensor([[1.0], [2.0]]))
    >>> p
    tensor([[0.7000, 0.1000, 0.2000],
            [0.3333, 0.3333, 0.3333]])
    >>> bool(((p >= lower) & (p <= 0.7)).all()), p.sum(-1).round(decimals=6).tolist()
    (True, [1.0, 1.0])

    It is differentiable; a class held at its bound gets no gradient from
    its own logit:

    >>> x = torch.tensor([2.0, 0.0, 0.0], requires_grad=True)
    >>> bcsoftmax(x, 0.1, 0.6)[0].backward()
    >>> x.grad
    tensor([0., 0., 0.])
    """
    return _apply("bcsoftmax", logits, lower, upper, tau, dim, check)


def ubsoftmax(logits, upper, *, tau=1.0, dim=-1, check=True):
    """Upper-bounded softmax (UBSoftmax): :func:`bcsoftmax` with ``lower = 0``.

    Source: Atarashi et al., arXiv 2506.10572 (2025), eq. 19 and Algorithm 1.

    Parameters
    ----------
    logits : torch.Tensor
        Floating-point tensor with the classes along ``dim``, e.g.
        ``(n_samples, n_classes)``; as in :func:`bcsoftmax`.
    upper : float or torch.Tensor
        Upper bounds: a Python float, a 0-d tensor, a length-``K`` tensor or
        a tensor broadcastable to ``logits``; feasible when
        ``0 <= upper <= 1`` and ``sum(upper) >= 1``.
    tau : float or torch.Tensor, default=1.0
        Temperature ``> 0``, as in :func:`bcsoftmax`.
    dim : int, default=-1
        The class dimension.
    check : bool, default=True
        Validate the inputs, as in :func:`bcsoftmax`.

    Returns
    -------
    torch.Tensor
        The shape and dtype of ``logits``; every probability is at most its
        bound and each slice along ``dim`` sums to one.

    Raises
    ------
    TypeError, ValueError
        As :func:`bcsoftmax`.

    Examples
    --------
    The mass the cap removes from the top class goes to the others in
    proportion to their softmax weights (equal here):

    >>> import torch
    >>> from confcal.ops import ubsoftmax
    >>> ubsoftmax(torch.tensor([[2.0, 0.0, 0.0]]), 0.6)
    tensor([[0.6000, 0.2000, 0.2000]])
    >>> ubsoftmax(torch.tensor([[2.0, 0.0, 0.0]]), 1.0)  # no cap: plain softmax
    tensor([[0.7870, 0.1065, 0.1065]])
    """
    return _apply("ubsoftmax", logits, 0.0, upper, tau, dim, check)


def lbsoftmax(logits, lower, *, tau=1.0, dim=-1, check=True):
    """Lower-bounded softmax (LBSoftmax): :func:`bcsoftmax` with ``upper = 1``.

    Source: Atarashi et al., arXiv 2506.10572 (2025), eq. 19 and Algorithm 2.

    Parameters
    ----------
    logits : torch.Tensor
        Floating-point tensor with the classes along ``dim``, e.g.
        ``(n_samples, n_classes)``; as in :func:`bcsoftmax`.
    lower : float or torch.Tensor
        Lower bounds: a Python float, a 0-d tensor, a length-``K`` tensor or
        a tensor broadcastable to ``logits``; feasible when
        ``0 <= lower <= 1`` and ``sum(lower) <= 1``.
    tau : float or torch.Tensor, default=1.0
        Temperature ``> 0``, as in :func:`bcsoftmax`.
    dim : int, default=-1
        The class dimension.
    check : bool, default=True
        Validate the inputs, as in :func:`bcsoftmax`.

    Returns
    -------
    torch.Tensor
        The shape and dtype of ``logits``; every probability is at least its
        bound and each slice along ``dim`` sums to one.

    Raises
    ------
    TypeError, ValueError
        As :func:`bcsoftmax`.

    Examples
    --------
    Softmax of ``[3, 1, -2]`` gives the last class 0.006; a floor of 0.1
    lifts it to 0.1 and the other two share 0.9 in the ratio
    ``e^3 : e^1`` (0.7927 and 0.1073 by hand):

    >>> import torch
    >>> from confcal.ops import lbsoftmax
    >>> lbsoftmax(torch.tensor([3.0, 1.0, -2.0]), 0.1)
    tensor([0.7927, 0.1073, 0.1000])
    """
    return _apply("lbsoftmax", logits, lower, 1.0, tau, dim, check)
