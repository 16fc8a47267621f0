"""Kimi-Linear (model_type kimi_linear): KDA linear-attention layers and NoPE MLA layers
(MODELS.md §4.1-4.4, §6).

Decoder: pre-norm residual blocks; the mixer is KDA (``linear_attention``) or MLA
(``full_attention``), from ``linear_attn_config`` (1-indexed ``kda_layers`` /
``full_attn_layers``) or transformers' ``layer_types``; the MLP is a dense SwiGLU for the first
``first_k_dense_replace`` layers and a sigmoid-routed MoE with shared experts after; plain
RMSNorms (eps ``rms_norm_eps``); no positional encoding.

Checkpoint layouts: the published one (dense layer MLP under ``mlp.``, MoE under
``block_sparse_moe.`` with per-expert ``w1``/``w3``/``w2``, separate ``q/k/v_conv1d``) and
transformers' ``save_pretrained`` output, identical except that it writes the dense MLP under
``block_sparse_moe.`` as well.

Kimi-K3 (``hwinfer.models.kimi_k3``) reuses :func:`kimi_args` and :class:`KimiDecoderLayer`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, Linear, RMSNorm
from hwinfer.layers.kda import KimiDeltaAttention
from hwinfer.layers.kimi_mla import KimiMLA
from hwinfer.layers.kimi_moe import KimiMLP, KimiMoE
from hwinfer.loader.config import ConfigError, check_quantization, require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch

_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "situ": "situ"}


@dataclass(frozen=True)
class KimiArgs:
    """Everything the Kimi layers read, from published or transformers config field names."""

    raw: dict[str, Any]
    hidden: int
    vocab: int
    eps: float
    layer_types: list[str]      # "linear_attention" | "full_attention"
    mlp_types: list[str]        # "dense" | "sparse"
    lin_heads: int
    lin_dim: int
    conv_kernel: int
    intermediate: int
    moe: dict[str, Any]         # KimiMoE keyword arguments (without ops / dtype)
    activation: str
    situ_beta: float
    situ_linear_beta: float | None
    tied: bool


def _layer_types(cfg: dict[str, Any], n: int) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    lin = cfg.get("linear_attn_config") or {}
    if "full_attn_layers" in lin and "kda_layers" in lin:
        types: list[str | None] = [None] * n
        for i in lin["full_attn_layers"]:
            types[i - 1] = "full_attention"  # 1-indexed in released configs
        for i in lin["kda_layers"]:
            types[i - 1] = "linear_attention"
        missing = [i + 1 for i, t in enumerate(types) if t is None]
        if missing:
            raise ConfigError(f"linear_attn_config puts layer(s) {missing} in neither kda_layers nor full_attn_layers")
        return types  # type: ignore[return-value]
    # transformers' default when the config says nothing: every 4th layer (0-based 4, 8, ...) MLA.
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]


def _mlp_types(cfg: dict[str, Any], n: int) -> list[str]:
    if cfg.get("mlp_layer_types"):
        return list(cfg["mlp_layer_types"])
    first_dense = cfg.get("first_k_dense_replace", 1)
    freq = cfg.get("moe_layer_freq", 1) or 1  # DeepSeek-style; every released Kimi config has 1
    return ["sparse" if i >= first_dense and i % freq == 0 else "dense" for i in range(n)]


def kimi_args(cfg: dict[str, Any]) -> KimiArgs:
    """Parse a Kimi-Linear / Kimi-K3 text config (flattened) into :class:`KimiArgs`."""
    n = require(cfg, "num_hidden_layers")
    if cfg.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"moe_router_activation_func {cfg['moe_router_activation_func']!r}: "
                          "only sigmoid routing is implemented (as in every Kimi release)")
    if cfg.get("mla_use_nope") is False:
        raise ConfigError("mla_use_nope=false (RoPE MLA) is not part of any Kimi release; not implemented")
    act = cfg.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} is not supported for Kimi models (silu or situ)")
    lin = cfg.get("linear_attn_config") or {}
    moe = dict(
        experts=require(cfg, "num_experts", "num_local_experts", "n_routed_experts"),
        top_k=require(cfg, "num_experts_per_token", "num_experts_per_tok"),
        inter=require(cfg, "moe_intermediate_size"),
        shared=cfg.get("num_shared_experts", cfg.get("n_shared_experts", 1)) or 0,
        renormalize=bool(cfg.get("moe_renormalize", cfg.get("norm_topk_prob", True))),
        scaling=float(cfg.get("routed_scaling_factor", 1.0)),
        n_group=cfg.get("num_expert_group", cfg.get("n_group", 1)) or 1,
        topk_group=cfg.get("topk_group", 1) or 1,
        latent=cfg.get("routed_expert_hidden_size"),
        latent_norm=bool(cfg.get("latent_moe_use_norm", False)),
        # compressed-tensors MXFP4 releases (K3): keep the routed experts packed.
        packed=check_quantization(cfg) == "mxfp4",
    )
    return KimiArgs(
        raw=cfg, hidden=require(cfg, "hidden_size"), vocab=require(cfg, "vocab_size"),
        eps=float(cfg.get("rms_norm_eps", 1e-5)), layer_types=_layer_types(cfg, n), mlp_types=_mlp_types(cfg, n),
        lin_heads=lin.get("num_heads", cfg.get("linear_num_heads", 32)),
        lin_dim=lin.get("head_dim", cfg.get("linear_head_dim", 128)),
        conv_kernel=lin.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 4)),
        intermediate=require(cfg, "intermediate_size"), moe=moe, activation=_ACTIVATIONS[act],
        situ_beta=float(cfg.get("activation_situ_beta", 1.0)),
        situ_linear_beta=cfg.get("activation_situ_linear_beta"),
        tied=bool(cfg.get("tie_word_embeddings", False)),
    )


class KimiDecoderLayer(nn.Module):
    """input_layernorm -> KDA or MLA -> (+) -> post_attention_layernorm -> MLP / MoE -> (+).
    ``kda_options``: extra KimiDeltaAttention arguments (K3's gate variants); ``mla_gate``: K3's
    MLA output gate. x [T, H] -> [T, H]."""

    def __init__(self, args: KimiArgs, index: int, ops: OpTable, dtype: torch.dtype, *,
                 kda_options: dict[str, Any] | None = None, mla_gate: bool = False) -> None:
        super().__init__()
        h = args.hidden
        self.kind = args.layer_types[index]
        if self.kind == "linear_attention":
            self.self_attn = KimiDeltaAttention(h, args.lin_heads, args.lin_dim, args.conv_kernel, args.eps,
                                                ops, dtype, **(kda_options or {}))
        else:
            self.self_attn = KimiMLA(args.raw, ops, dtype, output_gate=mla_gate)
        act = (args.activation, args.situ_beta, args.situ_linear_beta)
        self.sparse = args.mlp_types[index] == "sparse"
        if self.sparse:
            self.mlp = KimiMoE(h, ops=ops, dtype=dtype, activation=act[0], situ_beta=act[1],
                               situ_linear_beta=act[2], eps=args.eps, **args.moe)
        else:
            self.mlp = KimiMLP(ops, h, args.intermediate, dtype, *act)
        self.input_layernorm = RMSNorm(ops, h, args.eps)
        self.post_attention_layernorm = RMSNorm(ops, h, args.eps)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] the previous layer's MLP output (the embeddings, residual None) -> (this
        layer's MLP output, the residual stream before it): each residual add is fused with the
        norm after it (``add_rms_norm``, the same bf16 sums as ``x + y``)."""
        h, residual = self.input_layernorm.add(x, residual)
        h, residual = self.post_attention_layernorm.add(self.self_attn(h, batch, cache), residual)
        return self.mlp(h), residual


def add_layer_entries(layout: Layout, layer: KimiDecoderLayer, prefix: str, ours: str,
                      dense_under: str = "mlp") -> None:
    """Declare one decoder layer's published tensors (``prefix`` = ``...layers.<i>``).

    Published names differ from ours in three places: the MoE lives under ``block_sparse_moe.``
    (and the dense MLP under ``dense_under``), the three KDA convs fill slices of our fused
    conv1d.weight, and experts are per expert (``w1``/``w3``/``w2``, possibly MXFP4)."""
    p = layer.self_attn.proj_dim if layer.kind == "linear_attention" else 0
    for name, param in layer.named_parameters():
        if name.startswith("mlp.experts."):
            continue
        shape = tuple(param.shape)
        if name == "self_attn.conv1d.weight":
            for j, which in enumerate("qkv"):
                layout.add(f"{prefix}.self_attn.{which}_conv1d.weight", f"{ours}.{name}", (p, *shape[1:]),
                           (slice(j * p, (j + 1) * p),))
            continue
        key = name
        if name.startswith("mlp."):
            key = ("block_sparse_moe." if layer.sparse else f"{dense_under}.") + name[len("mlp."):]
        layout.add(f"{prefix}.{key}", f"{ours}.{name}", shape, quantizable=name.endswith("proj.weight"))
    if layer.sparse:
        layer.mlp.add_expert_entries(layout, f"{prefix}.block_sparse_moe.experts", f"{ours}.mlp.experts")


class KimiLinearForCausalLM(CausalLM):
    # Sync-free decode forward without host values baked into shapes (hwinfer.engine.graphs).
    graph_decode = True
    # A one-request prefill reads no host lengths either (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.ops, self.dtype = config, ops, dtype
        self.args = args = kimi_args(config)
        self.embed_tokens = Embedding(args.vocab, args.hidden, dtype)
        self.layers = nn.ModuleList([self.make_layer(i) for i in range(len(args.layer_types))])
        self.norm = RMSNorm(ops, args.hidden, args.eps)
        self.lm_head = Linear(args.hidden, args.vocab, dtype=dtype)
        if args.tied:
            self.lm_head.weight = self.embed_tokens.weight

    def make_layer(self, index: int) -> KimiDecoderLayer:
        return KimiDecoderLayer(self.args, index, self.ops, self.dtype)

    def post_load(self) -> None:
        if self.args.tied:
            self.lm_head.weight = self.embed_tokens.weight

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.self_attn.cache_specs(self.dtype) for layer in self.layers]

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        x, residual = self.embed_tokens(batch.input_ids), None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, batch, batch.cache.layers[i] if batch.cache is not None else None,
                                residual)
        return self.norm.add(x, residual)[0]

    def _layout(self, name: str, dense_under: str) -> Layout:
        layout = Layout({}, name=name)
        layout.add("model.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add("model.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        if not self.args.tied:
            layout.add("lm_head.weight", "lm_head.weight", tuple(self.lm_head.weight.shape))
        for i, layer in enumerate(self.layers):
            add_layer_entries(layout, layer, f"model.layers.{i}", f"layers.{i}", dense_under)
        return layout

    def layouts(self) -> list[Layout]:
        """Published (dense MLP under ``mlp.``), then transformers' save_pretrained output
        (dense MLP written under ``block_sparse_moe.``; everything else as published)."""
        return [self._layout("published", "mlp"),
                self._layout("transformers save_pretrained", "block_sparse_moe")]
