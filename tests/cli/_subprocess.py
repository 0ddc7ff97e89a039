"""Run the ``confcal`` command as a user does: a subprocess of this interpreter on the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env():
    return {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def confcal(*argv, cwd=None):
    """``python -m confcal ARGV...``; returns the CompletedProcess (text stdout/stderr)."""
    return subprocess.run([sys.executable, "-m", "confcal", *map(str, argv)], env=_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=600)
