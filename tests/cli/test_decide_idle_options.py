"""``confcal decide``: option combinations that changed nothing are refused (exit 2, one line naming the
option, nothing written); the ones that now act (``--input-kind`` with ``--calibrator``, ``--input-kind
probs`` on 1-D scores) are checked against an independent computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from confcal.cli import main
from confcal.decisions import fit_decisions


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(7)
    n = 6000
    s = rng.random(n)
    np.save(tmp_path / "s.npy", s)
    np.save(tmp_path / "s6.npy", 6 * s)  # scores up to 6: not probabilities
    np.save(tmp_path / "y.npy", (rng.random(n) < s).astype(np.int64))
    np.save(tmp_path / "d.npy", np.where(np.arange(n) % 2 == 0, "camA", "camB"))
    z = rng.normal(size=(n, 4)) * 2
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "yy.npy", (z + rng.normal(size=z.shape) * 1.5).argmax(1))
    p = np.exp(z - z.max(1, keepdims=True))
    np.save(tmp_path / "p.npy", p / p.sum(1, keepdims=True))
    np.save(tmp_path / "ml.npy", rng.random((n, 3)))
    np.save(tmp_path / "mly.npy", (rng.random((n, 3)) < 0.5).astype(np.int64))
    return tmp_path


def _run(*argv):
    return main([str(a) for a in argv])


def _refused(capsys, argv, message, out):
    code = _run(*argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == f"confcal: error: {message}\n"
    assert not out.exists()


BINARY = ["--logits", "s.npy", "--labels", "y.npy"]


@pytest.mark.parametrize("extra, message", [
    (["--alpha-accept", "none", "--delta-split", "0.3"],
     "--delta-split: splits delta between the accept and reject sides, got --alpha-accept none (the other side "
     "gets all of --delta)"),
    (["--alpha-reject", "none", "--delta-split", "0.3"],
     "--delta-split: splits delta between the accept and reject sides, got --alpha-reject none (the other side "
     "gets all of --delta)"),
    (["--alpha-accept", "none", "--accept-risk", "fpr"],
     "--accept-risk: sets the risk of the accept side, got --alpha-accept none (no accept side)"),
    (["--alpha-reject", "none", "--reject-risk", "miss"],
     "--reject-risk: sets the risk of the reject side, got --alpha-reject none (no reject side)"),
    (["--simultaneous"], "--simultaneous: applies to rules per group (--domains, or --per class / domain+class), "
                         "got one group (--per none)"),
    (["--pool-small"], "--pool-small: applies to rules per group (--domains, or --per class / domain+class), "
                       "got one group (--per none)"),
    (["--domains", "d.npy", "--per", "none"],
     "--domains: unused with --per none (one rule for all items); drop --domains or choose --per domain"),
    (["--domains", "d.npy", "--per", "none", "--simultaneous"],
     "--domains: unused with --per none (one rule for all items); drop --domains or choose --per domain"),
])
def test_binary_options_that_change_nothing_are_refused(files, capsys, extra, message):
    argv = ["decide", "fit", *[files / a if a.endswith(".npy") else a for a in BINARY + extra], "-o", files / "x.json"]
    _refused(capsys, argv, message, files / "x.json")


@pytest.mark.parametrize("per", ["none", "class", "domain+class"])
def test_multilabel_per_is_refused(files, capsys, per):
    # the rule is per label (and per domain with --domains): --per none / class changed nothing
    argv = ["decide", "fit", "--input", "multilabel", "--input-kind", "probs", "--logits", files / "ml.npy",
            "--labels", files / "mly.npy", "--per", per, "-o", files / "x.json"]
    _refused(capsys, argv, "--per: multilabel rules are per label (per domain and label with --domains), got "
                           f"--per {per}", files / "x.json")
    argv = argv[:-4] + ["--per", "domain", "-o", files / "x.json"]
    _refused(capsys, argv, "--per: multilabel rules are per label (per domain and label with --domains), got "
                           "--per domain without --domains", files / "x.json")
    assert _run(*argv[:-4], "--per", "domain", "--domains", files / "d.npy", "-o", files / "ok.json") == 0
    assert json.loads((files / "ok.json").read_text())["input"]["per"] == "domain+label"


def test_the_options_still_act_where_they_mean_something(files, capsys):
    t = files
    # with both sides, --delta-split moves delta between them: the thresholds follow the library's fit
    s, y = np.load(t / "s.npy"), np.load(t / "y.npy")
    seen = []
    for split in (0.2, 0.8):
        assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--delta-split", split,
                    "-o", t / f"sp{split}.json") == 0
        g = json.loads((t / f"sp{split}.json").read_text())["groups"]["*"]
        lib = fit_decisions(s, y, None, delta_split=split).thresholds("*")
        for got, want in zip((g["lambda_lo"], g["lambda_hi"]), lib):
            assert math.isinf(want) if got is None else math.isclose(got, want, rel_tol=1e-12)  # inf: none certified
        seen.append((g["lambda_lo"], g["lambda_hi"]))
    assert seen[0] != seen[1]  # on these data the split moves a threshold
    # groups from --domains: --simultaneous and --pool-small are taken and recorded
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--domains", t / "d.npy",
                "--simultaneous", "--pool-small", "-o", t / "g.json") == 0
    m = json.loads((t / "g.json").read_text())
    assert m["guarantee"]["simultaneous"] is True and m["guarantee"]["pool_small"] is True


def test_a_one_sided_rule_states_its_own_guarantee(files, capsys):
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--alpha-reject", "none",
                "--delta", "0.1", "-o", t / "one.json") == 0
    m = json.loads((t / "one.json").read_text())
    st_ = m["guarantee"]["statement"]
    assert "jointly" not in st_ and st_.startswith("fdr of accepted items <= 0.05 with probability >= 0.9 ")
    assert m["guarantee"]["delta_split"] is None  # nothing was split: no value that does nothing
    # the accept side spends all of delta: its threshold is the library's at delta_accept = delta
    s, y = np.load(t / "s.npy"), np.load(t / "y.npy")
    lib = fit_decisions(s, y, None, alpha_reject=None, delta=0.1)
    assert math.isclose(m["groups"]["*"]["lambda_hi"], lib.thresholds("*")[1], rel_tol=1e-12)
    assert m["groups"]["*"]["accept"]["delta"] == pytest.approx(0.1, rel=1e-12)
    # the manifest loads back: apply and evaluate run on it
    assert _run("decide", "apply", "--decisions", t / "one.json", "--logits", t / "s.npy", "-o", t / "a.npy") == 0
    assert _run("decide", "evaluate", "--decisions", t / "one.json", "--logits", t / "s.npy", "--labels",
                t / "y.npy") == 0
    # two sides: still "jointly", and the split recorded
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "two.json") == 0
    m2 = json.loads((t / "two.json").read_text())
    assert ", jointly with probability" in m2["guarantee"]["statement"] and m2["guarantee"]["delta_split"] == 0.5


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 31), split=st.floats(0.05, 0.95), side=st.sampled_from(["accept", "reject"]),
       n=st.integers(50, 600))
def test_a_split_of_delta_is_refused_by_the_library_too_with_one_side(seed, split, side, n):
    # --delta-split is refused with one side switched off because a split does nothing there; the library
    # refuses delta_split the same way (it took it silently before), and its one side spends all of delta
    rng = np.random.default_rng(seed)
    s = rng.random(n)
    y = rng.random(n) < s
    off = {"alpha_reject": None} if side == "accept" else {"alpha_accept": None}
    with pytest.raises(ValueError, match=r"^delta_split: expected None with alpha_"):
        fit_decisions(s, y, None, delta_split=split, **off)
    fit = fit_decisions(s, y, None, delta=0.1, **off).groups["*"]
    assert getattr(fit, side).delta == 0.1


@pytest.mark.parametrize("action", ["apply", "rank", "evaluate"])
def test_domains_on_a_rule_without_domain_groups_are_refused(files, capsys, action):
    t = files
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "none.json") == 0
    assert _run("decide", "fit", "--input", "top-label", "--logits", t / "z.npy", "--labels", t / "yy.npy",
                "--per", "class", "-o", t / "cls.json") == 0
    capsys.readouterr()
    out = {"apply": ["-o", t / "o.csv"], "rank": ["-o", t / "o.csv"], "evaluate": []}[action]
    labels = {"none": ["--labels", t / "y.npy"], "cls": ["--labels", t / "yy.npy"]}
    for rule, logits, what in (("none", "s.npy", "without groups (--per none)"),
                               ("cls", "z.npy", "per class, not per domain")):
        argv = ["decide", action, "--decisions", t / f"{rule}.json", "--logits", t / logits, "--domains", t / "d.npy",
                *(labels[rule] if action == "evaluate" else []), *out]
        _refused(capsys, argv, f"--domains: unused, the decisions were fitted {what}; drop --domains", t / "o.csv")


def test_input_kind_probs_is_checked_on_one_d_scores(files, capsys):
    t = files
    # scores up to 6 said to be probabilities: refused as confcal fit refuses them
    argv = ["decide", "fit", "--logits", t / "s6.npy", "--labels", t / "y.npy", "--input-kind", "probs",
            "-o", t / "x.json"]
    code = _run(*argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("confcal: error: --logits: --input-kind probs expects values in [0, 1], row ")
    assert err.count("\n") == 1 and not (t / "x.json").exists()
    assert _run("fit", "--method", "ts", "--logits", t / "z.npy", "--labels", t / "yy.npy", "-o", t / "c.json") == 0
    # probabilities are recorded as such, and apply reads them as probabilities by default
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "--input-kind", "probs",
                "-o", t / "p.json") == 0
    m = json.loads((t / "p.json").read_text())
    assert m["input"]["scale"] == "probs"
    assert _run("decide", "apply", "--decisions", t / "p.json", "--logits", t / "s6.npy", "-o", t / "a.npy") == 2
    assert "expects values in [0, 1]" in capsys.readouterr().err and not (t / "a.npy").exists()
    # raw scores and probabilities are the same numbers: a rule on raw scores takes --input-kind probs
    assert _run("decide", "fit", "--logits", t / "s.npy", "--labels", t / "y.npy", "-o", t / "r.json") == 0
    assert _run("decide", "apply", "--decisions", t / "r.json", "--logits", t / "s.npy", "--input-kind", "probs",
                "-o", t / "b.npy") == 0
    assert _run("decide", "apply", "--decisions", t / "r.json", "--logits", t / "s.npy", "-o", t / "c.npy") == 0
    assert (np.load(t / "b.npy") == np.load(t / "c.npy")).all()


def test_input_kind_with_a_calibrator_is_honoured_as_apply_does(files, capsys):
    t = files
    # a calibrator fitted on probabilities; the same items given as their log (logits up to a row constant)
    p = np.load(t / "p.npy")
    np.save(t / "logp.npy", np.log(p))
    assert _run("fit", "--method", "ts", "--logits", t / "p.npy", "--input-kind", "probs", "--labels", t / "yy.npy",
                "-o", t / "ts.json") == 0
    common = ["--input", "top-label", "--calibrator", t / "ts.json", "--labels", t / "yy.npy"]
    assert _run("decide", "fit", *common, "--logits", t / "p.npy", "-o", t / "a.json") == 0
    assert _run("decide", "fit", *common, "--logits", t / "logp.npy", "--input-kind", "logits",
                "-o", t / "b.json") == 0
    a, b = (json.loads((t / f"{k}.json").read_text())["groups"]["*"] for k in "ab")
    for key in ("lambda_lo", "lambda_hi"):  # exp/log round trip: equal up to rounding
        assert (a[key] is None) == (b[key] is None)
        if a[key] is not None:
            assert abs(a[key] - b[key]) <= 1e-9
    # confcal apply honours --input-kind the same way: its probabilities are the ones decide used
    assert _run("apply", "--calibrator", t / "ts.json", "--logits", t / "logp.npy", "--input-kind", "logits",
                "-o", t / "pa.npy") == 0
    assert _run("apply", "--calibrator", t / "ts.json", "--logits", t / "p.npy", "-o", t / "pb.npy") == 0
    np.testing.assert_allclose(np.load(t / "pa.npy"), np.load(t / "pb.npy"), rtol=1e-9, atol=1e-12)
    # decide apply: the default is what the calibrator was fitted on, the option overrides it
    assert _run("decide", "apply", "--decisions", t / "a.json", "--calibrator", t / "ts.json", "--logits",
                t / "logp.npy", "--input-kind", "logits", "-o", t / "da.npy") == 0
    assert _run("decide", "apply", "--decisions", t / "a.json", "--calibrator", t / "ts.json", "--logits",
                t / "p.npy", "-o", t / "db.npy") == 0
    assert (np.load(t / "da.npy") != np.load(t / "db.npy")).mean() <= 1e-3
    capsys.readouterr()
    assert _run("decide", "apply", "--decisions", t / "a.json", "--calibrator", t / "ts.json", "--logits",
                t / "logp.npy", "-o", t / "dc.npy") == 2
    assert "expects values in [0, 1]" in capsys.readouterr().err and not (t / "dc.npy").exists()


def test_sets_warn_when_alpha_is_below_what_n_rows_can_honour(files, capsys):
    t = files
    n = 6000
    # split conformal's q is the ceil((n+1)(1-alpha))-th smallest of n scores: finite iff alpha >= 1/(n+1)
    for alpha in (0.5 / (n + 1), 1e-4, 1.5 / (n + 1), 0.1):
        infinite = math.ceil((n + 1) * (1 - alpha)) > n  # the oracle
        assert _run("decide", "fit", "--input", "sets", "--logits", t / "z.npy", "--labels", t / "yy.npy",
                    "--alpha", repr(alpha), "-o", t / "s.json") == 0  # q = inf is a valid (trivial) set rule
        err = capsys.readouterr().err
        q = json.loads((t / "s.json").read_text())["conformal"]["cells"][0]["q"]
        assert (q is None) == infinite
        line = (f"confcal: warning: --alpha: {alpha:g} is below 1/(n+1) = {1 / (n + 1):.3g} for 1 of 1 cell(s) "
                f"(smallest n = {n}): their sets hold every class (q = inf); use --alpha >= {1 / (n + 1):.3g} "
                "or more calibration items\n")
        assert (line in err) == infinite and err.count("confcal: warning:") == int(infinite), err


def test_sets_with_domains_and_per_none_are_refused(files, capsys):
    t = files
    argv = ["decide", "fit", "--input", "sets", "--logits", t / "z.npy", "--labels", t / "yy.npy", "--domains",
            t / "d.npy", "--per", "none", "-o", t / "x.json"]
    _refused(capsys, argv, "--domains: unused with --per none (one rule for all items); drop --domains or choose "
                           "--per domain", t / "x.json")
