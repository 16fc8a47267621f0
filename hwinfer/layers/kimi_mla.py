"""NoPE multi-head latent attention of Kimi-Linear / Kimi-K3 full-attention layers (MODELS.md §4.3).

Per token: q = q_proj(x) (or q_b(RMS(q_a(x))) when ``q_lora_rank`` is set, K3) viewed
[nh, nope + rope]; [c | k_rot] = kv_a_proj_with_mqa(x) with c = RMS(c) (``kv_a_layernorm``);
per head k = [k_nope | k_rot] (k_rot shared by all heads and *not* rotated: no positional
encoding anywhere), [k_nope | v] = kv_b_proj(c); causal softmax with scale (nope + rope)^-1/2;
K3 multiplies each head's output by sigmoid(g_proj(x)); then o_proj.

The cache keeps one row per token: [c | k_rot] (kv_lora_rank + qk_rope_head_dim). A first prefill
attends in expanded form (k, v per head); a continuation (decode, chunked prefill) attends in
absorbed form over the cached rows: q_lat = q_nope W_UK (per head, [kv_lora]), query
[q_lat | q_rot] against keys [c | k_rot] as one shared head (V = the same rows; the first
kv_lora output channels are the latent output), then W_UV per head. Both forms are the same
function; they differ by fp32 rounding only.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Linear, RMSNorm
from hwinfer.layers.kv_attention import cached_attention, kv_cache_specs
from hwinfer.runtime.batch import ForwardBatch

# transformers builds q_a_layernorm / kv_a_layernorm with its RMSNorm default eps, not
# rms_norm_eps (DeepSeek-V3 heritage; the K3 ports do the same).
_LATENT_NORM_EPS = 1e-6


class KimiMLA(nn.Module):
    """x [T, H] -> [T, H]. ``cfg`` keys: hidden_size, num_attention_heads, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim, kv_lora_rank, q_lora_rank (None: a direct q_proj).
    ``output_gate``: K3's ``mla_use_output_gate`` (g_proj [nh * v_head_dim, H])."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype, *,
                 output_gate: bool = False) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.nope, self.rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        self.v_dim, self.kv_lora = cfg["v_head_dim"], cfg["kv_lora_rank"]
        self.q_lora = cfg.get("q_lora_rank")
        qk = self.nope + self.rope
        self.scale = qk ** -0.5
        if self.q_lora:
            self.q_a_proj = Linear(h, self.q_lora, dtype=dtype)
            self.q_a_layernorm = RMSNorm(ops, self.q_lora, _LATENT_NORM_EPS)
            self.q_b_proj = Linear(self.q_lora, self.heads * qk, dtype=dtype)
        else:
            self.q_proj = Linear(h, self.heads * qk, dtype=dtype)
        self.kv_a_proj_with_mqa = Linear(h, self.kv_lora + self.rope, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(ops, self.kv_lora, _LATENT_NORM_EPS)
        self.kv_b_proj = Linear(self.kv_lora, self.heads * (self.nope + self.v_dim), dtype=dtype)
        self.o_proj = Linear(self.heads * self.v_dim, h, dtype=dtype)
        self.g_proj = Linear(h, self.heads * self.v_dim, dtype=dtype) if output_gate else None
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        """One [1, kv_lora + rope] row per token: the normed latent and the shared key part."""
        return kv_cache_specs(1, self.kv_lora + self.rope, None, dtype)

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: all of them (full attention)."""
        return context

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        return q.view(x.shape[0], self.heads, self.nope + self.rope)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        t = x.shape[0]
        q = self._query(x)
        c, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], dim=-1)
        latent = torch.cat([self.kv_a_layernorm(c), k_rot], dim=-1)  # [T, kv_lora + rope]
        if cache is None or not batch.has_prefix:
            if cache is not None:
                store = cache["k"].flatten(0, 1)
                store.index_copy_(0, batch.token_rows(), latent[:, None].to(store.dtype))
            o = self._expanded(q, latent, batch)
        else:
            o = self._absorbed(q, latent, batch, cache)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x).view(t, self.heads, self.v_dim))
        return self.o_proj(o.reshape(t, -1))

    def _expanded(self, q: torch.Tensor, latent: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Attention over this call's tokens only: per-head keys and values from kv_b_proj."""
        t = q.shape[0]
        kv = self.kv_b_proj(latent[:, : self.kv_lora]).view(t, self.heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_rot = latent[:, None, self.kv_lora:].expand(t, self.heads, self.rope)
        k = torch.cat([k_nope, k_rot], dim=-1)
        cu = batch.cu_seqlens_host   # bounds the attention op reads on the host
        return self.ops.attention(q, k, v, cu, cu, scale=self.scale)   # v: a strided view

    def _absorbed(self, q: torch.Tensor, latent: torch.Tensor, batch: ForwardBatch,
                  cache: dict) -> torch.Tensor:
        """Attention over the cached rows of every request (prefix + new), in latent space."""
        w = self.kv_b_proj.weight.view(self.heads, self.nope + self.v_dim, self.kv_lora)
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope:]
        q_lat = torch.einsum("thn,hnc->thc", q[..., : self.nope], w_uk)
        query = torch.cat([q_lat, q[..., self.nope:]], dim=-1)
        o_lat = cached_attention(self.ops, batch, cache, query, latent[:, None], None, scale=self.scale)
        return torch.einsum("thc,hvc->thv", o_lat[..., : self.kv_lora], w_uv)
