"""Causal softmax attention over a paged KV cache, the way every dense-attention layer runs it.

The layer computes q, k, v for its new tokens; :func:`cached_attention` stores k and v in the
layer's cache rows and attends: the ``attention`` op over the new tokens alone (no cache, or a
first prefill), ``paged_attention`` for decode, or ``attention`` over the gathered prefix + new
tokens (chunked prefill, prefix-cache hits).

Sliding-window layers keep their K / V in a ring of ``window`` rows per request (row = position %
window) instead of one row per token: memory is fixed per request. Decode reads the ring as a
paged cache whose every block is the request's ring (block size = window); a chunked prefill reads
the last ``window - 1`` cached rows before writing the new ones.
"""
from __future__ import annotations

from itertools import accumulate

import torch

from hwinfer.backend.select import OpTable
from hwinfer.cache.spec import CacheTensor
from hwinfer.runtime.batch import ForwardBatch, packed_spans


def kv_cache_specs(kv_heads: int, head_dim: int, v_head_dim: int | None, dtype: torch.dtype, *,
                   window: int | None = None, v_from_k: bool = False) -> list[CacheTensor]:
    """K (and V unless ``v_head_dim`` is None: V shares K's storage): one row per token, or for a
    sliding-window layer a ring of ``window`` rows per request. ``v_from_k``: V is derived from
    the same projection as K (a deployed cache stores one of them; informs the ledger)."""
    if window:
        specs = [CacheTensor("k", "ring", (kv_heads, head_dim), dtype, rows=window)]
        if v_head_dim is not None:
            specs.append(CacheTensor("v", "ring", (kv_heads, v_head_dim), dtype, rows=window,
                                     shared_with="k" if v_from_k else None))
        return specs
    specs = [CacheTensor("k", "token", (kv_heads, head_dim), dtype)]
    if v_head_dim is not None:
        specs.append(CacheTensor("v", "token", (kv_heads, v_head_dim), dtype,
                                 shared_with="k" if v_from_k else None))
    return specs


