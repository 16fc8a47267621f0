"""MiniMax-M3 text (model_type minimax_m3_vl / minimax_m3_vl_text; MODELS.md §5).

Full-attention and block-sparse (lightning-indexer) layers, dense SwiGLU-OAI MLP or a sigmoid-routed
MoE with a shared expert per layer (blocks in :mod:`hwinfer.layers.minimax_m3_blocks`),
zero-centred RMSNorms, untied LM head. The MTP module of the release is not used (its tensors are
ignored, as transformers does).

Config: the published fields (``sparse_attention_config`` {sparse_attention_freq,
sparse_num_index_heads, sparse_index_dim, sparse_block_size, sparse_topk_blocks,
sparse_local_block}, ``moe_layer_freq``, ``rotary_dim``, ``rope_theta``) and transformers' names
(``layer_types`` with ``minimax_m3_sparse``, ``mlp_layer_types``, ``index_*``, ``rope_parameters``).

Checkpoint layouts: the published VLM layout (``language_model.model.*``, ``language_model.lm_head``;
``block_sparse_moe.{gate, e_score_correction_bias, experts.E.w1/w2/w3, shared_experts.*}``,
``self_attn.index_{q,k}_{proj,norm}``, dense ``mlp.{gate,up,down}_proj``; vision tower, projector,
patch-merge MLP and MTP ignored) — transformers' MiniMaxM3SparseForConditionalGeneration writes the
same names — and the text layout of MiniMaxM3VLForCausalLM (``model.*``, fused ``gate_up_proj``
tensors, ``mlp.gate.*``, ``self_attn.indexer.*``). FP8 releases (e4m3 + fp32 ``weight_scale_inv``
128x128 blocks) are dequantized by the loader.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, RMSNorm
from hwinfer.layers.minimax_m3_blocks import MiniMaxM3DecoderLayer, SwiGLUOAIMLP
from hwinfer.loader.config import ConfigError, require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch

# transformers' index_* name -> the published sparse_attention_config name, and HF's defaults.
_INDEX_FIELDS = {"index_n_heads": ("sparse_num_index_heads", 4), "index_head_dim": ("sparse_index_dim", 128),
                 "index_block_size": ("sparse_block_size", 128), "index_topk_blocks": ("sparse_topk_blocks", 16),
                 "index_local_blocks": ("sparse_local_block", 1)}
_VLM_IGNORED = ("vision_tower.", "multi_modal_projector.", "patch_merge_mlp.", "language_model.model.mtp.")


def normalize_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text config with transformers' field names filled in from the published ones."""
    cfg = dict(raw)
    n = require(cfg, "num_hidden_layers")
    sparse = cfg.get("sparse_attention_config") or {}
    for name, (published, default) in _INDEX_FIELDS.items():
        cfg[name] = cfg.get(name, sparse.get(published, default))
    if not cfg.get("layer_types"):
        freq = sparse.get("sparse_attention_freq") if sparse.get("use_sparse_attention", True) else None
        cfg["layer_types"] = ["minimax_m3_sparse" if f else "full_attention" for f in (freq or [0] * n)]
    if not cfg.get("mlp_layer_types"):
        freq = cfg.get("moe_layer_freq") or [1] * n
        cfg["mlp_layer_types"] = ["sparse" if f else "dense" for f in freq]
    if len(cfg["layer_types"]) < n or len(cfg["mlp_layer_types"]) < n:
        raise ConfigError("minimax_m3: layer_types / mlp_layer_types must cover num_hidden_layers")
    cfg["num_local_experts"] = require(cfg, "num_local_experts", "num_experts")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"minimax_m3: scoring_func {cfg['scoring_func']!r} is not supported (sigmoid only)")
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    cfg["rope_theta"] = float(rope.get("rope_theta", cfg.get("rope_theta", 5_000_000.0)))
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    # The published configs give both rotary_dim (what engines read) and partial_rotary_factor
    # (what transformers reads); they agree in every release.
    cfg["rotary_dim"] = int(cfg.get("rotary_dim") or cfg["head_dim"] * partial)
    if "minimax_m3_sparse" in cfg["layer_types"] and cfg["rotary_dim"] > cfg["index_head_dim"]:
        raise ConfigError("minimax_m3: rotary_dim exceeds index_head_dim")
    cfg.setdefault("swiglu_alpha", 1.702)
    cfg.setdefault("swiglu_limit", 7.0)
    return cfg


