"""MiniMax-M3 decoder blocks (MODELS.md §5): full / block-sparse attention and the SwiGLU-OAI MLPs.

Attention: GQA with per-head zero-centred q/k RMSNorms (weight 1 + w) and rotate-half RoPE on the
first ``rotary_dim`` channels of each head (theta ``rope_theta``), scale head_dim^-1/2.
``minimax_m3_sparse`` layers add a lightning indexer (``self_attn.indexer``: ``index_n_heads`` =
KV heads query heads and one key head of ``index_head_dim``, both through zero-centred norms and
the same RoPE) whose block selection (:func:`block_sparse_indexer`) restricts the attention
(:func:`block_sparse_attention`) to ``index_topk_blocks`` blocks of ``index_block_size`` keys,
the query's own block always among them. Index keys are cached per token next to K and V.
Decode over the paged cache is one op, :func:`block_sparse_decode` (selection and attention at
the batch's fixed-width entry rows, no host lengths: CUDA-graph safe).

MLPs use SwiGLU-OAI: ``(clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)`` with
``g = min(gate, limit)``; dense layers use ``dense_intermediate_size``, MoE layers a sigmoid
router with a selection bias (``e_score_correction_bias``), renormalised top-k weights times
``routed_scaling_factor``, and one shared expert of ``shared_intermediate_size``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Linear, RMSNorm
from hwinfer.layers.kv_attention import cached_attention, gather_sequences, kv_cache_specs
from hwinfer.layers.moe import Experts
from hwinfer.loader.config import ConfigError
from hwinfer.runtime.batch import ForwardBatch

RopeTable = tuple[torch.Tensor, torch.Tensor]


class SwiGLUOAIMLP(nn.Module):
    """down((clamp(up) + 1) * g * sigmoid(alpha g)), g = min(gate, limit); x [T, H] -> [T, H].
    ``gate_up_proj`` [2I, H] holds the gate rows then the up rows (transformers' fused form;
    published checkpoints store ``gate_proj`` / ``up_proj`` separately)."""

    def __init__(self, hidden: int, inter: int, alpha: float, limit: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.inter, self.alpha, self.limit = inter, alpha, limit
        self.gate_up_proj = Linear(hidden, 2 * inter, dtype=dtype)
        self.down_proj = Linear(inter, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return self.down_proj((up + 1.0) * gate * torch.sigmoid(self.alpha * gate))


class MiniMaxM3MoE(nn.Module):
    """Sigmoid top-k routed SwiGLU-OAI experts (scaled) + one shared expert; x [T, H] -> [T, H]."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, e = cfg["hidden_size"], cfg["num_local_experts"]
        self.top_k, self.scaling = cfg["num_experts_per_tok"], float(cfg.get("routed_scaling_factor", 1.0))
        self.alpha, self.limit = cfg["swiglu_alpha"], cfg["swiglu_limit"]
        self.gate = Linear(h, e, dtype=dtype)
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(e, dtype=torch.float32), requires_grad=False)
        self.experts = Experts(e, h, cfg["intermediate_size"], dtype)
        self.shared_experts = SwiGLUOAIMLP(h, cfg["shared_intermediate_size"], self.alpha, self.limit, dtype)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers scales the routed *output* by routed_scaling_factor; scaling the weights
        # instead is the same sum up to rounding (route_topk's contract).
        weights, ids = self.ops.route_topk(self.gate(x).float(), top_k=self.top_k, scoring="sigmoid",
                                           bias=self.gate.e_score_correction_bias, renormalize=True,
                                           scaling=self.scaling)
        routed = self.ops.moe_experts(x, weights, ids, self.experts.w13, self.experts.w2, activation="swiglu_oai",
                                      limit=self.limit, swiglu_alpha=self.alpha)
        return routed + self.shared_experts(x)


