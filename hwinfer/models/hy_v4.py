"""Tencent HY4 (model_type ``hy_v4``, tencent/Hy4-preview; MODELS.md §5).

GLM-5's MLA + DSA layer (:mod:`hwinfer.layers.mla`) with three additions: a learnable sink
logit per head in the attention softmax, a sigmoid output gate per head channel (``linear_gate``
[nh*v, H], applied after the W_UV up-projection, before o_proj) and iHC hyper-connections: the
residual is ``hc_mult`` streams [T, N, H]; each block reads ``ihc_pre`` (sigmoid-weighted sum of
the streams) and writes back ``ihc_post`` (each stream += post_k * block output), and
``mhc_head`` collapses the streams before the final norm. RoPE is rotate-half, in the attention
and in the indexer (whose rotary channels are its *last* ``qk_rope_head_dim``); the indexer
LayerNorm eps is ``rms_norm_eps``. Routed experts clamp their SwiGLU at ``swiglu_limit``; the
first layer (``mlp_layer_types``) is a dense MLP. Logits are computed in fp32 (transformers keeps
lm_head in fp32). Conventions as transformers 5.23.0 implements them (the oracle); a public
vLLM port instead uses interleaved RoPE, rms_norm_eps for the latent norms and 1e-6 for the
indexer LayerNorm (MLAConfig carries each convention, should the release prove it right).

Checkpoint layouts: the published one (fused experts ``mlp.experts.gate_up_proj`` /
``down_proj``; ``learnable_sink_param``, ``linear_gate``, ``hc_attn_layer.hc_pre.hc_fn`` ...,
``model.hc_head.hc_head_fn``; MTP ``model.mtp_layers.*`` and indexer weights on shared layers
not used), and transformers' ``save_pretrained`` output, which renames mechanically in
reverse: ``hc_pre.hc_attn_layer.*``, ``model.hc_pre.hc_head.*`` and ``linear_gate`` for *every*
``gate_proj`` (dense and shared experts included).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Embedding, Linear, RMSNorm
from hwinfer.layers.mla import MLAConfig, MLAttention, check_indexer_types
from hwinfer.loader.config import ConfigError, require
from hwinfer.loader.weights import Layout
from hwinfer.models.base import CausalLM
from hwinfer.models.glm5 import add_layer_entries, make_mlp, mlp_types, unused_prefixes, with_defaults
from hwinfer.runtime.batch import ForwardBatch


# transformers' HYV4Config defaults for fields that change behaviour when a config omits them.
DEFAULTS: dict[str, Any] = {"n_shared_experts": 1, "routed_scaling_factor": 2.827, "n_group": 1, "topk_group": 1,
                            "norm_topk_prob": True, "rms_norm_eps": 1e-5, "index_topk": 2048, "hc_mult": 4,
                            "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0}


def indexer_types(cfg: dict[str, Any]) -> list[str]:
    """The config list, else transformers' default: full at layer 0 and every 4th from layer 1."""
    n = require(cfg, "num_hidden_layers")
    types = cfg.get("indexer_types") or ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)]
    return check_indexer_types(list(types), n)


def _check_variant(cfg: dict[str, Any]) -> None:
    """Published switches that transformers (and this file) always assume on: refuse the others."""
    for flag in ("gated_mla", "learnable_sink", "enable_ihc", "use_dsa"):
        if cfg.get(flag) is False:
            raise ConfigError(f"hy_v4 with {flag}=false is not supported (transformers always enables it)")
    if cfg.get("gating_type", "elementwise") != "elementwise":
        raise ConfigError(f"hy_v4 gating_type {cfg['gating_type']!r} is not supported (only elementwise)")


class HyperConnection(nn.Module):
    """iHC parameters of one block: fn [2N, N*H], base [2N], scale [2] (fp32)."""

    def __init__(self, n: int, h: int, rows: int, n_scale: int) -> None:
        super().__init__()
        self.fn = nn.Parameter(torch.empty(rows, n * h, dtype=torch.float32), requires_grad=False)
        self.base = nn.Parameter(torch.empty(rows, dtype=torch.float32), requires_grad=False)
        self.scale = nn.Parameter(torch.empty(n_scale, dtype=torch.float32), requires_grad=False)