def gather_sequences(storage: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """Rows of positions 0 .. seq_len-1 of every request, packed in request order (the key
    layout ``cu_seqlens_k`` describes), from a paged ``per="token"`` tensor [NB, BS, ...]."""
    return storage.flatten(0, 1).index_select(0, batch.context_rows())


def cached_attention(ops: OpTable, batch: ForwardBatch, cache: dict | None, q: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor | None, *, scale: float,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     gate: torch.Tensor | None = None, store: bool = True) -> torch.Tensor:
    """q [T, Hq, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] or None (V = K) -> [T, Hq, Dv].

    ``store=False``: k and v are already in ``cache`` (a layer attending over another layer's
    KV, Gemma 4 ``num_kv_shared_layers``), so nothing is written."""
    # The attention op's sequence bounds from the host: the torch implementation reads them
    # there, and a device tensor would make every prefill layer wait on the GPU.
    cu = batch.cu_seqlens_host
    if cache is None:
        return ops.attention(q, k, v, cu, cu, scale=scale, window=window, sinks=sinks, gate=gate)
    if cache.specs["k"].per == "ring":
        return _ring_attention(ops, batch, cache, q, k, v, scale=scale, window=window, sinks=sinks,
                               gate=gate, store=store)
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
    k_all = gather_sequences(cache["k"], batch).to(q.dtype)
    v_all = None if v_cache is None else gather_sequences(v_cache, batch).to(q.dtype)
    return ops.attention(q, k_all, v_all, cu, batch.cu_seqlens_k_host, scale=scale, window=window,
                         sinks=sinks, gate=gate)


def _ring_attention(ops: OpTable, batch: ForwardBatch, cache: dict, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor | None, *, scale: float, window: int | None,
                    sinks: torch.Tensor | None, gate: torch.Tensor | None, store: bool) -> torch.Tensor:
    """cached_attention for a ring-stored sliding-window layer (see the module docstring)."""
    rows_per = cache["k"].shape[1]
    if window is None or window > rows_per:
        raise ValueError(f"a ring of {rows_per} rows cannot serve window {window}")
    device, n = q.device, batch.num_requests
    v_cache = cache.get("v")
    slots = batch.slots.to(torch.int64)
    # Prefix rows a chunked prefill needs, read before this step's writes can overwrite them.
    keep = [min(c, window - 1) for c in batch.context_lens_host]
    prefix_k = prefix_v = None
    if not batch.is_decode and any(keep) and store:
        req, pos = packed_spans([c - m for c, m in zip(batch.context_lens_host, keep)], keep, device)
        rows = slots[req] * rows_per + pos % rows_per
        prefix_k = cache["k"].flatten(0, 1).index_select(0, rows)
        prefix_v = None if v_cache is None else v_cache.flatten(0, 1).index_select(0, rows)
    if store:
        # Only the last ``rows_per`` new tokens of a request survive in its ring: every token's
        # row gets the value of the last token landing on it (ForwardBatch.ring_sources), so the
        # rows written several times in one index_copy_ are written with one value.
        rows, k_new, v_new = batch.ring_rows(rows_per), k, v
        if not batch.is_decode:  # decode: one token per request, always kept
            src = batch.ring_sources(rows_per)
            k_new = k.index_select(0, src)
            v_new = None if v is None else v.index_select(0, src)
        cache["k"].flatten(0, 1).index_copy_(0, rows, k_new.to(cache["k"].dtype))
        if v_new is not None and v_cache is not None:
            v_cache.flatten(0, 1).index_copy_(0, rows, v_new.to(v_cache.dtype))
    if batch.is_decode:
        width = -(-batch.seq_len_bound // rows_per) + 1
        table = batch.shared(("ring_table", width),
                             lambda: slots.to(torch.int32)[:, None].expand(n, width).contiguous())
        out = ops.paged_attention(q.view(n, 1, *q.shape[1:]), cache["k"], v_cache, table, batch.seq_lens,
                                  scale=scale, window=window, sinks=sinks,
                                  gate=None if gate is None else gate.view(n, 1, *gate.shape[1:]))
        return out.view(q.shape[0], *out.shape[2:])
    if not any(keep):
        cu = batch.cu_seqlens_host
        return ops.attention(q, k, v, cu, cu, scale=scale, window=window, sinks=sinks, gate=gate)
    if store:
        keys, values, cu_k = _interleave(batch, keep, prefix_k, k, prefix_v, v)
        batch.scratch[("ring_kv", id(cache))] = (keys, values, cu_k)
    else:
        # A KV-shared layer: its owner already overwrote ring rows this prefix needs; reuse the
        # rows the owner gathered before writing.
        keys, values, cu_k = batch.scratch[("ring_kv", id(cache))]
    return ops.attention(q, keys.to(q.dtype), None if values is None else values.to(q.dtype),
                         batch.cu_seqlens_host, cu_k, scale=scale, window=window, sinks=sinks, gate=gate)


def _interleave(batch: ForwardBatch, keep: list[int], prefix_k: torch.Tensor, k: torch.Tensor,
                prefix_v: torch.Tensor | None, v: torch.Tensor | None):
    """Per request: its kept prefix rows then its new rows, packed, with their cu_seqlens."""
    ks, vs, lens = [], [], []
    p0, n0 = 0, 0
    for kept, new in zip(keep, batch.new_lens):
        ks += [prefix_k[p0:p0 + kept], k[n0:n0 + new]]
        if prefix_v is not None and v is not None:
            vs += [prefix_v[p0:p0 + kept], v[n0:n0 + new]]
        lens.append(kept + new)
        p0, n0 = p0 + kept, n0 + new
    cu = torch.tensor(list(accumulate(lens, initial=0)), dtype=torch.int32)   # host bounds
    return torch.cat(ks), (torch.cat(vs) if vs else None), cu
