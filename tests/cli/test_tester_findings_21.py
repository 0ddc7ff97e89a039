"""The fresh tester's findings of issue 21 (``/tmp/tester/findings.md``, T1...), one test each, in
process through ``main(argv)``: the command's exit status, its one-line error and no output file."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from confcal.cli import main
from tests.dask._documents import key_paths


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("confcal: error: ") and "Traceback" not in "\n".join(err)
    assert sum(line.startswith("confcal: error:") for line in err) == 1
    return err[-1]


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3)) * 2
    y = np.where(rng.random(300) < 0.8, z.argmax(1), rng.integers(0, 3, 300))
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "v.npz", logits=z, labels=y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--logits", f"{tmp_path}/z.npy", "--labels", f"{tmp_path}/y.npy", "--method", "ts",
                     "-o", f"{tmp_path}/cal.json"]) == 0
    return tmp_path, z, y


def _fitted_manifest(d, method):
    """``confcal fit --method METHOD`` on the fixture's files, written to ``d/m.json``; its JSON."""
    import json

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--method", method, "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy",
                     "-o", f"{d}/m.json"]) == 0
    return json.loads((d / "m.json").read_text())


@pytest.mark.parametrize("suffix, column", [(".parquet", "probs"), (".csv", "probs_1")])
def test_t1_kept_column_named_like_an_output_column_is_refused(files, capsys, suffix, column):
    """T1: --keep-columns probs wrote a Parquet file with two 'probs' columns (unreadable by name)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    d, z, _ = files
    pq.write_table(pa.table({**{f"logit_{j}": z[:, j] for j in range(3)}, column: np.arange(300)}), d / "x.parquet")
    capsys.readouterr()
    out = d / f"p{suffix}"
    code = main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/x.parquet:logit_*",
                 "--keep-columns", column, "-o", str(out)])
    err = _err(capsys)
    assert code == 2 and err.startswith(f"confcal: error: --keep-columns: {column!r} is the name of an output column")
    assert not out.exists() and not [p for p in os.listdir(d) if p.endswith(".tmp")]
    # another kept column is still copied
    assert main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/x.parquet:logit_*",
                 "--keep-columns", "logit_0", "-o", str(out)]) == 0


def test_t2_compare_default_cal_size_falls_back_to_half_the_rows(files, capsys):
    """T2: compare on 300 rows refused the default --cal-size 5000 the user never gave."""
    d, _, _ = files
    capsys.readouterr()
    assert main(["compare", "-q", "--json", "--logits", f"{d}/v.npz:logits", "--labels", f"{d}/v.npz:labels",
                 "--methods", "ts", "--splits", "1"]) == 0
    cap = capsys.readouterr()
    assert "calibrating on half (150)" in cap.err
    import json

    assert json.loads(cap.out)["protocol"]["cal_size"] == 150
    # an explicit size >= n is still the user's mistake
    code = main(["compare", "-q", "--logits", f"{d}/v.npz:logits", "--labels", f"{d}/v.npz:labels",
                 "--methods", "ts", "--splits", "1", "--cal-size", "300"])
    assert code == 2 and _err(capsys).startswith("confcal: error: --cal-size: ")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_t3_output_that_is_a_fifo_is_refused(files, capsys):
    """T3: apply -o FIFO replaced the pipe with a regular file (a reader never got the data)."""
    d, _, _ = files
    os.mkfifo(d / "f.npy")
    capsys.readouterr()
    code = main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/z.npy", "-o", f"{d}/f.npy"])
    err = _err(capsys)
    assert code == 2 and "--output: " in err and "FIFO" in err
    import stat

    assert stat.S_ISFIFO(os.stat(d / "f.npy").st_mode)  # still the pipe


@pytest.mark.parametrize("flag", [["--sample-rows", "-1"], ["--sample-rows", "0"], ["--sample-rows", "5"],
                                  ["--seed", "3"]])
def test_t4_dask_sample_options_without_the_dask_engine_are_refused(files, capsys, flag):
    """T4: --sample-rows -1 (or 0) was silently ignored by the local engine; --workers is refused there."""
    d, _, _ = files
    capsys.readouterr()
    code = main(["fit", "-q", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--method", "ts",
                 "-o", f"{d}/o.json", *flag])
    err = _err(capsys)
    assert code == 2 and err == f"confcal: error: {flag[0]}: only with --engine dask", err
    assert not (d / "o.json").exists()


def _coco(d):
    import json

    images = [{"id": i, "file_name": f"img{i}.png", "width": 100, "height": 100} for i in range(4)]
    anns = [{"id": i, "image_id": i, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400, "iscrowd": 0}
            for i in range(4)]
    dets = [{"image_id": i, "category_id": 1, "bbox": [11, 11, 20, 20], "score": 0.5 + 0.1 * i} for i in range(4)]
    dets += [{"image_id": i, "category_id": 1, "bbox": [60, 60, 10, 10], "score": 0.3} for i in range(4)]
    (d / "gt.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1}]}))
    return dets


def test_t5_rank_with_a_geometry_calibrator_is_refused_in_one_line(tmp_path, capsys):
    """T5: rank --calibrator det-platt-geo.json ended in 'internal error: AttributeError ... kind_'."""
    import json

    from confcal.calibrators import METHODS

    dets = _coco(tmp_path)
    (tmp_path / "dets.json").write_text(json.dumps(dets))
    rng = np.random.default_rng(0)
    s, cx = rng.uniform(0.05, 0.95, 200), rng.uniform(0, 1, 200)
    y = (rng.uniform(size=200) < s).astype(int)
    for method in ("det-platt-geo", "det-beta-geo", "det-hist-geo"):
        cal = METHODS[method](box_features="cx", min_samples=5).fit(s, y, features=cx[:, None])
        (tmp_path / "geo.json").write_text(json.dumps(cal.to_dict()))
        capsys.readouterr()
        code = main(["rank", "--detections", f"{tmp_path}/dets.json", "--gt", f"{tmp_path}/gt.json",
                     "--calibrator", f"{tmp_path}/geo.json", "-o", f"{tmp_path}/q.csv"])
        err = _err(capsys)
        assert code == 2 and err.startswith("confcal: error: --calibrator: rank takes det-ts") and method in err, err
        assert not (tmp_path / "q.csv").exists()


@pytest.mark.parametrize("bad, where", [({"bbox": [float("nan")] * 4}, "record 5 has box"),
                                        ({"bbox": [0, 0, -3, 4]}, "record 5 has box [0.0, 0.0, -3.0, 4.0]"),
                                        ({"category_id": 999}, "record 5 has category_id 999")])
def test_t6_rank_checks_detections_as_match_does(tmp_path, capsys, bad, where):
    """T6: rank queued a file with a NaN / negative box or an unknown category that match refuses."""
    import json

    dets = _coco(tmp_path)
    dets[5].update(bad)
    (tmp_path / "dets.json").write_text(json.dumps(dets).replace("NaN", "NaN"))
    argv = ["rank", "--detections", f"{tmp_path}/dets.json", "--gt", f"{tmp_path}/gt.json", "-o", f"{tmp_path}/q.csv"]
    capsys.readouterr()
    assert main(argv) == 2
    err = _err(capsys)
    assert err.startswith(f"confcal: error: --detections: {tmp_path}/dets.json: {where}"), err
    assert not (tmp_path / "q.csv").exists()
    # match says the same of the same file
    assert main(["detections", "match", "--gt", f"{tmp_path}/gt.json", "--detections", f"{tmp_path}/dets.json",
                 "-o", f"{tmp_path}/m.npz"]) == 2
    assert where.split(" has ")[0] in _err(capsys)
    dets[5] = {"image_id": 1, "category_id": 1, "bbox": [60, 60, 10, 10], "score": 0.3}
    (tmp_path / "dets.json").write_text(json.dumps(dets))
    assert main(argv) == 0 and (tmp_path / "q.csv").exists()


def _tamper_first_float_constant(src, dst):
    """Multiply the first float initializer / Constant of an ONNX graph (subgraphs included) by 3, plus 1."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))

    def tensors(graph):
        yield from graph.initializer
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    yield a.t
                elif a.type == onnx.AttributeProto.GRAPH:
                    yield from tensors(a.g)

    for t in tensors(model.graph):
        arr = numpy_helper.to_array(t)
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.any(arr != 0):
            t.CopyFrom(numpy_helper.from_array((arr * 3 + 1).astype(arr.dtype), t.name))
            break
    else:
        raise AssertionError("no float constant to tamper")
    onnx.save(model, str(dst))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_t7_verify_runs_the_head_and_refuses_an_edited_graph(files, capsys, dtype):
    """T7: --verify compared only the metadata's sha256: an edited graph passed."""
    pytest.importorskip("onnxruntime")
    d, _, _ = files
    head = d / "h.onnx"
    assert main(["export", "--calibrator", f"{d}/cal.json", "--format", "onnx", "--dtype", dtype,
                 "-o", str(head)]) == 0
    assert main(["export", "--verify", str(head), "--calibrator", f"{d}/cal.json"]) == 0
    _tamper_first_float_constant(head, d / "t.onnx")
    capsys.readouterr()
    code = main(["export", "--verify", f"{d}/t.onnx", "--calibrator", f"{d}/cal.json"])
    err = _err(capsys)
    assert code == 2 and err.startswith("confcal: error: --verify: the head ") and "does not" in err, err


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_t7_verify_refuses_a_head_of_another_method_with_the_copied_sha256(files, capsys, fmt):
    """T7: a VS head whose metadata carries the TS manifest's sha256 and method passed --verify."""
    pytest.importorskip("onnxruntime")
    import hashlib
    import json

    d, _, _ = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--method", "vs",
                     "-o", f"{d}/vs.json"]) == 0
    sha = hashlib.sha256((d / "cal.json").read_bytes()).hexdigest()
    head = d / ("vs.onnx" if fmt == "onnx" else "vs.pt")
    assert main(["export", "--calibrator", f"{d}/vs.json", "--format", fmt, "-o", str(head)]) == 0
    if fmt == "onnx":
        import onnx

        model = onnx.load(str(head))
        for p in model.metadata_props:
            if p.key == "confcal.manifest_sha256":
                p.value = sha
            elif p.key == "confcal.method":
                p.value = "ts"
        onnx.save(model, str(head))
    else:
        import torch

        extra = {"confcal.json": ""}
        module = torch.jit.load(str(head), _extra_files=extra)
        meta = {**json.loads(extra["confcal.json"]), "confcal.manifest_sha256": sha, "confcal.method": "ts"}
        torch.jit.save(module, str(head), _extra_files={"confcal.json": json.dumps(meta)})
    capsys.readouterr()
    code = main(["export", "--verify", str(head), "--calibrator", f"{d}/cal.json"])
    err = _err(capsys)
    assert code == 2 and "--verify: the head" in err and "does not compute its map" in err, err
    # the VS head still verifies against its own manifest... once its own sha256 is back
    assert main(["export", "--calibrator", f"{d}/vs.json", "--format", fmt, "-o", str(head)]) == 0
    assert main(["export", "--verify", str(head), "--calibrator", f"{d}/vs.json"]) == 0


