"""Notes (``note: ...`` lines on stderr about a choice the command made) are held until the command
succeeds: a refused input then gives its one error line alone, never a note about a choice made for the
input it goes on to refuse (T33). Outside :func:`held` (library use, worker threads) a note is printed
at once."""

from __future__ import annotations

import contextlib
import contextvars
import sys

__all__ = ["note", "held"]

_HELD: contextvars.ContextVar = contextvars.ContextVar("confcal_notes", default=None)


def note(text: str) -> None:
    """Say ``text`` on stderr, once the command has succeeded (inside :func:`held`) or now."""
    queue = _HELD.get()
    if queue is None:
        print(text, file=sys.stderr)
    else:
        queue.append(text)


@contextlib.contextmanager
def held():
    """Hold notes for the block; print them if it returns, drop them if it raises."""
    queue: list = []
    token = _HELD.set(queue)
    try:
        yield queue
    finally:
        _HELD.reset(token)
    for text in queue:  # reached only when the block did not raise
        print(text, file=sys.stderr)
