"""float32 ``2 ** y`` from numpy's elementwise ops, for blocks that stay in cache (issue 26).

numpy's float32 ``exp`` has SIMD loops only for AVX2 and AVX-512; with those paths off (an older
CPU, or ``NPY_DISABLE_CPU_FEATURES``) it falls back to one libm call per element, about 25 times
the cost of a multiply here. :func:`exp2_block` builds ``2 ** y`` from about 15 multiplies, adds and
integer ops instead, each of which numpy runs with SIMD on every x86-64 CPU:

* range reduction ``y = n + f`` with ``n = rint(y)`` and ``|f| <= 1/2``: adding ``1.5 * 2**23``
  rounds ``y`` to an integer held in the low mantissa bits (exact: ``f = y - n`` loses nothing);
* ``2 ** f`` by a degree-5 polynomial, minimax in the relative error on ``[-1/2, 1/2]`` (Lawson's
  iteration on a Chebyshev grid, coefficients rounded to float32; approximation error 9.2e-8,
  0.8 float32 ulp), evaluated by Horner's rule in float32;
* the scale ``2 ** n`` by adding ``n << 23`` to the result's bits (exact while the result is a
  normal float, i.e. for ``y`` in ``[-125, 127]``).

Elements outside ``[-125, 127]`` (underflow to subnormals or 0, overflow to inf, NaN, +-inf) are
taken from numpy's float64 ``exp2``, rounded to float32; they are found by one min (and max) reduction of the block, so
a block without them pays nothing more. Accuracy against float64 ``exp2`` of the same float32
input: at most :data:`EXP2_MAX_ULP` float32 ulp over the whole float32 range (tested).

Softmax callers fold ``log2(e)`` into their ``1 / T`` factor (``exp(x) = 2 ** (x log2 e)``), one
rounding like the ``x / T`` it replaces (:func:`confcal.calibrators.temperature.ts.scaled_softmax_rows`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LOG2E", "EXP2_MAX_ULP", "exp2_block", "exp2_f32"]

#: log2(e), for ``exp(x) = 2 ** (LOG2E * x)``
LOG2E = 1.4426950408889634
#: tested bound of :func:`exp2_block` against float64 ``exp2`` of the same input, float32 ulp
EXP2_MAX_ULP = 2.5

_F = np.float32
_ROUND = _F(1.5 * 2.0 ** 23)  # y + _ROUND rounds y to the nearest integer (ties to even)
#: 2**f ~ 1 + c1 f + ... + c5 f^5 on [-1/2, 1/2] (relative minimax, float32 coefficients, c0 = 1 exactly)
_COEF = (_F(0.6931470036506653), _F(0.24022242426872253), _F(0.05550733581185341),
         _F(0.009671512991189957), _F(0.001326472731307149))
_LO, _HI = -125.0, 127.0  # n = rint(y) in [-125, 127]: 2**n * p is a normal float32
#: elements per block in :func:`exp2_f32`: three float32 buffers of this size fit in a 512 KB L2
BLOCK = 1 << 15


def exp2_block(y: np.ndarray, t: np.ndarray, p: np.ndarray, *, nonpositive: bool = False) -> np.ndarray:
    """Replace ``y`` by ``2 ** y``, in place, and return it.

    Parameters
    ----------
    y : 1-D C-contiguous float32 array (a cache-sized block: every step is one pass over it)
    t, p : float32 scratch arrays of ``y``'s size (overwritten)
    nonpositive : the caller guarantees ``y <= 0`` or NaN (a softmax after subtracting the row max):
        only the lower end of the range is checked

    Raises
    ------
    ValueError
        ``y``, ``t`` or ``p`` not 1-D C-contiguous float32 of one size.
    """
    for name, a in (("y", y), ("t", t), ("p", p)):
        if a.dtype != _F or a.ndim != 1 or not a.flags.c_contiguous or a.shape != y.shape:
            raise ValueError(f"{name}: expected a 1-D C-contiguous float32 array of shape {y.shape}, got "
                             f"{a.dtype} of shape {a.shape}{'' if a.flags.c_contiguous else ' (not contiguous)'}")
    if y.size == 0:
        return y
    lo = y.min()
    slow = None
    if not (lo >= _LO) or (not nonpositive and not (y.max() <= _HI)):
        slow = np.flatnonzero(~((y >= _LO) & (y <= _HI)))
        # in float64, then rounded once: numpy's float32 exp2 has an AVX-512 loop that is 2.7 ulp off near
        # the overflow edge (and 1 ulp off at 127.99999), where libm's, taken on other CPUs, is exact
        with np.errstate(over="ignore", invalid="ignore"):
            slow_val = np.exp2(y[slow].astype(np.float64)).astype(_F)
        y[slow] = 0.0  # the fast path below sees finite, in-range values only
    np.add(y, _ROUND, out=t)  # t = _ROUND + n
    np.subtract(t, _ROUND, out=p)  # p = n
    y -= p  # y = f, |f| <= 1/2, exact
    c = _COEF
    np.multiply(y, c[4], out=p)
    p += c[3]
    p *= y
    p += c[2]
    p *= y
    p += c[1]
    p *= y
    p += c[0]
    p *= y
    p += _F(1.0)  # p = 2**f in [0.707, 1.415]
    tb = t.view(np.uint32)
    tb <<= 23  # the low mantissa bits of t hold n (two's complement): n << 23, mod 2**32
    np.add(p.view(np.uint32), tb, out=y.view(np.uint32))  # exponent field += n
    if slow is not None:
        y[slow] = slow_val
    return y


def exp2_f32(y) -> np.ndarray:
    """``2 ** y`` in float32, block by block (see the module docstring): a new array of ``y``'s shape.

    ``y`` is cast to float32. Within :data:`EXP2_MAX_ULP` float32 ulp of float64 ``exp2`` of the
    float32 input; subnormal results, 0, inf and NaN as float64 ``exp2`` rounded to float32 gives them.
    """
    out = np.array(y, dtype=_F, order="C", copy=True)
    flat = out.reshape(-1)
    t = np.empty(min(BLOCK, flat.size), dtype=_F)
    p = np.empty_like(t)
    for i in range(0, flat.size, BLOCK):
        b = flat[i:i + BLOCK]
        exp2_block(b, t[:b.size], p[:b.size])
    return out
