"""Print the SIMD features numpy dispatches to on this CPU beyond its compiled baseline, space
separated: the value for NPY_DISABLE_CPU_FEATURES that switches every optional path off."""

import numpy as np

try:  # numpy >= 2
    from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
except ImportError:  # numpy 1.x
    from numpy.core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__

extra = [f for f in __cpu_dispatch__ if __cpu_features__.get(f) and f not in __cpu_baseline__]
print(" ".join(extra))
assert np.__version__  # the import is the point; keep linters quiet
