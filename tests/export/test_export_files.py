"""Exported files: metadata, tamper detection, refusals, the CLI command, CalibratedModel under
torch.jit.script and torch.compile."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from confcal.calibrators import METHODS, GroupedTemperatureScaling
from confcal.cli import main
from confcal.export import (REFUSALS, ExportError, export_onnx, export_torchscript, exportable, group_index,
                            index_table, read_metadata, to_torch, verify_manifest)
from confcal.io import save_manifest
from confcal.torch import CalibratedModel
from tests.export._fixtures import ATOL32, ATOL64, cifar, fitted_classifier

ort = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")


@pytest.fixture
def ts_manifest(tmp_path):
    path = tmp_path / "ts.json"
    save_manifest(fitted_classifier("ts"), path)
    return path


def test_onnx_graph_has_named_inputs_dynamic_batch_and_metadata(tmp_path):
    cal = fitted_classifier("grouped-ts")
    manifest = tmp_path / "gts.json"
    save_manifest(cal, manifest)
    out = tmp_path / "gts.onnx"
    model = export_onnx(manifest, out, dtype="float64")
    assert [i.name for i in model.graph.input] == ["logits", "domain_index"]
    assert [o.name for o in model.graph.output] == ["probs"]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "n" and dims[1].dim_value == 100
    assert model.opset_import[0].version >= 17
    meta = read_metadata(out)
    assert meta["confcal.method"] == "grouped-ts" and meta["confcal.n_classes"] == "100"
    import hashlib

    assert meta["confcal.manifest_sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    table = json.loads(meta["confcal.index_table"])
    assert sorted(k for k, _ in table) == [0, 1, 2]
    # the table in the graph is enough to run it: unseen id 7 -> -1 -> pooled
    _, _, _, x, dom = cifar()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"logits": x, "domain_index": group_index(meta["confcal.index_table"], dom)})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_allclose(got, cal.predict_proba(x, domains=dom, dtype=np.float64), rtol=0, atol=ATOL64)


def test_object_export_records_the_sha256_of_the_file_save_manifest_writes(ts_manifest):
    from_object = export_onnx(fitted_classifier("ts"))
    from_file = export_onnx(ts_manifest)
    sha = {m: {p.key: p.value for p in g.metadata_props}["confcal.manifest_sha256"]
           for m, g in (("object", from_object), ("file", from_file))}
    assert sha["object"] == sha["file"]


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_tampered_manifest_is_detected(tmp_path, ts_manifest, fmt):
    head = tmp_path / ("head.onnx" if fmt == "onnx" else "head.pt")
    (export_onnx if fmt == "onnx" else export_torchscript)(ts_manifest, head)
    verify_manifest(head, ts_manifest)  # untouched: passes
    tampered = tmp_path / "tampered.json"
    d = json.loads(ts_manifest.read_text())
    d["parameters"]["temperature"] *= 1.01
    tampered.write_text(json.dumps(d, indent=2) + "\n")
    with pytest.raises(ValueError, match="sha256"):
        verify_manifest(head, tampered)
    # a head exported from the tampered file records the new hash, and its map follows it
    head2 = tmp_path / ("head2.onnx" if fmt == "onnx" else "head2.pt")
    (export_onnx if fmt == "onnx" else export_torchscript)(tampered, head2)
    assert read_metadata(head2)["confcal.manifest_sha256"] != read_metadata(head)["confcal.manifest_sha256"]
    verify_manifest(head2, tampered)
    # a manifest damaged beyond its constraint table is refused, and nothing is written
    d["parameters"]["temperature"] = -1.0
    tampered.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="temperature"):
        export_onnx(tampered, tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


def test_every_method_exports_or_says_why_not():
    for method in METHODS:
        ok, why = exportable(method)
        assert ok or (why and "\n" not in why), method
    for method, why in REFUSALS.items():
        if method == "prior-adapted":  # confcal adapt's manifest format, not a registered method (tests/adaptation)
            continue
        assert method in METHODS and not exportable(method)[0]


def _pb_fitted():
    """A fitted ``pb`` (refused: BCSoftmax is not in the graph yet) on 300 CIFAR-10 outputs."""
    from tests.conftest import require_shared_data

    d = np.load(require_shared_data("cifar", "wideresnet-16-4-cifar-10.npz"))
    with np.errstate(divide="ignore"):
        x = np.log(d["predictions"][:300].astype(np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return METHODS["pb"]().fit(x, d["ground_truth"][:300])


def test_refusal_is_one_line_naming_the_method():
    cal = _pb_fitted()
    with pytest.raises(ExportError, match="'pb' cannot be exported: BCSoftmax"):
        to_torch(cal)
    with pytest.raises(ExportError):
        cal.to_torch()


def test_to_torch_method_on_the_calibrator():
    cal = fitted_classifier("ts")
    _, _, _, x, _ = cifar()
    with torch.no_grad():
        out = cal.to_torch()(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(out, cal.predict_proba(x, dtype=np.float64), rtol=0, atol=ATOL64)


def test_fallback_groups_map_to_the_pooled_index():
    x, y, dom, _, _ = cifar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = GroupedTemperatureScaling(min_samples=501).fit(x, y, domains=np.where(dom == 0, 0, 1))
    table = index_table(cal)
    assert table == {0: 1, 1: 0}  # domain 1 (1000 rows) has its own T; domain 0 (500) falls back


class _Net(torch.nn.Module):
    """A tiny classifier with K = 100 outputs, float64 (the calibrator's input)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 100).double()

    def forward(self, x):
        return self.lin(x) * 3.0


@pytest.mark.parametrize("method", ["ts", "grouped-ts", "dirichlet"])
def test_calibrated_model_under_jit_script(method):
    cal = fitted_classifier(method)
    net = _Net().eval()
    model = CalibratedModel(net, cal).eval()
    x = torch.randn(64, 8, dtype=torch.float64)
    dom = np.arange(64) % 5
    idx = torch.as_tensor(group_index(index_table(cal), dom)) if cal.method == "grouped-ts" else None
    side = {"domains": dom} if idx is not None else {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = cal.predict_proba(net(x).numpy(), **side, dtype=np.float64)
        scripted = torch.jit.script(model)
        np.testing.assert_allclose(scripted(x, idx).numpy(), ref, rtol=0, atol=ATOL64)
        np.testing.assert_allclose(model(x, idx).numpy(), ref, rtol=0, atol=ATOL64)


def test_calibrated_model_under_torch_compile():
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("torch.compile on CPU needs a C++ compiler")
    cal = fitted_classifier("ts")
    net = _Net().eval()
    model = torch.compile(CalibratedModel(net, cal).eval())
    x = torch.randn(16, 8, dtype=torch.float64)
    with torch.no_grad():
        out = model(x).numpy()
        ref = cal.predict_proba(net(x).numpy(), dtype=np.float64)
    np.testing.assert_allclose(out, ref, rtol=0, atol=ATOL64)


def test_cli_export_onnx_and_torchscript(tmp_path, ts_manifest, capsys):
    out = tmp_path / "head.onnx"
    assert main(["export", "--calibrator", str(ts_manifest), "--format", "onnx", "-o", str(out)]) == 0
    assert "ts head" in capsys.readouterr().out
    _, _, _, x, _ = cifar()
    x32 = x.astype(np.float32)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"logits": x32})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, fitted_classifier("ts").predict_proba(x32, dtype=np.float64), rtol=0, atol=ATOL32)
    pt = tmp_path / "head.pt"
    assert main(["export", "--calibrator", str(ts_manifest), "--format", "torchscript", "-o", str(pt)]) == 0
    loaded = torch.jit.load(str(pt))
    np.testing.assert_allclose(loaded(torch.as_tensor(x)).numpy(), fitted_classifier("ts").predict_proba(x, dtype=np.float64),
                               rtol=0, atol=ATOL64)
    # --verify alone (as the export guide writes it): no --format / --output needed
    assert main(["export", "--verify", str(out), "--calibrator", str(ts_manifest)]) == 0
    capsys.readouterr()
    assert main(["export", "--calibrator", str(ts_manifest), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("confcal: error: --format: required to export") and "\n" not in err


def test_cli_export_refusals_exit_2_without_output(tmp_path, ts_manifest, capsys):
    iso = tmp_path / "iso.json"
    save_manifest(_pb_fitted(), iso)
    cases = [
        (["--calibrator", str(iso), "--format", "onnx", "-o", str(tmp_path / "a.onnx")], "'pb' cannot"),
        (["--calibrator", str(ts_manifest), "--format", "onnx", "-o", str(tmp_path / "a.pt")], "--output"),
        (["--calibrator", str(tmp_path / "missing.json"), "--format", "onnx", "-o", str(tmp_path / "a.onnx")],
         "no such file"),
    ]
    for args, needle in cases:
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iso.json", "ts.json"]


def test_cli_export_without_torch_names_the_extra(ts_manifest, tmp_path):
    """In an interpreter where torch cannot be imported, the command exits 2 with one line naming
    the extra, and writes nothing."""
    from tests.cli.test_startup import run_cli

    out = tmp_path / "head.onnx"
    rc, _, err = run_cli("export", "--calibrator", str(ts_manifest), "--format", "onnx", "-o", str(out),
                         block_torch=True)
    # the export extra brings torch (issue 44): the line names the one extra that makes export work
    assert rc == 2 and "confcal[export]" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def _verify_cases():
    from tests.export._fixtures import BOXES, CLASSIFIERS

    return [("c", m) for m in CLASSIFIERS] + [("b", m) for m in BOXES]


@pytest.mark.parametrize("kind, name", _verify_cases())
def test_verify_passes_every_exported_head_of_its_own_manifest(tmp_path, kind, name):
    """--verify runs the head on probe rows (tester finding T7): an untouched export of every method,
    ONNX float32 / float64 and TorchScript, passes; a head of another manifest with the same
    sha256 in its metadata does not (the map check, not the metadata, refuses it)."""
    from tests.export._fixtures import fitted_box

    cal = fitted_classifier(name) if kind == "c" else fitted_box(name)[0]
    manifest = tmp_path / "m.json"
    save_manifest(cal, manifest)
    for fmt, dtype in (("onnx", "float32"), ("onnx", "float64"), ("torchscript", "float32"),
                       ("torchscript", "float64")):
        head = tmp_path / ("h.onnx" if fmt == "onnx" else "h.pt")
        (export_onnx if fmt == "onnx" else export_torchscript)(manifest, head, dtype=dtype)
        verify_manifest(head, manifest)


def test_verify_refuses_a_head_with_another_temperature_but_the_same_sha256(tmp_path, ts_manifest):
    import onnx

    d = json.loads(ts_manifest.read_text())
    d["parameters"]["temperature"] *= 1.05
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d, indent=2) + "\n")
    head = tmp_path / "h.onnx"
    export_onnx(other, head)
    model = onnx.load(str(head))
    sha = read_metadata(tmp_path / "h.onnx")["confcal.manifest_sha256"]
    import hashlib

    for p in model.metadata_props:
        if p.key == "confcal.manifest_sha256":
            assert p.value == sha
            p.value = hashlib.sha256(ts_manifest.read_bytes()).hexdigest()
    onnx.save(model, str(head))
    with pytest.raises(ValueError, match=r"^verify: the head .* does not compute its map"):
        verify_manifest(head, ts_manifest)


def test_an_adapted_manifest_is_refused_with_its_reason():
    """confcal adapt's PriorAdapted has no graph yet: both exporters refuse it in one line naming the way out."""
    from confcal.adaptation import PriorAdapted
    from confcal.export import ExportError, export_onnx

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    z = rng.normal(size=(600, 3)) + 2.0 * np.eye(3)[y]
    ad = PriorAdapted(base="ts", n_boot=0).fit(z, y)
    ad.adapt(z[:200])
    for export in (to_torch, export_onnx):
        with pytest.raises(ExportError, match=r"pi_t / pi_s") as info:
            export(ad)
        assert "\n" not in str(info.value)
