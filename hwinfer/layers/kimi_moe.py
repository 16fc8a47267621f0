"""Kimi MLP and MoE blocks (Kimi-Linear §4.4, Kimi-K3 §4.5).

Router: ``block_sparse_moe.gate.weight`` [E, H] applied in fp32, sigmoid scores, top-k of
score + ``e_score_correction_bias`` (groups ``num_expert_group`` / ``topk_group``), weights =
the chosen scores renormalised (``moe_renormalize``) times ``routed_scaling_factor``. Routed
experts (per-expert ``w1`` gate, ``w3`` up, ``w2`` down) plus ``num_shared_experts`` shared
experts fused into one MLP of width ``moe_intermediate_size * num_shared_experts``, added
unscaled. Kimi-K3 runs the routed experts in a latent space (``routed_expert_down_proj`` ->
experts -> weighted sum -> ``routed_expert_norm`` -> ``routed_expert_up_proj``, op
``latent_moe``) and uses SiTU-GLU instead of SwiGLU in every MLP (dense, shared, routed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.layers.basic import Linear
from hwinfer.layers.moe import Experts
from hwinfer.loader.weights import Layout


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str, situ_beta: float,
        situ_linear_beta: float | None) -> torch.Tensor:
    """SwiGLU ``silu(gate) * up`` or K3's SiTU-GLU ``b tanh(gate / b) sigmoid(gate) * u`` with
    ``u = lb tanh(up / lb)`` (lb = ``activation_situ_linear_beta``, skipped when None); fp32
    math, result in gate's dtype (the same definition as the ``moe_experts`` op's "situ")."""
    if activation == "swiglu":
        return F.silu(gate) * up
    g, u = gate.float(), up.float()
    if situ_linear_beta is not None:
        u = situ_linear_beta * torch.tanh(u / situ_linear_beta)
    return (situ_beta * torch.tanh(g / situ_beta) * torch.sigmoid(g) * u).to(gate.dtype)


class KimiMLP(nn.Module):
    """Dense gated MLP (layer 0, shared experts): down(glu(gate(x), up(x))); x [T, H] -> [T, H]
    (SwiGLU's activation and product one ``gated_act``)."""

    def __init__(self, ops: OpTable, hidden: int, intermediate: int, dtype: torch.dtype,
                 activation: str = "swiglu", situ_beta: float = 1.0,
                 situ_linear_beta: float | None = None) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, dtype=dtype)
        self.up_proj = Linear(hidden, intermediate, dtype=dtype)
        self.down_proj = Linear(intermediate, hidden, dtype=dtype)
        self.act = (activation, situ_beta, situ_linear_beta)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.act[0] == "swiglu":
            return self.down_proj(self.ops.gated_act(gate, up, activation="silu"))
        return self.down_proj(glu(gate, up, *self.act))


