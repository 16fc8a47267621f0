"""Causal softmax attention over a paged KV cache, the way every dense-attention layer runs it.

The layer computes q, k, v for its new tokens; :func:`cached_attention` stores k and v in the
layer's cache rows and attends: the ``attention`` op over the new tokens alone (no cache, or a
first prefill), ``paged_attention`` for decode, or ``attention`` over the gathered prefix + new
tokens (chunked prefill, prefix-cache hits).
"""
from __future__ import annotations

import torch

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.runtime.batch import ForwardBatch


def kv_cache_specs(kv_heads: int, head_dim: int, v_head_dim: int | None, dtype: torch.dtype, *,
                   window: int | None = None, v_from_k: bool = False) -> list[CacheTensor]:
    """Per-token K (and V unless ``v_head_dim`` is None: V shares K's storage). ``window``: a
    sliding-window layer reads only the last ``window`` rows; ``v_from_k``: V is derived from
    the same projection as K (a deployed cache stores one of them). Both only inform the ledger."""
    specs = [CacheTensor("k", "token", (kv_heads, head_dim), dtype, window=window)]
    if v_head_dim is not None:
        specs.append(CacheTensor("v", "token", (kv_heads, v_head_dim), dtype, window=window,
                                 shared_with="k" if v_from_k else None))
    return specs


def _gather(storage: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """Packed rows of positions 0..seq_len-1 of every request, from a paged [NB, BS, ...] tensor."""
    n = batch.num_requests
    lengths = [c + m for c, m in zip(batch.context_lens_host, batch.new_lens)]
    requests = torch.repeat_interleave(torch.arange(n, device=storage.device),
                                       torch.tensor(lengths, device=storage.device))
    positions = torch.cat([torch.arange(s, device=storage.device) for s in lengths])
    rows = batch.rows_for(positions, requests)
    return storage.flatten(0, 1).index_select(0, rows)


def gather_sequences(storage: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """Rows of positions 0 .. seq_len-1 of every request, packed in request order (the key
    layout ``cu_seqlens_k`` describes), from a paged ``per="token"`` tensor [NB, BS, ...]."""
    return _gather(storage, batch)


def cached_attention(ops: OpTable, batch: ForwardBatch, cache: dict | None, q: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor | None, *, scale: float,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     gate: torch.Tensor | None = None, store: bool = True) -> torch.Tensor:
    """q [T, Hq, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] or None (V = K) -> [T, Hq, Dv].

    ``store=False``: k and v are already in ``cache`` (a layer attending over another layer's
    KV, Gemma 4 ``num_kv_shared_layers``), so nothing is written."""
    cu = batch.cu_seqlens
    if cache is None:
        return ops.attention(q, k, v, cu, cu, scale=scale, window=window, sinks=sinks, gate=gate)
    v_cache = cache.get("v")
    if store:
        rows = batch.token_rows()
        k_store = cache["k"].flatten(0, 1)
        k_store.index_copy_(0, rows, k.to(k_store.dtype))
        if v is not None and v_cache is not None:
            v_cache.flatten(0, 1).index_copy_(0, rows, v.to(v_cache.dtype))
    if batch.is_decode:
        n = batch.num_requests
        out = ops.paged_attention(
            q.view(n, 1, *q.shape[1:]), cache["k"], v_cache, batch.block_table, batch.seq_lens,
            scale=scale, window=window, sinks=sinks,
            gate=None if gate is None else gate.view(n, 1, *gate.shape[1:]))
        return out.view(q.shape[0], *out.shape[2:])
    if not batch.has_prefix:
        return ops.attention(q, k, v, cu, cu, scale=scale, window=window, sinks=sinks, gate=gate)
    k_all = _gather(cache["k"], batch).to(q.dtype)
    v_all = None if v_cache is None else _gather(v_cache, batch).to(q.dtype)
    return ops.attention(q, k_all, v_all, cu, batch.cu_seqlens_k, scale=scale, window=window,
                         sinks=sinks, gate=gate)
