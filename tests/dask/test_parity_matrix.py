"""The engine parity matrix, generated from the registry: every registered method x every input
kind it takes x every command that takes ``--engine`` (``fit``, ``evaluate`` with its ``--max-ece``
exit status, ``apply``), plus ``drift``, ``report`` and ``rank`` on the manifest fitted either way.
The CLI runs in this process (its ``main``); the Dask side runs on the session's two-process cluster.

Input kinds (:func:`input_kinds`, from each method's declared inputs):

* ``logits`` -- class-vector logits with the method's required side inputs (``domains``,
  ``features``: the penultimate layer whose linear map gives the logits, so ``fc`` fits too);
  ``logits+domains`` where domains are optional;
* ``multihot`` -- sigmoid-head logits with multi-hot labels ``(n, K)`` (``multilabel`` methods);
* ``box`` -- 1-D box scores; ``box+domains`` / ``box+category`` where the method takes them
  optionally; ``geo`` -- box scores with geometry columns ``cx,cy,w,h`` (``--box-features``);
* hyper-parameters a method cannot do without (:data:`PARAMS`: ``source-gated-ts`` needs its
  source domain).

Asserted for every case:

* manifests equal field by field (fit record, data digest and data summary included; fitted
  parameters within 1e-9 relative), except the engine's own fields (:data:`ENGINE_FIELDS`);
* a method that fits on a seeded sample on Dask says so (``fit.fitted_on == "sample"``, the
  command's note); with ``--sample-rows`` above the row count the sample is every row in order, so
  its parameters (and digest) equal the single-process fit's; a full-data method says ``"all rows"``;
* metrics within 1e-12 relative (1e-13 absolute for values that are 0 up to rounding), exit codes
  and warnings identical (fit, evaluate, apply); the ``evaluate --json`` documents have the same key
  set, recursively (one builder, :mod:`confcal.evaluation.document`), the engine's name aside;
* ``drift``, ``report`` (its ``<stem>.numbers.json``) and ``rank`` (its queue CSV) on the local-
  and the Dask-fitted manifest: the same exit code and the same output field by field (numbers
  within 1e-9 relative: they go through the fitted parameters), except the manifest file's sha256.

A method registered later joins by being registered; the test fails if a case is refused by either
engine. Formerly "refused alike" (multilabel, fc, source-gated-ts), skipped (the geometry maps)
and refused by Dask (``evaluate --engine dask`` of multi-hot labels) cases all run now.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from confcal.calibrators import METHODS
from tests.conftest import require_shared_data
from tests.dask._documents import run_cli, same_document
from tests.dask.conftest import write_dataset
from tests.dask.test_parity import ENGINE_FIELDS, _close

pytestmark = pytest.mark.slow

N_ROWS = 240
ABS = 1e-13
#: hyper-parameters a method has no default for
PARAMS = {"source-gated-ts": ["--param", "source_domain=s0"]}
#: methods whose optional side input is required at fit time (source-gated-ts: the source rows
#: are those of domain ``source_domain``), so only that input kind applies
FIT_NEEDS = {"source-gated-ts": "domains"}
#: per-output fields that name the manifest file itself (its sha256 differs: utc_time, engine)
FILE_FIELDS = {"calibrator_sha256"}
GEO = ("cx", "cy", "w", "h")


def _target(name: str):
    cls = METHODS[name]
    return getattr(cls, "cls", cls)


def input_kinds(name: str) -> list[str]:
    """The input kinds ``name`` takes (module docstring), from its declared inputs."""
    t = _target(name)
    optional = tuple(getattr(t, "optional_side_inputs", ()) or ())
    if getattr(t, "multilabel", False):
        return ["multihot"]
    if getattr(t, "takes_box_features", False):
        return ["geo"] + (["geo+category"] if "category_ids" in optional else [])
    if getattr(t, "takes_box_scores", False):
        return ["box"] + [f"box+{s.split('_')[0]}" for s in ("domains", "category_ids") if s in optional]
    kinds = ["logits"] + (["logits+domains"] if "domains" in optional else [])
    return [k for k in kinds if FIT_NEEDS.get(name, "") in k]


CASES = [(m, k) for m in sorted(METHODS.available()) for k in input_kinds(m)]


@pytest.fixture(scope="module")
def matrix_data(tmp_path_factory):
    """Small real slices, each as one .npz (single process) and one Parquet dataset of 3 uneven
    files (Dask): CIFAR-10 (LeNet-5) logits with domains, penultimate features (the logits and one
    more column: the logits are their linear map) and multi-hot labels; KITTI box scores with
    domains, category ids and synthetic box geometry (seeded; a function of the score, so the
    geometry maps have something to find)."""
    root = tmp_path_factory.mktemp("matrix")
    rng = np.random.default_rng(7)
    # LeNet-5 (about 60% accurate): no class is separable on a small slice, so every optimum is
    # well defined (on WideResNet's 92% a 240-row slice sends vs biases past 1e3 along a flat ridge)
    d = np.load(require_shared_data("cifar", "lenet-5-cifar-10.npz"))
    logits = np.log(d["predictions"]).astype(np.float32)[:N_ROWS]
    labels = d["ground_truth"].astype(np.int64)[:N_ROWS]
    domains = np.array(["s0", "s1", "s2"])[np.arange(N_ROWS) % 3]
    features = np.hstack([logits.astype(np.float64), rng.normal(size=(N_ROWS, 1))])
    # multi-hot: the true class plus each other label with probability 0.1
    multihot = (rng.random((N_ROWS, logits.shape[1])) < 0.1).astype(np.int64)
    multihot[np.arange(N_ROWS), labels] = 1
    cls = {"logits": logits, "label": labels, "domain": domains, "features": features, "mlabel": multihot}
    np.savez(root / "cls.npz", **cls)
    write_dataset(root / "cls.parquet", cls, n_parts=3)
    k = np.load(require_shared_data("detection", "kitti_bev_cars", "matched_iou50.npz"))
    scores = np.clip(k["score"], 1e-6, 1 - 1e-6)[:N_ROWS]
    correct = k["label"].astype(np.int64)[:N_ROWS]
    bdom = np.where(k["image_id"][:N_ROWS] % 2 == 0, "even", "odd")
    cat = (k["det_id"][:N_ROWS] % 3).astype(np.int64)
    geo = np.column_stack([rng.random(N_ROWS), rng.random(N_ROWS), 0.05 + 0.3 * scores * rng.random(N_ROWS),
                           0.05 + 0.2 * rng.random(N_ROWS)])
    box = {"logits": scores, "label": correct, "domain": bdom, "cat": cat, "geo": geo,
           **{g: geo[:, i] for i, g in enumerate(GEO)}}
    np.savez(root / "box.npz", **box)
    write_dataset(root / "box.parquet", box, n_parts=3)
    return root


def _cli(*argv, capsys):
    caught = []
    code, out, err = run_cli(capsys, *argv, caught=caught)
    # the CLI prints its warnings as `confcal: warning: ...` lines on stderr (its own showwarning), so
    # they are read there; a warning that reached Python's machinery instead is compared too
    said = [ln.split("confcal: warning:", 1)[1].strip() for ln in err.splitlines() if "confcal: warning:" in ln]
    said += [str(w.message) for w in caught]
    return code, out, err, sorted({w for w in said if "dask" not in w.lower()})


def _inputs(name: str, kind: str, root, where: str) -> dict:
    """``{"x": --logits/--labels, "side": side inputs for fit/evaluate/report, "apply": side inputs
    for apply, "extra": evaluate/report flags}`` of one case."""
    t = _target(name)
    box = kind.split("+")[0] in ("box", "geo")
    src = root / (("box" if box else "cls") + (".npz" if where == "local" else ".parquet"))
    x = ["--logits", f"{src}:logits", "--labels", f"{src}:{'mlabel' if kind == 'multihot' else 'label'}"]
    side, apply_side, extra = [], [], []
    required = tuple(getattr(t, "side_inputs", ()) or ())
    if "domains" in required or kind.endswith("+domains"):
        side += ["--domains", f"{src}:domain"]
    if kind.startswith("geo"):
        side += ["--box-features", ",".join(GEO)]
        apply_side += ["--features", f"{src}:geo"]
    elif "features" in required:
        side += ["--features", f"{src}:features"]
    if kind.endswith("+category"):
        side += ["--category-ids", f"{src}:cat"]
    if kind == "multihot":
        extra += ["--multilabel"]
    apply_side = [a for a in side if not a.startswith("--box-features") and "," not in a] + apply_side
    return {"x": x, "side": side, "apply": apply_side, "extra": extra, "src": src}


def _metrics(res: dict) -> dict:
    return res["metrics"]


def _rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: v for k, v in r.items() if k not in FILE_FIELDS} for r in csv.DictReader(fh)]


def _numeric(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _same_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w), i
        for k in w:
            a, b = _numeric(g[k]), _numeric(w[k])
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-9, abs=ABS), (i, k)
            else:
                assert a == b, (i, k)


#: input kinds whose evaluate cannot yet recognise its own calibration rows, on either engine: the fit digest
#: of a per-category box map covers the category ids, which evaluate does not digest; the multi-label
#: evaluate has no such check
FITTED_ON_GAPS = ("box+category", "geo+category", "multihot")


def _same_evaluation(method, kind, local, dask):
    """Same --max-ece exit status, warnings and evaluate document: the same keys, recursively, and
    values within 1e-12 relative (:func:`tests.dask._documents.same_document`)."""
    (cl, ol, el, wl), (cd, od, ed, wd) = local, dask
    assert cl == cd, (el, ed)
    assert wl == wd
    # the matrix evaluates the rows it fitted on: both engines must say so (the warnings compared are not
    # empty), except where neither engine can yet tell (FITTED_ON_GAPS)
    if kind not in FITTED_ON_GAPS:
        assert any("fitted on" in w for w in wl), (method, kind, wl)
    same_document(json.loads(ol), json.loads(od))


@pytest.mark.parametrize(("method", "kind"), CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_engine_parity(method, kind, matrix_data, dask_client, tmp_path, capsys, monkeypatch):
    sched = ["--engine", "dask", "--scheduler", dask_client.scheduler.address]
    loc, dsk = _inputs(method, kind, matrix_data, "local"), _inputs(method, kind, matrix_data, "dask")
    params = PARAMS.get(method, [])
    # fit, both engines
    man_l, man_d = tmp_path / "local.json", tmp_path / "dask.json"
    code_l, _, err_l, warn_l = _cli("fit", "--method", method, *loc["x"], *loc["side"], *params, "-o", man_l,
                                    capsys=capsys)
    code_d, _, err_d, warn_d = _cli("fit", "--method", method, *dsk["x"], *dsk["side"], *params, "-o", man_d,
                                    "--sample-rows", 10 * N_ROWS, *sched, capsys=capsys)
    assert code_l == code_d == 0, (err_l, err_d)
    assert warn_l == warn_d
    want, got = json.loads(man_l.read_text()), json.loads(man_d.read_text())
    fitted_on = got["fit"]["fitted_on"]
    assert fitted_on in ("all rows", "sample")
    if fitted_on == "sample":  # the documented difference: a sample (here every row, in order)
        assert got["fit"]["sample"]["rows"] == N_ROWS and "seeded sample" in err_d
    else:
        assert "all rows" in err_d and got["fit"]["n_passes"] >= 1
    assert got["fit"]["data_summary"] == want["fit"]["data_summary"]
    # the data digest does not depend on the engine (fixed global row blocks, confcal._digest)
    assert got["fit"]["data_sha256"] == want["fit"]["data_sha256"]
    for m in (want, got):
        m["fit"] = {k: v for k, v in m["fit"].items() if k not in ENGINE_FIELDS | {"sample"}}
    _close(got, want)

    # evaluate with the local manifest on both engines: same metrics, same --max-ece exit status
    ev_l = [*loc["x"], *loc["side"], *loc["extra"]]
    ev_d = [*dsk["x"], *dsk["side"], *dsk["extra"]]
    code, out, err, _ = _cli("evaluate", *ev_l, "--calibrator", man_l, "--json", capsys=capsys)
    assert code == 0, err
    local_res = json.loads(out)
    after = _metrics(local_res)[method]
    after = after.get("mean", after)  # multi-hot labels: the gate reads the mean over labels
    gate = "d_ece" if "d_ece" in after else "ece"
    # half the calibrated value: exit 3 on both (a value 0 up to rounding: 1e-9, exit 0 on both)
    limit = f"{max(0.5 * after[gate], 1e-9):.6g}"
    # every gate rule (issue 42): the same verdict, intervals and test p-values on both engines
    for rule in ("point", "confident", "test"):
        runs = {}
        for where, args, more in (("local", ev_l, []), ("dask", ev_d, sched)):
            runs[where] = _cli("evaluate", *args, "--calibrator", man_l, "--max-ece", limit, "--json",
                               "--gate-rule", rule, *more, capsys=capsys)
        _same_evaluation(method, kind, runs["local"], runs["dask"])

    # apply with the dask-fitted manifest on both engines
    out_l, out_d = tmp_path / "probs.npy", tmp_path / "probs.parquet"
    cl, _, el, wl = _cli("apply", "--calibrator", man_d, loc["x"][0], loc["x"][1], *loc["apply"], "-o", out_l,
                         capsys=capsys)
    cd, _, ed, wd = _cli("apply", "--calibrator", man_d, dsk["x"][0], dsk["x"][1], *dsk["apply"], "-o", out_d,
                         *sched, capsys=capsys)
    assert cl == cd == 0, (el, ed)
    assert wl == wd
    import pyarrow.parquet as pq

    p_l = np.load(out_l)
    p_d = pq.read_table(out_d).column("probs").combine_chunks().flatten().to_numpy().reshape(p_l.shape[0], -1)
    np.testing.assert_allclose(p_d, p_l.reshape(p_l.shape[0], -1), rtol=1e-12, atol=ABS)

    # drift on the manifest fitted either way: the same verdict
    dl = _cli("drift", "--calibrator", man_l, *loc["x"][:2], "--json", capsys=capsys)
    dd = _cli("drift", "--calibrator", man_d, *loc["x"][:2], "--json", capsys=capsys)
    assert dl[0] == dd[0], (dl[2], dd[2])
    if dl[0] == 0:
        assert json.loads(dl[1]) == json.loads(dd[1])

    # report on the manifest fitted either way: <stem>.numbers.json equal field by field, and the
    # figures drawn from the same inputs: the local report draws them (matplotlib: most of the
    # matrix's time, e.g. 2.8 s per label of a multi-hot report under load), the Dask-fitted one
    # reuses each drawing after checking that its inputs equal the local one's
    import confcal.report as report_module

    real_svg, drawn = report_module.reliability_svg, []

    def local_svg(stages, title):
        drawn.append((stages, title, real_svg(stages, title)))
        return drawn[-1][2]

    def dask_svg(stages, title):
        want_stages, want_title, svg = drawn.pop(0)
        assert title == want_title
        _close(stages, want_stages, f"report figure {title}")
        return svg

    reports = {}
    for where, man in (("local", man_l), ("dask", man_d)):
        html = tmp_path / f"report-{where}.html"
        monkeypatch.setattr(report_module, "reliability_svg", local_svg if where == "local" else dask_svg)
        code, _, err, warn = _cli("report", *ev_l, "--calibrator", man, "--bootstrap", 20, "-o", html,
                                  capsys=capsys)
        monkeypatch.setattr(report_module, "reliability_svg", real_svg)
        numbers = tmp_path / f"report-{where}.numbers.json"
        has = code == 0
        reports[where] = (code, warn, json.loads(numbers.read_text()) if has else err)
        assert numbers.exists() == has, where
    assert reports["local"][0] == reports["dask"][0] == 0, (reports["local"][2], reports["dask"][2])
    assert drawn == [], "the Dask-fitted report drew fewer figures"
    assert reports["local"][1] == reports["dask"][1]
    rl, rd = ({k: v for k, v in r[2].items() if k not in FILE_FIELDS} for r in (reports["local"], reports["dask"]))
    _close(rd, rl)

    # rank (box calibrators): the queue CSV on the manifest fitted either way, field by field
    if kind.split("+")[0] in ("box", "geo"):
        det = require_shared_data("detection", "kitti_bev_cars", "detections.json")
        ranks = {}
        for where, man in (("local", man_l), ("dask", man_d)):
            q = tmp_path / f"queue-{where}.csv"
            ranks[where] = (*_cli("rank", "--detections", det, "--calibrator", man, "-o", q, capsys=capsys), q)
        assert ranks["local"][0] == ranks["dask"][0], (ranks["local"][2], ranks["dask"][2])
        assert ranks["local"][3] == ranks["dask"][3]
        if ranks["local"][0] == 0:
            _same_rows(_rows(ranks["dask"][4]), _rows(ranks["local"][4]))
