"""Comparing two ``confcal evaluate --json`` documents (:mod:`confcal.evaluation.document`): the same
key paths, recursively, and the same values up to float64 summation order."""

from __future__ import annotations

import math

#: the facts of the run, not of the data (their keys are compared, not their values)
RUN_FIELDS = {"engine"}


def key_paths(doc, path: str = "") -> set[str]:
    """Every key path of a JSON value (``a.b[]`` for items of a list)."""
    out = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out |= {f"{path}.{k}"} | key_paths(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= key_paths(v, f"{path}[]")
    return out


def same_values(got, want, path: str = "", rel: float = 1e-12, abs_: float = 1e-13) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), f"{path}: keys {sorted(set(got) ^ set(want))}"
        for k in want:
            if not (path == "" and k in RUN_FIELDS):
                same_values(got[k], want[k], f"{path}.{k}", rel, abs_)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            same_values(g, w, f"{path}[{i}]", rel, abs_)
    elif isinstance(want, float):
        assert isinstance(got, (int, float)) and not isinstance(got, bool), path
        assert math.isclose(got, want, rel_tol=rel, abs_tol=abs_), (path, got, want)
    else:
        assert got == want, (path, got, want)


def same_document(local: dict, dask: dict) -> None:
    """Identical key sets (recursively) and values within 1e-12 relative, the run's facts aside."""
    assert key_paths(local) == key_paths(dask), sorted(key_paths(local) ^ key_paths(dask))
    same_values(dask, local)
    assert (local["engine"]["name"], dask["engine"]["name"]) == ("local", "dask")


def run_cli(capsys, *argv, ignore_warnings: bool = False, caught: list | None = None):
    """``(exit code, stdout, stderr)`` of ``confcal ARGV`` run in this process (``capsys``: pytest's
    fixture; earlier captured output is dropped first). Python warnings that reach the test process (the
    CLI prints its own on stderr) are silenced with ``ignore_warnings``, or appended to ``caught``."""
    import warnings

    from confcal.cli import main

    capsys.readouterr()
    with warnings.catch_warnings(record=caught is not None) as got:
        if ignore_warnings:
            warnings.simplefilter("ignore")
        elif caught is not None:
            warnings.simplefilter("always")
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    if caught is not None:
        caught.extend(got)
    out = capsys.readouterr()
    return code, out.out, out.err
