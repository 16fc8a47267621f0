"""Gemma 4 text, dense and MoE (model_type gemma4 / gemma4_text; MODELS.md §5).

Sliding-window and global attention layers (blocks in :mod:`hwinfer.layers.gemma4_blocks`), the
embedding scaled by sqrt(hidden_size), per-layer input embeddings (PLE: a second embedding table
with ``hidden_size_per_layer_input`` channels per layer, mixed with a projection of the main
embedding), KV sharing for the last ``num_kv_shared_layers`` layers (only the owners keep a
cache), a final RMSNorm, the tied LM head and ``final_logit_softcapping``.

Config: the published fields (``global_head_dim``, ``num_global_key_value_heads``,
``attention_k_eq_v``, ``rope_parameters`` keyed by layer type) and transformers' saved form
(``per_layer_config`` {layer: {head_dim, num_key_value_heads}} instead of the global_* fields).

Checkpoint layouts: the published VLM layout (``model.language_model.*``, vision / audio towers
ignored; the original E2B/E4B releases also carry unused k_proj / v_proj / k_norm for KV-shared
layers, ignored too) — transformers' Gemma4ForConditionalGeneration writes the same names — and
the text layout of Gemma4ForCausalLM (``model.*``). MoE experts are stored fused
(``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]) in both.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, Linear, RMSNorm
from hwinfer.layers.gemma4_blocks import Gemma4DecoderLayer, LayerSpec, RopeTable
from hwinfer.loader.config import ConfigError, require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch

_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """``layer_types``, or transformers' default 5 sliding : 1 global; the last layer is global."""
    n = require(cfg, "num_hidden_layers")
    types = list(cfg.get("layer_types") or
                 ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    types[-1] = "full_attention"  # transformers forces this too
    return types


def _check_supported(cfg: dict[str, Any]) -> None:
    """Refuse the config options the text model does not implement (none appears in a release)."""
    if cfg.get("use_bidirectional_attention") == "all":
        raise ConfigError("gemma4: use_bidirectional_attention='all' (non-causal text) is not supported")
    if cfg.get("attention_bias"):
        raise ConfigError("gemma4: attention_bias=true is not supported (no release uses it)")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"gemma4: hidden_activation {act!r} is not supported (gelu_pytorch_tanh only)")


def layer_specs(cfg: dict[str, Any]) -> list[LayerSpec]:
    """Per-layer head geometry, window, KV owner and MLP width."""
    _check_supported(cfg)
    types = layer_types(cfg)
    n = len(types)
    kv = require(cfg, "num_key_value_heads")
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    per_layer = cfg.get("per_layer_config")
    global_kv = cfg.get("num_global_key_value_heads") if k_eq_v else None
    shared = cfg.get("num_kv_shared_layers") or 0
    first_shared = n - shared
    owners = {kind: max((j for j in range(first_shared) if types[j] == kind), default=None) for kind in set(types)}
    if shared and any(owners[types[i]] is None for i in range(first_shared, n)):
        raise ConfigError("gemma4: a KV-shared layer type has no earlier layer of that type to own its KV")
    inter = require(cfg, "intermediate_size")
    specs = []
    for i, kind in enumerate(types):
        full = kind == "full_attention"
        if per_layer is not None:  # transformers' saved form
            over = per_layer.get(str(i)) or per_layer.get(i) or {}
            head_dim = over.get("head_dim", cfg.get("head_dim", 256))
            heads_kv = over.get("num_key_value_heads", kv)
        else:  # published fields; transformers defaults global_head_dim to 512
            head_dim = cfg.get("global_head_dim", 512) if full else cfg.get("head_dim", 256)
            heads_kv = (global_kv or kv) if full else kv
        source = owners[kind] if i >= first_shared else None
        width = inter[i] if isinstance(inter, list) else inter
        if source is not None and cfg.get("use_double_wide_mlp"):
            width *= 2
        specs.append(LayerSpec(kind, head_dim, heads_kv, k_eq_v and full,
                               None if full else cfg.get("sliding_window", 512), source, width))
    return specs


def rope_args(cfg: dict[str, Any], kind: str) -> tuple[float, dict[str, Any] | None]:
    """(base, scaling) for ops.rope_tables on one layer type (rotary_dim = that layer's head)."""
    params = (cfg.get("rope_parameters") or {}).get(kind) or _DEFAULT_ROPE[kind]
    rope_type = params.get("rope_type", "default")
    scaling = None if rope_type == "default" else {
        "rope_type": rope_type, **{k: params[k] for k in ("partial_rotary_factor", "factor") if k in params}}
    return float(params.get("rope_theta", _DEFAULT_ROPE[kind]["rope_theta"])), scaling


