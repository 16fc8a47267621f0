"""DeepSeek-V4 MoE block (MODELS.md §2.8, ENGINES.md §2.4).

Router logits ``W_gate x`` -> scores ``sqrt(softplus(.))`` (``scoring_func``). Ordinary layers pick
the top-k of ``score + bias`` (the bias only selects: "noaux_tc"); the first ``num_hash_layers``
("hash") layers take their experts from a fixed token-id table ``tid2eid[token_id]``. Either way
the chosen scores are renormalised and scaled by ``routed_scaling_factor``. Experts (routed and
shared) are SwiGLU with ``gate = min(gate, limit)``, ``up = clamp(up, -limit, limit)``.

Checkpoint (published): ``ffn.gate.weight`` [E, H], ``ffn.gate.bias`` [E] (fp32) or
``ffn.gate.tid2eid`` [V, k]; ``ffn.experts.<e>.w1/w3/w2.weight`` (FP4 in releases);
``ffn.shared_experts.w1/w3/w2.weight`` (FP8).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.layers.basic import Linear
from hwinfer.layers.moe import Experts
from hwinfer.loader.weights import Layout


class ClampedSwiGLU(nn.Module):
    """Shared expert: ``w2(silu(min(w1 x, limit)) * clamp(w3 x, -limit, limit))``; [T, H] -> [T, H]
    (the clamps and the product one ``gated_act``)."""

    def __init__(self, ops: OpTable, hidden: int, inter: int, limit: float | None,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = Linear(hidden, inter, dtype=dtype)
        self.w2 = Linear(inter, hidden, dtype=dtype)
        self.w3 = Linear(hidden, inter, dtype=dtype)
        self.limit, self.ops = limit, ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.ops.gated_act(self.w1(x), self.w3(x), activation="silu", limit=self.limit))


class Router(nn.Module):
    """``weight`` [E, H]; a hash layer holds ``tid2eid`` [V, k] (int64 buffer), the others a
    selection ``bias`` [E] (fp32)."""

    def __init__(self, hidden: int, experts: int, vocab: int, top_k: int, hashed: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden, dtype=dtype), requires_grad=False)
        self.hashed = hashed
        if hashed:
            self.register_buffer("tid2eid", torch.zeros(vocab, top_k, dtype=torch.int64))
        else:
            self.bias = nn.Parameter(torch.empty(experts, dtype=torch.float32), requires_grad=False)


class DeepseekMoE(nn.Module):
    """Routed + shared experts; x [T, H] (normed), token_ids [T] -> [T, H]."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype, hashed: bool) -> None:
        super().__init__()
        h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
        experts = cfg.get("n_routed_experts") or cfg["num_local_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.scoring = cfg.get("scoring_func", "sqrtsoftplus")
        self.scaling = float(cfg.get("routed_scaling_factor", 1.0))
        self.limit = cfg.get("swiglu_limit")
        self.gate = Router(h, experts, cfg["vocab_size"], self.top_k, hashed, dtype)
        self.experts = Experts(experts, h, inter, dtype)
        self.shared_experts = ClampedSwiGLU(ops, h, inter * cfg.get("n_shared_experts", 1), self.limit,
                                            dtype)
        self.ops = ops

    def add_expert_entries(self, layout: Layout, prefix: str, ours: str, fused: bool) -> None:
        """Per-expert ``<prefix>.<e>.w1/w3/w2.weight`` (published and transformers' save) or
        transformers' in-memory fused ``gate_up_proj`` / ``down_proj``."""
        self.experts.add_entries(layout, prefix, ours, fused, names=("w1", "w3", "w2"))

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        logits = self.ops.linear(x, self.gate.weight)   # the GEMV with PDL in decode
        # transformers always renormalises the chosen scores (norm_topk_prob is not consulted).
        if self.gate.hashed:
            weights, ids = self.ops.route_hash(logits, token_ids, self.gate.tid2eid, scoring=self.scoring,
                                               renormalize=True, scaling=self.scaling)
        else:
            weights, ids = self.ops.route_topk(logits, top_k=self.top_k, scoring=self.scoring,
                                               bias=self.gate.bias, renormalize=True, scaling=self.scaling)
        routed = self.ops.moe_experts(x, weights, ids, self.experts.w13, self.experts.w2,
                                      activation="swiglu", limit=self.limit)
        return routed + self.shared_experts(x)
