"""Vectorised torch KV compressor (contracts: :mod:`hwinfer.ops.compressor`).

* :func:`kv_compress`: windows in cache-sized chunks. The CSA 2m-slot softmax is computed in two
  parts (window w's Cb slots, window w-1's Ca slots) sharing one max, so the Ca series is never
  copied into a shifted [n, 2m, D] tensor.
* :func:`kv_compress_step`: one scatter for the new rows, then gathers and pools only the requests
  whose window closed (1 in m during decode; 1 in 128 for HCA).
"""
from __future__ import annotations

import torch

from hwinfer.ops.compressor import (
    RopeTables, check_compress_args, check_step_state, norm_and_rope, step_in_place,
)

# Windows are pooled in chunks of about this many fp32 elements per operand: large enough to
# amortise op dispatch, small enough that the temporaries stay in cache and off mmap'd pages
# (one pass over multi-MB temporaries ran up to 4x slower here; 2^18 measured best of 2^14..2^20).
_CHUNK = 1 << 18


def _pool_two_part(cb_v: torch.Tensor, cb_l: torch.Tensor, ca_v: torch.Tensor | None,
                   ca_l: torch.Tensor | None) -> torch.Tensor:
    """Per-channel softmax pooling over the slot dim (1) of Cb and, where given, Ca slots.

    ``cb_*`` [n, m, D]; ``ca_*`` [n, m, D] aligned with ``cb_*`` (row i = the Ca slots of entry
    i) or None (no Ca slots anywhere). Returns [n, D] fp32.
    """
    mx = cb_l.amax(dim=1)
    if ca_l is not None:
        mx = torch.maximum(mx, ca_l.amax(dim=1))
    e_b = torch.exp(cb_l - mx[:, None])
    num = (e_b * cb_v).sum(dim=1)
    den = e_b.sum(dim=1)
    if ca_l is not None:
        e_a = torch.exp(ca_l - mx[:, None])
        num = num + (e_a * ca_v).sum(dim=1)
        den = den + e_a.sum(dim=1)
    return num / den


def kv_compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor, *,
                ratio: int, overlap: bool, eps: float, rope: RopeTables | None = None,
                rope_dim: int = 64) -> torch.Tensor:
    """Same contract as :func:`hwinfer.ops.compressor.kv_compress`; [T, c*D] -> [T // m, D]."""
    n = kv.shape[0] // ratio if kv.dim() == 2 and isinstance(ratio, int) and ratio > 0 else 0
    c, d = check_compress_args(kv, score, ape, norm_weight, ratio, overlap, rope, rope_dim, n, "kv_compress")
    width = c * d
    pooled = torch.empty(n, d, dtype=torch.float32, device=kv.device)
    ape32 = ape.float()
    step = max(1, _CHUNK // (ratio * width))
    for w0 in range(0, n, step):
        w1 = min(n, w0 + step)
        lo = max(w0 - 1, 0) if overlap else w0  # with overlap, also load the window before
        values = kv[lo * ratio:w1 * ratio].float().view(w1 - lo, ratio, width)
        logits = score[lo * ratio:w1 * ratio].float().view(w1 - lo, ratio, width) + ape32
        if not overlap:
            pooled[w0:w1] = _pool_two_part(values, logits, None, None)
            continue
        if w0 == 0:  # entry 0 has no Ca slots
            pooled[0] = _pool_two_part(values[:1, :, d:], logits[:1, :, d:], None, None)[0]
        a, b = max(w0, 1) - lo, w1 - lo  # chunk rows of the entries that have a window before
        if b > a:
            pooled[lo + a:w1] = _pool_two_part(values[a:b, :, d:], logits[a:b, :, d:],
                                               values[a - 1:b - 1, :, :d], logits[a - 1:b - 1, :, :d])
    return norm_and_rope(pooled, norm_weight, eps, rope, rope_dim).to(kv.dtype)


def kv_compress_step(kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor,
                     state_kv: torch.Tensor, state_score: torch.Tensor, ape: torch.Tensor,
                     norm_weight: torch.Tensor, *, ratio: int, overlap: bool, eps: float,
                     rope: RopeTables | None = None, rope_dim: int = 64,
                     state_slots: torch.Tensor | None = None, entry_store: torch.Tensor | None = None,
                     entry_rows: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`hwinfer.ops.compressor.kv_compress_step` (the in-place forms
    through the shared gather / write-back)."""
    if state_slots is not None or entry_store is not None:
        return step_in_place(kv_compress_step, kv, score, positions, state_kv, state_score, ape,
                             norm_weight, state_slots, entry_store, entry_rows, ratio=ratio,
                             overlap=overlap, eps=eps, rope=rope, rope_dim=rope_dim)
    c, d = check_compress_args(kv, score, ape, norm_weight, ratio, overlap, rope, rope_dim,
                               kv.shape[0] if kv.dim() == 2 else -1, "kv_compress_step")
    check_step_state(kv, positions, state_kv, state_score, ratio, c, "kv_compress_step")
    b, rows = kv.shape[0], state_kv.shape[1]
    pos = positions.long()
    req = torch.arange(b, device=kv.device)
    new_kv, new_score = state_kv.clone(), state_score.clone()
    new_kv[req, pos % rows] = kv.float()
    new_score[req, pos % rows] = score.float() + ape.float()[pos % ratio]

    emitted = (pos + 1) % ratio == 0
    entries = torch.zeros(b, d, dtype=kv.dtype, device=kv.device)
    idx = emitted.nonzero().squeeze(1)
    if idx.numel():
        w = pos[idx] // ratio
        cur = (w[:, None] * ratio + torch.arange(ratio, device=kv.device)) % rows   # [e, m]
        vals, logits = new_kv[idx[:, None], cur], new_score[idx[:, None], cur]        # [e, m, c*D]
        if not overlap:
            pooled = _pool_two_part(vals, logits, None, None)
        else:
            prev = (cur - ratio) % rows
            # Entry 0 has no Ca slots: a -inf logit gives them weight exactly 0, and a 0 value
            # keeps never-written ring rows (any garbage, even NaN) out of the product.
            first = (w == 0)[:, None, None]
            ca_v = new_kv[idx[:, None], prev, :d].masked_fill(first, 0.0)
            ca_l = new_score[idx[:, None], prev, :d].masked_fill(first, float("-inf"))
            pooled = _pool_two_part(vals[..., d:], logits[..., d:], ca_v, ca_l)
        sub_rope = None if rope is None else (rope[0][idx], rope[1][idx])
        entries[idx] = norm_and_rope(pooled, norm_weight, eps, sub_rope, rope_dim).to(kv.dtype)
    return entries, emitted, new_kv, new_score
