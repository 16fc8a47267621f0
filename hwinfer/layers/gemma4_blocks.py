"""Gemma 4 decoder blocks (MODELS.md §5): sliding / global attention and the sandwich-norm layer.

Attention (``self_attn``): q_norm / k_norm are weighted RMSNorms over each head and the logit
scale is 1.0 (the norms do the scaling); V goes through an unweighted RMSNorm. Sliding layers use
``head_dim`` and ``num_key_value_heads``; global ("full_attention") layers use ``global_head_dim``
and, when ``attention_k_eq_v``, ``num_global_key_value_heads`` and no ``v_proj``: V is the
unweighted RMSNorm of the *raw* k projection while K = RoPE(k_norm(k projection)). RoPE is
rotate-half over the whole head with the layer type's table (global layers: "proportional").
A KV-shared layer (the last ``num_kv_shared_layers``) has only q_proj / q_norm / o_proj and
attends over the K/V of the last earlier layer of its type (its "owner"), whose cache it reads.

Decoder layer: input_layernorm -> attn -> post_attention_layernorm -> +residual;
pre_feedforward_layernorm -> gelu-tanh MLP (-> post_feedforward_layernorm_1, plus, with
``enable_moe_block``, the MoE on the same residual: router on it, experts on
pre_feedforward_layernorm_2 of it, post_feedforward_layernorm_2, summed) ->
post_feedforward_layernorm -> +residual; then the per-layer input (PLE) branch
(gate -> gelu-tanh -> * per-layer input -> projection -> norm -> +residual); then * layer_scalar.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import GatedMLP, Linear, RMSNorm
from hwinfer.layers.kv_attention import cached_attention, kv_cache_specs
from hwinfer.layers.moe import Experts
from hwinfer.runtime.batch import ForwardBatch

RopeTable = tuple[torch.Tensor, torch.Tensor]
SharedKV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class LayerSpec:
    """Per-layer geometry resolved from the config (see the model file's parser)."""

    kind: str                 # "sliding_attention" or "full_attention"
    head_dim: int
    kv_heads: int
    k_eq_v: bool              # global layer without v_proj (V from the raw k projection)
    window: int | None        # sliding window W (keys p-W+1 .. p) or None
    kv_source: int | None     # owner layer whose KV this layer reuses, None if it owns its KV
    intermediate: int         # dense MLP width (doubled on KV-shared layers with use_double_wide_mlp)


class Gemma4Attention(nn.Module):
    """x [T, H] -> [T, H]. Owners return their new tokens' (k, v) for the layers sharing them."""

    def __init__(self, hidden: int, heads: int, spec: LayerSpec, eps: float, ops: OpTable,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, spec.kv_heads, spec.head_dim
        self.window, self.shared = spec.window, spec.kv_source is not None
        self.q_proj = Linear(hidden, heads * self.head_dim, dtype=dtype)
        self.q_norm = RMSNorm(ops, self.head_dim, eps)
        if not self.shared:
            self.k_proj = Linear(hidden, self.kv_heads * self.head_dim, dtype=dtype)
            self.k_norm = RMSNorm(ops, self.head_dim, eps)
            self.v_norm = RMSNorm(ops, self.head_dim, eps, weighted=False)
            self.v_proj = None if spec.k_eq_v else Linear(hidden, self.kv_heads * self.head_dim, dtype=dtype)
        self.o_proj = Linear(heads * self.head_dim, hidden, dtype=dtype)
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        if self.shared:
            return []
        return kv_cache_specs(self.kv_heads, self.head_dim, self.head_dim, dtype, window=self.window,
                              v_from_k=self.v_proj is None)

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: the window (sliding layers) or all of them."""
        return min(context, self.window) if self.window else context

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None, rope: RopeTable,
                shared_kv: SharedKV | None = None) -> tuple[torch.Tensor, SharedKV]:
        """cache: this layer's cache, or its owner's for a KV-shared layer; shared_kv: the owner's
        (k [T, Hkv, D], v [T, Hkv, D]) for this batch's new tokens (KV-shared layers only)."""
        t = x.shape[0]
        cos, sin = rope
        q = self.ops.apply_rope(self.q_norm(self.q_proj(x).view(t, self.heads, self.head_dim)), cos, sin)
        if self.shared:
            assert shared_kv is not None, "a KV-shared layer needs its owner's keys and values"
            k, v = shared_kv
        else:
            raw = self.k_proj(x).view(t, self.kv_heads, self.head_dim)
            k = self.ops.apply_rope(self.k_norm(raw), cos, sin)
            # attention_k_eq_v: V is the raw projection (before k_norm and RoPE), normalised alone.
            v_in = raw if self.v_proj is None else self.v_proj(x).view(t, self.kv_heads, self.head_dim)
            v = self.v_norm(v_in)
        o = cached_attention(self.ops, batch, cache, q, k, v, scale=1.0, window=self.window,
                             store=not self.shared)
        return self.o_proj(o.reshape(t, -1)), (k, v)


class Gemma4Router(nn.Module):
    """logits = proj(RMS(x) * scale * H^-1/2) (unweighted RMS); softmax top-k, renormalised,
    times ``per_expert_scale`` of the chosen experts. x [T, H] -> (weights [T, k] fp32, ids)."""

    def __init__(self, hidden: int, experts: int, top_k: int, eps: float, ops: OpTable,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.top_k, self.eps, self.ops = top_k, eps, ops
        self.proj = Linear(hidden, experts, dtype=dtype)
        self.scale = nn.Parameter(torch.empty(hidden, dtype=torch.float32), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.empty(experts, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ops.rms_norm(x, None, eps=self.eps)
        h = h * self.scale.to(h.dtype) * (x.shape[-1] ** -0.5)
        return self.ops.route_topk(self.proj(h).float(), top_k=self.top_k, scoring="softmax",
                                   renormalize=True, expert_scale=self.per_expert_scale)


class Gemma4DecoderLayer(nn.Module):
    """One decoder layer; parameter names are the checkpoint's (``layers.N.*``)."""

    def __init__(self, cfg: dict, spec: LayerSpec, ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.spec = spec
        self.self_attn = Gemma4Attention(h, cfg["num_attention_heads"], spec, eps, ops, dtype)
        self.mlp = GatedMLP(h, spec.intermediate, dtype, activation="gelu_tanh")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(ops, h, eps))
        self.moe = bool(cfg.get("enable_moe_block"))
        if self.moe:
            self.router = Gemma4Router(h, cfg["num_experts"], cfg["top_k_experts"], eps, ops, dtype)
            self.experts = Experts(cfg["num_experts"], h, cfg["moe_intermediate_size"], dtype)
            self.post_feedforward_layernorm_1 = RMSNorm(ops, h, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(ops, h, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(ops, h, eps)
        self.ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            self.per_layer_input_gate = Linear(h, self.ple_dim, dtype=dtype)
            self.per_layer_projection = Linear(self.ple_dim, h, dtype=dtype)
            self.post_per_layer_input_norm = RMSNorm(ops, h, eps)
        # in the model dtype, as the checkpoint stores it (one cast less per layer and step)
        self.layer_scalar = nn.Parameter(torch.empty(1, dtype=dtype), requires_grad=False)
        self.ops = ops

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The dense MLP, plus the MoE computed in parallel on the same input when enabled."""
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if not self.moe:
            return h
        weights, ids = self.router(x)
        routed = self.ops.moe_experts(self.pre_feedforward_layernorm_2(x), weights, ids, self.experts.w13,
                                      self.experts.w2, activation="gelu_tanh")
        return self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(routed)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None, rope: RopeTable,
                per_layer_input: torch.Tensor | None, shared_kv: SharedKV | None
                ) -> tuple[torch.Tensor, SharedKV]:
        """x [T, H]; per_layer_input [T, P] (PLE) or None -> (x [T, H], this layer's (k, v))."""
        a, kv = self.self_attn(self.input_layernorm(x), batch, cache, rope, shared_kv)
        x = x + self.post_attention_layernorm(a)
        x = x + self.post_feedforward_layernorm(self._feed_forward(x))
        if self.ple_dim:
            g = self.ops.gated_act(self.per_layer_input_gate(x), per_layer_input, activation="gelu_tanh")
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return x * self.layer_scalar, kv
