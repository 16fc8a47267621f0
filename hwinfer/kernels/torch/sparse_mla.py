"""Vectorised sparse MLA (contracts in :mod:`hwinfer.ops.sparse_mla`).

Gather-then-batched-matmul: the K selected rows of every token are gathered into a
[chunk, K, D] workspace, logits and outputs are two batched matmuls, and the softmax (with the
sink column folded into the denominator) is masked elementwise instead of per-token Python work.
Tokens are processed in chunks so the workspace stays around 4 MB of fp32 whatever T and K are
(on this CPU, chunks that stay in cache measured faster than one large gather).
"""
from __future__ import annotations

import torch

from hwinfer.ops.kv_pack import unpack_fp8_ds_mla
from hwinfer.ops.sparse_mla import (
    check_extra_args, check_index_range, check_packed_caches, check_sparse_mla_args,
    inverse_rope_interleaved,
)

_WORKSPACE_ELEMS = 1 << 20


def _sparse_softmax(logits: torch.Tensor, valid: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the valid columns of ``logits`` [c, H, K] (+ a sink column), sink dropped.

    Rows with no valid column and no sink give all-zero weights instead of NaN.
    """
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    top = logits.amax(dim=-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float()[None, :, None]
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(logits - top)
    denom = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sink - top)
    return weights / torch.where(denom > 0, denom, torch.ones_like(denom))


def sparse_mla_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                       sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                       out_rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.sparse_mla.sparse_mla_prefill` (gathered, batched)."""
    dv = check_sparse_mla_args(q, kv, indices, sinks, v_dim, out_rope, "sparse_mla_prefill")
    check_index_range(indices, kv.shape[0], "sparse_mla_prefill")
    t_len, heads, dim = q.shape
    k = indices.shape[1]
    out = torch.zeros(t_len, heads, dv, dtype=torch.float32, device=q.device)
    if t_len == 0 or k == 0:
        return out.to(q.dtype)
    valid = indices >= 0
    safe = indices.clamp(min=0).long()
    chunk = max(1, _WORKSPACE_ELEMS // max(1, k * dim))
    for start in range(0, t_len, chunk):
        sl = slice(start, start + chunk)
        # index_select: measured several times faster than advanced indexing for row gathers
        keys = kv.index_select(0, safe[sl].flatten()).view(-1, k, dim).float()  # [c, K, D]
        logits = torch.bmm(q[sl].float(), keys.transpose(1, 2)).mul_(scale)  # [c, H, K]
        probs = _sparse_softmax(logits, valid[sl], sinks)
        out[sl] = torch.bmm(probs, keys[..., :dv])
    if out_rope is not None:
        out = inverse_rope_interleaved(out, *out_rope)
    return out.to(q.dtype)


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                      out_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                      extra_kv_cache: torch.Tensor | None = None,
                      extra_indices: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.sparse_mla.sparse_mla_decode`: global slots into the
    paged cache viewed as rows (no copy), then the gathered prefill path. With a second row set,
    only the selected rows of both caches are gathered (never a copy of either cache)."""
    if q.dim() != 4 or kv_cache.dim() != 3 or indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
        raise ValueError("sparse_mla_decode: expected q [B, S, H, D], kv_cache [blocks, block_size, D], "
                         f"indices [B, S, K]; got {tuple(q.shape)}, {tuple(kv_cache.shape)}, "
                         f"{tuple(indices.shape)}")
    b, s, h, d = q.shape
    rope = None
    if out_rope is not None:
        cos, sin = out_rope
        if cos.dim() != 3 or cos.shape[:2] != q.shape[:2] or cos.shape != sin.shape:
            raise ValueError(f"sparse_mla_decode: out_rope cos/sin must both be [B={b}, S={s}, R/2]")
        rope = (cos.reshape(b * s, -1), sin.reshape(b * s, -1))
    if (extra_kv_cache is None) != (extra_indices is None):
        raise ValueError("sparse_mla_decode: give extra_kv_cache and extra_indices together")
    packed = check_packed_caches(q, kv_cache, extra_kv_cache)
    if extra_kv_cache is not None and not packed:
        check_extra_args(q, extra_kv_cache, extra_indices)
    rows, idx = kv_cache.reshape(-1, kv_cache.shape[-1]), indices.reshape(b * s, -1)
    if extra_kv_cache is not None or packed:
        # Only the selected rows are gathered (never a copy of a cache), and with a packed
        # (fp8_ds_mla) cache only they are dequantized.
        check_index_range(idx, rows.shape[0], "sparse_mla_decode")
        sets = [(rows, idx)]
        if extra_kv_cache is not None:
            extra = extra_indices.reshape(b * s, -1).to(idx.dtype)
            sets.append((extra_kv_cache.reshape(-1, extra_kv_cache.shape[-1]), extra))
            check_index_range(extra, sets[1][0].shape[0], "sparse_mla_decode")
        rows = torch.cat([r.index_select(0, i.clamp(min=0).flatten().long())
                          .view(b * s, i.shape[1], r.shape[-1]) for r, i in sets], dim=1).flatten(0, 1)
        if packed:
            rows = unpack_fp8_ds_mla(rows).to(q.dtype)
        both = torch.cat([i for _, i in sets], dim=1)
        local = torch.arange(rows.shape[0], device=q.device).view(b * s, -1)
        idx = torch.where(both >= 0, local, -1)
    out = sparse_mla_prefill(q.reshape(b * s, h, d), rows, idx, sinks, scale=scale, v_dim=v_dim, out_rope=rope)
    return out.reshape(b, s, h, -1)
