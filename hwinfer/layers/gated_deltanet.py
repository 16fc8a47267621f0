"""Gated DeltaNet mixer (Qwen3.5 linear-attention layers, MODELS.md §3.3).

x [T, H] -> in_proj_qkv -> causal conv1d + SiLU -> q, k [nk, dk], v [nv, dv]; beta = sigmoid(b),
g = gdn_gate(a); the gated delta rule (chunked for prefill, recurrent for decode, state carried
in the cache per request; decode computes the gates inside it, ``gdn_gated_recurrent``, and the
conv inside the input projection, ``add_rms_norm_linear_conv``);
output = gated RMSNorm(o, z) -> out_proj. Speculative decoding: with
``batch.capture`` set the layer records its per-token state inputs, and :meth:`replay` rebuilds
a request's state over an accepted prefix (:mod:`hwinfer.runtime.capture`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.layers.basic import Linear, MergedProjection
from hwinfer.layers.delta_state import decodes_in_place, run_delta_rule, run_short_conv
from hwinfer.runtime.batch import ForwardBatch


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: dict[str, Any], ops: OpTable, dtype: torch.dtype) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.nk, self.dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
        self.nv, self.dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
        self.kernel = cfg.get("linear_conv_kernel_dim", 4)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.conv_dim = 2 * self.nk * self.dk + self.nv * self.dv
        self.in_proj_qkv = Linear(h, self.conv_dim, dtype=dtype)
        self.in_proj_z = Linear(h, self.nv * self.dv, dtype=dtype)
        self.in_proj_b = Linear(h, self.nv, dtype=dtype)
        self.in_proj_a = Linear(h, self.nv, dtype=dtype)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(self.conv_dim, 1, self.kernel, dtype=dtype), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.nv, dtype=torch.float32), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.nv, dtype=torch.float32), requires_grad=False)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(self.dv, dtype=torch.float32), requires_grad=False)
        self.out_proj = Linear(self.nv * self.dv, h, dtype=dtype)
        self.in_proj = MergedProjection(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        self.ops = ops

    def cache_specs(self, dtype: torch.dtype) -> list[CacheTensor]:
        return [CacheTensor("conv", "request", (self.conv_dim, self.kernel - 1), dtype),
                CacheTensor("ssm", "request", (self.nv, self.dk, self.dv), torch.float32)]

    def decode_entries(self, context: int) -> int:
        """Cached tokens one decode step attends: none (a fixed-size recurrent state)."""
        return 0

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        return self._mix(self.in_proj(x), batch, cache)

    def forward_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm, batch: ForwardBatch,
                         cache: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual), the add and the norm fused into the input
        projection (``add_rms_norm_linear``; in decode also the conv, ``add_rms_norm_linear_conv``);
        x, residual [T, H]."""
        if decodes_in_place(batch, cache) and self.in_proj.fusable():
            # decode: the conv is the projection's epilogue (add_rms_norm_linear_conv, one GEMV)
            y, residual = self.ops.add_rms_norm_linear_conv(
                x, residual, norm.weight, self.in_proj.stacked()[0], self.conv1d.weight,
                cache["conv"], batch.slots, eps=norm.eps, weight_offset=norm.offset)
            mixed, z, b, a = self.in_proj.parts(y)
            return self._recur(mixed, z, b, a, batch, cache), residual
        parts, residual = self.in_proj.add_norm(self.ops.add_rms_norm_linear, x, residual, norm)
        return self._mix(parts, batch, cache), residual

    def _mix(self, parts: tuple[torch.Tensor, ...], batch: ForwardBatch, cache: dict | None) -> torch.Tensor:
        pre, z, b, a = parts
        mixed = run_short_conv(self.ops.causal_conv1d, batch, cache, pre, self.conv1d.weight)
        return self._recur(mixed, z, b, a, batch, cache, pre)

    def _recur(self, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
               batch: ForwardBatch, cache: dict | None, pre: torch.Tensor | None = None) -> torch.Tensor:
        """The gated delta rule and the output projection over the conv output ``mixed`` [T, C]
        (``pre``: the conv's input, kept for speculative replay when the batch records)."""
        ops = self.ops
        t = mixed.shape[0]
        q, k, v = mixed.split([self.nk * self.dk, self.nk * self.dk, self.nv * self.dv], dim=-1)
        q = q.reshape(1, t, self.nk, self.dk)
        k = k.reshape(1, t, self.nk, self.dk)
        v = v.reshape(1, t, self.nv, self.dv)
        if decodes_in_place(batch, cache):
            # decode: the gates computed inside the recurrence (two kernels fewer per layer)
            o = ops.gdn_gated_recurrent(q, k, v, a[None], b[None], self.A_log, self.dt_bias,
                                        cache["ssm"], use_qk_l2norm=True,
                                        cu_seqlens=batch.cu_seqlens, state_slots=batch.slots)[0]
        else:
            beta = torch.sigmoid(b)[None]  # in the model dtype, as transformers (b.sigmoid())
            g = ops.gdn_gate(a[None], self.A_log, self.dt_bias)
            o = run_delta_rule(ops.gdn_recurrent, ops.gdn_chunked, batch, cache, q, k, v, g, beta)
            if cache is not None and batch.capture is not None:
                batch.capture.record(self, cache, pre=pre, q=q[0], k=k[0], v=v[0], g=g[0], beta=beta[0])
        z = z.view(t, self.nv, self.dv)
        # The gated norm inside out_proj's product (one GEMV in decode).
        return self.out_proj.gated_norm(o[0], z, self.norm.weight, eps=self.eps, activation="silu")

    def replay(self, cache: dict, slots: torch.Tensor, state: dict[str, torch.Tensor],
               inputs: dict[str, torch.Tensor], cu_seqlens: torch.Tensor) -> None:
        """Set the state of ``slots`` [N] to ``state`` (``conv`` [N, C, K-1], ``ssm`` [N, Hv, Dk,
        Dv]: their rows before a forward) advanced over the kept tokens of that forward:
        ``inputs`` as :meth:`forward` recorded them (``pre`` [T, C] conv input, q, k [T, Hk, Dk],
        v [T, Hv, Dv], g, beta [T, Hv]), packed per request by ``cu_seqlens`` [N+1] int32."""
        _, conv = self.ops.causal_conv1d(inputs["pre"][None], self.conv1d.weight, None, state["conv"],
                                         activation="silu", cu_seqlens=cu_seqlens)
        _, ssm = self.ops.gdn_recurrent(inputs["q"][None], inputs["k"][None], inputs["v"][None],
                                        inputs["g"][None], inputs["beta"][None], state["ssm"],
                                        use_qk_l2norm=True, cu_seqlens=cu_seqlens)
        cache["conv"][slots] = conv.to(cache["conv"].dtype)
        cache["ssm"][slots] = ssm
