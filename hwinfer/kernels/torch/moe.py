"""Grouped torch MoE experts (contracts: :mod:`hwinfer.ops.moe_experts`, :mod:`hwinfer.ops.moe_latent`).

The references evaluate every (token, slot) pair on its own: T*k matrix-vector products. Here
the (token, slot) pairs are sorted by expert and each *active* expert runs one matmul over all
its tokens (one upcast / dequantization of that expert's weights, only for experts some token
chose), then the weighted results are scattered back with ``index_add_``. Everything stays in
fp32 as the contract requires; only the summation order differs from the references.
"""
from __future__ import annotations

from typing import Callable

import torch

from hwinfer.kernels.torch.quant import dequant_fp4, dequant_fp8_block
from hwinfer.ops.moe_experts import (
    check_activation, check_expert_shapes, check_routing, fp8_w13_grid, glu,
)
from hwinfer.ops.moe_latent import check_latent

Fetch = Callable[[int], torch.Tensor]


def grouped_experts(x32: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13_of: Fetch,
                    w2_of: Fetch, out_dim: int, act: dict) -> torch.Tensor:
    """fp32 [T, out_dim]: sum over slots of weight * w2_of(e) act(w13_of(e) x), grouped by expert."""
    t, k = ids.shape
    out = torch.zeros(t, out_dim, dtype=torch.float32, device=x32.device)
    flat = ids.reshape(-1).long()
    valid = flat >= 0
    tok = torch.arange(t, device=ids.device).repeat_interleave(k)[valid]
    slot_w = weights.reshape(-1).float()[valid]
    flat = flat[valid]
    if flat.numel() == 0:
        return out
    order = torch.argsort(flat, stable=True)
    flat, tok, slot_w = flat[order], tok[order], slot_w[order]
    experts, counts = torch.unique_consecutive(flat, return_counts=True)
    start = 0
    for e, c in zip(experts.tolist(), counts.tolist()):
        rows = tok[start:start + c]
        h = glu(x32[rows] @ w13_of(e).T, **act)
        out.index_add_(0, rows, (h @ w2_of(e).T).mul_(slot_w[start:start + c, None]))
        start += c
    return out


def _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta) -> dict:
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    return dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha, situ_beta=situ_beta,
                situ_linear_beta=situ_linear_beta)


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, *, activation: str = "swiglu", limit: float | None = None,
                swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                situ_linear_beta: float | None = None) -> torch.Tensor:
    """Grouped dense experts (contract: ``hwinfer.ops.moe_experts.moe_experts``)."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    e, _ = check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts")
    check_routing(x, weights, ids, e, "moe_experts")
    out = grouped_experts(x.float(), weights, ids, lambda i: w13[i].float(), lambda i: w2[i].float(),
                          w2.shape[1], act)
    return out.to(x.dtype)


def moe_experts_fp8(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                    block: tuple[int, int] = (128, 128), activation: str = "swiglu",
                    limit: float | None = None, swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                    situ_linear_beta: float | None = None) -> torch.Tensor:
    """Grouped FP8 experts, dequantizing only the chosen experts (contract:
    ``hwinfer.ops.moe_experts.moe_experts_fp8``)."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    h = x.shape[-1]
    e, i = check_expert_shapes(h, w13.shape, w2.shape, "moe_experts_fp8")
    if tuple(w13_scale.shape) != (e, *fp8_w13_grid(i, h, block)):
        raise ValueError(f"moe_experts_fp8: w13_scale shape {tuple(w13_scale.shape)} != "
                         f"{(e, *fp8_w13_grid(i, h, block))}")
    check_routing(x, weights, ids, e, "moe_experts_fp8")
    g = w13_scale.shape[1] // 2

    def w13_of(j: int) -> torch.Tensor:
        gate = dequant_fp8_block(w13[j, :i], w13_scale[j, :g], block=block)
        return torch.cat([gate, dequant_fp8_block(w13[j, i:], w13_scale[j, g:], block=block)])

    out = grouped_experts(x.float(), weights, ids, w13_of,
                          lambda j: dequant_fp8_block(w2[j], w2_scale[j], block=block), h, act)
    return out.to(x.dtype)


def moe_experts_fp4(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, *,
                    activation: str = "swiglu", limit: float | None = None,
                    swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
                    situ_linear_beta: float | None = None) -> torch.Tensor:
    """Grouped FP4 experts, dequantizing only the chosen experts (contract:
    ``hwinfer.ops.moe_experts.moe_experts_fp4``)."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    e, _ = check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts_fp4", packed=2)
    check_routing(x, weights, ids, e, "moe_experts_fp4")
    out = grouped_experts(x.float(), weights, ids, lambda j: dequant_fp4(w13[j], w13_scale[j]),
                          lambda j: dequant_fp4(w2[j], w2_scale[j]), x.shape[-1], act)
    return out.to(x.dtype)


def latent_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, down_proj: torch.Tensor,
               w13: torch.Tensor, w2: torch.Tensor, up_proj: torch.Tensor,
               norm_weight: torch.Tensor | None = None, *, w13_scale: torch.Tensor | None = None,
               w2_scale: torch.Tensor | None = None, eps: float = 1e-5, activation: str = "situ",
               limit: float | None = None, swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
               situ_linear_beta: float | None = None) -> torch.Tensor:
    """Grouped latent MoE (contract: ``hwinfer.ops.moe_latent.latent_moe``)."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    lat = check_latent(x, down_proj, up_proj, norm_weight, w13_scale, w2_scale)
    if w13_scale is None:
        e, _ = check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe")
        w13_of, w2_of = (lambda j: w13[j].float()), (lambda j: w2[j].float())
    else:
        e, _ = check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe", packed=2)
        w13_of = lambda j: dequant_fp4(w13[j], w13_scale[j])  # noqa: E731
        w2_of = lambda j: dequant_fp4(w2[j], w2_scale[j])  # noqa: E731
    check_routing(x, weights, ids, e, "latent_moe")
    z = x.float() @ down_proj.float().T
    y = grouped_experts(z, weights, ids, w13_of, w2_of, lat, act)
    if norm_weight is not None:
        y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.float()
    return (y @ up_proj.float().T).to(x.dtype)
