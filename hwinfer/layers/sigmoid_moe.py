"""Sigmoid-scored "noaux_tc" MoE block (GLM-5, HY4; DeepSeek-V3 lineage).

Router: fp32 logits ``x W_r^T``; scores ``sigmoid``; experts chosen on ``score +
e_score_correction_bias`` (the bias only selects), optionally within the ``topk_group`` best of
``n_group`` expert groups; weights are the unbiased scores of the chosen experts, renormalised
when ``norm_topk_prob``, times ``routed_scaling_factor``. Routed SwiGLU experts (gate clamped
from above and up clamped to +-``swiglu_limit`` when the model has one: HY4) plus always-on
shared experts (``n_shared_experts`` x ``moe_intermediate_size``, never clamped).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.layers.basic import GatedMLP
from hwinfer.layers.moe import Experts
from hwinfer.loader.config import require
from hwinfer.loader.weights import Layout


class SigmoidMoE(nn.Module):
    """x [T, H] -> [T, H]. Parameters: gate.weight [E, H] and gate.e_score_correction_bias [E]
    (both fp32), experts (fused w13 [E, 2I, H], w2 [E, H, I]), shared_experts (a GatedMLP)."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype,
                 swiglu_limit: float | None = None) -> None:
        super().__init__()
        h = require(cfg, "hidden_size")
        e = require(cfg, "n_routed_experts", "num_experts", "num_local_experts")
        inter = require(cfg, "moe_intermediate_size")
        self.top_k = require(cfg, "num_experts_per_tok")
        self.n_group, self.topk_group = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
        self.renormalize = bool(cfg.get("norm_topk_prob", True))
        self.scaling = float(cfg.get("routed_scaling_factor", 1.0))
        self.limit = swiglu_limit if swiglu_limit is not None and swiglu_limit > 0 else None
        self.gate = nn.Module()
        self.gate.weight = nn.Parameter(torch.empty(e, h, dtype=torch.float32), requires_grad=False)
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(e, dtype=torch.float32), requires_grad=False)
        self.experts = Experts(e, h, inter, dtype)
        shared = int(cfg.get("n_shared_experts") or 0)
        self.shared_experts = GatedMLP(h, inter * shared, dtype) if shared else None
        self.ops = ops

    def add_expert_entries(self, layout: Layout, prefix: str, ours: str, fused: bool) -> None:
        self.experts.add_entries(layout, prefix, ours, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.gate.weight)
        weights, ids = self.ops.route_topk(
            logits, top_k=self.top_k, scoring="sigmoid", bias=self.gate.e_score_correction_bias,
            renormalize=self.renormalize, scaling=self.scaling, n_group=self.n_group,
            topk_group=self.topk_group)
        out = self.ops.moe_experts(x, weights, ids, self.experts.w13, self.experts.w2,
                                   activation="swiglu", limit=self.limit)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
