"""Shared pieces of the BCSoftmax test files: hypothesis settings, float64
tensors, and a call of one solver by name (kernel, sort or newton)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck

from confcal.ops import _bcsoftmax_dispatch as impl

F64 = torch.float64
HYP = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def t64(v):
    return torch.tensor(v, dtype=F64)


def solve_with(method, g, a, b, dtype=F64):
    """Run one solver on rows g (2-D) with bounds in an internal layout."""
    x = torch.as_tensor(g, dtype=dtype)
    return impl._solve(x, a, b, True, torch.finfo(dtype).eps, impl._Meta("t", (x.shape[0],), 1), method=method)
