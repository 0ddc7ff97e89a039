"""The one error path of the command line: any exception a command raises becomes one line that
names the option (and, where it is known, the file), in the CLI's words.

:func:`one_line` is called once, by :func:`confcal.cli.main`, for every error; the commands and the
library raise ordinary exceptions with messages such as ``logits: ...`` (a library argument name),
``[Errno 27] File too large`` (the operating system) or ``'Field "logit_1" does not exist in
schema'`` (pyarrow), and this module turns them into ``--logits: ...``, ``--output: cannot write
'p.npy': File too large`` and ``--logits: ... (in 'x.parquet')``.
"""

from __future__ import annotations

import errno as _errno
import os
import re

#: library argument names whose CLI option has another spelling
ALIASES = {"scores": "logits", "probs": "logits", "manifest": "calibrator", "domain names": "domain_name",
           "box_scores": "logits", "n_splits": "splits", "n_draws": "draws", "n_domains": "n_calibration",
           "quota": "per_domain_quota", "mc_probs": "mc_scores", "det_boxes": "detections", "gt_boxes": "gt",
           "params": "param"}

#: exception types (by name: their packages are optional) that mean a damaged input file, not a defect
#: of confcal: protobuf's DecodeError (an ONNX file), zipfile's BadZipFile, zlib's error, EOFError, ...
INPUT_ERROR_NAMES = {"DecodeError", "BadZipFile", "LargeZipFile", "EOFError", "UnpicklingError", "error"}


def is_input_error(exc: BaseException) -> bool:
    """True for an exception that reports a damaged input (see :data:`INPUT_ERROR_NAMES`)."""
    t = type(exc)
    return t.__name__ in INPUT_ERROR_NAMES and (t.__name__ != "error" or t.__module__ == "zlib")


def options_of(parser, args) -> dict:
    """``{dest: "--option"}`` of the subcommand that ``args`` ran (``detections match`` included)."""
    import argparse

    out = {}
    p = parser
    for attr in ("command", "detections_command", "decide_command"):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if getattr(args, attr, None) is None:  # another command's level of actions
            continue
        p = subs[0].choices[getattr(args, attr)]
    for a in p._actions:
        if a.option_strings and a.dest not in ("help",):
            out[a.dest] = max(a.option_strings, key=len)
    return out


