"""Qwen3.5 dense and MoE (model_type qwen3_5 / qwen3_5_moe and their *_text forms).

Hybrid decoder (MODELS.md §3): Gated DeltaNet layers and gated full-attention layers (GQA,
per-head sigmoid output gate, zero-centred q/k norms, partial rotate-half RoPE on the first
``head_dim * partial_rotary_factor`` channels); a SwiGLU MLP or a softmax top-k MoE with a
sigmoid-gated shared expert; zero-centred decoder RMSNorms. MTP weights (``mtp.*``) are loaded
into ``self.mtp`` for speculative decoding.

Checkpoint layouts: the published VLM layout (``model.language_model.*``, ``model.visual.*``
not used, ``mtp.*``; experts per expert or fused) and transformers' text-class layout
(``model.*``, fused experts).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, GatedMLP, Linear, MergedProjection, RMSNorm
from hwinfer.layers.gated_deltanet import GatedDeltaNet
from hwinfer.layers.kv_attention import cached_attention, kv_cache_specs
from hwinfer.layers.moe import SoftmaxMoE
from hwinfer.loader.config import require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch


def _layer_types(cfg: dict[str, Any]) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    interval = cfg.get("full_attention_interval", 4)
    n = require(cfg, "num_hidden_layers")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]


def _rope(cfg: dict[str, Any]) -> tuple[float, float]:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10_000_000.0))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return float(theta), float(partial)


class GatedAttention(nn.Module):
    """Full attention with a per-head sigmoid output gate; q_proj gives [query | gate] per head."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.heads
        theta, partial = _rope(cfg)
        self.rotary_dim, self.theta = int(self.head_dim * partial), theta
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_proj = Linear(h, self.heads * self.head_dim * 2, dtype=dtype)
        self.k_proj = Linear(h, self.kv_heads * self.head_dim, dtype=dtype)
        self.v_proj = Linear(h, self.kv_heads * self.head_dim, dtype=dtype)
        self.o_proj = Linear(self.heads * self.head_dim, h, dtype=dtype)
        self.q_norm = RMSNorm(ops, self.head_dim, eps, offset=1.0)
        self.k_norm = RMSNorm(ops, self.head_dim, eps, offset=1.0)
        self.qkv_proj = MergedProjection(self.q_proj, self.k_proj, self.v_proj)
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        return kv_cache_specs(self.kv_heads, self.head_dim, self.head_dim, dtype)

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: all of them (full attention)."""
        return context

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        return self._attend(self.qkv_proj(x), batch, cache)

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm,
                         batch: ForwardBatch, cache: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual), the add and the norm fused into the qkv
        projection (``add_rms_norm_linear``)."""
        parts, residual = self.qkv_proj.add_norm(self.ops.add_rms_norm_linear, x, residual, norm)
        return self._attend(parts, batch, cache), residual

    def _attend(self, parts: tuple[torch.Tensor, ...], batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        qg, k, v = parts
        t = qg.shape[0]
        qg = qg.view(t, self.heads, 2 * self.head_dim)
        q, gate = qg[..., : self.head_dim], qg[..., self.head_dim:]
        v = v.view(t, self.kv_heads, self.head_dim)
        cos, sin = batch.rope(self.ops, self.rotary_dim, self.theta)
        k = k.view(t, self.kv_heads, self.head_dim)
        # Zero-centred q/k norm then partial rotate-half RoPE; in decode one op also writes K and
        # V into their cache rows (q, k, v in one kernel), elsewhere one fused op each.
        norm = dict(eps=self.q_norm.eps, weight_offset=self.q_norm.offset)
        store = cache is None or not batch.is_decode
        if store:
            q = self.ops.rms_norm_rope(q, self.q_norm.weight, cos, sin, **norm)
            k = self.ops.rms_norm_rope(k, self.k_norm.weight, cos, sin, **norm)
        else:
            q = self.ops.rms_norm_rope_kv_store(q, k, v, self.q_norm.weight, self.k_norm.weight,
                                                cos, sin, cache["k"], cache["v"],
                                                batch.token_rows(), **norm)
        o = cached_attention(self.ops, batch, cache, q, k, v, scale=self.head_dim ** -0.5,
                             gate=gate, store=store)
        return self.o_proj(o.reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], kind: str, ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, ops, dtype)
        else:
            self.self_attn = GatedAttention(cfg, ops, dtype)
        if cfg.get("num_experts"):
            self.mlp = SoftmaxMoE(cfg, ops, dtype)
        else:
            self.mlp = GatedMLP(h, cfg["intermediate_size"], dtype)
        self.input_layernorm = RMSNorm(ops, h, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(ops, h, eps, offset=1.0)

    @property
    def mixer(self) -> nn.Module:
        return self.linear_attn if self.kind == "linear_attention" else self.self_attn

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] the previous layer's MLP output (or the embeddings, with residual None) ->
        (this layer's MLP output, the residual stream before it): each residual add is fused
        with the norm after it and the projection after that (add_rms_norm_linear); the caller
        adds the last output."""
        if residual is None:  # the first layer adds zeros (exact), so its norm fuses too
            residual = torch.zeros_like(x)
        # add, norm and the mixer's input projection: one op
        out, residual = self.mixer.forward_add_norm(x, residual, self.input_layernorm, batch, cache)
        if isinstance(self.mlp, GatedMLP):  # add, norm, gate|up and activation: one op
            return self.mlp.add_norm_forward(out, residual, self.post_attention_layernorm)
        h, residual = self.post_attention_layernorm.add(out, residual)
        return self.mlp(h), residual


class MultiTokenPredictor(nn.Module):
    """Qwen3.5's MTP head (``mtp.*``): h' = fc([norm_e(embed(next)); norm_h(h)]) -> one
    full-attention decoder layer -> norm -> the shared lm_head. Used for speculative decoding;
    its math follows the Qwen3-Next convention (embedding first in the fc input, ``h`` = the
    main model's hidden after its final norm, position = that of ``h``; vLLM's qwen3_next_mtp)
    and is NOT checked against transformers (which does not implement it). Only ``layers[0]``
    drafts (releases have one MTP layer)."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.fc = Linear(2 * h, h, dtype=dtype)
        self.pre_fc_norm_embedding = RMSNorm(ops, h, eps, offset=1.0)
        self.pre_fc_norm_hidden = RMSNorm(ops, h, eps, offset=1.0)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention", ops, dtype)
                                     for _ in range(cfg.get("mtp_num_hidden_layers", 1))])
        self.norm = RMSNorm(ops, h, eps, offset=1.0)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch,
                cache: dict | None) -> torch.Tensor:
        """embeds [T, H] of the next tokens, hidden [T, H] at batch.positions -> [T, H] (normed)."""
        x = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        return self.norm.add(*self.layers[0](x, batch, cache))[0]


