"""The ``confcal`` command. Each subcommand is a module here exposing ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int`` as the default."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import warnings

from confcal import __version__

#: subcommand modules, in the order ``confcal --help`` lists them
SUBCOMMANDS = ["fit", "apply", "evaluate", "compare", "domain_eval", "demo", "detections", "rank", "drift", "report", "export"]


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
    print(f"confcal: warning: {message}", file=sys.stderr)


class Terminated(SystemExit):
    """SIGTERM, turned into an exception so ``atomic_write`` removes its temporary file."""


def _on_sigterm(signum, frame):
    raise Terminated(128 + signum)


def install_signal_handlers():
    """SIGTERM unwinds like Ctrl-C (exit status 143), so no ``.NAME.tmp`` file is left behind.
    Returns the previous handler (None when it cannot be set: not the main thread)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (e.g. main() called from a worker thread): leave it
        return None
    if hasattr(signal, "SIGHUP"):  # a closed terminal: unwind the same way (no temp file left)
        _PREVIOUS_HUP[0] = signal.signal(signal.SIGHUP, _on_sigterm)
    return previous


_PREVIOUS_HUP = [None]


def main(argv=None) -> int:
    previous = install_signal_handlers()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C: partial outputs are already removed on the way up; one line, the shell's status
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise
        print("confcal: interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            if _PREVIOUS_HUP[0] is not None:
                signal.signal(signal.SIGHUP, _PREVIOUS_HUP[0])


def _main(argv=None) -> int:
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
        from confcal.cli._outputs import guard_command_outputs

        from confcal.sources import csv_header_default

        guard_command_outputs(args)  # one output-path guard for every command, before any work
        # one CSV header rule for every file the command reads (--csv-header), not per call site
        from confcal.cli._notes import held

        with csv_header_default(getattr(args, "csv_header", None) or "first"), held():
            return int(args.func(args) or 0)
    except BrokenPipeError:
        # `confcal fit ... | head`: the reader left; outputs were already written. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, KeyError, OSError, RuntimeError, ImportError, MemoryError) as exc:
        # ImportError: a method whose optional extra is missing (the message names the extra)
        if args.debug:
            raise
        from confcal.cli._errors import one_line, options_of

        # the one error path: the option (and file) named in the CLI's words, on one line
        print(f"confcal: error: {one_line(exc, args, options_of(parser, args))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a defect of confcal, not of the input: one line, and how to see more
        if args.debug:
            raise
        from confcal.cli._errors import is_input_error, one_line, options_of

        if is_input_error(exc):  # a damaged file (corrupt ONNX, zip, zlib stream): the input's fault
            print(f"confcal: error: {one_line(exc, args, options_of(parser, args))}", file=sys.stderr)
            return 2

        print(f"confcal: internal error: {type(exc).__name__}: {one_line(exc, args, options_of(parser, args))} "
              "(a bug in confcal: rerun with --debug for the traceback and report it)", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = old


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
