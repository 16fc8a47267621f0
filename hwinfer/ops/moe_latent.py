"""Kimi-K3's latent MoE ("Stable LatentMoE") contract (family ``moe``).

Kimi-K3 is not in transformers (MODELS.md §4.5); :func:`latent_moe`'s docstring says which
parts of the definition are verified and how. Sources read: transformers' ``NemotronHMoE``
(same skeleton: router on the full hidden state, ``fc1_latent_proj`` once per token, experts in
latent space, ``fc2_latent_proj``, shared expert on the full hidden state; no norm, non-gated
experts) and public K3 ports found by code search — llama.cpp's ``KimiK3Model`` converter
("down proj -> experts -> weighted sum -> RMSNorm -> up proj"), SGLang / vLLM-based / JAX /
Megatron-style ports, which all apply ``routed_expert_norm`` once to the combined sum.
"""
from __future__ import annotations

import torch

from hwinfer.ops.contract import Case, define_op, fan_in_scale, randn
from hwinfer.ops.moe_experts import (
    EXPERT_TOL, SITU_K3, check_activation, check_expert_shapes, check_routing, expert_weights,
    experts_loop, fp4_expert_inputs, routing_inputs,
)
from hwinfer.ops.quant import dequant_fp4


def check_latent(x: torch.Tensor, down_proj: torch.Tensor, up_proj: torch.Tensor,
                 norm_weight: torch.Tensor | None, w13_scale: torch.Tensor | None,
                 w2_scale: torch.Tensor | None) -> int:
    """Validate the non-expert inputs of :func:`latent_moe`; returns the latent width L."""
    if x.dim() != 2 or down_proj.dim() != 2 or down_proj.shape[1] != x.shape[1]:
        raise ValueError(f"latent_moe: need x [T, H] and down_proj [L, H], got {tuple(x.shape)}, "
                         f"{tuple(down_proj.shape)}")
    lat = down_proj.shape[0]
    if tuple(up_proj.shape) != (x.shape[1], lat):
        raise ValueError(f"latent_moe: up_proj shape {tuple(up_proj.shape)} != {(x.shape[1], lat)}")
    if norm_weight is not None and tuple(norm_weight.shape) != (lat,):
        raise ValueError(f"latent_moe: norm_weight shape {tuple(norm_weight.shape)} != ({lat},)")
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("latent_moe: give both w13_scale and w2_scale (FP4 experts) or neither")
    return lat


def latent_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, down_proj: torch.Tensor,
               w13: torch.Tensor, w2: torch.Tensor, up_proj: torch.Tensor,
               norm_weight: torch.Tensor | None = None, *, w13_scale: torch.Tensor | None = None,
               w2_scale: torch.Tensor | None = None, eps: float = 1e-5, activation: str = "situ",
               limit: float | None = None, swiglu_alpha: float = 1.702, situ_beta: float = 1.0,
               situ_linear_beta: float | None = None) -> torch.Tensor:
    """Routed part of a latent MoE layer (Kimi-K3), all in fp32, cast once to x.dtype:

        z = x @ down_proj^T                                   [T, L]
        y = sum_j weights[t, j] * Expert_{ids[t, j]}(z_t)     [T, L]   (as moe_experts)
        y = y / sqrt(mean(y^2) + eps) * norm_weight           (skipped when norm_weight is None)
        out = y @ up_proj^T                                   [T, H]

    x [T, H]; weights / ids [T, k] from ``route_topk`` on the *full* hidden state (ids -1
    skipped); down_proj [L, H] (``block_sparse_moe.routed_expert_down_proj.weight``, bias-free);
    up_proj [H, L] (``routed_expert_up_proj.weight``); norm_weight [L]
    (``routed_expert_norm.weight``, present when ``latent_moe_use_norm``) or None. Experts:
    dense w13 [E, 2I, L] / w2 [E, L, I], or — when w13_scale / w2_scale are given — packed FP4
    as in :func:`moe_experts_fp4` (K3's compressed-tensors MXFP4 ``weight_packed`` [out, in/2]
    uint8 + ``weight_scale`` [out, in/32] uint8: w13 [E, 2I, L/2], w13_scale [E, 2I, L/32],
    w2 [E, L, I/2], w2_scale [E, L, I/32]). Shared experts (K3: 2, full width, on x) are the
    layer's. Returns [T, H] in x.dtype.

    K3: L = ``routed_expert_hidden_size`` 3584 (H 7168), 896 experts, top-16,
    ``moe_intermediate_size`` 3072, ``activation="situ"``, situ_beta 4, situ_linear_beta 25,
    eps = ``rms_norm_eps`` 1e-5; routing ``route_topk(scoring="sigmoid", bias=..., groups 1/1)``.

    Verification: nothing here is checkable against transformers (no ``kimi_k3``). The order
    down-proj once per token -> routed sum -> one RMSNorm of the *sum* -> up-proj is what every
    public K3 port found does (llama.cpp converter, SGLang, vLLM-based, JAX, Megatron-style);
    ports measured that a per-expert norm or a norm after up_proj is a different function.
    Unverified: K3's ``routed_scaling_factor`` (ports say 1.0 or 2.827; nearly irrelevant since
    the RMSNorm is scale-invariant up to eps) and the precision in which the official code forms
    the sum before the norm (here fp32, unrounded).
    """
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    lat = check_latent(x, down_proj, up_proj, norm_weight, w13_scale, w2_scale)
    if w13_scale is None:
        e, _ = check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe")
        w13_32, w2_32 = w13, w2
    else:
        e, _ = check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe", packed=2)
        w13_32, w2_32 = dequant_fp4(w13, w13_scale), dequant_fp4(w2, w2_scale)
    check_routing(x, weights, ids, e, "latent_moe")
    act = dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha, situ_beta=situ_beta,
               situ_linear_beta=situ_linear_beta)
    z = x.float() @ down_proj.float().T
    y = experts_loop(z, weights, ids, w13_32, w2_32, act)
    if norm_weight is not None:
        y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.float()
    return (y @ up_proj.float().T).to(x.dtype)


def _latent_case(t, h, lat, e, k, i, fp4, norm=True, pad=False):
    def make(gen, dtype, device):
        weights, ids = routing_inputs(gen, t, e, k, device, pad)
        inputs = {"x": randn(gen, t, h, dtype=dtype, device=device), "weights": weights, "ids": ids,
                  "down_proj": randn(gen, lat, h, dtype=dtype, device=device, scale=fan_in_scale(h)),
                  "up_proj": randn(gen, h, lat, dtype=dtype, device=device, scale=fan_in_scale(lat)),
                  "eps": 1e-5, **SITU_K3}
        if fp4:
            inputs.update(fp4_expert_inputs(gen, e, i, lat, device, gate_scale=3.0, up_scale=20.0))
        else:
            w13, w2 = expert_weights(gen, e, i, lat, 3.0, 20.0)
            inputs.update(w13=w13.to(device=device, dtype=dtype), w2=w2.to(device=device, dtype=dtype))
        if norm:
            inputs["norm_weight"] = randn(gen, lat, dtype=torch.float32, device=device, scale=0.1) + 1.0
        return inputs
    return make


LATENT_MOE = define_op(
    latent_moe,
    cases=[
        Case("k3_fp4_situ_norm", _latent_case(10, 128, 64, 16, 4, 64, fp4=True)),
        Case("dense_experts_norm_padded", _latent_case(9, 96, 64, 8, 3, 32, fp4=False, pad=True)),
        Case("no_norm", _latent_case(6, 64, 32, 8, 2, 32, fp4=False, norm=False)),
    ],
    tolerance=EXPERT_TOL,
    family="moe",
)