class Qwen3_5ForCausalLM(CausalLM):
    # The decode forward neither syncs with the host nor bakes batch values into shapes
    # (hwinfer.engine.graphs), given sync-free impls of its ops.
    graph_decode = True
    # A one-request prefill reads no host lengths either (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.ops, self.dtype = config, ops, dtype
        h, v = require(config, "hidden_size"), require(config, "vocab_size")
        self.layer_types = _layer_types(config)
        self.embed_tokens = Embedding(v, h, dtype)
        self.layers = nn.ModuleList([DecoderLayer(config, k, ops, dtype) for k in self.layer_types])
        self.norm = RMSNorm(ops, h, config.get("rms_norm_eps", 1e-6), offset=1.0)
        self.build_head(h, v, dtype, bool(config.get("tie_word_embeddings", False)))
        self.mtp = MultiTokenPredictor(config, ops, dtype) if config.get("mtp_num_hidden_layers") else None

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.mixer.cache_specs(self.dtype) for layer in self.layers]

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        x, residual = self.embed_tokens(batch.input_ids), None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, batch, batch.cache.layers[i] if batch.cache is not None else None, residual)
        return self.norm.add(x, residual)[0]

    # --- speculative decoding with the MTP head (hwinfer.engine.speculative) -----------------
    def spec_cache_specs(self, num_draft: int) -> list[list[CacheTensor]]:
        """The main layers' cache (no rings to widen: GDN state is replayed, attention KV is per
        token), then the MTP layer's own KV cache as one more layer."""
        return self.cache_specs() + [self.mtp.layers[0].mixer.cache_specs(self.dtype)]

    def forward_batch_mtp(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [T, H], what the MTP head consumes [T, H]: the same normed hidden)."""
        hidden = self.forward_batch(batch)
        return hidden, hidden

    def mtp_forward(self, hidden: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H] (main model or previous draft step) at batch.positions, batch.input_ids
        [T] the token after each position -> (lm_head input [T, H], hidden for the next draft
        step [T, H]). The MTP KV cache is ``batch.cache.layers[num_hidden_layers]``."""
        cache = batch.cache.layers[len(self.layers)] if batch.cache is not None else None
        out = self.mtp(self.embed_tokens(batch.input_ids), hidden, batch, cache)
        return out, out

    # --- checkpoint layouts ------------------------------------------------------------------
    def _layer_entries(self, layout: Layout, prefix: str, layer: DecoderLayer, ours: str,
                       fused_experts: bool) -> None:
        for name, p in layer.named_parameters():
            if name.startswith("mlp.experts."):
                continue  # added below, per expert or fused
            layout.add(f"{prefix}.{name}", f"{ours}.{name}", tuple(p.shape),
                       quantizable=name.endswith("proj.weight"))
        if isinstance(layer.mlp, SoftmaxMoE):
            layer.mlp.add_expert_entries(layout, f"{prefix}.mlp.experts", f"{ours}.mlp.experts", fused_experts)

    def _layout(self, stem: str, fused_experts: bool, with_mtp: bool) -> Layout:
        name = ("published" if stem == "model.language_model" else "text-only prefix") + \
            (", fused experts" if fused_experts else "") + ("" if with_mtp else ", no MTP")
        layout = Layout({}, name=name, ignored_prefixes=("model.visual.",))
        layout.add(f"{stem}.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add(f"{stem}.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        if not self.tied:
            layout.add("lm_head.weight", "lm_head.weight", tuple(self.lm_head.weight.shape))
        for i, layer in enumerate(self.layers):
            self._layer_entries(layout, f"{stem}.layers.{i}", layer, f"layers.{i}", fused_experts)
        if self.mtp is None:
            return layout
        if not with_mtp:
            layout.without = ("mtp",)
            return layout
        for name_, p in self.mtp.named_parameters():
            if ".mlp.experts." in name_:
                continue
            layout.add(f"mtp.{name_}", f"mtp.{name_}", tuple(p.shape), quantizable=name_.endswith("proj.weight"))
        for i, layer in enumerate(self.mtp.layers):
            if isinstance(layer.mlp, SoftmaxMoE):
                layer.mlp.add_expert_entries(layout, f"mtp.layers.{i}.mlp.experts",
                                             f"mtp.layers.{i}.mlp.experts", fused_experts)
        return layout

    def layouts(self) -> list[Layout]:
        """The published VLM layout (``model.language_model.*``, experts per expert or fused,
        MTP present or not: transformers' save_pretrained writes it without MTP), and the same
        under a plain ``model.*`` prefix (text-only checkpoints)."""
        return [self._layout(stem, fused, mtp)
                for stem in ("model.language_model", "model")
                for fused in (False, True) for mtp in (True, False)]
