"""The short conv and the gated delta rule with their per-request state kept in a layer's cache
(GDN and KDA layers).

Both ops run on the cache's state rows in place (``state_slots``), in decode and prefill alike:
no gather or scatter around them (for the delta rule in decode that is most of a step's bytes at
batch > 1; otherwise four small indexing kernels a layer, which in a short prefill cost more
launches than the ops). A batch recording for speculative replay (``batch.capture``) runs on a
gathered copy and writes the rows back, since replay restarts from the old rows.
"""
from __future__ import annotations

import torch

from hwinfer.runtime.batch import ForwardBatch


def in_place(batch: ForwardBatch, cache: dict | None) -> bool:
    """Whether this step runs the ops on the cache's state rows in place (see above)."""
    return cache is not None and batch.capture is None


def decodes_in_place(batch: ForwardBatch, cache: dict | None) -> bool:
    """Whether this is a decode step on the state rows in place (the layers' fused decode)."""
    return in_place(batch, cache) and batch.is_decode


def run_short_conv(conv, batch: ForwardBatch, cache: dict | None, x: torch.Tensor,
                   weight: torch.Tensor) -> torch.Tensor:
    """``conv``: the layer's bound causal_conv1d; x [T, C] packed by ``batch.cu_seqlens``,
    weight [C, 1, K]. Afterwards ``cache["conv"]`` holds every request's last K-1 inputs.
    Returns the SiLU conv output [T, C]."""
    cu = batch.cu_seqlens
    if cache is None:
        return conv(x[None], weight, None, None, activation="silu", cu_seqlens=cu)[0][0]
    if in_place(batch, cache):
        return conv(x[None], weight, None, cache["conv"], activation="silu", cu_seqlens=cu,
                    state_slots=batch.slots)[0][0]
    y, state = conv(x[None], weight, None, cache["conv"][batch.slots], activation="silu", cu_seqlens=cu)
    cache["conv"][batch.slots] = state.to(cache["conv"].dtype)
    return y[0]


def run_delta_rule(recurrent, chunked, batch: ForwardBatch, cache: dict | None, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``recurrent`` / ``chunked``: the layer's bound ops (gdn_* or kda_*); q, k, v, g, beta as
    they take them ([1, T, H, D] packed by ``batch.cu_seqlens``). Afterwards ``cache["ssm"]``
    holds every request's new state. Returns o [1, T, Hv, Dv]."""
    cu, rule = batch.cu_seqlens, recurrent if batch.is_decode else chunked
    if cache is None:
        return rule(q, k, v, g, beta, None, use_qk_l2norm=True, cu_seqlens=cu)[0]
    if in_place(batch, cache):
        return rule(q, k, v, g, beta, cache["ssm"], use_qk_l2norm=True, cu_seqlens=cu,
                    state_slots=batch.slots)[0]
    o, state = rule(q, k, v, g, beta, cache["ssm"][batch.slots], use_qk_l2norm=True, cu_seqlens=cu)
    cache["ssm"][batch.slots] = state
    return o
