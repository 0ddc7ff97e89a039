"""One BLAS thread around scipy's L-BFGS-B.

numpy and scipy wheels each bundle their own OpenBLAS, each with its own thread pool. An L-BFGS
fit alternates the two: the objective's matrix products in numpy's, and L-BFGS-B's dot products and
axpys over the ``K^2 + K`` parameters in scipy's (OpenBLAS threads level-1 BLAS from about 10,000
elements on). The idle threads of one pool spin while the other works, so on a 2-core machine the
two pools took turns at a crawl: a cross-validated 100-class matrix scaling fit took 26-36 s in one
process and 4-6 s in another, depending on import order. With one BLAS thread during the
minimisation it takes 4-6 s in every order (measured for issue 26, 5,000 x 100). The objective's
products are small (``(5000, 100) x (100, 100)``: 0.27 ms on two threads, 0.54 ms on one), so one
thread costs little where there is no contention. threadpoolctl (scikit-learn's dependency) finds
and limits the loaded BLAS libraries.
"""

from __future__ import annotations

__all__ = ["one_blas_thread"]

_CONTROLLER = None


def one_blas_thread():
    """A context manager that limits every loaded BLAS library to one thread and restores the
    previous limits on exit. The loaded libraries are looked up once per process (0.5 ms each
    time otherwise), after scipy.optimize, whose OpenBLAS is the one this is about, is imported."""
    global _CONTROLLER
    if _CONTROLLER is None:
        import scipy.optimize  # noqa: F401  (loads scipy's BLAS before the lookup)
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")
