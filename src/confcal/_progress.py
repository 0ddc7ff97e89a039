"""Progress bars (tqdm, on stderr) for passes over data, fits and epochs; silent unless asked for.

The one home of progress reporting: every bar in confcal comes from :func:`progress_bar`.

``progress=None`` means "when stderr is a terminal" (the CLI's default, turned off by
``--quiet``); ``True``/``False`` force it. The library's default is ``False``.
"""

from __future__ import annotations

import sys


class _Silent:
    def update(self, n=1):
        pass

    def close(self):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    def set_postfix_str(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress_bar(total: int | None, desc: str, progress=None, *, unit: str = "rows"):
    """A tqdm bar over ``total`` units (rows by default), or a silent stand-in."""
    on = progress if progress is not None else sys.stderr.isatty()
    if not on:
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, leave=False,
                dynamic_ncols=True)
