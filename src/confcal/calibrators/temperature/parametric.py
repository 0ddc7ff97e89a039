"""Parameterized temperature scaling (PTS), also called instance-based temperature scaling (IBTS).

Source: Tomani, Cremers and Buettner, "Parameterized Temperature Scaling for
Boosting the Expressive Power in Post-Hoc Uncertainty Calibration", ECCV 2022;
eq. 48 of Atarashi et al., arXiv 2506.10572: ``p = softmax(z / T(z))`` where
``T(z)`` is a network with two hidden layers of 5 units on the top-10 logits.

Trained by mini-batch Adam (Atarashi et al., sec. 6: 500 epochs, batch 256,
default Adam settings) from the temperature-scaling fit (the output layer
starts at zero weights), so the first step already starts at TS.
"""

from __future__ import annotations

import torch

from confcal.calibrators._fit.compose import OPTIM_CONSTRAINTS, MapCalibrator
from confcal.calibrators.protocol.constraints import Int
from confcal.calibrators._fit.maps import _softplus_inv, mask_neg_inf
from confcal.calibrators._fit.tsfit import fit_temperature
from confcal.calibrators.protocol.base import register

__all__ = ["ParameterizedTemperatureScaling"]


@register
class ParameterizedTemperatureScaling(MapCalibrator):
    """PTS: a per-sample temperature ``T(z) = softplus(MLP(top-k logits)) + 0.01``.

    Parameters
    ----------
    top_k : number of largest logits fed to the network (default 10)
    hidden : units in each of the two hidden layers (default 5)
    epochs, batch_size, lr : Adam schedule (defaults 500, 256, 1e-3)
    random_state : seed of the weight init and the batch order; the fit is deterministic per seed
    progress : show a tqdm bar over epochs when stderr is a terminal

    Attributes
    ----------
    map_ : the fitted :class:`~confcal.calibrators._fit.maps.PTSMap`; ``temperatures(logits)``
        gives the per-sample ``T`` ``(n_samples,)``. ``nll_``, ``n_iter_`` (Adam steps).

    Examples
    --------
    Over-confident logits of 300 samples and 3 classes (``4 *`` the logits of a
    weaker model); the fit lowers the negative log-likelihood (1.681 before):

    >>> import numpy as np
    >>> from confcal.metrics import nll
    >>> rng = np.random.default_rng(0)
    >>> labels = rng.integers(0, 3, size=300)
    >>> logits = 4 * (rng.normal(size=(300, 3)) + np.eye(3)[labels])
    >>> from confcal.calibrators import ParameterizedTemperatureScaling
    >>> pts = ParameterizedTemperatureScaling(epochs=20, progress=False).fit(logits, labels)
    >>> probs = pts.predict_proba(logits)
    >>> bool(np.allclose(probs.sum(axis=1), 1)), round(nll(probs, labels), 2)
    (True, 0.88)
    """

    method = "pts"
    hyper_constraints = {**OPTIM_CONSTRAINTS, "top_k": Int(ge=1), "hidden": Int(ge=1)}
    map_name = "pts"

    def __init__(self, top_k: int = 10, hidden: int = 5, epochs: int = 500, batch_size: int = 256,
                 lr: float = 1e-3, random_state: int = 0, progress: bool = True, input_kind: str = "logits"):
        self.input_kind = input_kind
        self.top_k = top_k
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.random_state = random_state
        self.progress = progress

    def _map_config(self, n_classes):
        return {"n_classes": n_classes, "top_k": self.top_k, "hidden": self.hidden}

    def _init_map(self, m, z, y, features, sample_weight=None):
        # the network sees -inf (masked) logits as their row's smallest finite one (Composite.prepare);
        # its input statistics must too, or one -inf makes them -inf / NaN
        m.set_input_stats(mask_neg_inf(z)[0])
        t = fit_temperature(z.numpy(), y.numpy(), warn=False).temperature
        with torch.no_grad():
            m.net[-1].bias.fill_(_softplus_inv(max(t - m.t_floor, 1e-6)))

    def temperatures(self, logits):
        """Per-sample temperatures ``(n_samples,)`` float64 for ``logits`` ``(n_samples, n_classes)``."""
        from confcal.calibrators._fit.compose import to_torch

        self._check_fitted()
        x = self._validate_logits(logits)
        with torch.no_grad():
            return self.map_.temperatures(to_torch(x))[:, 0].numpy()