class MiniMaxM3ForCausalLM(CausalLM):
    # Decode reads no host-side batch value (sparse layers: ``block_sparse_decode`` over the
    # batch's fixed-width entry rows; full layers: paged attention), so CUDA graphs replay it.
    graph_decode = True
    # A one-request prefill reads no host lengths either (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.ops, self.dtype = config, ops, dtype
        cfg = normalize_config(config)
        self.text = cfg
        h, v = require(cfg, "hidden_size"), require(cfg, "vocab_size")
        n = cfg["num_hidden_layers"]
        self.embed_tokens = Embedding(v, h, dtype)
        self.layers = nn.ModuleList([
            MiniMaxM3DecoderLayer(cfg, cfg["layer_types"][i] == "minimax_m3_sparse",
                                  cfg["mlp_layer_types"][i] == "sparse", ops, dtype) for i in range(n)])
        self.norm = RMSNorm(ops, h, cfg.get("rms_norm_eps", 1e-6), offset=1.0)
        self.build_head(h, v, dtype, bool(cfg.get("tie_word_embeddings", False)))

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.self_attn.cache_specs(self.dtype) for layer in self.layers]

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        rope = batch.rope(self.ops, self.text["rotary_dim"], self.text["rope_theta"])
        for i, layer in enumerate(self.layers):
            x = layer(x, batch, batch.cache.layers[i] if batch.cache is not None else None, rope)
        return self.norm(x)

    # --- checkpoint layouts ------------------------------------------------------------------
    @staticmethod
    def _glu_entries(layout: Layout, prefix: str, ours: str, mlp: SwiGLUOAIMLP, fused: bool) -> None:
        h, i = mlp.down_proj.weight.shape
        if fused:
            layout.add(f"{prefix}.gate_up_proj.weight", f"{ours}.gate_up_proj.weight", (2 * i, h), quantizable=True)
        else:
            layout.add(f"{prefix}.gate_proj.weight", f"{ours}.gate_up_proj.weight", (i, h), (slice(0, i),),
                       quantizable=True)
            layout.add(f"{prefix}.up_proj.weight", f"{ours}.gate_up_proj.weight", (i, h), (slice(i, 2 * i),),
                       quantizable=True)
        layout.add(f"{prefix}.down_proj.weight", f"{ours}.down_proj.weight", (h, i), quantizable=True)

    def _layer_entries(self, layout: Layout, stem: str, i: int, layer: MiniMaxM3DecoderLayer,
                       published: bool) -> None:
        ours = f"layers.{i}"
        for name, p in layer.named_parameters():
            if name.startswith(("mlp.", "self_attn.indexer.")):
                continue  # renamed below
            layout.add(f"{stem}.{name}", f"{ours}.{name}", tuple(p.shape), quantizable=name.endswith("proj.weight"))
        if layer.self_attn.indexer is not None:
            for name, p in layer.self_attn.indexer.named_parameters():
                key = f"self_attn.index_{name}" if published else f"self_attn.indexer.{name}"
                layout.add(f"{stem}.{key}", f"{ours}.self_attn.indexer.{name}", tuple(p.shape),
                           quantizable=name.endswith("proj.weight"))
        if not layer.moe:
            self._glu_entries(layout, f"{stem}.mlp", f"{ours}.mlp", layer.mlp, fused=not published)
            return
        moe, e = layer.mlp, layer.mlp.gate.weight.shape[0]
        block = f"{stem}.block_sparse_moe" if published else f"{stem}.mlp"
        bias = f"{block}.e_score_correction_bias" if published else f"{block}.gate.e_score_correction_bias"
        layout.add(f"{block}.gate.weight", f"{ours}.mlp.gate.weight", tuple(moe.gate.weight.shape))
        layout.add(bias, f"{ours}.mlp.gate.e_score_correction_bias", (e,))
        moe.experts.add_entries(layout, f"{block}.experts", f"{ours}.mlp.experts", fused=not published,
                                names=("w1", "w3", "w2"))
        self._glu_entries(layout, f"{block}.shared_experts", f"{ours}.mlp.shared_experts", moe.shared_experts,
                          fused=not published)

    def _layout(self, published: bool) -> Layout:
        root = "language_model.model" if published else "model"
        layout = Layout({}, name="published" if published else "text-only (MiniMaxM3VLForCausalLM)",
                        ignored_prefixes=_VLM_IGNORED if published else ("model.mtp.",))
        layout.add(f"{root}.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add(f"{root}.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        if not self.tied:
            layout.add("language_model.lm_head.weight" if published else "lm_head.weight", "lm_head.weight",
                       tuple(self.lm_head.weight.shape))
        for i, layer in enumerate(self.layers):
            self._layer_entries(layout, f"{root}.layers.{i}", i, layer, published)
        return layout

    def layouts(self) -> list[Layout]:
        """Published VLM layout (= transformers' VLM save), then MiniMaxM3VLForCausalLM's."""
        return [self._layout(True), self._layout(False)]