class PackedExperts(nn.Module):
    """Routed experts kept as stored in compressed-tensors MXFP4 checkpoints (K3): e2m1 pairs
    w13 [E, 2I, D/2] (gate rows then up rows) and w2 [E, D, I/2] (uint8, low nibble = even
    column) with UE8M0 scale bytes w13_scale [E, 2I, D/32], w2_scale [E, D, I/32]; D is the
    experts' input width. The FP4 expert ops read them directly (4x less memory than bf16)."""

    def __init__(self, num: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.num, self.hidden, self.inter = num, hidden, inter

        def packed(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)
        self.w13, self.w13_scale = packed(num, 2 * inter, hidden // 2), packed(num, 2 * inter, hidden // 32)
        self.w2, self.w2_scale = packed(num, hidden, inter // 2), packed(num, hidden, inter // 32)

    def add_entries(self, layout: Layout, prefix: str, ours: str) -> None:
        """``<prefix>.<e>.{w1,w3,w2}.weight_packed`` / ``.weight_scale``, copied as bytes."""
        i, d = self.inter, self.hidden
        for x in range(self.num):
            for name, param, rows, width in (("w1", "w13", slice(0, i), d), ("w3", "w13", slice(i, 2 * i), d),
                                             ("w2", "w2", slice(0, d), i)):
                n = rows.stop - rows.start
                layout.add(f"{prefix}.{x}.{name}.weight_packed", f"{ours}.{param}", (n, width // 2), (x, rows))
                layout.add(f"{prefix}.{x}.{name}.weight_scale", f"{ours}.{param}_scale", (n, width // 32), (x, rows))


class KimiMoE(nn.Module):
    """Sigmoid-routed MoE with shared experts; x [T, H] -> [T, H].

    Args: hidden H; experts E; top_k; inter I (``moe_intermediate_size``); shared
    (``num_shared_experts``); renormalize / scaling / n_group / topk_group: routing options;
    activation "swiglu" or "situ" (+ betas); latent L (``routed_expert_hidden_size``, None:
    experts at width H); latent_norm (``latent_moe_use_norm``); eps for that norm; packed: keep
    the experts MXFP4 (:class:`PackedExperts`, for compressed-tensors checkpoints).
    """

    def __init__(self, hidden: int, experts: int, top_k: int, inter: int, shared: int,
                 ops: OpTable, dtype: torch.dtype, *, renormalize: bool = True, scaling: float = 1.0,
                 n_group: int = 1, topk_group: int = 1, activation: str = "swiglu",
                 situ_beta: float = 1.0, situ_linear_beta: float | None = None,
                 latent: int | None = None, latent_norm: bool = False, eps: float = 1e-5,
                 packed: bool = False) -> None:
        super().__init__()
        self.top_k, self.renormalize, self.scaling = top_k, renormalize, scaling
        self.n_group, self.topk_group, self.eps = n_group, topk_group, eps
        self.act = dict(activation=activation, situ_beta=situ_beta, situ_linear_beta=situ_linear_beta)
        self.gate = nn.Module()
        # fp32 (loaded exactly from the checkpoint's bf16): the router runs in fp32, and a bf16
        # weight would be converted again on every forward.
        self.gate.weight = nn.Parameter(torch.empty(experts, hidden, dtype=torch.float32), requires_grad=False)
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(experts, dtype=torch.float32),
                                                         requires_grad=False)
        self.latent = latent
        self.packed = packed
        self.experts = (PackedExperts(experts, latent or hidden, inter) if packed
                        else Experts(experts, latent or hidden, inter, dtype))
        if latent:
            self.routed_expert_down_proj = Linear(hidden, latent, dtype=dtype)
            self.routed_expert_up_proj = Linear(latent, hidden, dtype=dtype)
            self.routed_expert_norm = None
            if latent_norm:
                self.routed_expert_norm = nn.Module()
                self.routed_expert_norm.weight = nn.Parameter(torch.empty(latent, dtype=torch.float32),
                                                              requires_grad=False)
        self.shared_experts = (KimiMLP(ops, hidden, inter * shared, dtype, activation, situ_beta,
                                       situ_linear_beta) if shared else None)
        self.ops = ops

    def add_expert_entries(self, layout: Layout, prefix: str, ours: str) -> None:
        """Published per-expert tensors ``<prefix>.<e>.{w1,w3,w2}.weight`` (dense; FP8/FP4 ones
        are dequantized at load), or their packed MXFP4 bytes when this block keeps them packed."""
        if self.packed:
            self.experts.add_entries(layout, prefix, ours)
        else:
            self.experts.add_entries(layout, prefix, ours, fused=False, names=("w1", "w3", "w2"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.gate.weight)
        weights, ids = self.ops.route_topk(
            logits, top_k=self.top_k, scoring="sigmoid", bias=self.gate.e_score_correction_bias,
            renormalize=self.renormalize, scaling=self.scaling, n_group=self.n_group,
            topk_group=self.topk_group)
        ex = self.experts
        scales = dict(w13_scale=ex.w13_scale, w2_scale=ex.w2_scale) if self.packed else {}
        if self.latent:
            norm = self.routed_expert_norm.weight if self.routed_expert_norm is not None else None
            routed = self.ops.latent_moe(x, weights, ids, self.routed_expert_down_proj.weight, ex.w13, ex.w2,
                                         self.routed_expert_up_proj.weight, norm, eps=self.eps, **scales, **self.act)
        elif self.packed:
            routed = self.ops.moe_experts_fp4(x, weights, ids, ex.w13, ex.w13_scale, ex.w2, ex.w2_scale, **self.act)
        else:
            routed = self.ops.moe_experts(x, weights, ids, ex.w13, ex.w2, **self.act)
        return routed if self.shared_experts is None else routed + self.shared_experts(x)
