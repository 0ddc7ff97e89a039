"""Signals while a command runs: raised once, never lost, and nothing left behind (issue 21, T11/T13).

:func:`handling_signals` (entered by ``confcal.cli.main`` for the length of one command) turns
SIGINT into ``KeyboardInterrupt`` and SIGTERM / SIGHUP into :class:`Terminated`, raised in the main
thread; on the way out every handler and ``sys.unraisablehook`` is put back exactly as it was.
Nothing is installed at import time, and nothing outlives the block (no thread, no timer).

Why more than a plain handler:

- Python runs a handler between two bytecodes of the main thread, also inside a gc callback or a
  ``__del__``, where the exception is printed as "Exception ignored" and dropped (distributed's GC
  diagnosis callback, tester T11): the command went on and wrote its output. The unraisable hook
  here recognises exactly the exception the handler raised, prints nothing, and has the signal
  armed again once the hook is over, so it is raised at the next bytecode outside that callback.
- The first signal ends the command; later ones are ignored while it unwinds, since a second
  exception in the middle of a cleanup (a temporary file's removal, a cluster's close) is what
  leaves debris behind.
- :func:`deferred` holds signals over a step that must not be cut in half (a local cluster starting
  or closing) and raises the held one when the step is over.
- A process forked during the command (a local Dask cluster's workers) inherits the handler: there
  a Ctrl-C, which the terminal sends to the whole process group, is ignored (the command itself
  closes the cluster), and SIGTERM / SIGHUP take their default action.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time

__all__ = ["Terminated", "deferred", "handling_signals", "raise_if_interrupted", "signal_of"]

#: the signals a command handles (SIGHUP: a closed terminal, handled as SIGTERM)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(SystemExit, KeyboardInterrupt):
    """SIGTERM or SIGHUP as an exception. A ``SystemExit`` with code ``128 + signum`` (the shell's
    status for that signal when uncaught), and a ``KeyboardInterrupt``, so cleanups written for
    Ctrl-C run for it too (distributed cancels its pending gather only on KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    def __reduce__(self):  # args hold the exit status, not the signal
        return type(self), (self.signum,)


def signal_of(exc: BaseException) -> int:
    """The signal number an interrupt exception stands for (SIGINT for a plain KeyboardInterrupt)."""
    return getattr(exc, "signum", signal.SIGINT)


class _Command:
    """The state of the one command running in this process."""

    def __init__(self):
        self.pid = os.getpid()
        self.signum = None  # the first signal received: the one the command ends with
        self.owed = False  # its exception is still to be raised (held, or raised and dropped)
        self.raised = None  # the exception last raised, to recognise it when Python drops it
        self.hold = 0  # > 0 inside deferred(): record, do not raise
        self.in_hook = False
        self.threads = []  # those of _arm_after_hook, joined at the end

    def exception(self) -> BaseException:
        self.owed = False
        self.raised = KeyboardInterrupt() if self.signum == signal.SIGINT else Terminated(self.signum)
        return self.raised


_current: _Command | None = None


def _handler(signum, frame):
    cmd = _current
    if cmd is None or os.getpid() != cmd.pid:  # a process forked during the command
        if signum != signal.SIGINT:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    if cmd.signum is None:
        cmd.signum, cmd.owed = signum, True
    elif not cmd.owed:
        return  # already raised and unwinding: a second exception would cut a cleanup short
    if cmd.in_hook:  # an exception raised here is dropped too; the hook has armed it again
        return
    if cmd.hold:
        return  # raised when deferred() ends
    raise cmd.exception()


def _unraisable_hook(previous):
    def hook(info):
        cmd = _current
        if cmd is not None and cmd.raised is not None and info.exc_value is cmd.raised:
            # our interrupt, dropped where Python cannot raise (gc callback, __del__): not printed,
            # raised again at the next bytecode outside this hook
            cmd.raised, cmd.owed, cmd.in_hook = None, True, True
            try:
                _arm_after_hook(cmd)
            finally:
                cmd.in_hook = False
            return
        previous(info)

    return hook


def _arm_after_hook(cmd: _Command) -> None:
    """Arm the command's signal again once the main thread has left the hook.

    Armed from the hook itself, the handler would run at the hook's next bytecode, still where an
    exception is dropped; so a short-lived thread arms it (``_thread.interrupt_main``) as soon as
    the hook is over, and the handler raises at the main thread's next bytecode, normally in the
    code the gc callback interrupted (if it lands in a callback again, this repeats). The thread
    ends within milliseconds and is joined when the command ends."""

    def arm():
        while cmd.in_hook:
            time.sleep(0.0005)
        _thread.interrupt_main(cmd.signum)

    thread = threading.Thread(target=arm, name="confcal-signal-rearm", daemon=True)
    cmd.threads.append(thread)
    thread.start()


def _check_pending() -> None:
    """A Python-level call: Python runs pending signal handlers on entering it."""


@contextlib.contextmanager
def handling_signals():
    """Handle SIGINT, SIGTERM and SIGHUP for the block, then restore the previous handlers.

    A signal whose handler is ``SIG_IGN`` (``nohup``, a background job) or was set outside Python
    (``signal.getsignal`` gives None: it could not be restored) is left alone. Outside the main
    thread, or inside an outer ``handling_signals`` block, nothing changes. A signal arriving while
    the handlers are put back (the command's work is over) is discarded.
    """
    global _current
    if _current is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    cmd = _Command()
    previous = {}
    previous_hook = sys.unraisablehook
    _current = cmd
    try:
        for sig in SIGNALS:
            old = signal.getsignal(sig)
            if old is None or old == signal.SIG_IGN:
                continue
            previous[sig] = old
            signal.signal(sig, _handler)
        sys.unraisablehook = _unraisable_hook(previous_hook)
        yield
    finally:
        cmd.hold += 1  # from here on a signal is recorded, never raised
        for thread in cmd.threads:
            thread.join()
        _check_pending()  # one armed by the hook or a late signal: handled (and discarded) now
        for sig, old in previous.items():
            signal.signal(sig, old)
        sys.unraisablehook = previous_hook
        _current = None


class deferred(contextlib.AbstractContextManager):
    """Hold signals for the block (a step that must not be cut in half); at its end raise the held
    one, unless an exception already propagates (the command is ending anyway: a cleanup)."""

    def __enter__(self):
        self._cmd = _current
        if self._cmd is not None:
            self._cmd.hold += 1
        return self

    def __exit__(self, exc_type, exc, tb):
        cmd = self._cmd
        if cmd is None:
            return False
        cmd.hold -= 1
        if exc_type is None and cmd.hold == 0 and cmd.owed:
            raise cmd.exception()
        return False


def raise_if_interrupted() -> None:
    """Raise the command's signal (again) if one was received: before an output is put in place, so
    an interrupted command leaves none, also when the exception was dropped or caught on its way
    up; and where an error is about to be reported, because an error after a signal is its
    consequence (an import cut short is re-raised as ImportError by numpy's C API). A no-op
    outside a command, inside :class:`deferred`, and in a process forked during the command."""
    cmd = _current
    if cmd is not None and cmd.signum is not None and not cmd.hold and os.getpid() == cmd.pid:
        raise cmd.exception()
