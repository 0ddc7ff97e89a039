"""The ``confcal`` command. Each subcommand is a module here exposing ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int`` as the default."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import warnings

from confcal._version import __version__
from confcal._signals import Terminated  # noqa: F401  (SIGTERM / SIGHUP as an exception; its old home)

#: subcommand modules, in the order ``confcal --help`` lists them
SUBCOMMANDS = ["fit", "apply", "evaluate", "compare", "domain_eval", "demo", "detections", "rank", "drift", "adapt", "report", "export", "decide"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line (the usage is one ``--help`` away), exit 2."""

    def error(self, message):
        self.exit(2, f"confcal: error: {self.prog.removeprefix('confcal ')}: {message} "
                     f"(see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="confcal",
        description="Post-hoc confidence calibration of classifiers and object detectors.")
    parser.add_argument("--version", action="version", version=f"confcal {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"confcal.cli.{name}").register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    from confcal.cli._shared.errors import plain_numbers

    print(f"confcal: warning: {plain_numbers(str(message))}", file=sys.stderr)


def main(argv=None) -> int:
    """Run one ``confcal`` command line (``sys.argv[1:]`` when ``argv`` is None); returns the exit status.

    SIGINT, SIGTERM and SIGHUP are handled only while the command runs (:mod:`confcal._signals`;
    the previous handlers are back when this returns or raises): the command unwinds (no temporary
    or partial output is left), says ``confcal: interrupted by SIGTERM`` on one line and returns
    128 + the signal number (130, 143, 129), as a shell reports a process ended by that signal.
    """
    import confcal._signals as _signals

    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    with _signals.handling_signals():
        try:
            code = _main(argv)
            _signals.raise_if_interrupted()  # a signal Python dropped and the command outran: still said
            return code
        except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM and SIGHUP are Terminated, a KeyboardInterrupt too
            if debug:
                raise
            signum = _signals.signal_of(exc)
            print(f"confcal: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            return 128 + signum


def _main(argv=None) -> int:
    import confcal._signals as _signals

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere on the line, not only before the subcommand
    debug = "--debug" in argv
    args = parser.parse_args([a for a in argv if a != "--debug"])
    args.debug = debug
    args.argv = [a for a in argv if a != "--debug"]  # the command line, for manifests' provenance
    old = warnings.showwarning
    if not args.debug:
        warnings.showwarning = _one_line_warning
    try:
        from confcal.cli._shared.outputs import guard_command_outputs

        from confcal.sources import csv_header_default

        guard_command_outputs(args)  # one output-path guard for every command, before any work
        # one CSV header rule for every file the command reads (--csv-header), not per call site
        from confcal.cli._shared.notes import held

        with csv_header_default(getattr(args, "csv_header", None) or "first"), held():
            return int(args.func(args) or 0)
    except BrokenPipeError:
        _signals.raise_if_interrupted()
        # `confcal fit ... | head`: the reader left; outputs were already written. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, KeyError, OSError, RuntimeError, ImportError, MemoryError) as exc:
        _signals.raise_if_interrupted()  # an error after a signal is its consequence: say the signal
        # ImportError: a method whose optional extra is missing (the message names the extra)
        if args.debug:
            raise
        from confcal.cli._shared.errors import one_line, options_of

        # the one error path: the option (and file) named in the CLI's words, on one line
        print(f"confcal: error: {one_line(exc, args, options_of(parser, args))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a defect of confcal, not of the input: one line, and how to see more
        _signals.raise_if_interrupted()
        if args.debug:
            raise
        from confcal.cli._shared.errors import is_input_error, one_line, options_of

        if is_input_error(exc):  # a damaged file (corrupt ONNX, zip, zlib stream): the input's fault
            print(f"confcal: error: {one_line(exc, args, options_of(parser, args))}", file=sys.stderr)
            return 2

        print(f"confcal: internal error: {type(exc).__name__}: {one_line(exc, args, options_of(parser, args))} "
              "(a bug in confcal: rerun with --debug for the traceback and report it)", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = old


def console() -> None:
    """The ``confcal`` script and ``python -m confcal``: :func:`main`, then exit with its status.

    Outside ``main`` (before its handlers exist, after they are restored, while the interpreter
    exits: atexit hooks of torch and distributed, thread joins) a signal printed those hooks'
    tracebacks or ended the process as -N after a finished command. Here a signal then ends the
    process at once: with the command's status once it is known, else 128 + signum and the one
    line. From the last exit hook on (Python then resets its handlers) the signals are ignored:
    the process is ending with the command's status."""
    import atexit
    import os

    from confcal._signals import SIGNALS

    code = []

    def outside(signum, frame):
        with contextlib.suppress(Exception):
            if not code:
                print(f"confcal: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code[0] if code else 128 + signum)

    for sig in SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) not in (None, signal.SIG_IGN):
                signal.signal(sig, outside)  # main() puts its own in place and this one back
    atexit.register(_ignore_signals)  # registered first, so it runs last
    code.append(main())
    sys.exit(code[0])


def _ignore_signals() -> None:
    """The last exit hook: Python now resets its handlers to the default action (ending the
    process as -N after a finished command); an ignored signal it leaves ignored."""
    from confcal._signals import SIGNALS

    for sig in SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is not None:
                signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":  # pragma: no cover
    console()