def _raw(exc: BaseException) -> str:
    """The first line of the exception's text (a KeyError's quotes dropped)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]
    else:
        text = str(exc)
    text = text.strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _values(args, dests) -> list[tuple[str, str]]:
    """``(dest, path)`` for every file-like value of the given options (repeatable ones: each)."""
    out = []
    for dest in dests:
        v = getattr(args, dest, None)
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, str) and item:
                path = item.partition("=")[2] if dest == "domain" and "=" in item else item
                out.append((dest, path))
    return out


def _os_error(exc: OSError, args, options: dict) -> str | None:
    """An operating-system error with no words of ours: name the file and the option."""
    from confcal.cli._shared.outputs import INPUT_DESTS, OUTPUT_DESTS

    if exc.strerror is None or re.match(r"^-{0,2}[\w ]+: ", exc.strerror):
        return None
    filename = exc.filename
    outputs = _values(args, OUTPUT_DESTS)
    if filename is None:
        # a write that failed mid-file (EFBIG: ulimit -f, ENOSPC: disk full) names no file: the output
        if exc.errno in (_errno.EFBIG, _errno.ENOSPC, _errno.EDQUOT) and outputs:
            dest, path = outputs[0]
            hint = {_errno.EFBIG: " (the file size limit, ulimit -f)", _errno.ENOSPC: " (the disk is full)"}
            return f"{options.get(dest, '--' + dest)}: cannot write {path!r}: {exc.strerror}" \
                   f"{hint.get(exc.errno, '')}"
        return None
    real = os.path.realpath(str(filename))
    for dest, path in [*outputs, *_values(args, INPUT_DESTS + ("domain",))]:
        if os.path.realpath(path.split(":")[0]) == real or real.startswith(os.path.realpath(path) + os.sep):
            verb = "write" if dest in OUTPUT_DESTS else "read"
            return f"{options.get(dest, '--' + dest)}: cannot {verb} {str(filename)!r}: {exc.strerror}"
    return f"cannot use {str(filename)!r}: {exc.strerror}"


def one_line(exc: BaseException, args, options: dict) -> str:
    """The one line (without the ``confcal: error: `` prefix) that reports ``exc`` for ``args``.

    ``options`` is :func:`options_of` of the command that ran."""
    from confcal.cli._shared.outputs import INPUT_DESTS, OUTPUT_DESTS

    if isinstance(exc, OSError):
        msg = _os_error(exc, args, options)
        if msg is not None:
            return msg
    if isinstance(exc, MemoryError):
        params = [p for p in (getattr(args, "param", None) or []) if any(ch.isdigit() for ch in p)]
        suspects = f" (check --param {', '.join(params)})" if params else ""
        return (f"out of memory (MemoryError: {_raw(exc)}){suspects}; use smaller inputs or numeric options "
                "within their documented caps (see --help)")
    # a library message's hint for CLI users, "(CLI: --input-kind probs)", is the message itself here
    msg = plain_numbers(re.sub(r" \(CLI: [^)]*\)", "", _raw(exc)))
    names = {**{k: k for k in options}, **{alias: dest for alias, dest in ALIASES.items() if dest in options}}
    given_outputs = [d for d, _ in _values(args, OUTPUT_DESTS)]
    if "output" not in options and len(given_outputs) == 1:  # ``output: ...`` of the writer: the one output
        names["output"] = given_outputs[0]
    # ``logits: ...`` (a library argument name) -> ``--logits: ...``; ``pass domains=`` -> ``pass --domains``
    for name, dest in sorted(names.items(), key=lambda kv: -len(kv[0])):
        opt = options[dest]
        msg = re.sub(rf"^{re.escape(name)}:", f"{opt}:", msg)
        msg = re.sub(rf"\b(pass |choose ){re.escape(name)}='([^']*)'", rf"\1{opt} \2", msg)  # pass x='v'
        msg = re.sub(rf"\b(?:pass |choose ){re.escape(name)}=?\s?", f"pass {opt} ", msg)
        msg = re.sub(rf"\b{re.escape(name)}=\s*", opt + " ", msg)
    if re.match(r"^--[\w-]+", msg):
        return msg
    # a hyper-parameter given by --param, named by the fit ("reg_lambda: ...", "ts: t_max: ...")
    keys = [item.partition("=")[0] for item in getattr(args, "param", None) or [] if isinstance(item, str)]
    method = getattr(args, "method", None)
    prefix = rf"(?:{re.escape(method)}: )?" if isinstance(method, str) else ""
    # the key alone or one of its entries: "reg_grid:", "reg_grid[0]:", "base_params.reg_grid:"
    if keys and re.match(rf"^{prefix}(?:{'|'.join(map(re.escape, keys))})(?:\[[^\]]*\]|\.[\w.\[\]]+)*:", msg):
        return f"{options.get('param', '--param')}: {msg}"
    # no option named: the option whose file the message mentions, else the only file option given
    files = _values(args, INPUT_DESTS + OUTPUT_DESTS + ("domain",))
    for dest, path in files:
        p = path.split(":")[0]
        if p and (p in msg or os.path.basename(p) in msg):
            return f"{options.get(dest, '--' + dest)}: {msg}"
    # a library message that quotes an argument name (``does not take ['domains']``)
    for name, dest in names.items():
        if re.search(rf"['\"]{re.escape(name)}['\"]", msg) and getattr(args, dest, None) not in (None, False, []):
            return f"{options[dest]}: {msg}"
    # a raw message from a library below (torch, onnx, pyarrow, numpy) that names nothing of ours:
    # say which inputs the command was reading, so the line still points at a file
    inputs = _values(args, INPUT_DESTS + ("domain",))
    if inputs:
        msg += " (" + FALLBACK + ", ".join(f"{options.get(d, '--' + d)} {p}" for d, p in inputs[:4]) + ")"
    return msg


def plain_numbers(text: str) -> str:
    """``np.float64(1.5)`` -> ``1.5``, ``np.True_`` -> ``True``: numpy 2's scalar repr, where a message
    formatted a numpy scalar with ``!r``, shown as the plain value a user reads."""
    text = re.sub(r"\bnp\.(?:float|int|uint|complex|longdouble|clongdouble|str_|bytes_)\w*\(([^()]*)\)", r"\1", text)
    return re.sub(r"\bnp\.(True|False)_\b", r"\1", text)


#: the words :func:`one_line` adds to a message that named no option
FALLBACK = "while reading "
