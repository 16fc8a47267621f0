"""GLM-5 (model_type ``glm_moe_dsa``, zai-org/GLM-5; MODELS.md §5).

Pre-norm decoder: MLA attention (q_lora / kv_lora latents, qk_nope + qk_rope heads, v_head_dim
values) whose keys are chosen per query by a DSA lightning indexer (top ``index_topk`` tokens,
see :mod:`hwinfer.layers.mla`); a SwiGLU MLP on the first ``first_k_dense_replace`` layers, then
a sigmoid noaux MoE with shared experts. RoPE pairs channels (2i, 2i+1) ("interleaved") in the
attention and in the indexer, whose rotary channels are its *first* ``qk_rope_head_dim``.

``indexer_types`` (``full`` / ``shared``; shared layers reuse the previous full layer's
selection) comes from the config list, or ``index_topk_pattern`` ("FSS..."), or
``index_topk_freq`` / ``index_skip_topk_offset`` (GLM-5.2 style); without any, every layer
runs its indexer.

Checkpoint layouts: the published one (``model.*``, per-expert tensors, optionally FP8 e4m3 with
fp32 ``weight_scale_inv`` 128x128 blocks; the ``num_nextn_predict_layers`` MTP layers stored as
``model.layers.<num_hidden_layers + i>.*`` and indexer weights on shared layers are not used),
which is also what transformers' ``save_pretrained`` writes, and the same with fused experts.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, GatedMLP, RMSNorm
from hwinfer.layers.mla import MLAConfig, MLAttention, check_indexer_types
from hwinfer.layers.sigmoid_moe import SigmoidMoE
from hwinfer.loader.config import ConfigError, require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch


# transformers' GlmMoeDsaConfig defaults for fields that change behaviour when a config omits them.
DEFAULTS: dict[str, Any] = {"n_shared_experts": 1, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
                            "norm_topk_prob": True, "rms_norm_eps": 1e-5, "first_k_dense_replace": 3,
                            "index_topk": 2048}


def with_defaults(config: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``defaults`` filled in where a field is absent or null."""
    return {**defaults, **{k: v for k, v in config.items() if v is not None}}


