"""Label-shift (prior) adaptation of a fitted calibrator from unlabelled data.

When a new sensor, region or season changes how often each class occurs, ``p(x | y)`` may hold
while the calibrated ``p(y | x)`` is off. :class:`PriorAdapted` corrects any fitted calibrator:
the target prior is estimated from unlabelled logits by EM (Saerens, Latinne & Decaestecker 2002)
or BBSE (Lipton, Wang & Smola 2018), pooled and per domain, with a bootstrap interval, and the
probabilities are reweighted by ``pi_t / pi_s``. Each EM iteration is one pass of
:mod:`confcal.passes`, so unlabelled data of any size is read in bounded memory.

Sits above :mod:`confcal.calibrators` and below :mod:`confcal.evaluation` and the CLI.
"""

from confcal.adaptation.adapted import ESTIMATORS, PriorAdapted, adapted_from_dict
from confcal.adaptation.estimate import (EMResult, LabelShiftTest, bbse_prior, bbse_weights, check_prior, em_prior,
                                         label_shift_test, reweight)
from confcal.adaptation.jobs import POOLED, bbse_job, em_job, poisson_weights
from confcal.adaptation.manifest import ADAPTED_FORMAT, ADAPTED_VERSION, is_adapted_manifest, to_adapted_manifest

__all__ = ["PriorAdapted", "ESTIMATORS", "EMResult", "LabelShiftTest", "em_prior", "bbse_prior", "bbse_weights",
           "check_prior", "reweight", "label_shift_test", "em_job", "bbse_job", "poisson_weights", "POOLED",
           "ADAPTED_FORMAT", "ADAPTED_VERSION", "adapted_from_dict", "is_adapted_manifest", "to_adapted_manifest"]