class Indexer(nn.Module):
    """Lightning-indexer projections: x [T, H] -> (q [T, Hi, Di], k [T, Di]), normed and roped."""

    def __init__(self, hidden: int, heads: int, dim: int, eps: float, ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.q_proj = Linear(hidden, heads * dim, dtype=dtype)
        self.k_proj = Linear(hidden, dim, dtype=dtype)
        self.q_norm = RMSNorm(ops, dim, eps, offset=1.0)
        self.k_norm = RMSNorm(ops, dim, eps, offset=1.0)
        self.ops = ops

    def forward(self, x: torch.Tensor, rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.shape[0]
        q = self.ops.apply_rope(self.q_norm(self.q_proj(x).view(t, self.heads, self.dim)), *rope)
        k = self.ops.apply_rope(self.k_norm(self.k_proj(x)), *rope)
        return q, k


class MiniMaxM3Attention(nn.Module):
    """Full or block-sparse GQA attention; x [T, H] -> [T, H]."""

    def __init__(self, cfg: dict[str, Any], sparse: bool, ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        self.q_proj = Linear(h, self.heads * self.head_dim, dtype=dtype)
        self.k_proj = Linear(h, self.kv_heads * self.head_dim, dtype=dtype)
        self.v_proj = Linear(h, self.kv_heads * self.head_dim, dtype=dtype)
        self.o_proj = Linear(self.heads * self.head_dim, h, dtype=dtype)
        self.q_norm = RMSNorm(ops, self.head_dim, eps, offset=1.0)
        self.k_norm = RMSNorm(ops, self.head_dim, eps, offset=1.0)
        self.indexer = None
        if sparse:
            if cfg["index_n_heads"] != self.kv_heads:
                raise ConfigError(f"minimax_m3: index_n_heads ({cfg['index_n_heads']}) must equal "
                                 f"num_key_value_heads ({self.kv_heads}): one block selection per KV group")
            self.indexer = Indexer(h, cfg["index_n_heads"], cfg["index_head_dim"], eps, ops, dtype)
            self.block_size, self.topk_blocks = cfg["index_block_size"], cfg["index_topk_blocks"]
            self.local_blocks = cfg["index_local_blocks"]
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        specs = kv_cache_specs(self.kv_heads, self.head_dim, self.head_dim, dtype)
        if self.indexer is not None:
            specs.append(CacheTensor("index_k", "token", (self.indexer.dim,), dtype))
        return specs

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: all (full layers) or ``index_topk_blocks``
        blocks of ``index_block_size`` keys, the forced local blocks among them (sparse layers)."""
        return context if self.indexer is None else min(context, self.topk_blocks * self.block_size)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None, rope: RopeTable) -> torch.Tensor:
        t, ops = x.shape[0], self.ops
        q = ops.apply_rope(self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim)), *rope)
        k = ops.apply_rope(self.k_norm(self.k_proj(x).view(t, self.kv_heads, self.head_dim)), *rope)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        scale = self.head_dim ** -0.5
        if self.indexer is None:
            o = cached_attention(ops, batch, cache, q, k, v, scale=scale)
            return self.o_proj(o.reshape(t, -1))
        iq, ik = self.indexer(x, rope)
        # The block-sparse ops read the sequence bounds on the host: pass host copies.
        cu_q = cu_k = batch.cu_seqlens_host
        if cache is not None:
            rows = batch.token_rows()
            for name, new in (("k", k), ("v", v), ("index_k", ik)):
                store = cache[name].flatten(0, 1)
                store.index_copy_(0, rows, new.to(store.dtype))
            if batch.is_decode:  # the paged form: no host lengths, so CUDA graphs can replay it
                o = ops.block_sparse_decode(
                    q, iq, cache["k"].flatten(0, 1), cache["v"].flatten(0, 1),
                    cache["index_k"].flatten(0, 1), batch.entry_rows(ops=ops), block_size=self.block_size,
                    topk_blocks=self.topk_blocks, local_blocks=self.local_blocks, scale=scale)
                return self.o_proj(o.reshape(t, -1))
            if batch.has_prefix:  # attend over every cached position of each request
                k, v, ik = (gather_sequences(cache[n], batch).to(q.dtype) for n in ("k", "v", "index_k"))
                cu_k = batch.cu_seqlens_k_host
        blocks = ops.block_sparse_indexer(iq, ik, cu_q, cu_k, block_size=self.block_size,
                                          topk_blocks=self.topk_blocks, local_blocks=self.local_blocks)
        o = ops.block_sparse_attention(q, k, v, blocks, cu_q, cu_k, block_size=self.block_size, scale=scale)
        return self.o_proj(o.reshape(t, -1))


class MiniMaxM3DecoderLayer(nn.Module):
    """input_layernorm -> attention -> +residual -> post_attention_layernorm -> MLP (dense or MoE)
    -> +residual; x [T, H] -> [T, H]."""

    def __init__(self, cfg: dict[str, Any], sparse_attention: bool, moe: bool, ops: OpTable,
                 dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.moe = moe
        self.self_attn = MiniMaxM3Attention(cfg, sparse_attention, ops, dtype)
        self.mlp = MiniMaxM3MoE(cfg, ops, dtype) if moe else SwiGLUOAIMLP(
            h, cfg["dense_intermediate_size"], cfg["swiglu_alpha"], cfg["swiglu_limit"], dtype)
        self.input_layernorm = RMSNorm(ops, h, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(ops, h, eps, offset=1.0)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None, rope: RopeTable) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, cache, rope)
        return x + self.mlp(self.post_attention_layernorm(x))
