"""Vectorised block-sparse indexer and attention (contracts in :mod:`hwinfer.ops.block_sparse`).

Both work on chunks of queries of one sequence; a chunk never looks at keys after its last
query's position, so a causal prefill scores about half the keys the references do.

* Indexer: one matmul per chunk for all heads, causal fill, max-pool by a view, top-k.
* Decode (``block_sparse_decode``): fixed-shape tensor ops only, no host read of a length, so
  it runs inside a CUDA graph: the indexer scores all W rows of every request (W = the rows'
  width, the graph table's capacity under graphs), then each KV head gathers its topk_blocks x
  block_size keys.
* Attention: per chunk of up to 32 queries, the union of the blocks the chunk selected (per
  KV head) is gathered once and attended with one batched matmul per KV head, each query
  masked to its own blocks. Decode (one query) thus touches only its n_sel blocks, and a
  prefill chunk touches about as many keys as its selections overlap in.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.block_sparse import (
    check_attention_args, check_decode_args, check_indexer_args, checked_blocks, seq_ranges,
)

_CHUNK_ELEMS = 1 << 21
_MAX_Q_CHUNK = 32


def block_sparse_indexer(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, *, block_size: int, topk_blocks: int,
                         local_blocks: int = 1) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.block_sparse.block_sparse_indexer`."""
    check_indexer_args(q, k, topk_blocks, local_blocks, block_size)
    heads, dim = q.shape[1], q.shape[2]
    out = torch.full((q.shape[0], heads, topk_blocks), -1, dtype=torch.int32, device=q.device)
    for q0, q1, k0, k1 in seq_ranges(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                     "block_sparse_indexer"):
        q_len, k_len = q1 - q0, k1 - k0
        if q_len == 0:
            continue
        k_t = k[k0:k1].float().T                                        # [D, k_len] (a view)
        chunk = max(1, _CHUNK_ELEMS // max(1, heads * k_len))
        for a in range(0, q_len, chunk):
            b = min(q_len, a + chunk)
            pos = torch.arange(k_len - q_len + a, k_len - q_len + b, device=q.device)
            n_blocks = -(-int(pos[-1] + 1) // block_size)                 # blocks this chunk can see
            span = min(n_blocks * block_size, k_len)
            scores = (q[q0 + a:q0 + b].float().reshape(-1, dim) @ k_t[:, :span]).view(b - a, heads, span)
            future = torch.arange(span, device=q.device)[None, :] > pos[:, None]
            scores = scores.masked_fill_(future[:, None, :], float("-inf"))
            scores = F.pad(scores, (0, n_blocks * block_size - span), value=float("-inf"))
            blocks = scores.view(b - a, heads, n_blocks, block_size).amax(dim=-1)
            own = pos // block_size
            for back in range(local_blocks):
                blocks.scatter_(-1, (own - back).clamp(min=0)[:, None, None].expand(-1, heads, 1),
                                float("inf"))
            top, idx = blocks.topk(min(topk_blocks, n_blocks), dim=-1)
            idx = idx.masked_fill(top == float("-inf"), -1)
            out[q0 + a:q0 + b, :, : idx.shape[-1]] = idx.to(torch.int32)
    return out


def _masked_softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax over the allowed entries of the last dim (in place); rows with none give zeros."""
    probs = torch.softmax(logits.masked_fill_(~allowed, float("-inf")), dim=-1)
    return probs.nan_to_num_(0.0)                          # all -inf rows come out NaN


def _union_chunk(q_c: torch.Tensor, k_seq: torch.Tensor, v_seq: torch.Tensor, sel: torch.Tensor,
                 pos: torch.Tensor, block_size: int, n_blocks: int, scale: float) -> torch.Tensor:
    """Attention of a chunk of queries over the union of the blocks any of them selected.

    q_c [c, Hkv, G, D] fp32; k_seq/v_seq [k_len, Hkv, D] (the sequence's keys, any float dtype);
    sel [c, Hkv, n_sel] int64; pos [c] positions of the chunk's queries.
    Per KV head the union's keys are gathered once ([Hkv, U*block_size, D]); each query then
    masks to its own blocks (a set: repeats collapse) and to keys <= its position.
    """
    c, hkv, g, d = q_c.shape
    k_len = k_seq.shape[0]
    keep = torch.zeros(c, hkv, n_blocks + 1, dtype=torch.bool, device=q_c.device)
    keep.scatter_(-1, torch.where(sel < 0, n_blocks, sel), True)        # -1 -> spare column
    keep = keep[..., :n_blocks]
    keep[..., int(pos[-1]) // block_size + 1:] = False                 # wholly future blocks
    present = keep.any(dim=0)                                          # [Hkv, n_blocks]
    counts = present.sum(dim=1)
    width = int(counts.max())
    if width == 0:
        return q_c.new_zeros(c, hkv, g, d)
    visible = int(pos[-1]) // block_size + 1
    if 4 * width >= 3 * visible:
        # The union is nearly the whole visible prefix: use it in place, no gather.
        span = int(pos[-1]) + 1
        key_idx = torch.arange(span, device=q_c.device)[None, :].expand(hkv, -1)
        k_u = k_seq[:span].float().transpose(0, 1)                     # [Hkv, L, D]
        v_u = v_seq[:span].float().transpose(0, 1)
        allowed = keep[..., key_idx[0] // block_size]                  # [c, Hkv, L]
    else:
        # Each head's union, ascending, padded at the end with block 0 (masked out below).
        order = torch.sort((~present).to(torch.int8), dim=1, stable=True).indices[:, :width]
        in_union = torch.arange(width, device=q_c.device)[None, :] < counts[:, None]
        in_block = torch.arange(block_size, device=q_c.device)
        key_idx = (order[..., None] * block_size + in_block).flatten(1)         # [Hkv, L]
        # Rows of the [k_len * Hkv, D] view; index_select gathers rows much faster than
        # advanced indexing on this CPU.
        head = torch.arange(hkv, device=q_c.device)[:, None]
        flat = (key_idx.clamp(max=k_len - 1) * hkv + head).flatten()
        k_u = k_seq.reshape(-1, d).index_select(0, flat).view(hkv, -1, d).float()   # [Hkv, L, D]
        v_u = v_seq.reshape(-1, d).index_select(0, flat).view(hkv, -1, d).float()
        allowed = keep.gather(-1, order[None].expand(c, -1, -1)) & in_union[None]   # [c, Hkv, U]
        allowed = allowed.repeat_interleave(block_size, dim=-1)
    allowed = allowed & (key_idx[None] <= pos[:, None, None])
    q_h = q_c.permute(1, 0, 2, 3).reshape(hkv, c * g, d)
    logits = torch.bmm(q_h, k_u.transpose(1, 2)).mul_(scale).view(hkv, c, g, -1)
    probs = _masked_softmax(logits, allowed.permute(1, 0, 2)[:, :, None, :])
    out = torch.bmm(probs.view(hkv, c * g, -1), v_u)                   # [Hkv, c*G, D]
    return out.view(hkv, c, g, d).permute(1, 0, 2, 3)


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_indices: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, *, block_size: int, scale: float) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.block_sparse.block_sparse_attention`."""
    hq, hkv = check_attention_args(q, k, v, block_indices, block_size)
    g, d = hq // hkv, q.shape[2]
    n_sel = block_indices.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in seq_ranges(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                     "block_sparse_attention"):
        q_len, k_len = q1 - q0, k1 - k0
        n_blocks = -(-k_len // block_size)
        sel = checked_blocks(block_indices[q0:q1], n_blocks, k_len)
        if q_len == 0 or n_sel == 0:
            continue
        # Small chunks keep each union (and so the work) close to the chunk's own selections.
        step = max(1, min(_MAX_Q_CHUNK, _CHUNK_ELEMS // (hq * k_len)))
        for a in range(0, q_len, step):
            b = min(q_len, a + step)
            pos = torch.arange(k_len - q_len + a, k_len - q_len + b, device=q.device)
            q_c = q[q0 + a:q0 + b].float().reshape(b - a, hkv, g, d)
            o = _union_chunk(q_c, k[k0:k1], v[k0:k1], sel[a:b], pos, block_size, n_blocks, scale)
            out[q0 + a:q0 + b] = o.reshape(b - a, hq, d)
    return out.to(q.dtype)


def block_sparse_decode(q: torch.Tensor, index_q: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, index_k_cache: torch.Tensor, rows: torch.Tensor, *,
                        block_size: int, topk_blocks: int, local_blocks: int = 1,
                        scale: float) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.block_sparse.block_sparse_decode`; graph-safe."""
    check_decode_args(q, index_q, k_cache, v_cache, index_k_cache, rows, block_size,
                      topk_blocks, local_blocks)
    n, width = rows.shape
    hq, hkv, d = q.shape[1], k_cache.shape[1], q.shape[2]
    valid = rows >= 0
    length = valid.sum(dim=1)                                         # [N] on the device
    safe = rows.clamp(min=0).long()
    # Block scores: max over each block's visible keys; the query's own local blocks forced.
    n_blocks = -(-width // block_size)
    scores = torch.einsum("nhd,nwd->nhw", index_q.float(), index_k_cache[safe].float())
    scores = scores.masked_fill_(~valid[:, None, :], float("-inf"))
    scores = F.pad(scores, (0, n_blocks * block_size - width), value=float("-inf"))
    blocks = scores.view(n, hkv, n_blocks, block_size).amax(dim=-1)     # [N, Hkv, n_blocks]
    own = (length - 1) // block_size
    for back in range(local_blocks):
        blocks.scatter_(-1, (own - back).clamp(min=0)[:, None, None].expand(-1, hkv, 1), float("inf"))
    top, sel = blocks.topk(min(topk_blocks, n_blocks), dim=-1)          # distinct blocks
    # Keys of the selected blocks: positions <= the query's (length - 1), blocks with a score.
    pos = (sel[..., None] * block_size + torch.arange(block_size, device=q.device)).flatten(2)
    usable = (top > float("-inf")).repeat_interleave(block_size, dim=-1) & (pos < length[:, None, None])
    key_rows = safe.gather(1, pos.clamp(max=width - 1).flatten(1)).view(n, hkv, -1)
    head = torch.arange(hkv, device=q.device)[None, :, None]
    k = k_cache[key_rows, head].float()                                 # [N, Hkv, K, D]
    v = v_cache[key_rows, head].float()
    logits = torch.einsum("nhgd,nhkd->nhgk", q.float().view(n, hkv, hq // hkv, d), k) * scale
    probs = _masked_softmax(logits, usable[:, :, None, :])
    return torch.einsum("nhgk,nhkd->nhgd", probs, v).reshape(n, hq, d).to(q.dtype)
