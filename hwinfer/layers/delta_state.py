"""The gated delta rule with its per-request state kept in a layer's cache (GDN and KDA layers).

Decode runs the recurrent op on the cache's state rows in place (``state_slots``): no gather or
scatter of the state, which is most of a decode step's bytes at batch > 1. Prefill and chunks run
the chunked op on a gathered copy and write the rows back. A batch recording for speculative
replay (``batch.capture``) also takes the copy path, since replay restarts from the old rows.
"""
from __future__ import annotations

import torch

from hwinfer.runtime.batch import ForwardBatch


def run_delta_rule(recurrent, chunked, batch: ForwardBatch, cache: dict | None, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """``recurrent`` / ``chunked``: the layer's bound ops (gdn_* or kda_*); q, k, v, g, beta as
    they take them ([1, T, H, D] packed by ``batch.cu_seqlens``). Afterwards ``cache["ssm"]``
    holds every request's new state. Returns o [1, T, Hv, Dv]."""
    cu, rule = batch.cu_seqlens, recurrent if batch.is_decode else chunked
    if cache is None:
        return rule(q, k, v, g, beta, None, use_qk_l2norm=True, cu_seqlens=cu)[0]
    if batch.is_decode and batch.capture is None:
        return recurrent(q, k, v, g, beta, cache["ssm"], use_qk_l2norm=True, cu_seqlens=cu,
                         state_slots=batch.slots)[0]
    o, state = rule(q, k, v, g, beta, cache["ssm"][batch.slots], use_qk_l2norm=True, cu_seqlens=cu)
    cache["ssm"][batch.slots] = state
    return o
