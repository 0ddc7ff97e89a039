"""Exported heads of the sigmoid-head maps (ts-multilabel, platt-multilabel) and the box-geometry
maps (det-platt-geo, det-beta-geo, det-hist-geo, with their ``features`` input) equal predict_proba:
eager, TorchScript and onnxruntime, float32 (1e-6) and float64 (1e-12), extreme rows, a batch of
1 and an empty batch."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from scipy.special import expit

from tests.export._fixtures import ATOL32, ATOL64, cifar, kitti

ort = pytest.importorskip("onnxruntime", reason="the export extra (onnxruntime) is not installed")
from confcal.calibrators import METHODS  # noqa: E402
from confcal.export import export_onnx, export_torchscript, read_metadata, to_torch  # noqa: E402

N_LABELS = 20
GEO = {"det-platt-geo": {"reg": "fixed", "reg_lambda": 1e-3},
       "det-platt-geo-independent": {"reg": "fixed", "reg_lambda": 1e-3, "dependent": False,
                                     "score_transform": "raw"},
       "det-beta-geo": {"reg": "fixed", "reg_lambda": 1e-3},
       "det-hist-geo": {"n_bins": 4, "n_feature_bins": 3}}


def _multilabel_data():
    """Sigmoid-head stand-in from the real CIFAR-100 outputs: the first 20 log-probabilities as
    label logits (clipped to +-1e4: sigmoid heads refuse -inf), one-hot labels as multi-hot."""
    x, y, _, xt, _ = cifar()
    z, zt = np.clip(x[:, :N_LABELS], -1e4, 1e4), np.clip(xt[:, :N_LABELS], -1e4, 1e4)
    labels = (y[:, None] == np.arange(N_LABELS)[None, :]).astype(np.int64)
    assert np.abs(zt[1]).max() == 1e4 and zt[0].min() == -1e4  # the extreme rows are kept
    return z, labels, zt


def _geo_data():
    """KITTI BEV car scores with a seeded stand-in geometry (cx, w): the matched file carries no
    box geometry. The scores' true-positive rate is made to depend on cx, so the maps use it."""
    s, y, _, _ = kitti()
    rng = np.random.default_rng(7)
    f = np.stack([rng.uniform(0, 1, s.size), rng.uniform(0.01, 0.3, s.size)], axis=1)
    y = np.where(f[:, 0] > 0.8, 0, y)
    cal, test = slice(0, 3000), slice(3000, 3400)
    st, ft = s[test].copy(), f[test].copy()
    st[:4] = [0.0, 1.0, 1e-12, 1.0 - 1e-12]  # score edges
    ft[:2] = [[-5.0, 3.0], [10.0, -1.0]]  # geometry outside the calibration range
    return s[cal], y[cal], f[cal], st, ft