def _domain_files(tmp_path, names):
    rng = np.random.default_rng(3)
    out = []
    for j, name in enumerate(names):
        z = rng.normal(0, 3, (120, 3))
        y = np.where(rng.random(120) < 0.7, z.argmax(1), rng.integers(0, 3, 120))
        np.savez(tmp_path / f"{name}.npz", logits=z, labels=y, features=rng.normal(j, 1, (120, 2)))
        out += ["--domain", f"{name}={tmp_path / name}.npz"]
    return out


def test_p2_de_ok_two_domains_refused_in_words_not_an_empty_range(tmp_path, capsys):
    """p2 misc/de-ok: source + one target said '--n-calibration: expected 1..0 ..., got 2' for a
    default the user never gave; the protocol needs a calibration domain, so --domain is named."""
    capsys.readouterr()
    code = main(["domain-eval", *_domain_files(tmp_path, ["a", "b"]), "--source", "a", "--draws", "3",
                 "--csv", str(tmp_path / "o.csv")])
    err = _err(capsys)
    assert code == 2 and err.startswith("confcal: error: --domain: target 'b' leaves no calibration domain"), err
    assert "1..0" not in err and not (tmp_path / "o.csv").exists()


def test_p2_de_ok_default_n_calibration_falls_back_to_the_domains_left(tmp_path, capsys):
    """Three domains: the default --n-calibration 2 cannot be met (one domain is left besides source and
    target); the run uses 1 with a note, while an explicit --n-calibration 2 is still refused."""
    argv = ["domain-eval", *_domain_files(tmp_path, ["a", "b", "c"]), "--source", "a", "--draws", "3",
            "--n-samples", "40"]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*argv, "--csv", str(tmp_path / "o.csv")]) == 0
    captured = capsys.readouterr()
    assert "note: --n-calibration 2 (the default)" in captured.err
    assert r"a \| c -> b" in captured.out and r"a \| b -> c" in captured.out
    code = main([*argv, "--n-calibration", "2"])
    err = _err(capsys)
    assert code == 2 and "--n-calibration: expected 1..1" in err


