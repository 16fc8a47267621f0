"""Vectorised torch implementations of the dense attention ops (contracts in
:mod:`hwinfer.ops.attention` and :mod:`hwinfer.ops.attention_paged`).

* ``attention``: one fused SDPA call per sequence (per query chunk with a sliding window, so the
  cost is O(L*W), not O(L^2)) instead of the reference's materialised fp32 logits. GQA runs as
  batch = kv head, heads = its query heads, with K/V broadcast (stride 0): no head repetition,
  and the output comes back token-major. Without sinks it is the public
  ``scaled_dot_product_attention`` (any device). Sinks need each row's log-sum-exp ``lse``
  (``o_sink = o * sigmoid(lse - sink)``: the sink only adds ``exp(sink)`` to the softmax
  denominator), which only torch's CPU flash kernel returns, so sink calls are CPU-only
  (:func:`check_attention_impl` refuses them elsewhere).
* ``paged_attention``: one gather of every sequence's visible slots into a padded
  [Hkv, B, span, D] batch, then two batched GQA-grouped matmuls around an fp32 softmax.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hwinfer.ops.attention import check_attention
from hwinfer.ops.attention_paged import check_paged

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def check_attention_impl(q: torch.Tensor, sinks: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check for :func:`attention`: sinks need the CPU flash kernel (for its lse)."""
    if sinks is not None and (q.device.type != "cpu" or _CPU_FLASH is None):
        return "attention sinks need torch's CPU flash-attention kernel (it returns the log-sum-exp)"
    return None


