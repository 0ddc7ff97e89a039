"""Pure, differentiable torch operators: no state, no I/O."""

from confcal.ops.bcsoftmax import bcsoftmax, lbsoftmax, ubsoftmax

__all__ = ["bcsoftmax", "lbsoftmax", "ubsoftmax"]