@pytest.mark.parametrize("case", ["onnx-as-pt", "pt-as-onnx", "garbage", "foreign-onnx", "folder"])
def test_p2_verify_of_a_file_that_is_not_a_head_names_verify_in_one_line(files, capsys, case):
    """p2 export/verify-onnx-as-pt: an ONNX graph copied to h.pt gave torch's zip-reader text (several
    sentences of checkpoint advice) instead of a line naming --verify."""
    pytest.importorskip("onnxruntime")
    import shutil

    d, _, _ = files
    assert main(["export", "--calibrator", f"{d}/cal.json", "--format", "onnx", "-o", f"{d}/h.onnx"]) == 0
    assert main(["export", "--calibrator", f"{d}/cal.json", "--format", "torchscript", "-o", f"{d}/h.pt"]) == 0
    target, want = {"onnx-as-pt": ("x.pt", "is not a TorchScript file written by confcal export"),
                    "pt-as-onnx": ("x.onnx", "is not an ONNX graph written by confcal export"),
                    "garbage": ("g.pt", "is not a TorchScript file"),
                    "foreign-onnx": ("f.onnx", "holds no confcal.manifest_sha256 metadata"),
                    "folder": ("sub", "is not a regular file")}[case]
    if case == "onnx-as-pt":
        shutil.copy(d / "h.onnx", d / target)
    elif case == "pt-as-onnx":
        shutil.copy(d / "h.pt", d / target)
    elif case == "garbage":
        (d / target).write_bytes(b"not a head\n")
    elif case == "foreign-onnx":
        import onnx

        model = onnx.load(str(d / "h.onnx"))
        del model.metadata_props[:]
        onnx.save(model, str(d / target))
    else:
        (d / target).mkdir()
    capsys.readouterr()
    code = main(["export", "--verify", str(d / target), "--calibrator", f"{d}/cal.json"])
    err = _err(capsys)
    assert code == 2 and err.startswith("confcal: error: --verify: ") and want in err, err
    assert "If you are seeing" not in err and len(err) < 300, err


@pytest.mark.parametrize("method", ["grouped-ts", "det-ts"])
def test_t12_bool_domain_ids_give_a_manifest_that_loads(tmp_path, capsys, method):
    """T12: fit with bool domain ids wrote groups false/true, which every later command refused
    ('parameters.groups[0][0]: expected an int or string id, got False'). Bool ids are the ints 0 / 1."""
    rng = np.random.default_rng(5)
    z = rng.normal(size=(400, 3)) * 2
    y = np.where(rng.random(400) < 0.7, z.argmax(1), rng.integers(0, 3, 400))
    mask = rng.random(400) < 0.5
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", mask)
    np.save(tmp_path / "t.npy", ~mask)
    np.save(tmp_path / "ti.npy", (~mask).astype(np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--method", method, "--logits", f"{tmp_path}/z.npy", "--labels",
                     f"{tmp_path}/y.npy", "--domains", f"{tmp_path}/d.npy", "-o", f"{tmp_path}/g.json"]) == 0
        for ids, out in (("t.npy", "p.npy"), ("ti.npy", "pi.npy")):
            assert main(["apply", "-q", "--calibrator", f"{tmp_path}/g.json", "--logits", f"{tmp_path}/z.npy",
                         "--domains", f"{tmp_path}/{ids}", "-o", f"{tmp_path}/{out}"]) == 0
    from confcal.io import load_calibrator

    cal = load_calibrator(tmp_path / "g.json")
    keys = {k if not isinstance(k, tuple) else k[0] for k in cal.groups_}
    assert keys == {0, 1}
    p, pi = np.load(tmp_path / "p.npy"), np.load(tmp_path / "pi.npy")
    np.testing.assert_allclose(p, pi, rtol=0, atol=0)  # same rows through the same groups' maps
    # and the map really is per group: the two groups' rows go through their own temperatures
    direct = cal.predict_proba(z, domains=(~mask).astype(np.int64), dtype=np.float64)
    np.testing.assert_allclose(p, direct, rtol=1e-12, atol=1e-15)


def test_t8_local_dask_cluster_says_nothing_when_port_8787_is_taken():
    """T8: with port 8787 taken, every --engine dask command printed distributed's three-line
    'Port 8787 is already in use' notice. The local cluster's scheduler serves on an ephemeral
    loopback port."""
    pytest.importorskip("distributed")
    import socket

    from confcal.dask._cluster import cluster_client

    holder = socket.socket()
    try:
        holder.bind(("", 8787))
        holder.listen()
    except OSError:
        pass  # already taken by someone else: the situation of the finding all the same
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with cluster_client(workers=1) as client:
                assert client.submit(sum, [1, 2]).result() == 3
                port = client.cluster.scheduler.http_server.port
        assert not [w for w in seen if "already in use" in str(w.message)], [str(w.message) for w in seen]
        assert port != 8787
    finally:
        holder.close()


