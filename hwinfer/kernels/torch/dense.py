"""``linear`` (contract: :func:`hwinfer.ops.dense.linear`) as torch's own F.linear in the input
dtype: the vendor BLAS, accumulating in fp32 on GPUs; ``add_rms_norm_linear`` and
``rms_norm_gated_linear`` (:mod:`hwinfer.ops.dense`) as compositions of the torch kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] in x.dtype, then ``out_dtype``."""
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    y = F.linear(x, weight, None if bias is None else bias.to(x.dtype))
    return y if out_dtype in (None, x.dtype) else y.to(out_dtype)



def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                        weight: torch.Tensor, *, eps: float = 1e-6, weight_offset: float = 0.0,
                        activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., K], weight [N, K] -> (y [..., N] or [..., N/2] gated, x + residual)."""
    from hwinfer.kernels.torch.norm import add_rms_norm
    from hwinfer.ops.activation import gated_act
    from hwinfer.ops.dense import compose_add_rms_norm_linear

    return compose_add_rms_norm_linear(add_rms_norm, linear, gated_act, x, residual, norm_weight,
                                       weight, eps=eps, weight_offset=weight_offset,
                                       activation=activation)


def add_rms_norm_linear_conv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor | None,
                             weight: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor,
                             state_slots: torch.Tensor, *, eps: float = 1e-6,
                             weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [T, K], weight [N, K], conv pool [S, C, W-1] (in place), state_slots [T] ->
    (y [T, N] with the first C channels convolved, x + residual)."""
    from hwinfer.kernels.torch.conv import causal_conv1d
    from hwinfer.ops.dense import compose_add_rms_norm_linear_conv

    return compose_add_rms_norm_linear_conv(add_rms_norm_linear, causal_conv1d, x, residual,
                                            norm_weight, weight, conv_weight, conv_state,
                                            state_slots, eps=eps, weight_offset=weight_offset)


def rms_norm_gated_linear(x: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor | None,
                          weight: torch.Tensor, *, eps: float = 1e-6,
                          activation: str = "silu") -> torch.Tensor:
    """x, gate [T, H, D], weight [N, H * D] -> [T, N]."""
    from hwinfer.kernels.torch.norm import rms_norm_gated
    from hwinfer.ops.dense import compose_rms_norm_gated_linear

    return compose_rms_norm_gated_linear(rms_norm_gated, linear, x, gate, norm_weight, weight,
                                         eps=eps, activation=activation)
