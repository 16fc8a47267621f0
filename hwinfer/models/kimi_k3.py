"""Kimi-K3 (model_type kimi_k3, a VLM wrapper whose text_config is model_type kimi_linear): the
Kimi-Linear skeleton plus the changes below (MODELS.md §4.5). transformers 5.23 has no K3, so
this is assembled from public facts; tests/models/test_kimi_k3.py checks each block against
transformers pieces. "Seen in" = the public K3 ports and header dumps that state it.

* KDA (verified in its parts against transformers' glm5_next KDA): lower-bounded decay
  ``g = lb * sigmoid(exp(A_log) (f + dt_bias))`` (``linear_attn_config.gate_lower_bound`` -5)
  and a full-rank output gate ``g_proj`` [P, H] (``use_full_rank_gate``). A_log is stored as
  [max(h, d)] (release: [128] for 96 heads, entries 96.. zero; seen in two header dumps) and
  only its first h entries are read (unverified beyond that release shape).
* MLA: low-rank queries (``q_lora_rank``: q_a_proj, q_a_layernorm, q_b_proj, as transformers'
  kimi_linear MLA) and a sigmoid gate ``g_proj`` [nh * v_head_dim, H] on each head's output
  before o_proj (``mla_use_output_gate``; seen in three ports).
* MoE: latent routed experts (``routed_expert_hidden_size``; down_proj -> experts -> weighted
  sum -> ``routed_expert_norm`` -> up_proj; router and shared experts on the full hidden state),
  SiTU-GLU in every MLP (``hidden_act: situ``, ``activation_situ_beta`` 4,
  ``activation_situ_linear_beta`` 25), ``routed_scaling_factor`` 1.0 (release config), routed
  experts stored compressed-tensors MXFP4 (``weight_packed`` / ``weight_scale``).
* Attention residuals (``attn_res_block_size`` B; unverified against Moonshot's code, three
  public transcriptions agree): the hidden state is the running sum of the current block's
  sublayer outputs; at every layer i with i % B == 0 that sum (the embedding at layer 0) is
  frozen as a block summary and the sum restarts. A sublayer reads a softmax mix over
  [summaries..., current sum] (scores RMS(v) . (norm.weight * proj.weight), mixing the raw
  candidates): before attention only when summaries exist, before the MLP always, and once
  more before the final norm (``output_attn_res_{norm,proj}``). Summaries are kept in the
  model dtype, as the transcriptions of the official code do.

Checkpoint layouts: published (``language_model.model.*``, ``language_model.lm_head.weight``;
the vision tower and projector are not loaded) and a text-only export (``model.*``).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.layers.basic import Linear
from hwinfer.loader.weights import Layout
from hwinfer.models.kimi_linear import KimiArgs, KimiDecoderLayer, KimiLinearForCausalLM, add_layer_entries
from hwinfer.runtime.batch import ForwardBatch

VISION_PREFIXES = ("vision_tower.", "mm_projector.")


class AttnRes(nn.Module):
    """One attention-residual site: ``norm.weight`` [H] and ``proj.weight`` [1, H] (a single
    pseudo-query). ``forward(current [T, H], summaries: list of [T, H]) -> [T, H]``."""

    def __init__(self, ops: OpTable, hidden: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(hidden, dtype=torch.float32), requires_grad=False)
        self.proj = Linear(hidden, 1, dtype=dtype)
        self.eps, self.rms_norm = eps, ops.rms_norm

    def forward(self, current: torch.Tensor, summaries: list[torch.Tensor]) -> torch.Tensor:
        v = torch.stack([*summaries, current], dim=1).float()            # [T, n, H] candidates
        keys = self.rms_norm(v, self.norm.weight, eps=self.eps)           # fp32 in, fp32 out
        probs = torch.softmax(keys @ self.proj.weight.float()[0], dim=-1)  # [T, n]
        return torch.einsum("tn,tnh->th", probs, v).to(current.dtype)


class K3DecoderLayer(KimiDecoderLayer):
    """Kimi decoder layer with K3's attention-residual sites (``self_attention_res_*``,
    ``mlp_res_*``) when ``attn_res_block_size`` is set."""

    def __init__(self, args: KimiArgs, index: int, ops: OpTable, dtype: torch.dtype, **kwargs: Any) -> None:
        super().__init__(args, index, ops, dtype, **kwargs)
        self.block = args.raw.get("attn_res_block_size") or 0
        self.starts_block = bool(self.block) and index % self.block == 0
        if self.block:
            self.self_attention_res = AttnRes(ops, args.hidden, args.eps, dtype)
            self.mlp_res = AttnRes(ops, args.hidden, args.eps, dtype)

    def forward_res(self, h: torch.Tensor, summaries: list[torch.Tensor], batch: ForwardBatch,
                    cache: dict | None) -> torch.Tensor:
        """h [T, H] = running sum of the current block; ``summaries`` grows in place at block
        starts. Returns the new running sum."""
        x = self.self_attention_res(h, summaries) if summaries else h
        prefix: torch.Tensor | None = h
        if self.starts_block:
            summaries.append(h)
            prefix = None
        a = self.self_attn(self.input_layernorm(x), batch, cache)
        prefix = a if prefix is None else prefix + a
        m = self.mlp(self.post_attention_layernorm(self.mlp_res(prefix, summaries)))
        return prefix + m


def _a_log_shape(heads: int, head_dim: int) -> tuple[int, ...]:
    return (max(heads, head_dim),)


class KimiK3ForCausalLM(KimiLinearForCausalLM):
    def __init__(self, config: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__(config, ops, dtype)
        self.block = config.get("attn_res_block_size") or 0
        if self.block:
            self.output_attn_res = AttnRes(ops, self.args.hidden, self.args.eps, dtype)

    def make_layer(self, index: int) -> K3DecoderLayer:
        args = self.args
        lin = args.raw.get("linear_attn_config") or {}
        kda = dict(lower_bound=lin.get("gate_lower_bound"), full_rank_gate=bool(lin.get("use_full_rank_gate")),
                   a_log_shape=_a_log_shape(args.lin_heads, args.lin_dim))
        return K3DecoderLayer(args, index, self.ops, self.dtype, kda_options=kda,
                              mla_gate=bool(args.raw.get("mla_use_output_gate")))

    def forward_batch(self, batch: ForwardBatch) -> torch.Tensor:
        if not self.block:
            return super().forward_batch(batch)
        h = self.embed_tokens(batch.input_ids)
        summaries: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            h = layer.forward_res(h, summaries, batch, batch.cache.layers[i] if batch.cache is not None else None)
        return self.norm(self.output_attn_res(h, summaries))

    def _k3_layout(self, name: str, stem: str, head: str) -> Layout:
        layout = Layout({}, name=name, ignored_prefixes=VISION_PREFIXES)
        layout.add(f"{stem}.embed_tokens.weight", "embed_tokens.weight", tuple(self.embed_tokens.weight.shape))
        layout.add(f"{stem}.norm.weight", "norm.weight", tuple(self.norm.weight.shape))
        if not self.args.tied:
            layout.add(head, "lm_head.weight", tuple(self.lm_head.weight.shape))
        if self.block:
            h = self.args.hidden
            layout.add(f"{stem}.output_attn_res_norm.weight", "output_attn_res.norm.weight", (h,))
            layout.add(f"{stem}.output_attn_res_proj.weight", "output_attn_res.proj.weight", (1, h))
        for i, layer in enumerate(self.layers):
            _add_k3_layer(layout, layer, f"{stem}.layers.{i}", f"layers.{i}")
        return layout

    def layouts(self) -> list[Layout]:
        """Published VLM layout (``language_model.`` prefix), then a text-only export."""
        return [self._k3_layout("published", "language_model.model", "language_model.lm_head.weight"),
                self._k3_layout("text-only", "model", "lm_head.weight")]


def _add_k3_layer(layout: Layout, layer: K3DecoderLayer, prefix: str, ours: str) -> None:
    """The Kimi-Linear entries, with the attention-residual sites renamed to the published
    ``self_attention_res_norm`` / ``self_attention_res_proj`` / ``mlp_res_*`` names."""
    inner = Layout({})
    add_layer_entries(inner, layer, prefix, ours)
    for key, entry in inner.entries.items():
        for site in ("self_attention_res", "mlp_res"):
            for part in ("norm", "proj"):
                key = key.replace(f".{site}.{part}.weight", f".{site}_{part}.weight")
        layout.entries[key] = entry