def indexer_types(cfg: dict[str, Any]) -> list[str]:
    """Per-layer ``full`` / ``shared`` (transformers' GlmMoeDsaConfig derivation)."""
    n = require(cfg, "num_hidden_layers")
    if cfg.get("indexer_types"):
        return check_indexer_types(list(cfg["indexer_types"]), n)
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        types = [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
        return check_indexer_types(types, n)
    freq = max(int(cfg.get("index_topk_freq") or 1), 1)
    offset = int(cfg.get("index_skip_topk_offset", 2))
    return check_indexer_types(["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)], n)


def mlp_types(cfg: dict[str, Any], dense: int) -> list[str]:
    """Per-layer ``dense`` / ``sparse``: ``mlp_layer_types``, else ``dense`` dense layers first."""
    n = require(cfg, "num_hidden_layers")
    types = cfg.get("mlp_layer_types")
    if not types:
        dense = min(dense, n)
        types = ["dense"] * dense + ["sparse"] * (n - dense)
    if len(types) != n or any(k not in ("dense", "sparse") for k in types):
        raise ConfigError(f"mlp_layer_types must list 'dense' or 'sparse' for each of the {n} layers, got {types}")
    return list(types)


def make_mlp(cfg: dict[str, Any], kind: str, ops: OpTable, dtype: torch.dtype,
             swiglu_limit: float | None = None) -> nn.Module:
    """The layer's feed-forward: SigmoidMoE (``sparse``) or a SwiGLU MLP of intermediate_size."""
    if kind == "sparse":
        return SigmoidMoE(cfg, ops, dtype, swiglu_limit)
    return GatedMLP(require(cfg, "hidden_size"), require(cfg, "intermediate_size"), dtype)


class DecoderLayer(nn.Module):
    """x [T, H] -> x + attn(norm(x)) -> x + mlp(norm(x)); passes the DSA selection along."""

    def __init__(self, cfg: dict[str, Any], mla: MLAConfig, index_kind: str, mlp_kind: str,
                 ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = mla.hidden, cfg["rms_norm_eps"]
        self.self_attn = MLAttention(mla, ops, dtype, has_indexer=index_kind == "full")
        self.mlp = make_mlp(cfg, mlp_kind, ops, dtype)
        self.input_layernorm = RMSNorm(ops, h, eps)
        self.post_attention_layernorm = RMSNorm(ops, h, eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None,
                selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        attn, selection = self.self_attn(self.input_layernorm(x), batch, cache, selection)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), selection


def unused_prefixes(indexer_kinds: list[str]) -> tuple[str, ...]:
    """Indexer weights a checkpoint may still carry on ``shared`` layers (trained with an indexer
    everywhere, then shared at inference): declared unused rather than unexpected."""
    return tuple(f"model.layers.{i}.self_attn.indexer." for i, k in enumerate(indexer_kinds) if k == "shared")


def add_layer_entries(layout: Layout, layer: nn.Module, prefix: str, ours: str, fused_experts: bool,
                      rename: dict[str, str] | None = None) -> None:
    """Every parameter of ``layer`` under ``prefix`` (names as in transformers unless ``rename``
    maps our name to the checkpoint's); routed experts per expert or fused."""
    for name, p in layer.named_parameters():
        if name.startswith("mlp.experts."):
            continue
        key = (rename or {}).get(name, name)
        layout.add(f"{prefix}.{key}", f"{ours}.{name}", tuple(p.shape), quantizable=p.dim() == 2)
    if isinstance(layer.mlp, SigmoidMoE):
        layer.mlp.add_expert_entries(layout, f"{prefix}.mlp.experts", f"{ours}.mlp.experts", fused_experts)


class GlmMoeDsaForCausalLM(CausalLM):
    # Decode reads no host value of the batch but its length bound: the DSA indexer scores the
    # key store in place through fixed-width rows (hwinfer.engine.graphs).
    graph_decode = True
    # A one-request prefill reads no host lengths either (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        config = with_defaults(config, DEFAULTS)
        self.config, self.ops, self.dtype = config, ops, dtype
        h, v = require(config, "hidden_size"), require(config, "vocab_size")
        mla = MLAConfig.from_config(config, rope_interleaved=True, index_rope_first=True, index_norm_eps=1e-6)
        self.indexer_types = indexer_types(config)
        self.mlp_types = mlp_types(config, dense=int(config["first_k_dense_replace"]))
        self.embed_tokens = Embedding(v, h, dtype)
        self.layers = nn.ModuleList([DecoderLayer(config, mla, k, m, ops, dtype)
                                     for k, m in zip(self.indexer_types, self.mlp_types)])
        self.norm = RMSNorm(ops, h, config["rms_norm_eps"])
        self.build_head(h, v, dtype, bool(config.get("tie_word_embeddings", False)))

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.self_attn.cache_specs() for layer in self.layers]

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        selection = None
        for i, layer in enumerate(self.layers):
            x, selection = layer(x, batch, batch.cache.layers[i] if batch.cache is not None else None, selection)
        return self.norm(x)

    def _layout(self, fused_experts: bool) -> Layout:
        n = len(self.layers)
        mtp = tuple(f"model.layers.{n + i}." for i in range(int(self.config.get("num_nextn_predict_layers") or 0)))
        layout = Layout({}, name="published" + (", fused experts" if fused_experts else ""),
                        ignored_prefixes=mtp + unused_prefixes(self.indexer_types))
        layout.add("model.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add("model.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        if not self.tied:
            layout.add("lm_head.weight", "lm_head.weight", tuple(self.lm_head.weight.shape))
        for i, layer in enumerate(self.layers):
            add_layer_entries(layout, layer, f"model.layers.{i}", f"layers.{i}", fused_experts)
        return layout

    def layouts(self) -> list[Layout]:
        """Published (per-expert; also transformers' save_pretrained output), then fused experts."""
        return [self._layout(False), self._layout(True)]
