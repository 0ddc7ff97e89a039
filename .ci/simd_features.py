"""Print the SIMD features numpy dispatches to on this CPU beyond its compiled baseline, space
separated: the value for NPY_DISABLE_CPU_FEATURES that switches every optional path off.

With ``--avx512``, only the AVX-512 ones (``X86_V4`` and ``AVX512*`` groups): numpy then runs its
AVX2 paths where it has them, as on a CPU without AVX-512 (issue 26's benchmark setting)."""

import argparse

import numpy as np

try:  # numpy >= 2
    from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__
except ImportError:  # numpy 1.x
    from numpy.core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__, __cpu_features__

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--avx512", action="store_true", help="only the AVX-512 features (keep AVX2)")
args = ap.parse_args()
extra = [f for f in __cpu_dispatch__ if __cpu_features__.get(f) and f not in __cpu_baseline__]
if args.avx512:
    extra = [f for f in extra if f == "X86_V4" or f.startswith("AVX512")]
print(" ".join(extra))
assert np.__version__  # the import is the point; keep linters quiet
