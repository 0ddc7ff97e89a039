"""The light catalogue (:mod:`confcal.catalog`) against the registered classes, and the lazy
registry: looking a name up imports its module only; a torch method without torch fails in
one line naming the extra."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from confcal.calibrators import METHODS
from confcal.calibrators.protocol.registry import MissingExtraError, Preset
from confcal.catalog import CATALOG, TORCH_EXTRA_HINT, method_names
from tests.cli.test_startup import NO_TORCH


def _cls(entry):
    return entry.cls if isinstance(entry, Preset) else entry


def test_catalogue_names_modules_and_help_match_the_registry():
    assert method_names() == sorted(CATALOG)
    for name, info in CATALOG.items():
        entry = METHODS[name]
        assert dict.__contains__(METHODS, name) and _cls(entry).__module__ == info.module, name
        assert entry().method == name
        assert info.module.startswith("confcal.calibrators.") and info.help and len(info.help) < 90
    assert sorted(METHODS.available()) == sorted(CATALOG)


def _in_fresh_interpreter(code: str, *, block_torch: bool) -> dict:
    prog = (NO_TORCH if block_torch else "") + code
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_needs_torch_flag_is_what_importing_the_module_needs():
    """Each catalogued module, imported where torch cannot be: the flag says which fail."""
    code = """
import importlib, json
from confcal.catalog import CATALOG
res = {}
for mod in sorted({i.module for i in CATALOG.values()}):
    try:
        importlib.import_module(mod)
        res[mod] = True
    except ModuleNotFoundError as exc:
        assert exc.name == "torch", exc
        res[mod] = False
print(json.dumps(res))
"""
    imports = _in_fresh_interpreter(code, block_torch=True)
    for name, info in CATALOG.items():
        assert imports[info.module] is (not info.needs_torch), (name, info.module)


def test_lookup_imports_the_methods_module_only():
    code = """
import json, sys
from confcal.calibrators import METHODS
before = sorted(m for m in sys.modules if m.startswith("confcal.calibrators."))
names = sorted(METHODS)
METHODS["isotonic"]
after = sorted(m for m in sys.modules if m.startswith("confcal.calibrators."))
print(json.dumps({"before": before, "after": after, "n": len(names), "torch": "torch" in sys.modules,
                  "sklearn": "sklearn" in sys.modules}))
"""
    r = _in_fresh_interpreter(code, block_torch=False)
    assert r["n"] == len(CATALOG)
    assert "confcal.calibrators.binning.methods" not in r["before"] and "confcal.calibrators.binning.methods" in r["after"]
    assert not any(m.endswith((".scaling", ".bounding", ".ensemble", ".parametric")) for m in r["after"])
    assert not r["torch"] and not r["sklearn"]


def test_torch_methods_without_torch_raise_one_line_naming_the_extra():
    code = """
import json
from confcal.calibrators import METHODS, MissingExtraError
from confcal.catalog import CATALOG
msgs = {}
for name, info in CATALOG.items():
    if info.needs_torch:
        try:
            METHODS[name]
            msgs[name] = None
        except MissingExtraError as exc:
            msgs[name] = str(exc)
import confcal.calibrators as c
try:
    c.VectorScaling
    msgs["VectorScaling"] = None
except ImportError as exc:
    msgs["VectorScaling"] = str(exc)
msgs["available"] = sorted(METHODS.available())
msgs["contains_vs"] = "vs" in METHODS
print(json.dumps(msgs))
"""
    r = _in_fresh_interpreter(code, block_torch=True)
    assert r.pop("contains_vs") is True  # known, so `--method vs` gets the extra's message, not "unknown"
    assert sorted(r.pop("available")) == sorted(n for n, i in CATALOG.items() if not i.needs_torch)
    for name, msg in r.items():
        assert msg is not None and "\n" not in msg and TORCH_EXTRA_HINT in msg, (name, msg)


def test_unknown_names_are_key_errors_and_iteration_lists_user_presets():
    from confcal.calibrators import TemperatureScaling
    from confcal.calibrators.protocol.registry import register_preset

    with pytest.raises(KeyError):
        METHODS["no-such-method"]
    assert "no-such-method" not in METHODS and METHODS.get("no-such-method") is None
    register_preset("ts-test-preset", TemperatureScaling, t_max=10.0)
    try:
        assert "ts-test-preset" in list(METHODS) and METHODS["ts-test-preset"]().t_max == 10.0
        with pytest.raises(TypeError):
            register_preset("ts-test-preset", TemperatureScaling, t_max=5.0)
    finally:
        del METHODS["ts-test-preset"]
    assert "ts-test-preset" not in METHODS


def test_missing_extra_error_is_an_import_error():
    assert issubclass(MissingExtraError, ImportError)