def _check(cal, x, side, ref_fn, width):
    for dtype, atol in ((np.float64, ATOL64), (np.float32, ATOL32)):
        xin = np.ascontiguousarray(x.astype(dtype))
        fin = None if side is None else np.ascontiguousarray(side.astype(dtype))
        ref = ref_fn(xin, fin)
        head = to_torch(cal)
        t_side = None if fin is None else torch.as_tensor(fin)
        with torch.no_grad():
            outs = {"eager": head(torch.as_tensor(xin), t_side).numpy(),
                    "torchscript": torch.jit.script(head)(torch.as_tensor(xin), t_side).numpy()}
        sess = ort.InferenceSession(export_onnx(cal, dtype=np.dtype(dtype).name).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feeds = {"logits": xin} if fin is None else {"logits": xin, "features": fin}
        outs["onnx"] = sess.run(None, feeds)[0]
        one = {k: v[:1] for k, v in feeds.items()}
        empty = {k: v[:0] for k, v in feeds.items()}
        outs_one = sess.run(None, one)[0]
        assert sess.run(None, empty)[0].shape == (0, width)
        with torch.no_grad():
            assert head(torch.as_tensor(xin[:0]), None if t_side is None else t_side[:0]).shape == (0, width)
        for name, out in outs.items():
            assert out.dtype == dtype and out.shape == ref.shape
            np.testing.assert_allclose(out, ref, rtol=0, atol=atol, err_msg=f"{cal.method} {name} {dtype.__name__}")
        np.testing.assert_allclose(outs_one, ref[:1], rtol=0, atol=atol)


@pytest.mark.parametrize("method", ["ts-multilabel", "platt-multilabel"])
def test_sigmoid_heads_equal_predict_proba_and_closed_form(method):
    z, labels, zt = _multilabel_data()
    cal = METHODS[method]().fit(z, labels)
    _check(cal, zt, None, lambda x, _: cal.predict_proba(x, dtype=np.float64), N_LABELS)
    # independent oracle: scipy's expit of the per-label affine map
    if method == "ts-multilabel":
        want = expit(zt / cal.temperatures_)
    else:
        want = expit(zt * cal.slopes_ + cal.biases_)
    with torch.no_grad():
        np.testing.assert_allclose(to_torch(cal)(torch.as_tensor(zt)).numpy(), want, rtol=0, atol=ATOL64)


def test_sigmoid_head_on_probabilities():
    z, labels, zt = _multilabel_data()
    cal = METHODS["platt-multilabel"](input_kind="probs").fit(expit(z), labels)
    p = expit(zt)
    p[0, :3] = [0.0, 1.0, 1e-300]  # clipped to [eps, 1 - eps] before the logit, as predict_proba
    _check(cal, p, None, lambda x, _: cal.predict_proba(x, dtype=np.float64), N_LABELS)


@pytest.mark.parametrize("name", list(GEO))
def test_geometry_heads_equal_predict_proba(name, tmp_path):
    s, y, f, st, ft = _geo_data()
    method = "-".join(name.split("-")[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method](box_features="cx,w", **GEO[name]).fit(s, y, features=f)
    _check(cal, st, ft, lambda x, fx: cal.predict_proba(x, features=fx, dtype=np.float64), 2)
    if method == "det-hist-geo":  # the cells are used: a feature change moves some boxes' probability
        ref = cal.predict_proba(st, features=ft, dtype=np.float64)
        assert np.abs(ref - cal.predict_proba(st, features=ft[::-1].copy(), dtype=np.float64)).max() > 0.01
    meta = {p.key: p.value for p in export_onnx(cal).metadata_props}
    assert json.loads(meta["confcal.feature_names"]) == ["cx", "w"] and meta["confcal.features_input"] == "features"
    export_torchscript(cal, tmp_path / "head.pt")
    assert json.loads(read_metadata(tmp_path / "head.pt")["confcal.feature_names"]) == ["cx", "w"]


def test_geometry_head_needs_its_features():
    s, y, f, st, _ = _geo_data()
    cal = METHODS["det-platt-geo"](box_features="cx,w", reg="fixed").fit(s, y, features=f)
    with pytest.raises(Exception, match="features"):
        torch.jit.script(to_torch(cal))(torch.as_tensor(st))


def _cluster_data():
    """Office-Caltech10 (amazon) GoogLeNet features, the first 16 columns (real), and seeded stand-in
    logits (the file has none) whose over-confidence depends on feature 0; test rows 0-2 get -inf / 1e4."""
    from tests.conftest import require_shared_data

    d = np.load(require_shared_data("domains", "office_caltech10_googlenet", "amazon.npz"))
    f = d["features"][:, :16].astype(np.float64)
    y = d["labels"].astype(np.int64)
    y = np.unique(y, return_inverse=True)[1]
    rng = np.random.default_rng(3)
    k = y.max() + 1
    # over-confident by a factor that depends on the features (so the temperatures differ by cluster)
    scale = np.where(f[:, 0] > np.median(f[:, 0]), 6.0, 1.5)[:, None]
    z = scale * (rng.normal(size=(y.size, k)) + 1.5 * np.eye(k)[y])
    zt = z[600:].copy()
    zt[0, 3] = -np.inf
    zt[1, :5], zt[1, 5:] = 1e4, -1e4
    zt[2, 1], zt[2, 2] = -np.inf, 1e4
    return z[:600], y[:600], f[:600], zt, f[600:]


@pytest.mark.parametrize("method", ["cluster-ts", "cluster-ts-regression", "domain-ensemble"])
def test_feature_temperature_heads_equal_predict_proba(method):
    z, y, f, zt, ft = _cluster_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = METHODS[method](n_clusters=6, n_init=2).fit(z, y, features=f, **(
            {"domains": np.arange(600) % 2} if method == "domain-ensemble" else {}))
    _check(cal, zt, ft, lambda x, fx: cal.predict_proba(x, features=fx, dtype=np.float64), cal.n_classes_)
    # independent oracle: scipy's softmax at the calibrator's own per-sample temperatures
    from scipy.special import softmax

    t = cal.temperatures_for(ft)
    assert np.ptp(t) > 1e-3  # the temperature does depend on the features
    with torch.no_grad():
        out = to_torch(cal)(torch.as_tensor(zt[3:]), torch.as_tensor(ft[3:])).numpy()
    np.testing.assert_allclose(out, softmax(zt[3:] / t[3:, None], axis=1), rtol=0, atol=ATOL64)


def test_geometry_clip_levels_are_in_the_head_and_grouped_maps_are_refused():
    """Scores at or past the clip (``clip_levels``: their own fitted level) give predict_proba's value
    in the head; a per-class map says in one line that it is not exported."""
    from confcal.export import ExportError

    s, y, f, st, ft = _geo_data()
    cal = METHODS["det-platt-geo"](box_features="cx,w", reg="fixed").fit(s, y, features=f)
    assert cal._n_levels() == 2 and cal.coef_.size == cal._n_basis(2) + 2
    edge = np.array([0.0, 1e-5, 1.0, 1.3, 0.5])
    fe = ft[: edge.size]
    head = torch.jit.script(to_torch(cal).double())
    got = head(torch.as_tensor(edge), torch.as_tensor(fe)).numpy()
    np.testing.assert_allclose(got, cal.predict_proba(edge, features=fe, dtype=np.float64), rtol=0, atol=ATOL64)
    cls = np.arange(s.size) % 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grouped = METHODS["det-platt-geo"](box_features="cx,w", reg="fixed", per_class=True).fit(
            s, y, features=f, category_ids=cls)
    with pytest.raises(ExportError, match="per-class / per-domain geometry map is not exported"):
        export_onnx(grouped)