class DecoderLayer(nn.Module):
    """Streams [T, N, H] -> streams: iHC around attention, then around the MLP / MoE."""

    def __init__(self, cfg: dict[str, Any], mla: MLAConfig, index_kind: str, mlp_kind: str,
                 ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h, n = mla.hidden, cfg["hc_mult"]
        self.eps, self.hc_eps, self.magnitude = cfg["rms_norm_eps"], cfg["hc_eps"], cfg["hc_magnitude"]
        self.self_attn = MLAttention(mla, ops, dtype, has_indexer=index_kind == "full")
        self.mlp = make_mlp(cfg, mlp_kind, ops, dtype, swiglu_limit=cfg["swiglu_limit"])
        self.input_layernorm = RMSNorm(ops, h, self.eps)
        self.post_attention_layernorm = RMSNorm(ops, h, self.eps)
        self.attn_hc = HyperConnection(n, h, 2 * n, 2)
        self.ffn_hc = HyperConnection(n, h, 2 * n, 2)
        self.ops = ops

    def _pre(self, x: torch.Tensor, hc: HyperConnection) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.ihc_pre(x, hc.fn, hc.base, hc.scale, norm_eps=self.eps, hc_eps=self.hc_eps,
                                hc_magnitude=self.magnitude)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None,
                selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        block_in, post = self._pre(x, self.attn_hc)
        attn, selection = self.self_attn(self.input_layernorm(block_in), batch, cache, selection)
        x = self.ops.ihc_post(attn, x, post)
        block_in, post = self._pre(x, self.ffn_hc)
        x = self.ops.ihc_post(self.mlp(self.post_attention_layernorm(block_in)), x, post)
        return x, selection


class HYV4ForCausalLM(CausalLM):
    # Decode reads no host value of the batch but its length bound: the DSA indexer scores the
    # key store in place through fixed-width rows (hwinfer.engine.graphs).
    graph_decode = True
    # A one-request prefill reads no host lengths either (hwinfer.engine.prefill_graphs).
    graph_prefill = True

    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        _check_variant(config)
        config = with_defaults(config, DEFAULTS)
        self.config, self.ops, self.dtype = config, ops, dtype
        h, v = require(config, "hidden_size"), require(config, "vocab_size")
        self.streams, self.eps, self.hc_eps = config["hc_mult"], config["rms_norm_eps"], config["hc_eps"]
        mla = MLAConfig.from_config(config, rope_interleaved=False, index_rope_first=False,
                                    index_norm_eps=self.eps, sinks=True, output_gate=True)
        self.indexer_types = indexer_types(config)
        self.mlp_types = mlp_types(config, dense=1)  # transformers reads no first_k_dense_replace here
        self.embed_tokens = Embedding(v, h, dtype)
        self.layers = nn.ModuleList([DecoderLayer(config, mla, k, m, ops, dtype)
                                     for k, m in zip(self.indexer_types, self.mlp_types)])
        self.hc_head = HyperConnection(self.streams, h, self.streams, 1)
        self.norm = RMSNorm(ops, h, self.eps)
        self.lm_head = Linear(h, v, dtype=dtype)
        if config.get("tie_word_embeddings"):
            raise ConfigError("hy_v4 with tie_word_embeddings=true is not supported")

    def cache_specs(self) -> list[list[CacheTensor]]:
        return [layer.self_attn.cache_specs() for layer in self.layers]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.float(), self.lm_head.weight.float())

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        x = x[:, None, :].expand(-1, self.streams, -1).contiguous()                 # [T, N, H]
        selection = None
        for i, layer in enumerate(self.layers):
            x, selection = layer(x, batch, batch.cache.layers[i] if batch.cache is not None else None, selection)
        hc = self.hc_head
        return self.norm(self.ops.mhc_head(x, hc.fn, hc.base, hc.scale, norm_eps=self.eps, hc_eps=self.hc_eps))

    # --- checkpoint layouts ------------------------------------------------------------------
    def _layout(self, hf_save: bool) -> Layout:
        """The published layout, or (``hf_save``) what transformers' save_pretrained writes."""
        hc = "hc_pre.hc_{block}.hc_{leaf}" if hf_save else "hc_{block}.hc_pre.hc_{leaf}"
        rename = {"self_attn.sinks": "self_attn.learnable_sink_param",
                  "self_attn.gate_proj.weight": "self_attn.linear_gate.weight"}
        for ours, block in (("attn_hc", "attn_layer"), ("ffn_hc", "mlp_layer")):
            for leaf in ("fn", "base", "scale"):
                rename[f"{ours}.{leaf}"] = hc.format(block=block, leaf=leaf)
        if hf_save:
            rename["mlp.gate_proj.weight"] = "mlp.linear_gate.weight"
            rename["mlp.shared_experts.gate_proj.weight"] = "mlp.shared_experts.linear_gate.weight"
        layout = Layout({}, name="transformers save_pretrained" if hf_save else "published",
                        ignored_prefixes=("model.mtp_layers.",) + unused_prefixes(self.indexer_types))
        layout.add("model.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add("model.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        layout.add("lm_head.weight", "lm_head.weight", tuple(self.lm_head.weight.shape))
        head = "model.hc_pre.hc_head.hc_head_" if hf_save else "model.hc_head.hc_head_"
        for leaf in ("fn", "base", "scale"):
            p = getattr(self.hc_head, leaf)
            layout.add(head + leaf, f"hc_head.{leaf}", tuple(p.shape))
        for i, layer in enumerate(self.layers):
            add_layer_entries(layout, layer, f"model.layers.{i}", f"layers.{i}", fused_experts=True,
                              rename=rename)
        return layout

    def layouts(self) -> list[Layout]:
        return [self._layout(False), self._layout(True)]
