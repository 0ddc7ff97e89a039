"""Decisions with a stated guarantee, from a calibrated (or raw) score.

* :func:`ltt_threshold` -- one cutoff whose risk (false discovery, false-positive rate, miss rate,
  false omission = 1 - NPV) is certified by Learn-then-Test (Angelopoulos et al. 2021, arXiv:2110.01052);
* :func:`three_way` -- accept / review / reject with the smallest review band among jointly valid pairs;
* :func:`fit_decisions` -- the same per group (sensor, domain, class: Mondrian), with the fallback to
  review of a group too small to certify;
* :func:`fit_conformal` -- split-conformal prediction sets (LAC, APS, RAPS), marginal, class-conditional
  or per group;
* :func:`decision_manifest` / :func:`load_decision_manifest` -- the rule as JSON, with its guarantee and
  the digest of its calibration data and calibrator.

Fitting runs in one process on a calibration slice (a pass over ``n`` scores: O(n log G) for a grid of
``G`` thresholds); applying is elementwise and runs batch by batch at any size.
"""

from confcal.decisions.conformal import CONFORMAL_SCORES, ConformalSets, conformal_quantile, fit_conformal
from confcal.decisions.fwer import fixed_sequence, holm
from confcal.decisions.manifest import (calibrator_sha256, decision_manifest, load_decision_manifest,
                                        scores_digest)
from confcal.decisions.pvalues import binomial_pvalue, hoeffding_bentkus_pvalue
from confcal.decisions.rule import ACCEPT, DECISION_NAMES, POOLED, REJECT, REVIEW, DecisionRule, fit_decisions
from confcal.decisions.threeway import ThreeWayFit, three_way
from confcal.decisions.threshold import RISKS, ThresholdFit, ltt_threshold

__all__ = ["ltt_threshold", "ThresholdFit", "RISKS", "three_way", "ThreeWayFit", "fit_decisions", "DecisionRule",
           "ACCEPT", "REVIEW", "REJECT", "DECISION_NAMES", "POOLED", "fit_conformal", "ConformalSets",
           "CONFORMAL_SCORES", "conformal_quantile", "binomial_pvalue", "hoeffding_bentkus_pvalue",
           "fixed_sequence", "holm", "decision_manifest", "load_decision_manifest", "calibrator_sha256",
           "scores_digest"]
