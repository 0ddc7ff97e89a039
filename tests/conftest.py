"""Shared test helpers.

Real data lives beside the repository in ``../shared/data`` (never copied in).
Tests that need it call :func:`require_shared_data` (or use the ``shared_data``
fixture): they skip with a clear reason when it is absent, except under CI
(``CI=true``), where its absence is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _default_signal_dispositions() -> None:
    """A suite started under ``nohup`` or as a background job (``make test &``) inherits SIGHUP / SIGINT
    ignored, and so would every command the tests start: the CLI rightly keeps an ignored signal ignored,
    so the signal tests would see no signal at all. Start from what a terminal gives instead."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


_default_signal_dispositions()

settings.register_profile("confcal", deadline=None, print_blob=True)
# CI replays the same examples every run (a landing must not depend on the draw); local runs keep
# exploring new ones, which is how the flat-optimum and 2**63 cases were found
settings.register_profile("confcal-ci", deadline=None, print_blob=True, derandomize=True)
settings.load_profile("confcal-ci" if os.environ.get("CI", "").lower() == "true" else "confcal")


def require_shared_data(*parts: str) -> Path:
    """Path to ``../shared/data/<parts>``; skip if absent (fail under ``CI=true``)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        msg = f"real data not found at {path} (expected ../shared/data beside the repository)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg + "; CI=true, so this is an error")
        pytest.skip(msg)
    return path


@pytest.fixture
def shared_data():
    """Factory fixture: ``shared_data("cifar", "x.npz")`` -> Path, with the skip/fail rule above."""
    return require_shared_data


# --------------------------------------------------------------- without the torch extra
# CI also runs the tests in a virtual environment without torch (.ci/run): there, test modules
# that import torch at the top are not collected, and a test that reaches a torch method
# (MissingExtraError, or `import torch` inside it) is reported as skipped, with the reason.
# Where torch is installed, none of this applies.
import importlib.util as _ilu  # noqa: E402
import re as _re  # noqa: E402

HAVE_TORCH = _ilu.find_spec("torch") is not None
_TOP_TORCH = _re.compile(r"^(?:import torch|from torch\b)", _re.MULTILINE)


def pytest_ignore_collect(collection_path, config):
    if HAVE_TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if _TOP_TORCH.search(collection_path.read_text(encoding="utf-8")) else None


def _needs_torch(exc) -> bool:
    from confcal.catalog import MissingExtraError

    return isinstance(exc, MissingExtraError) or (
        isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torch")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if HAVE_TORCH or call.excinfo is None or not _needs_torch(call.excinfo.value):
        return
    rep = outcome.get_result()
    rep.outcome = "skipped"
    rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: needs torch ({call.excinfo.value})")


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch (the torch extra is not installed)")
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(skip)
