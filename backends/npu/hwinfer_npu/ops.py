"""Thin adapters from hwinfer op contracts to torch_npu fused ops (documented torch_npu APIs).

Not run on hardware. Each adapter keeps the contract's signature and dtype rules.
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
             weight_offset: float = 0.0) -> torch.Tensor:
    """``torch_npu.npu_rms_norm(x, gamma, epsilon)`` returns (y, rstd); gamma must exist."""
    import torch_npu

    d = x.shape[-1]
    gamma = torch.ones(d, dtype=x.dtype, device=x.device) if weight is None else weight.to(x.dtype)
    if weight_offset:
        gamma = gamma + weight_offset
    y, _ = torch_npu.npu_rms_norm(x, gamma, epsilon=eps)
    return y
