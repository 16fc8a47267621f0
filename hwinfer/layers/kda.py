"""Kimi Delta Attention mixer (Kimi-Linear / Kimi-K3 ``linear_attention`` layers, MODELS.md §4.2, §4.5).

x [T, H] -> q, k, v projections [T, P] (P = heads * head_dim) -> depthwise causal conv + SiLU
(published checkpoints keep three convs ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` [P, 1, K];
here they are one [3P, 1, K] parameter, q then k then v, which is also transformers' fused
``conv1d.weight``) -> per-head q, k, v [T, h, d]; per-channel log-decay g = kda_gate(f_b(f_a(x)))
(softplus form for Kimi-Linear, lower-bounded sigmoid form for K3); beta = sigmoid(b_proj(x));
the KDA delta rule (chunked for prefill, recurrent for decode, state per request in the cache;
decode computes the gate and beta inside the recurrence, ``kda_gated_recurrent``);
output = RMSNorm(o) * sigmoid(gate) with gate = g_b(g_a(x)) (Kimi-Linear) or the full-rank
g_proj(x) (K3), then o_proj.
"""
from __future__ import annotations

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Linear, MergedProjection
from hwinfer.layers.delta_state import decodes_in_place, run_delta_rule, run_short_conv
from hwinfer.runtime.batch import ForwardBatch


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class KimiDeltaAttention(nn.Module):
    """KDA layer. Parameter names follow the published checkpoint (``self_attn.*``) except
    ``conv1d.weight``, which the published per-projection convs fill by slices.

    Args:
        hidden: model width H. heads, head_dim: h, d (Dk = Dv = d). kernel: conv width K.
        eps: output RMSNorm epsilon (``rms_norm_eps``).
        lower_bound: None (Kimi-Linear softplus decay) or K3's ``gate_lower_bound`` (< 0).
        full_rank_gate: K3's ``use_full_rank_gate``: one g_proj [P, H] instead of g_a / g_b.
        a_log_shape: how the checkpoint stores A_log: Kimi-Linear [1, 1, h, 1]; K3 [max(h, d)]
            with the first h entries used (see the K3 model file). Only the first h are read.
    """

    def __init__(self, hidden: int, heads: int, head_dim: int, kernel: int, eps: float,
                 ops: OpTable, dtype: torch.dtype, *, lower_bound: float | None = None,
                 full_rank_gate: bool = False, a_log_shape: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.heads, self.head_dim, self.kernel, self.eps = heads, head_dim, kernel, eps
        self.lower_bound, self.full_rank_gate = lower_bound, full_rank_gate
        p = self.proj_dim = heads * head_dim
        self.q_proj = Linear(hidden, p, dtype=dtype)
        self.k_proj = Linear(hidden, p, dtype=dtype)
        self.v_proj = Linear(hidden, p, dtype=dtype)
        self.conv1d = nn.Module()
        self.conv1d.weight = _param((3 * p, 1, kernel), dtype)
        self.f_a_proj = Linear(hidden, head_dim, dtype=dtype)
        self.f_b_proj = Linear(head_dim, p, dtype=dtype)
        # The decay parameters stay fp32 whatever the model dtype (checkpoints store them so).
        self.dt_bias = _param((p,), torch.float32)
        self.A_log = _param(a_log_shape or (1, 1, heads, 1), torch.float32)
        self.b_proj = Linear(hidden, heads, dtype=dtype)
        if full_rank_gate:
            self.g_proj = Linear(hidden, p, dtype=dtype)
        else:
            self.g_a_proj = Linear(hidden, head_dim, dtype=dtype)
            self.g_b_proj = Linear(head_dim, p, dtype=dtype)
        self.o_norm = nn.Module()
        self.o_norm.weight = _param((head_dim,), torch.float32)
        self.o_proj = Linear(p, hidden, dtype=dtype)
        # Every projection of x in one GEMM: q | k | v (adjacent: the conv reads them as one) | f_a | b | gate.
        self.in_proj = MergedProjection(self.q_proj, self.k_proj, self.v_proj, self.f_a_proj, self.b_proj,
                                        self.g_proj if full_rank_gate else self.g_a_proj)
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        """Per request: the last K-1 conv inputs of q|k|v and the fp32 delta-rule state."""
        return [CacheTensor("conv", "request", (3 * self.proj_dim, self.kernel - 1), dtype),
                CacheTensor("ssm", "request", (self.heads, self.head_dim, self.head_dim), torch.float32)]

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: none (a fixed-size recurrent state)."""
        return 0

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        """x [T, H] (packed requests of ``batch``) -> [T, H]."""
        ops, t, h, d = self.ops, x.shape[0], self.heads, self.head_dim
        q, k, v, f_a, b, gate = self.in_proj(x)
        qkv = MergedProjection.joined((q, k, v))
        mixed = run_short_conv(ops.causal_conv1d, batch, cache, qkv, self.conv1d.weight)
        q, k, v = (part.reshape(1, t, h, d) for part in mixed.split(self.proj_dim, dim=-1))
        a_log = self.A_log.reshape(-1)[:h]
        f = self.f_b_proj(f_a).view(1, t, h, d)
        if decodes_in_place(batch, cache):
            # decode: the gate and beta's sigmoid inside the recurrence (three kernels fewer)
            o = ops.kda_gated_recurrent(q, k, v, f, b[None], a_log, self.dt_bias, cache["ssm"],
                                        use_qk_l2norm=True, cu_seqlens=batch.cu_seqlens,
                                        state_slots=batch.slots, lower_bound=self.lower_bound)[0]
        else:
            g = ops.kda_gate(f, a_log, self.dt_bias, lower_bound=self.lower_bound)
            beta = torch.sigmoid(b.float())[None]
            o = run_delta_rule(ops.kda_recurrent, ops.kda_chunked, batch, cache, q, k, v, g, beta)
        if not self.full_rank_gate:
            gate = self.g_b_proj(gate)
        gate = gate.view(t, h, d)
        # The gated norm inside o_proj's product (one GEMV in decode).
        return self.o_proj.gated_norm(o[0], gate, self.o_norm.weight, eps=self.eps, activation="sigmoid")
