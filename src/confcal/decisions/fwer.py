"""Family-wise error control over the threshold grid (the "Test" step of Learn-then-Test).

LTT (Angelopoulos et al. 2021, arXiv:2110.01052), Theorem 1: if an FWER-controlling procedure at
level ``delta`` rejects the nulls ``H_j: R(lambda_j) > alpha`` in a set ``A``, every ``lambda`` in ``A``
satisfies ``P(R(lambda) <= alpha) >= 1 - delta`` simultaneously, so any choice from ``A`` is certified.

* :func:`fixed_sequence` (LTT Sec. 4, fixed-sequence testing): the hypotheses are tested in an order
  fixed before the labels are seen, each at the full level ``delta``, stopping at the first p-value
  above ``delta``. No multiplicity penalty; strong when the risk moves monotonically along the order.
* :func:`holm` (Bonferroni--Holm step-down): the ``i``-th smallest of ``G`` p-values is compared with
  ``delta / (G - i)`` (``i`` from 0); valid in any order, at the price of the ``G`` in the divisor.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fixed_sequence", "holm"]


def fixed_sequence(pvalues, delta: float, start: int = 0) -> np.ndarray:
    """Rejections of fixed-sequence testing over ``pvalues`` given in the testing order.

    Parameters
    ----------
    pvalues : array_like of float, shape (n_hypotheses,)
        p-values in the order the hypotheses are tested.
    delta : float
        FWER level in (0, 1).
    start : int
        Index where testing starts; hypotheses before it are not tested (not rejected).

    Returns
    -------
    numpy.ndarray of bool, shape (n_hypotheses,)
        True for the rejected hypotheses: ``start .. start + r - 1`` where ``r`` is the number of
        consecutive p-values ``<= delta`` from ``start`` on.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.zeros(p.shape, dtype=bool)
    tail = p[start:] <= delta
    r = int(np.argmin(tail)) if not tail.all() else tail.size
    out[start:start + r] = True
    return out


def holm(pvalues, delta: float) -> np.ndarray:
    """Rejections of the Bonferroni--Holm step-down procedure at FWER level ``delta``.

    Parameters
    ----------
    pvalues : array_like of float, shape (n_hypotheses,)
    delta : float
        FWER level in (0, 1).

    Returns
    -------
    numpy.ndarray of bool, shape (n_hypotheses,)
        True for the rejected hypotheses.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    g = p.size
    order = np.argsort(p, kind="stable")
    ok = p[order] <= delta / (g - np.arange(g))
    r = int(np.argmin(ok)) if not ok.all() else g
    out = np.zeros(g, dtype=bool)
    out[order[:r]] = True
    return out
