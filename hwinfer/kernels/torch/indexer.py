"""Vectorised torch lightning indexer (contract: :func:`hwinfer.ops.indexer.lightning_indexer`).

Queries go in row chunks: one matmul for every head's logits against the chunk's key span
(the union of its rows' visible ranges, so packed sequences do not score each other's keys much),
ReLU, one batched matmul with the head weights, a -inf mask outside each row's range, one top-k.
Chunks bound the [rows, Hi, keys] fp32 logits to ~4 MiB (measured best of 256 KiB..16 MiB).
"""
from __future__ import annotations

import torch

from hwinfer.ops.indexer import check_indexer_args

_LOGITS_BUDGET = 1 << 20  # fp32 elements of one chunk's [rows, Hi, keys] logits


def lightning_indexer(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                      k_end: torch.Tensor, *, topk: int, scale: float,
                      max_len: int | None = None, k_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as the reference: [T, Hi, Di] x [N, Di] -> [T, topk] int32, -1 padded."""
    check_indexer_args(q, k, weights, k_start, k_end, topk, max_len=max_len, k_rows=k_rows)
    if k_rows is not None:  # host memory: one gather costs less than scattered reads per chunk
        k = k.index_select(0, k_rows.long())
    t_total, heads, dim = q.shape
    out = torch.full((t_total, topk), -1, dtype=torch.int32, device=q.device)
    if t_total == 0:
        return out
    starts, ends = k_start.long(), k_end.long()
    span = max(1, int((ends - starts).max()))
    rows = max(1, _LOGITS_BUDGET // (heads * span))
    for r0 in range(0, t_total, rows):
        r1 = min(t_total, r0 + rows)
        lo, hi = int(starts[r0:r1].min()), int(ends[r0:r1].max())
        if hi <= lo:
            continue
        keys = k[lo:hi].float()
        logits = (q[r0:r1].float().reshape(-1, dim) @ keys.T).view(r1 - r0, heads, hi - lo)
        scores = torch.bmm(weights[r0:r1].float().unsqueeze(1), torch.relu_(logits)).squeeze(1) * scale
        cols = torch.arange(lo, hi, device=q.device)
        hidden = (cols < starts[r0:r1, None]) | (cols >= ends[r0:r1, None])
        vals, idx = scores.masked_fill_(hidden, float("-inf")).topk(min(topk, hi - lo), dim=1)
        # Valid scores are finite, so a -inf pick means the row ran out of visible keys.
        idx = torch.where(vals == float("-inf"), -1, idx + lo)
        out[r0:r1, : idx.shape[1]] = idx.to(torch.int32)
    return out
