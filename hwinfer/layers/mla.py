"""Multi-head latent attention with a DSA lightning indexer (GLM-5 ``glm_moe_dsa``, HY4 ``hy_v4``).

Per token the layer caches one row ``[kv_a_layernorm(latent) (kv_lora_rank) | roped k_pe
(qk_rope_head_dim)]`` and, on layers that run their own indexer, the indexer key
``LayerNorm(wk x)`` (roped) of ``index_head_dim`` channels.

Attention always runs in the *absorbed* form through ``sparse_mla_prefill`` /
``sparse_mla_decode``, for prefill and decode alike: the query is ``[q_nope @ W_UK | q_pe]``
against the rows ``[latent | k_pe]``, values are the latent (``v_dim = kv_lora_rank``), and the
per-head output goes through ``W_UV`` (from ``kv_b_proj``) afterwards. One path for every step
keeps cached decode and full recompute on the same arithmetic; the softmax scale stays
``(qk_nope + qk_rope)^-1/2`` (times YaRN ``mscale^2``), not the latent width's.

The indexer picks, per query at position p, the ``index_topk`` best of the positions 0..p of its
own sequence (``lightning_indexer`` with ``k_end = p + 1``: the op has no causal mask, and
transformers' own top-k also returns future positions when the sequence is shorter than
``index_topk``, which its causal mask then discards — the visible set is the same). Layers
marked ``shared`` run no indexer and reuse the previous full layer's selection of this forward.
Selections are row numbers in the packed new tokens (no cache) or global cache slots (with a
cache), so every layer can use them on its own rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor, fp8_indexer_row_bytes, fp8_mla_row_bytes
from hwinfer.layers.basic import Linear, RMSNorm
from hwinfer.loader.config import ConfigError, require
from hwinfer.runtime.batch import ForwardBatch

def rope_settings(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None) from ``rope_parameters`` or legacy ``rope_theta`` /
    ``rope_scaling``; a YaRN dict gets ``original_max_position_embeddings`` from the config
    when it lacks one (as transformers' config standardisation does)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "yarn":
        params.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return theta, params


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class MLAConfig:
    """Dimensions and conventions of one MLA + DSA layer (published config field names in the
    comments; the model file fills the per-model conventions)."""

    hidden: int              # hidden_size
    heads: int               # num_attention_heads
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope: int             # qk_nope_head_dim
    qk_rope: int             # qk_rope_head_dim
    v_head: int              # v_head_dim
    index_heads: int         # index_n_heads
    index_dim: int           # index_head_dim
    index_topk: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleaved: bool   # main q_pe / k_pe: GLM-5 pairs (2i, 2i+1), HY4 rotate-half
    index_rope_first: bool   # indexer RoPE on the first qk_rope dims (GLM-5) or the last (HY4)
    index_norm_eps: float    # indexer k_norm LayerNorm eps
    sinks: bool = False      # HY4 learnable_sink_param, one logit per head
    output_gate: bool = False  # HY4 linear_gate: sigmoid gate per head channel before o_proj
    attention_bias: bool = False
    # transformers builds q_a_layernorm / kv_a_layernorm without rms_norm_eps (both models)
    latent_norm_eps: float = 1e-6

    @classmethod
    def from_config(cls, cfg: dict[str, Any], **conventions: Any) -> "MLAConfig":
        theta, scaling = rope_settings(cfg)
        return cls(
            hidden=require(cfg, "hidden_size"), heads=require(cfg, "num_attention_heads"),
            q_lora_rank=require(cfg, "q_lora_rank"), kv_lora_rank=require(cfg, "kv_lora_rank"),
            qk_nope=require(cfg, "qk_nope_head_dim"), qk_rope=require(cfg, "qk_rope_head_dim"),
            v_head=require(cfg, "v_head_dim"), index_heads=require(cfg, "index_n_heads"),
            index_dim=require(cfg, "index_head_dim"), index_topk=require(cfg, "index_topk"),
            rope_theta=theta, rope_scaling=scaling,
            attention_bias=bool(cfg.get("attention_bias", False)), **conventions)

    @property
    def scale(self) -> float:
        """Softmax scale: (qk_nope + qk_rope)^-1/2, times mscale(factor, mscale_all_dim)^2 under
        YaRN (transformers' ``yarn_apply_mscale``)."""
        scale = (self.qk_nope + self.qk_rope) ** -0.5
        s = self.rope_scaling or {}
        if s.get("mscale_all_dim"):
            m = _yarn_mscale(float(s["factor"]), float(s["mscale_all_dim"]))
            scale *= m * m
        return scale


class DSAIndexer(nn.Module):
    """Lightning indexer projections: queries from the q latent, one key per token.

    wq_b [Hi*Di, q_lora_rank]; wk [Di, H]; k_norm = LayerNorm(Di) with bias (fp32); weights_proj
    [Hi, H] kept in fp32 (transformers keeps it in fp32 too).
    """

    def __init__(self, c: MLAConfig, ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        self.c, self.ops = c, ops
        self.wq_b = Linear(c.q_lora_rank, c.index_heads * c.index_dim, dtype=dtype)
        self.wk = Linear(c.hidden, c.index_dim, dtype=dtype)
        self.k_norm = nn.Module()
        self.k_norm.weight = nn.Parameter(torch.empty(c.index_dim, dtype=torch.float32), requires_grad=False)
        self.k_norm.bias = nn.Parameter(torch.empty(c.index_dim, dtype=torch.float32), requires_grad=False)
        self.weights_proj = Linear(c.hidden, c.index_heads, dtype=torch.float32)
        self.rope_start = 0 if c.index_rope_first else c.index_dim - c.qk_rope

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.ops.apply_rope(x, cos, sin, start=self.rope_start, interleaved=self.c.rope_interleaved)

    def queries(self, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q_latent [T, q_lora_rank] (after q_a_layernorm) -> roped queries [T, Hi, Di]."""
        q = self.wq_b(q_latent).view(q_latent.shape[0], self.c.index_heads, self.c.index_dim)
        return self._rope(q, cos, sin)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> roped keys [T, Di] (LayerNorm in fp32, then the model dtype)."""
        k = F.layer_norm(self.wk(x).float(), (self.c.index_dim,), self.k_norm.weight, self.k_norm.bias,
                         self.c.index_norm_eps).to(x.dtype)
        return self._rope(k, cos, sin)

    def head_weights(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> per-head score weights [T, Hi] fp32, Hi^-1/2 folded in."""
        return self.weights_proj(x.float()) * self.c.index_heads ** -0.5


def _context_rows(batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Global cache rows of positions 0..L-1 of every request, packed request after request,
    and their [N+1] offsets. Without a cached prefix those are exactly the new tokens."""
    if not batch.has_prefix:
        return batch.token_rows(), batch.cu_seqlens
    return batch.context_rows(), batch.cu_seqlens_k


class MLAttention(nn.Module):
    """MLA self-attention with DSA token selection. x [T, H] -> [T, H].

    Parameters (transformers' names): q_a_proj [q_lora, H], q_a_layernorm [q_lora],
    q_b_proj [nh*(nope+rope), q_lora], kv_a_proj_with_mqa [kv_lora+rope, H], kv_a_layernorm
    [kv_lora], kv_b_proj [nh*(nope+v), kv_lora], o_proj [H, nh*v]; optional indexer (full
    layers), sinks [nh] (fp32) and gate_proj [nh*v, H].
    """

    def __init__(self, c: MLAConfig, ops: OpTable, dtype: torch.dtype, *, has_indexer: bool) -> None:
        super().__init__()
        self.c, self.ops, self.dtype = c, ops, dtype
        h, nh, bias = c.hidden, c.heads, c.attention_bias
        self.q_a_proj = Linear(h, c.q_lora_rank, bias=bias, dtype=dtype)
        self.q_a_layernorm = RMSNorm(ops, c.q_lora_rank, c.latent_norm_eps)
        self.q_b_proj = Linear(c.q_lora_rank, nh * (c.qk_nope + c.qk_rope), dtype=dtype)
        self.kv_a_proj_with_mqa = Linear(h, c.kv_lora_rank + c.qk_rope, bias=bias, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(ops, c.kv_lora_rank, c.latent_norm_eps)
        self.kv_b_proj = Linear(c.kv_lora_rank, nh * (c.qk_nope + c.v_head), dtype=dtype)
        self.o_proj = Linear(nh * c.v_head, h, bias=bias, dtype=dtype)
        self.indexer = DSAIndexer(c, ops, dtype) if has_indexer else None
        self.sinks = nn.Parameter(torch.empty(nh, dtype=torch.float32), requires_grad=False) if c.sinks else None
        self.gate_proj = Linear(h, nh * c.v_head, dtype=dtype) if c.output_gate else None

    def cache_specs(self) -> list[CacheTensor]:
        # fp8_row_bytes: the fp8_ds_mla row and FP8 indexer key of DeepSeek's DSA kernels.
        specs = [CacheTensor("kv", "token", (self.c.kv_lora_rank + self.c.qk_rope,), self.dtype,
                             fp8_row_bytes=fp8_mla_row_bytes(self.c.kv_lora_rank, self.c.qk_rope))]
        if self.indexer is not None:
            specs.append(CacheTensor("index_k", "token", (self.c.index_dim,), self.dtype,
                                     fp8_row_bytes=fp8_indexer_row_bytes(self.c.index_dim)))
        return specs

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: the DSA selection (own or shared), at most
        ``index_topk``."""
        return min(context, self.c.index_topk)

    def _select(self, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        """Top-k positions per new token [T, index_topk] (-1 padded): packed rows without a cache,
        global cache slots with one."""
        assert self.indexer is not None
        keys = self.indexer.keys(x, cos, sin)
        q = self.indexer.queries(q_latent, cos, sin)
        weights = self.indexer.head_weights(x)
        request = batch.request_of_token()
        if cache is not None:
            store = cache["index_k"].flatten(0, 1)
            store.index_copy_(0, batch.token_rows(), keys.to(store.dtype))
        if cache is not None and batch.is_decode:
            # Score the store in place through fixed-width rows: no host value of the batch but
            # its length bound, so the step can be captured in a CUDA graph. The rows and the key
            # ranges depend on the batch alone: built once a step for every DSA layer.
            def decode_ranges() -> tuple[torch.Tensor, torch.Tensor]:
                start = request * batch.seq_len_bound
                return start.to(torch.int32), (start + batch.positions + 1).to(torch.int32)

            k_start, k_end = batch.shared(("dsa_decode_ranges",), decode_ranges)
            pick_rows = batch.pick_rows(dtype=torch.int32, ops=self.ops)
            picked = self.ops.lightning_indexer(q, store, weights, k_start, k_end,
                                                topk=self.c.index_topk, scale=self.c.index_dim ** -0.5,
                                                max_len=batch.seq_len_bound, k_rows=pick_rows[:-1])
            return pick_rows[picked]   # the picks' cache rows; -1 stays -1
        if cache is None:
            rows, start = None, batch.cu_seqlens[:-1].to(torch.int64)[request]
        else:
            rows, cu = _context_rows(batch)
            keys = store.index_select(0, rows) if batch.has_prefix else keys
            start = cu[:-1].to(torch.int64)[request]
        k_start = start.to(torch.int32)
        k_end = (start + batch.positions + 1).to(torch.int32)
        picked = self.ops.lightning_indexer(q, keys, weights, k_start, k_end, topk=self.c.index_topk,
                                            scale=self.c.index_dim ** -0.5, max_len=batch.seq_len_bound)
        if rows is None:
            return picked
        return torch.where(picked >= 0, rows[picked.clamp(min=0).long()], -1).to(torch.int32)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None,
                selection: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H]; ``selection`` the previous full layer's picks (used on shared layers).
        Returns (output [T, H], this layer's selection)."""
        c, ops, t = self.c, self.ops, x.shape[0]
        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(t, c.heads, c.qk_nope + c.qk_rope)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope], dim=-1)
        cos, sin = batch.rope(ops, c.qk_rope, c.rope_theta, c.rope_scaling)
        q_pe = ops.apply_rope(q[..., c.qk_nope:], cos, sin, interleaved=c.rope_interleaved)
        k_pe = ops.apply_rope(k_pe, cos, sin, interleaved=c.rope_interleaved)
        rows_new = torch.cat([self.kv_a_layernorm(latent), k_pe], dim=-1)          # [T, r + rope]

        kv_b = self.kv_b_proj.weight.view(c.heads, c.qk_nope + c.v_head, c.kv_lora_rank)
        q_lat = torch.einsum("thn,hnr->thr", q[..., : c.qk_nope], kv_b[:, : c.qk_nope])
        query = torch.cat([q_lat, q_pe], dim=-1)                                     # [T, nh, r + rope]

        if cache is not None:
            store = cache["kv"].flatten(0, 1)
            store.index_copy_(0, batch.token_rows(), rows_new.to(store.dtype))
        if self.indexer is not None:
            selection = self._select(x, q_latent, cos, sin, batch, cache)
        elif selection is None:
            raise ValueError("a shared-indexer layer needs the selection of a previous full layer")

        kw = dict(scale=c.scale, v_dim=c.kv_lora_rank)
        if cache is None:
            o_lat = ops.sparse_mla_prefill(query, rows_new, selection, self.sinks, **kw)
        elif batch.is_decode:
            n = batch.num_requests
            o_lat = ops.sparse_mla_decode(query.view(n, 1, c.heads, -1).to(cache["kv"].dtype), cache["kv"],
                                          selection.view(n, 1, -1), self.sinks, **kw).view(t, c.heads, -1)
        else:
            o_lat = ops.sparse_mla_prefill(query.to(cache["kv"].dtype), cache["kv"].flatten(0, 1), selection,
                                           self.sinks, **kw)
        out = torch.einsum("thr,hvr->thv", o_lat.to(x.dtype), kv_b[:, c.qk_nope:])    # [T, nh, v]
        if self.gate_proj is not None:
            out = out * torch.sigmoid(self.gate_proj(x).view(t, c.heads, c.v_head))
        return self.o_proj(out.reshape(t, -1)), selection


def check_indexer_types(types: list[str], n_layers: int) -> list[str]:
    """Validate a per-layer ``full`` / ``shared`` list (the first layer must run an indexer)."""
    if len(types) != n_layers or any(k not in ("full", "shared") for k in types):
        raise ConfigError(f"indexer_types must list 'full' or 'shared' for each of the {n_layers} layers, got {types}")
    if types and types[0] != "full":
        raise ConfigError("indexer_types: the first layer must be 'full' (shared layers reuse an earlier selection)")
    return types