def _mask(lq: int, lk: int, causal: bool, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Bool [lq, lk] visibility for bottom-right causal (+window) attention; None = all visible."""
    if not causal:
        return None
    k_pos = torch.arange(lk, device=device)
    q_pos = torch.arange(lk - lq, lk, device=device)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    return visible


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *,
                  scale: float, causal: bool, window: int | None, sinks: torch.Tensor | None) -> None:
    """q [Lq, Hq, Dk], k [Lk, Hkv, Dk], v [Lk, Hkv, Dv] (Lq, Lk >= 1); writes out [Lq, Hq, Dv]."""
    lq, hq, dk = q.shape
    lk, hkv, dv = v.shape
    if window is not None:
        # Sliding window: queries need only the keys from their first query's window on, and a
        # chunk of C queries at most C + W - 1 keys; attending chunk by chunk costs O(L*W)
        # instead of masking a full [Lq, Lk] score matrix. Every chunk's last query sits on its
        # key slice's last key, so bottom-right alignment still holds inside the chunk.
        chunk = max(window, 128)
        if lq > chunk:
            for a in range(0, lq, chunk):
                b = min(lq, a + chunk)
                first, last = max(0, lk - lq + a - window + 1), lk - lq + b
                _one_sequence(q[a:b], k[first:last], v[first:last], out[a:b], scale=scale,
                              causal=causal, window=window, sinks=sinks)
            return
        first = max(0, lk - lq - window + 1)
        k, v, lk = k[first:], v[first:], lk - first
    group = hq // hkv
    # Top-left and bottom-right causal coincide when q_len == k_len: the kernel's own causal
    # path then skips masked tiles instead of reading an explicit mask.
    implicit_causal = causal and lq == lk and window is None
    mask = None if implicit_causal else _mask(lq, lk, causal, window, q.device)
    if sinks is not None and dk != dv:
        # The CPU flash kernel wants equal q/k/v head dims: zero-pad the shorter one (zero
        # channels change neither logits nor outputs).
        dmax = max(dk, dv)
        q, k, v = F.pad(q, (0, dmax - dk)), F.pad(k, (0, dmax - dk)), F.pad(v, (0, dmax - dv))
    # GQA without copies: batch = kv head, heads = its G query heads, K/V broadcast over them
    # (stride 0). The kernels then write their output token-major, i.e. already [Lq, Hq, D].
    qh = q.view(lq, hkv, group, q.shape[2]).permute(1, 2, 0, 3)
    kh = k.permute(1, 0, 2)[:, None].expand(hkv, group, lk, k.shape[2])
    vh = v.permute(1, 0, 2)[:, None].expand(hkv, group, lk, v.shape[2])
    if sinks is None:
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=implicit_causal,
                                           scale=scale)
        out.view(lq, hkv, group, dv).copy_(o.permute(2, 0, 1, 3))
        return
    additive = None
    if mask is not None:
        additive = torch.zeros(lq, lk, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    o, lse = _CPU_FLASH(qh, kh, vh, 0.0, implicit_causal, attn_mask=additive, scale=scale)
    # The sink only adds exp(sink) to each row's softmax denominator exp(lse).
    keep = torch.sigmoid(lse - sinks.float().view(hkv, group, 1))  # [Hkv, G, Lq]
    torch.mul(o[..., :dv].permute(2, 0, 1, 3), keep.permute(2, 0, 1)[..., None],
              out=out.view(lq, hkv, group, dv))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, *, scale: float, causal: bool = True,
              window: int | None = None, sinks: torch.Tensor | None = None,
              gate: torch.Tensor | None = None) -> torch.Tensor:
    """Varlen attention (contract: :func:`hwinfer.ops.attention.attention`) via fused SDPA."""
    bq, bk = check_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, sinks, gate)
    v = k if v is None else v
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    for i in range(len(bq) - 1):
        lq, lk = bq[i + 1] - bq[i], bk[i + 1] - bk[i]
        if lq == 0:
            continue
        if lk == 0:  # only reachable without causality: no visible key -> 0 by contract
            out[bq[i]:bq[i + 1]].zero_()
            continue
        _one_sequence(q[bq[i]:bq[i + 1]], k[bk[i]:bk[i + 1]], v[bk[i]:bk[i + 1]], out[bq[i]:bq[i + 1]],
                      scale=scale, causal=causal, window=window, sinks=sinks)
    if gate is not None:
        out.mul_(torch.sigmoid(gate.float()))
    return out


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                    window: int | None = None, sinks: torch.Tensor | None = None,
                    gate: torch.Tensor | None = None) -> torch.Tensor:
    """Paged decode (contract: :func:`hwinfer.ops.attention_paged.paged_attention`):
    gather the visible slots of all sequences at once, then batched GQA matmuls."""
    lens = check_paged(q, k_cache, v_cache, block_table, seq_lens, window, sinks, gate)
    v_cache = k_cache if v_cache is None else v_cache
    b, sq, hq, dk = q.shape
    num_blocks, block_size, hkv, dv = v_cache.shape
    group = hq // hkv
    if b == 0 or sq == 0:
        return torch.zeros(b, sq, hq, dv, dtype=q.dtype, device=q.device)
    dev = q.device
    # End-aligned span: row b gathers positions L_b - span .. L_b - 1. With a window no query
    # sees further back than its first query's window (W + Sq - 1 positions).
    span = max(lens) if window is None else min(max(lens), window + sq - 1)
    seq = seq_lens.to(device=dev, dtype=torch.long)
    pos = seq[:, None] - span + torch.arange(span, device=dev)[None, :]  # [B, span]
    valid = pos >= 0
    pos_c = pos.clamp_min(0)
    block = block_table.to(dev).long().gather(1, pos_c // block_size)
    # Padding positions may land on unused (garbage) table entries: never dereference those.
    slot = torch.where(valid, block * block_size + pos_c % block_size, torch.zeros_like(pos_c))
    flat = slot.reshape(-1)
    # Gather the rows (index_select along the contiguous row dim: its cost follows the rows
    # read, not the pool size), then lay them out as [Hkv, B*span, D] so both GEMMs below are
    # batched matmuls over (Hkv, B); each kv head serves its G query heads in one GEMM.
    k = k_cache.reshape(-1, hkv, dk).index_select(0, flat).float().transpose(0, 1).reshape(hkv, b, span, dk)
    v = v_cache.reshape(-1, hkv, dv).index_select(0, flat).float().transpose(0, 1).contiguous()
    if not bool(valid.all()):
        # Padding rows read slot 0, which may be an unwritten (NaN) slot: 0 * NaN would leak.
        v[:, ~valid.reshape(-1)] = 0.0
    v = v.view(hkv, b, span, dv)
    qg = q.float().view(b, sq, hkv, group, dk).permute(2, 0, 3, 1, 4).reshape(hkv, b, group * sq, dk)
    logits = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale).view(hkv, b, group, sq, span)
    q_pos = seq[:, None] - sq + torch.arange(sq, device=dev)[None, :]  # [B, Sq]
    visible = valid[:, None, :] & (pos[:, None, :] <= q_pos[:, :, None])  # [B, Sq, span]
    if window is not None:
        visible &= pos[:, None, :] > q_pos[:, :, None] - window
    logits.masked_fill_(~visible[None, :, None], float("-inf"))
    # Every query sees at least itself, so row maxima are finite.
    row_max = logits.amax(dim=-1, keepdim=True)
    if sinks is not None:
        sink = sinks.to(device=dev, dtype=torch.float32).view(hkv, 1, group, 1, 1)
        row_max = torch.maximum(row_max, sink)
    p = logits.sub_(row_max).exp_()
    denom = p.sum(dim=-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sink - row_max)
    p = p.div_(denom).view(hkv, b, group * sq, span)
    out = torch.matmul(p, v)  # [Hkv, B, G*Sq, Dv]
    out = out.view(hkv, b, group, sq, dv).permute(1, 3, 0, 2, 4).reshape(b, sq, hq, dv)
    if gate is not None:
        out = out * torch.sigmoid(gate.float())
    return out.to(q.dtype)
