"""Documented caps of the numeric options, checked once before dispatch: a typo such as
``--bootstrap 10000000`` or ``--workers 500`` is refused in one line instead of running for
minutes or ending in MemoryError."""

from __future__ import annotations

import os

from confcal.metrics._binning import MAX_BINS

#: option dest -> (smallest, largest) accepted value; the reason for each cap is in its comment
CAPS = {
    "bootstrap": (1, 100_000),  # 95% intervals settle by ~2,000 resamples
    "draws": (1, 100_000),  # same, domain-eval's bootstrap
    "n_bins": (1, MAX_BINS),  # the metrics' own limit
    "splits": (1, 1_000),  # compare: random splits; 10 is the usual
    "jobs": (1, 256),  # processes on one machine
    "workers": (1, 4 * (os.cpu_count() or 1)),  # a local Dask cluster: processes on this machine
    "n_calibration": (1, 1_000),
    "seed": (0, 2 ** 32 - 1),  # numpy's seed range
    "n_boot": (0, 100_000),  # adapt: bootstrap replicates, one (rows x replicates) product per pass
    "max_iter": (1, 1_000_000),  # adapt: EM iterations, one pass over the unlabelled rows each
}

#: ``fit --method auto --param KEY=VALUE``: (smallest, largest) of each integer setting of the search
AUTO_CAPS = {
    "n_folds": (2, 20),  # every candidate is fitted once per fold: 5 is the default, 10 the usual most
    "max_rows": (2, 1_000_000),  # the search's sample (the chosen method is refitted on all rows)
    "n_boot": (100, 100_000),  # as --bootstrap; the selection needs >= 100 draws
    "random_state": (0, 2 ** 32 - 1),  # numpy's seed range
}


def check_auto_params(params: dict) -> None:
    """Raise ``ValueError`` naming ``--param KEY`` when an integer setting of ``--method auto`` is not an
    integer inside :data:`AUTO_CAPS` (``n_folds=5000`` ran for more than 10 minutes before this)."""
    for key, (lo, hi) in AUTO_CAPS.items():
        if key not in params:
            continue
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"--param: {key}: expected an integer in [{lo:,}, {hi:,}], got {v!r}")


def check_caps(args) -> None:
    """Raise ``ValueError`` naming the option when a numeric option is outside its cap (see :data:`CAPS`)."""
    for dest, (lo, hi) in CAPS.items():
        v = getattr(args, dest, None)
        if v is None or isinstance(v, bool) or not isinstance(v, int):
            continue
        # the upper cap here; a value below the range keeps each command's own message (seeds excepted)
        if v > hi or (dest == "seed" and v < lo):
            raise ValueError(f"--{dest.replace('_', '-')}: expected an integer in [{lo:,}, {hi:,}], got {v:,}")
    for s in getattr(args, "seeds", None) or []:
        if isinstance(s, int) and not 0 <= s <= 2 ** 32 - 1:
            raise ValueError(f"--seeds: expected integers in [0, {2 ** 32 - 1:,}], got {s:,}")