class Gemma4ForCausalLM(CausalLM):
    # Sync-free decode forward without host values baked into shapes (hwinfer.engine.graphs).
    graph_decode = True
    # A one-request prefill reads no host lengths either: the sliding layers' ring store takes
    # every token, each row with its surviving value (ForwardBatch.ring_sources).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.ops, self.dtype = config, ops, dtype
        h, v = require(config, "hidden_size"), require(config, "vocab_size")
        eps = config.get("rms_norm_eps", 1e-6)
        self.specs = layer_specs(config)
        n = len(self.specs)
        self.embed_tokens = Embedding(v, h, dtype)
        self.ple_dim = config.get("hidden_size_per_layer_input") or 0
        if self.ple_dim:
            ple_vocab = config.get("vocab_size_per_layer_input", v)
            self.embed_tokens_per_layer = Embedding(ple_vocab, n * self.ple_dim, dtype)
            self.per_layer_model_projection = Linear(h, n * self.ple_dim, dtype=dtype)
            self.per_layer_projection_norm = RMSNorm(ops, self.ple_dim, eps)
        self.layers = nn.ModuleList([Gemma4DecoderLayer(config, s, ops, dtype) for s in self.specs])
        self.norm = RMSNorm(ops, h, eps)
        self.build_head(h, v, dtype, bool(config.get("tie_word_embeddings", True)))
        self.softcap = config.get("final_logit_softcapping")
        self.rope = {kind: rope_args(config, kind) for kind in {s.kind for s in self.specs}}

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.self_attn.cache_specs(self.dtype) for layer in self.layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden, out_dtype=torch.float32)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _scaled(self, table: Embedding, ids: torch.Tensor, dim: int) -> torch.Tensor:
        # The sqrt(dim) multiplier is rounded to the weight dtype first, as Gemma does; rounded on
        # the host, because a device tensor built from a Python number is an upload (a sync that
        # CUDA graph capture refuses).
        return table(ids) * float(torch.tensor(math.sqrt(dim), dtype=table.weight.dtype))

    def _per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """PLE: [T, layers, P] = (norm(proj(x) / sqrt(H)) + scaled per-layer embedding) / sqrt(2)."""
        t, n, p = ids.shape[0], len(self.layers), self.ple_dim
        token = self._scaled(self.embed_tokens_per_layer, ids, p).view(t, n, p)
        proj = self.per_layer_model_projection(x) * (x.shape[-1] ** -0.5)
        return (self.per_layer_projection_norm(proj.view(t, n, p)) + token) * (2.0 ** -0.5)

    def _tables(self, batch: ForwardBatch) -> dict[tuple[str, int], RopeTable]:
        tables = {}
        for spec in self.specs:
            key = (spec.kind, spec.head_dim)
            if key not in tables:
                base, scaling = self.rope[spec.kind]
                tables[key] = self.ops.rope_tables(batch.positions, rotary_dim=spec.head_dim, base=base,
                                                   scaling=scaling)
        return tables

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        ids = batch.input_ids
        x = self._scaled(self.embed_tokens, ids, self.embed_tokens.weight.shape[1])
        ple = self._per_layer_inputs(ids, x) if self.ple_dim else None
        tables = self._tables(batch)
        owned_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        sources = {s.kv_source for s in self.specs if s.kv_source is not None}
        for i, (layer, spec) in enumerate(zip(self.layers, self.specs)):
            src = spec.kv_source
            cache = batch.cache.layers[i if src is None else src] if batch.cache is not None else None
            x, kv = layer(x, batch, cache, tables[(spec.kind, spec.head_dim)],
                          None if ple is None else ple[:, i], None if src is None else owned_kv[src])
            if i in sources:
                owned_kv[i] = kv
        return self.norm(x)

    # --- checkpoint layouts ------------------------------------------------------------------
    def _layout(self, stem: str, name: str) -> Layout:
        ignored = list(_TOWERS) if stem == "model.language_model" else []
        for i, spec in enumerate(self.specs):
            if spec.kv_source is not None:  # unused KV weights some releases ship for shared layers
                ignored += [f"{stem}.layers.{i}.self_attn.{m}." for m in ("k_proj", "v_proj", "k_norm")]
        layout = Layout({}, name=name, ignored_prefixes=tuple(ignored))
        top = ["embed_tokens.weight", "norm.weight"]
        if self.ple_dim:
            top += ["embed_tokens_per_layer.weight", "per_layer_model_projection.weight",
                    "per_layer_projection_norm.weight"]
        params = dict(self.named_parameters(remove_duplicate=False))
        for key in top:
            layout.add(f"{stem}.{key}", key, tuple(params[key].shape))
        if not self.tied:
            layout.add("lm_head.weight", "lm_head.weight", tuple(self.lm_head.weight.shape))
        for i, layer in enumerate(self.layers):
            for pname, p in layer.named_parameters():
                if pname.startswith("experts."):
                    continue
                layout.add(f"{stem}.layers.{i}.{pname}", f"layers.{i}.{pname}", tuple(p.shape),
                           quantizable=pname.endswith("proj.weight"))
            if layer.moe:
                layer.experts.add_entries(layout, f"{stem}.layers.{i}.experts", f"layers.{i}.experts", fused=True)
        return layout

    def layouts(self) -> list[Layout]:
        """The published VLM layout (= transformers' Gemma4ForConditionalGeneration save), then
        Gemma4ForCausalLM's text layout."""
        return [self._layout("model.language_model", "published"),
                self._layout("model", "text-only (Gemma4ForCausalLM)")]