def test_t17_compare_on_one_row_names_the_rows_not_a_cal_size_it_chose(tmp_path, capsys):
    """T17: with the default --cal-size, one row was halved to --cal-size 0 and then refused as if the
    user had asked for it; now the row count is named (class vectors and 1-D box scores alike)."""
    from confcal.cli import main

    np.save(tmp_path / "x.npy", np.array([[0.5, -0.5, 0.1]]))
    np.save(tmp_path / "y.npy", np.array([0]))
    np.save(tmp_path / "s.npy", np.array([0.7]))
    for logits in ("x.npy", "s.npy"):
        code = main(["compare", "--logits", str(tmp_path / logits), "--labels", str(tmp_path / "y.npy"),
                     "--methods", "ts" if logits == "x.npy" else "det-platt"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, err
        assert err[-1].startswith("confcal: error: --logits:") and "at least 2" in err[-1], err
        assert "--cal-size" not in err[-1]


def test_t9_evaluate_json_has_one_layout_with_and_without_domains_or_a_limit(files, capsys):
    """T9: in one process `evaluate --json` had two layouts (``n_classes`` + ``metrics`` when streamed, an
    ``audit`` block once --domains or --max-ece was given, without ``ece_equal_mass``/``mce``); the Dask
    engine a third (tests/dask/test_evaluate_document.py). Now one document: the same keys whatever the
    flags (``per_domain`` filled with --domains, ``limits`` with --max-ece), the same metric values."""
    import json

    d, z, y = files
    np.save(d / "dom.npy", np.array(["a", "b"])[np.arange(len(y)) % 2])
    base = ["evaluate", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--calibrator", f"{d}/cal.json", "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        docs = {}
        for name, more in (("plain", []), ("gated", ["--max-ece", "1"]), ("domains", ["--domains", f"{d}/dom.npy"])):
            assert main(base + more) == 0
            docs[name] = json.loads(capsys.readouterr().out)
    plain, gated, per = docs["plain"], docs["gated"], docs["domains"]
    assert set(plain) == set(gated) == set(per)
    assert key_paths(plain) == {p for p in key_paths(gated) if not p.startswith(".limits.")}
    assert key_paths(plain) == {p for p in key_paths(per) if not p.startswith(".per_domain.")}
    assert plain["limits"] is None and gated["limits"]["verdict"] == "pass" and plain["per_domain"] == {}
    for stage in ("uncalibrated", "ts"):
        assert set(plain["metrics"][stage]) == {"accuracy", "ece", "ece_equal_mass", "mce", "nll", "brier"}
        for k, v in plain["metrics"][stage].items():
            assert per["metrics"][stage][k] == pytest.approx(v, rel=1e-12)
            assert gated["metrics"][stage][k] == pytest.approx(v, rel=1e-12)
    # per domain: the same metrics as overall, on that domain's rows (oracle: calibration_summary)
    from confcal.io import load_calibrator
    from confcal.metrics import calibration_summary

    p = load_calibrator(str(d / "cal.json")).predict_proba(z, dtype=np.float64)
    for i, g in enumerate(("a", "b")):
        want = calibration_summary(p[i::2], y[i::2])
        got = per["per_domain"][g]
        assert got["n_samples"] == len(y[i::2]) and set(got["metrics"]["ts"]) == set(want)
        for k, v in want.items():
            assert got["metrics"]["ts"][k] == pytest.approx(v, rel=1e-12, abs=1e-15)


def test_t30_evaluate_json_is_strict_json_with_the_same_keys_on_both_engines(tmp_path, capsys):
    """T30: `evaluate --engine dask --json` printed bare NaN for empty reliability bins (rejected by jq and
    JSON.parse) and other keys than in one process. Now both print the one document (null for empty bins)."""
    import json

    pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    z = 4 * rng.normal(size=(200, 3))  # confident: the low-confidence bins are empty
    y = z.argmax(1)
    pq.write_table(pa.table({"logit_0": z[:, 0], "logit_1": z[:, 1], "logit_2": z[:, 2], "label": y}),
                   tmp_path / "cols.parquet")
    base = ["evaluate", "--logits", f"{tmp_path}/cols.parquet:logit_*", "--labels", f"{tmp_path}/cols.parquet:label",
            "--json", "-q"]

    def refuse(const):
        raise AssertionError(f"{const} in the JSON output")

    docs = {}
    for where, more in (("local", []), ("dask", ["--engine", "dask", "--workers", "1"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(base + more) == 0
        docs[where] = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert key_paths(docs["local"]) == key_paths(docs["dask"])
    bins = docs["dask"]["reliability"]["uncalibrated"]
    assert any(b["count"] == 0 and b["mean_confidence"] is None and b["accuracy"] is None for b in bins)
    for stage, m in docs["local"]["metrics"].items():
        for k, v in m.items():
            assert docs["dask"]["metrics"][stage][k] == pytest.approx(v, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("method", ["vs", "pb"])
def test_t31_apply_of_a_torch_map_on_a_memory_mapped_npy_says_nothing(tmp_path, capsys, method):
    """T31: `apply` of a torch-based map (vs, pb, ...) on a float64 .npy (memory-mapped, read-only) printed
    PyTorch's 'The given NumPy array is not writable ... undefined behavior' warning; the read-only block
    is copied before it becomes a tensor."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 400)
    z = 2 * (rng.normal(size=(400, 5)) + np.eye(5)[y])
    np.save(tmp_path / "x.npy", z.astype(np.float64))
    np.save(tmp_path / "y.npy", y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--method", method, "--logits", f"{tmp_path}/x.npy", "--labels", f"{tmp_path}/y.npy",
                     "-o", f"{tmp_path}/m.json"]) == 0
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # a torch warning is shown once per process otherwise
        assert main(["apply", "-q", "--calibrator", f"{tmp_path}/m.json", "--logits", f"{tmp_path}/x.npy",
                     "-o", f"{tmp_path}/p.npy"]) == 0
    err = capsys.readouterr().err
    assert "writable" not in err and "warning" not in err, err
    p = np.load(tmp_path / "p.npy")
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)


def test_t32_drift_json_is_json_alone_when_drift_is_flagged(files, capsys):
    """T32: `drift --json` appended 'drift flagged in: ...' to stdout after the JSON exactly when drift was
    found; the line now goes to stderr with --json (the flags are in tests[].drift)."""
    import json

    d, z, y = files
    np.save(d / "far.npy", 50 * z)  # far more confident than the calibration data
    assert main(["drift", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/far.npy", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert any(t["drift"] for t in doc["tests"]) and "drift flagged in" in out.err
    assert main(["drift", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/far.npy"]) == 0
    assert "drift flagged in" in capsys.readouterr().out  # the table's line stays on stdout without --json


def test_t33_a_refused_input_gives_its_error_line_alone_without_an_earlier_note(files, capsys):
    """T33: 'note: --cal-size default ... calibrating on half' (compare) and 'note: ... box scores lie outside
    [0, 1]' (evaluate) came before the error about the same input: two lines. Notes are held until the
    command succeeds."""
    d, z, y = files
    bad = z.copy()
    bad[7, 1] = np.nan
    np.save(d / "nan.npy", bad)
    scores = np.linspace(-1, 2, len(y))  # outside [0, 1]: a note on success
    np.save(d / "s.npy", scores)
    np.save(d / "y3.npy", np.full(len(y), 2))  # labels 2: not 0/1, refused
    for argv in (["compare", "--logits", f"{d}/nan.npy", "--labels", f"{d}/y.npy", "--methods", "ts", "--splits", "2"],
                 ["evaluate", "--logits", f"{d}/s.npy", "--labels", f"{d}/y3.npy", "--json"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("confcal: error:"), err
    # on success the note is said (after the work, on stderr)
    np.save(d / "y01.npy", (scores > 0.5).astype(np.int64))
    assert main(["evaluate", "--logits", f"{d}/s.npy", "--labels", f"{d}/y01.npy", "--json"]) == 0
    assert "box scores lie outside [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["isotonic", "histogram-binning", "bbq", "beta", "platt-ovr",
                                    "scaling-binning-marginal"])
def test_t36_a_manifest_with_a_per_class_map_removed_is_refused_naming_maps(files, capsys, method):
    """T36: an isotonic / histogram-binning manifest with one entry of parameters.maps removed gave an
    IndexError (exit 1) in apply; the number of one-vs-rest maps is checked against n_classes on load."""
    d, z, y = files
    m = _fitted_manifest(d, method)
    assert len(m["parameters"]["maps"]) == 3
    m["parameters"]["maps"].pop(1)
    (d / "cut.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["apply", "--calibrator", f"{d}/cut.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"]) == 2
    assert "parameters.maps: expected a list of 3 entries (n_classes = 3), got 2" in _err(capsys)
    assert not (d / "p.npy").exists()


def test_t35_nan_in_the_fit_record_does_not_block_apply(files, capsys):
    """T35: a NaN in the fit record (json.dump writes it) refused the whole manifest; now the record's
    check names the field in one warning and apply runs (tests/calibrators/test_fit_record_constraints.py
    tampers every field)."""
    import json

    d, z, y = files
    m = json.loads((d / "cal.json").read_text())
    m["fit"]["metrics_before"]["ece"] = float("nan")
    (d / "nan.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["apply", "--calibrator", f"{d}/nan.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"]) == 0
    err = capsys.readouterr().err
    assert "fit.metrics_before.ece: expected a finite number >= 0 and <= 1, got nan" in err and str(d) in err


@pytest.mark.parametrize("command", ["compare", "apply"])
def test_t37_an_empty_output_path_is_refused_not_taken_as_no_output(files, capsys, command):
    """T37: `--csv ''` (an unset shell variable) was taken as "no --csv": compare ran and wrote nothing."""
    d, z, y = files
    argv = {"compare": ["compare", "--logits", f"{d}/z.npy", "--labels", f"{d}/y.npy", "--methods", "ts",
                        "--splits", "2", "--csv", ""],
            "apply": ["apply", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/z.npy", "-o", ""]}[command]
    assert main(argv) == 2
    opt = "--csv" if command == "compare" else "--output"
    assert _err(capsys) == f"confcal: error: {opt}: expected a file path, got ''"


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_t38_demo_output_dir_that_is_not_a_folder_is_refused_before_the_demo_runs(tmp_path, capsys, kind):
    """T38: `demo --output-dir` naming a file or FIFO ran the whole demo, printed its tables, then failed
    with 'cannot use ...: File exists' naming no option."""
    target = tmp_path / "x"
    if kind == "file":
        target.write_text("keep")
    elif hasattr(os, "mkfifo"):
        os.mkfifo(target)
    else:
        pytest.skip("no FIFOs on this platform")
    assert main(["demo", "--output-dir", str(target), "--no-plot"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == (f"confcal: error: --output-dir: {str(target)!r} exists and is not a "
                                                 "folder; name a folder (it is created if missing)")
    assert kind == "fifo" or target.read_text() == "keep"


@pytest.mark.parametrize("method", ["ts", "pb", "ets"])
def test_t34_a_negative_fitted_nll_is_refused_naming_it(files, capsys, method):
    """T34: parameters.nll = -5 (a negative mean negative log-likelihood) loaded silently; it is >= 0 (up to
    rounding) and refused naming the field. (Missing diagnostic fields stay accepted: older manifests.)"""
    d, z, y = files
    m = _fitted_manifest(d, method)
    assert m["parameters"]["nll"] >= 0
    m["parameters"]["nll"] = -5
    (d / "neg.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["apply", "--calibrator", f"{d}/neg.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"]) == 2
    assert "parameters.nll: expected a finite number >= -1e-09, got -5" in _err(capsys)


@pytest.mark.parametrize("method", ["bbq", "bbq-top"])
@pytest.mark.parametrize("tamper, said", [
    ("drop_weight", "model_weights: expected as many entries as {at}n_bins (one weight per binning model, at least "
                    "one), got {w} model_weights and {b} n_bins"),
    ("drop_bins", "model_weights: expected as many entries as {at}n_bins (one weight per binning model, at least "
                  "one), got {w} model_weights and {b} n_bins"),
    ("halve", "model_weights: expected model_weights summing to 1 (within 1e-6), got a sum of 0.5"),
], ids=["drop_weight", "drop_bins", "halve"])
def test_t34_bbq_model_weights_and_n_bins_are_checked_against_each_other(files, capsys, method, tamper, said):
    """T34 (rest): a bbq manifest whose model_weights and n_bins differ in length, or whose weights do not
    sum to 1, loaded silently; both are refused on load naming the field."""
    d, z, y = files
    m = _fitted_manifest(d, method)
    maps = m["parameters"]["maps"] if "maps" in m["parameters"] else [m["parameters"]["map"]]
    one = maps[0]
    assert len(one["model_weights"]) == len(one["n_bins"]) >= 1
    assert abs(sum(one["model_weights"]) - 1) < 1e-9
    if tamper == "drop_weight":
        one["model_weights"].pop()
    elif tamper == "drop_bins":
        one["n_bins"].pop()
    else:
        one["model_weights"] = [w / 2 for w in one["model_weights"]]
    (d / "bad.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["apply", "--calibrator", f"{d}/bad.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"]) == 2
    err = _err(capsys)
    at = "parameters.maps[0]." if "maps" in m["parameters"] else "parameters.map."
    assert at + said.format(at=at, w=len(one["model_weights"]), b=len(one["n_bins"])) in err
    assert not (d / "p.npy").exists()


def test_t43_grouped_ts_fits_probabilities_with_input_kind_probs(tmp_path, capsys):
    """T43: grouped-ts(input_kind="probs") refused probabilities, telling the user to pass the flag they had
    passed (the per-domain job ran with the base's default "logits"). Oracle: per domain, ts fitted on
    that domain's rows with input_kind="probs"."""
    from confcal.calibrators import METHODS

    rng = np.random.default_rng(3)
    z = rng.normal(size=(600, 4)) * 2
    y = np.where(rng.random(600) < 0.7, z.argmax(1), rng.integers(0, 4, 600))
    d = rng.integers(0, 2, 600)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    cal = METHODS["grouped-ts"](input_kind="probs").fit(p, y, domains=d)
    assert cal.fit_record_["input_kind"] == "probs"
    groups = dict((k, v["temperature"]) for k, v in cal._get_fitted()["groups"])
    for g in (0, 1):
        want = METHODS["ts"](input_kind="probs").fit(p[d == g], y[d == g]).temperature_
        assert groups[g] == pytest.approx(want, rel=1e-7)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", d)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--method", "grouped-ts", "--logits", f"{tmp_path}/p.npy", "--labels",
                     f"{tmp_path}/y.npy", "--domains", f"{tmp_path}/d.npy", "--input-kind", "probs",
                     "-o", f"{tmp_path}/g.json"]) == 0
    m = json.loads((tmp_path / "g.json").read_text())
    assert m["hyperparameters"]["input_kind"] == "probs"
    assert dict((k, v["temperature"]) for k, v in m["parameters"]["groups"]) == pytest.approx(groups, rel=1e-9)


def test_t41_dask_evaluate_refuses_a_manifest_of_another_class_count_as_in_one_process(files, capsys):
    """T41: `evaluate --engine dask --calibrator` applied a 3-class TS manifest to 4-class logits and printed
    its metrics (exit 0); in one process (and `apply --engine dask`) it is refused naming both counts."""
    pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    d, _, _ = files
    rng = np.random.default_rng(7)
    z4 = rng.normal(size=(120, 4))
    pq.write_table(pa.table({**{f"logit_{j}": z4[:, j] for j in range(4)}, "label": rng.integers(0, 4, 120)}),
                   d / "x4.parquet")
    base = ["evaluate", "--logits", f"{d}/x4.parquet:logit_*", "--labels", f"{d}/x4.parquet:label",
            "--calibrator", f"{d}/cal.json", "-q"]
    capsys.readouterr()
    want = (f"confcal: error: --calibrator: fitted on 3 classes (ts, {d}/cal.json), but --logits has 4 columns; "
            "pass the scores of the model it was fitted for, or a calibrator fitted on classes like these")
    for more in ([], ["--engine", "dask", "--workers", "1"]):
        assert main(base + more) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.strip().splitlines()[-1] == want and "Traceback" not in out.err


def test_t44_domain_map_with_json_string_keys_names_the_domains_of_int_image_ids(tmp_path, capsys):
    """T44: `--domain-map {"1": "z1", ...}` (JSON keys are strings) never matched the int image ids:
    `detections match` and `rank --gt` silently kept the GT's own domains, `rank` without --gt refused."""
    import csv

    dets = _coco(tmp_path)
    gt = json.loads((tmp_path / "gt.json").read_text())
    for im in gt["images"]:
        im["domain"] = "a" if im["id"] < 2 else "b"
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "dets.json").write_text(json.dumps(dets))
    want = {i: f"z{i % 2}" for i in range(4)}  # crosses the GT's a/b split: a mix-up cannot pass
    (tmp_path / "dmap.json").write_text(json.dumps({str(i): d for i, d in want.items()}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["detections", "match", "--gt", f"{tmp_path}/gt.json", "--detections", f"{tmp_path}/dets.json",
                     "--domain-map", f"{tmp_path}/dmap.json", "-o", f"{tmp_path}/mm.npz"]) == 0
    with np.load(tmp_path / "mm.npz", allow_pickle=False) as z:
        ids, doms = z["image_id"], z["domain"]
    assert len(ids) == len(dets) and [str(d) for d in doms] == [want[int(i)] for i in ids]
    for gt_args in (["--gt", f"{tmp_path}/gt.json", "--per-domain-quota"], []):
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["rank", "--detections", f"{tmp_path}/dets.json", *gt_args, "--domain-map",
                         f"{tmp_path}/dmap.json", "-o", f"{tmp_path}/q.csv"]) == 0, capsys.readouterr().err
        with open(tmp_path / "q.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows and all(r["domain"] == want[int(r["image_id"])] for r in rows)


@pytest.mark.parametrize("method, scale", [("pts", 1e307), ("lb", 1e300)])
def test_t42_a_map_that_overflows_on_finite_logits_is_refused_naming_the_rows(method, scale):
    """T42: pts (and lb) returned all-NaN rows from predict_proba for finite logits of magnitude >= 1e307
    (lb from ~1e154); now a ValueError names the rows and the scale, and ordinary rows still predict."""
    from confcal.calibrators import METHODS

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5)) * 3
    y = rng.integers(0, 5, 300)
    cal = METHODS[method]().fit(x, y)
    rows = np.vstack([x[:2], np.sign(x[2:4]) * scale])
    with pytest.raises(ValueError, match=rf"'{method}' map overflows float64 on 2 row\(s\) \(rows 2, 3;"):
        cal.predict_proba(rows)
    p = cal.predict_proba(x[:2], dtype=np.float64)
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["ts", "ts+pb"])
def test_p3_1_apply_on_zero_rows_says_the_logits_have_no_rows_not_that_the_manifest_is_damaged(files, capsys,
                                                                                               method):
    """P3-1: apply on a (0, K) file warned 'the manifest's fit.data_summary cannot be used (ValueError:
    logits: ...)' of an intact manifest; the drift check is now skipped naming --logits."""
    d, _, _ = files
    _fitted_manifest(d, method)
    np.save(d / "e0.npy", np.zeros((0, 3)))
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["apply", "--calibrator", f"{d}/m.json", "--logits", f"{d}/e0.npy", "-o", f"{d}/o.npy"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("confcal: warning: ")]
    assert warned == ["confcal: warning: drift check skipped: --logits holds no rows (nothing to compare with the "
                      "calibration data)"], err
    assert np.load(d / "o.npy").shape == (0, 3)


def test_p3_2_bool_true_positive_flags_are_box_labels_in_evaluate_as_in_fit(tmp_path, capsys):
    """P3-2: evaluate on box scores refused a bool TP/FP array ('expected integer class indices, got dtype
    bool') that fit reads as 1/0; one rule (confcal._validation.check_box_labels) for every box-label reader.
    The same arithmetic runs on the same 0/1 values, so the documents are equal."""
    rng = np.random.default_rng(0)
    s = rng.random(200)
    flags = rng.random(200) < s
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "b.npy", flags)
    np.save(tmp_path / "i.npy", flags.astype(np.int8))
    docs = []
    for labels in ("b.npy", "i.npy"):
        capsys.readouterr()
        assert main(["evaluate", "--logits", f"{tmp_path}/s.npy", "--labels", f"{tmp_path}/{labels}", "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0] == docs[1]
    # class labels of class vectors stay strict
    np.save(tmp_path / "z.npy", rng.normal(size=(200, 2)))
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{tmp_path}/z.npy", "--labels", f"{tmp_path}/b.npy"]) == 2
    assert "expected integer class indices, got dtype bool" in _err(capsys)


@pytest.mark.parametrize("dropped", [0, 1])
def test_p3_4_a_grouped_manifest_missing_a_fitted_group_is_refused(tmp_path, capsys, dropped):
    """P3-4: a grouped-ts manifest with parameters.groups[i] deleted (group_counts still counting that
    domain, fallback_groups empty) loaded, and the domain's rows silently took the pooled T without even
    the unseen-domain warning. The group lists are checked against each other on load (GroupsAgree)."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(600, 3)) * 2
    y = np.where(rng.random(600) < 0.8, z.argmax(1), rng.integers(0, 3, 600))
    dom = np.array(["a", "b", "c"])[np.arange(600) % 3]
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "d.npy", dom)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit", "-q", "--method", "grouped-ts", "--logits", f"{tmp_path}/z.npy", "--labels",
                     f"{tmp_path}/y.npy", "--domains", f"{tmp_path}/d.npy", "-o", f"{tmp_path}/g.json"]) == 0
    m = json.loads((tmp_path / "g.json").read_text())
    gone = m["parameters"]["groups"].pop(dropped)[0]
    assert m["parameters"]["fallback_groups"] == []
    (tmp_path / "t.json").write_text(json.dumps(m))
    capsys.readouterr()
    assert main(["apply", "--calibrator", f"{tmp_path}/t.json", "--logits", f"{tmp_path}/z.npy", "--domains",
                 f"{tmp_path}/d.npy", "-o", f"{tmp_path}/o.npy"]) == 2
    err = _err(capsys)
    assert err.startswith(f"confcal: error: --calibrator: manifest {tmp_path}/t.json: parameters.group_counts[")
    assert "expected a group of parameters.groups or parameters.fallback_groups" in err and repr(gone) in err
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.parametrize("cell, said", [("", "is empty at row 1 (line 3 of the file)"),
                                        ("NaN", "found NaN/+inf in row 1:")])
def test_p3_3_csv_errors_count_rows_as_every_other_message(tmp_path, capsys, cell, said):
    """P3-3: an empty cell was said to be 'at row 3' (the file's line), a NaN in the same cell 'in row 1'
    (the sample index). Rows are sample indices from 0 in every message; the CSV reader adds the line."""
    (tmp_path / "c.csv").write_text(f"logit_0,logit_1,logit_2,label\n1,2,3,0\n1,{cell},3,1\n\n4,5,6,2\n")
    capsys.readouterr()
    assert main(["evaluate", "--logits", f"{tmp_path}/c.csv:logit_*", "--labels", f"{tmp_path}/c.csv:label"]) == 2
    assert said in _err(capsys)
    # a blank line is skipped but still counted: the ragged third data row is on line 5
    (tmp_path / "r.csv").write_text("logit_0,logit_1,logit_2,label\n1,2,3,0\n1,2,3,1\n\n4,5,2\n")
    assert main(["evaluate", "--logits", f"{tmp_path}/r.csv:logit_*", "--labels", f"{tmp_path}/r.csv:label"]) == 2
    assert "row 2 (line 5 of the file) has 3 fields" in _err(capsys)


@pytest.mark.parametrize("key, where", [('"temperature":', "parameters.temperature"), ('"format":', "format"),
                                        ('"n_samples":', "fit.n_samples")])
def test_p3_5_a_key_given_twice_in_a_manifest_is_refused_or_in_the_fit_record_named(files, capsys, key, where):
    """P3-5: a manifest with "temperature" written twice was read silently (Python keeps the last value,
    other JSON readers the first). Refused in one line naming the key; inside the fit record (which never
    blocks apply) one warning names it and the map is applied."""
    d, _, _ = files
    text = (d / "cal.json").read_text()
    bad = text.replace(key, f'{key} 5, {key}', 1)
    assert bad != text
    (d / "dup.json").write_text(bad)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main(["apply", "--calibrator", f"{d}/dup.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"])
    if where.startswith("fit."):
        assert code == 0
        err = capsys.readouterr().err
        assert f"confcal: warning: manifest {d}/dup.json: {where}: key given twice" in err
        assert main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/z.npy", "-o",
                     f"{d}/want.npy"]) == 0
        np.testing.assert_array_equal(np.load(d / "p.npy"), np.load(d / "want.npy"))  # same file, same map
        return
    assert code == 2 and not (d / "p.npy").exists()
    assert _err(capsys) == (f"confcal: error: --calibrator: manifest {d}/dup.json: {where}: expected each key once, "
                            "got it twice (JSON readers differ on which value counts); the file is damaged")


def test_p3_5_other_json_inputs_refuse_a_key_given_twice(tmp_path):
    """P3-5, the same rule for the other JSON inputs: COCO ground truth / detections and the CLI's JSON
    options (--domain-map, ...) refuse a key given twice, naming it and the file."""
    from confcal.cli._shared.common import read_json
    from confcal.detection.coco import load_coco_gt

    (tmp_path / "m.json").write_text('{"1": "day", "1": "night"}')
    with pytest.raises(ValueError, match=r"^--domain-map: '.*m\.json' is not a JSON file \(key '1' given twice"):
        read_json(tmp_path / "m.json", "--domain-map")
    (tmp_path / "gt.json").write_text('{"images": [{"id": 1, "id": 2, "file_name": "a.jpg"}], "annotations": [], '
                                      '"categories": [{"id": 1, "name": "car"}]}')
    with pytest.raises(ValueError, match=r"gt\.json is not valid JSON \(key 'id' given twice"):
        load_coco_gt(tmp_path / "gt.json")


@pytest.mark.parametrize("method", ["ts", "ts+pb"])
def test_p3_6_fit_on_logits_near_the_float64_limit_prints_no_raw_numpy_warning(tmp_path, capsys, method):
    """P3-6: fit on log-probabilities times 1e306 (entries overflowing to -inf) printed numpy's 'overflow
    encountered in reduce' twice: the TS job re-ran its probabilities-as-logits sum on every pass after the
    first (a pass that checks nothing claimed its rows lay in [0, 1]). Now only the validating pass checks."""
    rng = np.random.default_rng(0)
    z = rng.normal(size=(500, 10)) * 60
    top = z.max(1, keepdims=True)
    lp = z - top - np.log(np.exp(z - top).sum(1, keepdims=True))
    with np.errstate(over="ignore"):
        huge = lp * 1e306
    assert np.isinf(huge).any() and np.nanmax(np.abs(huge[np.isfinite(huge)])) > 1e307
    np.save(tmp_path / "h.npy", huge)
    np.save(tmp_path / "y.npy", huge.argmax(1))
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main(["fit", "-q", "--method", method, "--logits", f"{tmp_path}/h.npy", "--labels", f"{tmp_path}/y.npy",
                     "-o", f"{tmp_path}/m.json"])
    err = capsys.readouterr().err
    assert "overflow encountered" not in err and "RuntimeWarning" not in err, err
    # ts fits (T on its bound); ts+pb may refuse this scale in its own words (its box solve overflows)
    assert code == 0 if method == "ts" else code == 0 or err.strip().splitlines()[-1].startswith(
        "confcal: error: --logits: the box-constrained softmax has no exact solution in float64"), err


def test_json_inputs_with_a_utf8_byte_order_mark_are_read_as_bom_csvs_are(files, tmp_path, capsys):
    """Tester pass 3, noticed: a manifest saved with a UTF-8 BOM was refused (JSONDecodeError: Unexpected UTF-8
    BOM) while BOM CSVs are read; the manifest, COCO and JSON-option readers decode utf-8-sig now."""
    from confcal.cli._shared.common import read_json
    from confcal.detection.coco import load_coco_gt

    d, _, _ = files
    (d / "bom.json").write_bytes(b"\xef\xbb\xbf" + (d / "cal.json").read_bytes())
    assert main(["apply", "-q", "--calibrator", f"{d}/bom.json", "--logits", f"{d}/z.npy", "-o", f"{d}/p.npy"]) == 0
    assert main(["apply", "-q", "--calibrator", f"{d}/cal.json", "--logits", f"{d}/z.npy", "-o", f"{d}/q.npy"]) == 0
    np.testing.assert_array_equal(np.load(d / "p.npy"), np.load(d / "q.npy"))  # same file, same map
    (tmp_path / "m.json").write_bytes(b"\xef\xbb\xbf" + b'{"1": "day"}')
    assert read_json(tmp_path / "m.json", "--domain-map") == {"1": "day"}
    (tmp_path / "gt.json").write_bytes(b"\xef\xbb\xbf" + b'{"images": [{"id": 1, "file_name": "a.jpg", "width": 10, '
                                       b'"height": 10}], "annotations": [], "categories": [{"id": 1, "name": "car"}]}')
    assert load_coco_gt(tmp_path / "gt.json")["images"][0]["id"] == 1
