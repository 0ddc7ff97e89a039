"""Every public op, metric, calibrator and ``load_calibrator`` documents an
``Examples`` section (numpydoc), which pytest runs as a doctest."""

from __future__ import annotations

import inspect
import re

import pytest

import confcal
import confcal.calibrators
import confcal.metrics
import confcal.metrics.detection
import confcal.ops
from confcal.calibrators import Calibrator

_HEADING = re.compile(r"^Examples\n-{8,}\n", re.MULTILINE)
_NEXT_HEADING = re.compile(r"^\w[\w ]*\n-{3,}\n", re.MULTILINE)


def _public_objects():
    out = {"confcal.load_calibrator": confcal.load_calibrator}
    for module in (confcal.ops, confcal.metrics, confcal.metrics.detection):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj):
                out[f"{module.__name__}.{name}"] = obj
    for name in confcal.calibrators.__all__:
        obj = getattr(confcal.calibrators, name)
        if inspect.isclass(obj) and issubclass(obj, Calibrator) and not inspect.isabstract(obj):
            out[f"confcal.calibrators.{name}"] = obj
    return out


def _has_examples(obj) -> bool:
    """An ``Examples`` heading whose section holds at least one doctest line."""
    doc = inspect.getdoc(obj) or ""
    head = _HEADING.search(doc)
    if head is None:
        return False
    section = doc[head.end():]
    nxt = _NEXT_HEADING.search(section)
    return any(line.lstrip().startswith(">>> ") for line in section[: nxt.start() if nxt else None].splitlines())


def test_every_public_object_has_a_doctest_example():
    objects = _public_objects()
    assert len(objects) >= 40  # the namespaces are really scanned
    missing = sorted(name for name, obj in objects.items() if not _has_examples(obj))
    assert missing == [], f"{len(missing)} of {len(objects)} public objects lack an Examples section: {missing}"


@pytest.mark.parametrize("doc, expected", [
    ("Sum.\n\nExamples\n--------\n>>> 1 + 1\n2\n", True),
    ("Sum.\n\nExamples\n--------\nNone yet.\n", False),  # a heading without a doctest
    ("Sum.\n\nExamples\n--------\nNone.\n\nNotes\n-----\n>>> 1\n1\n", False),  # doctest elsewhere
    ("Sum.\n\nSee the examples below.\n", False),
])
def test_the_check_needs_a_heading_and_a_doctest(doc, expected):
    def f():
        pass
    f.__doc__ = doc
    assert _has_examples(f) is expected
