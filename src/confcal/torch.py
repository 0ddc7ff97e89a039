"""A PyTorch model with its calibrated head: ``CalibratedModel(model, calibrator)``.

Import it as ``from confcal.torch import CalibratedModel`` (nothing else in confcal imports
this module; it needs torch).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

__all__ = ["CalibratedModel"]


class CalibratedModel(nn.Module):
    """``forward(x, index=None) = head(model(x), index)``: the model, then the fitted calibrator's map.

    Parameters
    ----------
    model
        ``nn.Module`` whose output is what the calibrator was fitted on: logits ``(n, K)``
        (probabilities when the calibrator has ``input_kind="probs"``; box scores ``(n,)`` for
        ``det-ts`` / ``det-platt``)
    calibrator
        A fitted calibrator, its manifest (dict or path), or a head from
        :func:`confcal.export.to_torch`
    dtype
        The box maps' score dtype (see :func:`confcal.export.to_torch`)

    Notes
    -----
    ``index`` is the int64 ``(n,)`` group index of grouped calibrators
    (:func:`confcal.export.group_index`; unseen ids use the pooled fit). The output is the
    calibrated probabilities ``(n, K)`` in the model output's dtype, equal to
    ``calibrator.predict_proba(model(x))``. The module is ``torch.jit.script``-able and
    ``torch.compile``-able when ``model`` is.

    Raises ``confcal.export.ExportError`` for a calibrator whose map cannot be exported.
    """

    def __init__(self, model: nn.Module, calibrator, dtype: str = "float64"):
        super().__init__()
        from confcal.export import to_torch
        from confcal.export._heads import Head

        self.model = model
        self.head = calibrator if isinstance(calibrator, Head) else to_torch(calibrator, dtype=dtype)

    def forward(self, x: Tensor, index: Optional[Tensor] = None) -> Tensor:
        return self.head(self.model(x), index)
