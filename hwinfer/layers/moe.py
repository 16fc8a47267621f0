"""MoE blocks built on the routing and grouped-expert ops.

Experts are stored fused as ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2`` [E, H, I];
``add_expert_entries`` declares how a checkpoint fills them: per-expert tensors
(``<prefix>.<e>.gate_proj.weight`` ...) or transformers' fused ``gate_up_proj`` / ``down_proj``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.layers.basic import GatedMLP, Linear
from hwinfer.loader.weights import Layout


class Experts(nn.Module):
    def __init__(self, num: int, hidden: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.num, self.hidden, self.inter = num, hidden, inter
        self.w13 = nn.Parameter(torch.empty(num, 2 * inter, hidden, dtype=dtype), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num, hidden, inter, dtype=dtype), requires_grad=False)

    def add_entries(self, layout: Layout, prefix: str, ours: str, fused: bool,
                    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> None:
        e, h, i = self.num, self.hidden, self.inter
        if fused:
            layout.add(f"{prefix}.gate_up_proj", f"{ours}.w13", (e, 2 * i, h))
            layout.add(f"{prefix}.down_proj", f"{ours}.w2", (e, h, i))
            return
        gate, up, down = names
        for x in range(e):
            layout.add(f"{prefix}.{x}.{gate}.weight", f"{ours}.w13", (i, h), (x, slice(0, i)), quantizable=True)
            layout.add(f"{prefix}.{x}.{up}.weight", f"{ours}.w13", (i, h), (x, slice(i, 2 * i)), quantizable=True)
            layout.add(f"{prefix}.{x}.{down}.weight", f"{ours}.w2", (h, i), (x,), quantizable=True)


class SoftmaxMoE(nn.Module):
    """Qwen3.5-MoE block: softmax top-k (renormalised) routed SwiGLU experts plus a shared
    expert scaled by sigmoid(shared_expert_gate(x)). x [T, H] -> [T, H]."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.top_k = cfg["num_experts_per_tok"]
        self.gate = Linear(h, cfg["num_experts"], dtype=dtype)
        self.experts = Experts(cfg["num_experts"], h, cfg["moe_intermediate_size"], dtype)
        self.shared_expert = GatedMLP(h, cfg["shared_expert_intermediate_size"], dtype)
        self.shared_expert_gate = Linear(h, 1, dtype=dtype)
        self.ops = ops

    def add_expert_entries(self, layout: Layout, prefix: str, ours: str, fused: bool) -> None:
        self.experts.add_entries(layout, prefix, ours, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.ops.route_topk(self.gate(x).float(), top_k=self.top_k, scoring="softmax",
                                           renormalize=True)
        routed = self.ops.moe_experts(x, weights, ids, self.experts.w13, self.experts.w2, activation="swiglu")
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared
