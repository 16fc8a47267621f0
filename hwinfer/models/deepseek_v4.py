"""DeepSeek-V4 Flash / Pro (model_type deepseek_v4; MODELS.md §2, ENGINES.md §2.1-2.4).

Residual: ``hc_mult`` streams mixed around every sub-block by mHC (:mod:`hwinfer.layers.
hyper_connection`). Attention per layer (``compress_ratios`` / ``layer_types``): sliding window
only (0), CSA (m = 4: overlapping compressor + lightning indexer top-k) or HCA (m = 128: every
completed entry), all with attention sinks, K = V, inverse RoPE on the output and a grouped
output projection (:mod:`hwinfer.layers.deepseek_v4_attention`). Sliding layers use RoPE base
``rope_theta`` without scaling; compressed layers (q, kv, compressors, indexer) use
``compress_rope_theta`` with YaRN at attention_factor 1. FFN: sqrt-softplus MoE, the first
``num_hash_layers`` routed by token id (:mod:`hwinfer.layers.deepseek_moe`). The MTP block(s)
(``mtp.<k>.*``, ``num_nextn_predict_layers``) are loaded into ``self.mtp`` for speculative
decoding; transformers does not implement them.

Checkpoint layouts: the published one (``layers.L.attn.wq_a.weight``, ``embed.weight``,
``head.weight``, ``hc_head_fn``, per-expert ``ffn.experts.E.w1/w3/w2``, ``mtp.0.*``; FP8 dense
weights with UE8M0 128x128 ``.scale`` and FP4 experts as released), and transformers'
``save_pretrained`` output (the same names under ``model.``, ``model.embed_tokens.weight``,
``model.hc_head.hc_fn``, ``attn.norm`` for ``attn.kv_norm``, no MTP).
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, Linear, RMSNorm
from hwinfer.layers.deepseek_moe import DeepseekMoE
from hwinfer.layers.deepseek_v4_attention import DeepseekV4Attention, RopeSpec, StepInfo
from hwinfer.layers.hyper_connection import HyperConnection, HyperHead
from hwinfer.loader.config import require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.runtime.batch import ForwardBatch

_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
              "mscale", "mscale_all_dim", "truncate")
# Releases store these dense projections FP8 (experts FP4, declared by the MoE block).
_QUANTIZED = re.compile(r"(^|\.)attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$|\.indexer\.wq_b\.weight$|"
                        r"\.shared_experts\.w[123]\.weight$|\.(e_proj|h_proj)\.weight$")


def attention_kinds(cfg: dict[str, Any]) -> list[tuple[int, bool]]:
    """(compression ratio, has indexer) per main layer, then per MTP layer. Published
    ``compress_ratios`` (0 sliding, 4 CSA, else HCA; last entries = MTP) or transformers'
    ``layer_types``; ``compress_rates`` / ``compress_rate_csa`` / ``_hca`` override the rates."""
    n, n_mtp = require(cfg, "num_hidden_layers"), cfg.get("num_nextn_predict_layers", 0)
    rates = cfg.get("compress_rates") or {}
    csa = int(cfg.get("compress_rate_csa") or rates.get("compressed_sparse_attention") or 4)
    hca = cfg.get("compress_rate_hca") or rates.get("heavily_compressed_attention")
    if cfg.get("layer_types"):
        ratios = [{"sliding_attention": 0, "compressed_sparse_attention": 4}.get(k, 128)
                  for k in cfg["layer_types"][:n]]
    elif cfg.get("compress_ratios"):
        ratios = list(cfg["compress_ratios"])
    else:  # transformers' default schedule: two HCA layers, then CSA / HCA alternating
        ratios = [128] * min(n, 2) + [4 if i % 2 else 128 for i in range(max(n - 2, 0))]
    ratios = (ratios + [0] * (n + n_mtp))[: n + n_mtp]
    return [(0, False) if r == 0 else (csa, True) if r == 4 else (int(hca or r), False) for r in ratios]


def ropes(cfg: dict[str, Any]) -> dict[str, RopeSpec]:
    """RoPE specs on the last qk_rope_head_dim channels: "main" (sliding layers: rope_theta, no
    scaling) and "compress" (compress_rope_theta + YaRN at attention_factor 1, as transformers
    forces for V4)."""
    params = cfg.get("rope_parameters") or {}
    main, comp = params.get("main") or {}, params.get("compress") or {}
    partial = main.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    head_dim = cfg["head_dim"]
    dim = cfg.get("qk_rope_head_dim") or int(head_dim * (partial if partial else 64 / 512))
    scaling = comp if comp.get("rope_type", comp.get("type", "default")) != "default" else cfg.get("rope_scaling")
    yarn = None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        yarn = {"rope_type": "yarn", "attention_factor": 1.0}
        yarn.update({k: scaling[k] for k in _YARN_KEYS if scaling.get(k) is not None})
    return {"main": RopeSpec(dim, float(main.get("rope_theta", cfg.get("rope_theta", 10000.0)))),
            "compress": RopeSpec(dim, float(comp.get("rope_theta", cfg.get("compress_rope_theta", 160000.0))),
                                 yarn)}


def hash_layers(cfg: dict[str, Any]) -> list[bool]:
    """Per main layer: routed by token id (``mlp_layer_types`` or the first ``num_hash_layers``)."""
    n = cfg["num_hidden_layers"]
    if cfg.get("mlp_layer_types"):
        return [t == "hash_moe" for t in cfg["mlp_layer_types"][:n]]
    k = cfg.get("num_hash_layers", 3)
    return [i < k for i in range(n)]


class DecoderLayer(nn.Module):
    """streams [T, N, H] -> [T, N, H]: mHC(attention) then mHC(MoE)."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype, kind: tuple[int, bool],
                 hashed: bool, rope: dict[str, RopeSpec]) -> None:
        super().__init__()
        h, eps, n = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6), cfg.get("hc_mult", 4)
        hc = dict(norm_eps=eps, hc_eps=cfg.get("hc_eps", 1e-6), sinkhorn_iters=cfg.get("hc_sinkhorn_iters", 20))
        ratio, indexer = kind
        key = "compress" if ratio else "main"
        self.attn_norm = RMSNorm(ops, h, eps)
        self.ffn_norm = RMSNorm(ops, h, eps)
        self.attn_hc = HyperConnection(ops, h, n, **hc)
        self.ffn_hc = HyperConnection(ops, h, n, **hc)
        self.attn = DeepseekV4Attention(cfg, ops, dtype, ratio=ratio, indexer=indexer, rope=rope[key], rope_key=key)
        self.ffn = DeepseekMoE(cfg, ops, dtype, hashed)

    def forward(self, streams: torch.Tensor, step: StepInfo, cache: dict | None) -> torch.Tensor:
        streams = self.attn_hc(streams, lambda x: self.attn(self.attn_norm(x), step, cache))
        return self.ffn_hc(streams, lambda x: self.ffn(self.ffn_norm(x), step.batch.input_ids))


class MTPBlock(DecoderLayer):
    """One multi-token-prediction block (``mtp.<k>.*``): a decoder layer (sliding attention,
    ordinary MoE) plus ``e_proj`` / ``h_proj`` [H, H] (FP8 in releases), ``enorm`` / ``hnorm`` /
    ``norm`` and its own hyper-head; the embedding and head are the main model's. Loaded for
    speculative decoding; transformers has no implementation to check its forward against."""

    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype, kind: tuple[int, bool],
                 rope: dict[str, RopeSpec]) -> None:
        super().__init__(cfg, ops, dtype, kind, False, rope)
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.e_proj = Linear(h, h, dtype=dtype)
        self.h_proj = Linear(h, h, dtype=dtype)
        self.enorm = RMSNorm(ops, h, eps)
        self.hnorm = RMSNorm(ops, h, eps)
        self.norm = RMSNorm(ops, h, eps)
        self.hc_head = HyperHead(ops, h, cfg.get("hc_mult", 4), norm_eps=eps, hc_eps=cfg.get("hc_eps", 1e-6))

    def draft(self, embeds: torch.Tensor, streams: torch.Tensor, step: StepInfo,
              cache: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds [T, H] of the next tokens, streams [T, N, H] (the main model's last-layer
        streams, before its hyper-head, or the previous draft step's) -> (head input [T, H],
        output streams [T, N, H]). ``e_proj(enorm(e))`` is added to every stream of
        ``h_proj(hnorm(streams))`` (hnorm per stream), then the decoder layer, then this block's
        own hyper-head and norm (as the public V4 inference code's MTPBlock; unverified here)."""
        x = self.e_proj(self.enorm(embeds))[:, None] + self.h_proj(self.hnorm(streams))
        out = self(x, step, cache)
        return self.norm(self.hc_head(out)), out


class DeepseekV4ForCausalLM(CausalLM):
    """embed -> N streams -> decoder layers -> hyper-head -> norm -> head; ids [T] -> hidden [T, H]."""

    # Decode reads no host value of the batch but its length bound: compressor entries close
    # by a device-side mask, entry rows and indexer keys have the bound's fixed width.
    graph_decode = True
    # A cached prefill neither: entry slots bounded by the step's size, windows and entries
    # gathered by device values (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.config, self.ops, self.dtype = config, ops, dtype
        h, v = require(config, "hidden_size"), require(config, "vocab_size")
        n, eps = require(config, "num_hidden_layers"), config.get("rms_norm_eps", 1e-6)
        self.hc_mult = config.get("hc_mult", 4)
        self.ropes = ropes(config)
        kinds, hashed = attention_kinds(config), hash_layers(config)
        self.embed = Embedding(v, h, dtype)
        self.layers = nn.ModuleList([DecoderLayer(config, ops, dtype, kinds[i], hashed[i], self.ropes)
                                     for i in range(n)])
        self.hc_head = HyperHead(ops, h, self.hc_mult, norm_eps=eps, hc_eps=config.get("hc_eps", 1e-6))
        self.norm = RMSNorm(ops, h, eps)
        self.lm_head = Linear(h, v, dtype=dtype)
        mtp = [MTPBlock(config, ops, dtype, kind, self.ropes) for kind in kinds[n:]]
        self.mtp = nn.ModuleList(mtp) if mtp else None

    def supports_fp8_kv(self) -> bool:
        """``kv_format="fp8"`` stores every layer's window ring and compressed entries as
        ``fp8_ds_mla`` rows: needs 512-wide heads with 64 RoPE channels in every attention
        (the released V4s; the tiny test configs with 64-wide heads do not qualify)."""
        blocks = [*self.layers, *(self.mtp or [])]
        return all(block.attn.packs_fp8 for block in blocks)

    def cache_specs(self) -> list[list[CacheTensor]]:
        packed = self.kv_format == "fp8"
        return [layer.attn.cache_specs(self.dtype, packed=packed) for layer in self.layers]

    def step_info(self, batch: ForwardBatch) -> StepInfo:
        tables = {key: spec.tables(self.ops, batch.positions) for key, spec in self.ropes.items()}
        return StepInfo(batch, batch.cache is not None, batch.request_of_token(),
                        list(batch.context_lens_host), tables)

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        return self.forward_batch_mtp(batch)[0]

    # --- speculative decoding with the MTP block (hwinfer.engine.speculative) ----------------
    def forward_batch_mtp(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [T, H] after hyper-head and norm, the last layer's streams [T, N, H]: what
        the MTP block consumes)."""
        step = self.step_info(batch)
        x = self.embed(batch.input_ids)
        streams = x[:, None].expand(-1, self.hc_mult, -1).contiguous()
        for i, layer in enumerate(self.layers):
            streams = layer(streams, step, batch.cache.layers[i] if batch.cache is not None else None)
        return self.norm(self.hc_head(streams)), streams

    def spec_cache_specs(self, num_draft: int) -> list[list[CacheTensor]]:
        """Every ring (sliding window, compressor partial windows) gets ``num_draft`` spare rows,
        so rejected draft tokens need no undo; then ``mtp[0]``'s own cache as one more layer."""
        packed = self.kv_format == "fp8"
        return [layer.attn.cache_specs(self.dtype, num_draft, packed) for layer in [*self.layers, self.mtp[0]]]

    def mtp_forward(self, streams: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """streams [T, N, H] at batch.positions, batch.input_ids [T] the token after each
        position -> (lm_head input [T, H], streams for the next draft step). Only ``mtp[0]``
        drafts (releases have one block); its cache is ``batch.cache.layers[num_hidden_layers]``."""
        cache = batch.cache.layers[len(self.layers)] if batch.cache is not None else None
        return self.mtp[0].draft(self.embed(batch.input_ids), streams, self.step_info(batch), cache)

    # --- checkpoint layouts ------------------------------------------------------------------
    @staticmethod
    def _key(name: str, hf: bool, kv_norm: str) -> str:
        """Our parameter name -> its checkpoint key (published, or transformers' save)."""
        name = re.sub(r"(^|\.)(attn|ffn)_hc\.(fn|base|scale)$", r"\1hc_\2_\3", name)
        name = re.sub(r"(^|\.)hc_head\.(fn|base|scale)$", r"\1hc_head_\2", name)
        name = name.replace(".attn.kv_norm.", f".attn.{kv_norm}.")
        if name == "lm_head.weight":
            return "head.weight"
        if not hf:
            return name
        top = {"embed.weight": "model.embed_tokens.weight", "hc_head_fn": "model.hc_head.hc_fn",
               "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
        return top.get(name, f"model.{name}")

    def _layout(self, hf: bool, kv_norm: str, with_mtp: bool) -> Layout:
        name = "transformers save_pretrained" if hf else "published" + \
            ("" if kv_norm == "kv_norm" else ", attn.norm") + ("" if with_mtp else ", no MTP")
        layout = Layout({}, name=name)
        tensors = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        for param, t in tensors.items():
            if ".ffn.experts." in param or (param.startswith("mtp.") and not with_mtp):
                continue
            layout.add(self._key(param, hf, kv_norm), param, tuple(t.shape),
                       quantizable=bool(_QUANTIZED.search(param)))
        blocks = [(f"layers.{i}", layer) for i, layer in enumerate(self.layers)]
        if with_mtp and self.mtp is not None:
            blocks += [(f"mtp.{k}", block) for k, block in enumerate(self.mtp)]
        for ours, block in blocks:
            prefix = f"model.{ours}" if hf else ours
            block.ffn.add_expert_entries(layout, f"{prefix}.ffn.experts", f"{ours}.ffn.experts", fused=False)
        if self.mtp is not None and not with_mtp:
            layout.without = ("mtp",)
        return layout

    def layouts(self) -> list[Layout]:
        """Published (``attn.kv_norm``, as released; ``attn.norm`` also accepted), with or
        without the MTP block, then transformers' save_pretrained layout (no MTP)."""
        out = [self._layout(False, kv, mtp) for kv in ("kv_norm", "norm") for mtp in (True, False)
               if mtp or self.mtp is not None]
        return out + [self._layout(True, "norm", False)]
