"""Triton KV-compressor decode step (contract: :func:`hwinfer.ops.compressor.kv_compress_step`).

``_compress_step_kernel``, one program per request:

1. writes this token's ring row ``p % R`` (kv as fp32; score + ape[p % m]) into the new state
   (the wrapper makes the state copies the contract returns; the kernel only writes one row);
2. if the window closes (``(p + 1) % m == 0``), pools the entry with an online per-channel
   softmax over slot chunks of BS slots (CSA: 2m slots, Ca halves of window w-1 then Cb halves
   of window w; HCA: m slots). Slots are read from the *input* ring, the closing token itself
   (always the window's last slot) from registers, so no program reads what it wrote;
3. RMS-normalises the entry (weighted), applies interleaved RoPE on the last ``rope_dim``
   channels, and stores it (zeros when no window closed).

Channels are laid out as [D/2, 2] (pairs) so the RoPE partner swap is a tl.split / tl.join in
registers. Positions are trusted (no host sync: this runs in captured decode graphs).

The plain form returns whole-ring copies (the wrapper clones the input rings). The engine's
decode uses the in-place form: ``state_slots`` points the program at its request's ring in the
pool (read and written there, one new row), and ``entry_store`` / ``entry_rows`` fuse the cache
write, a closing window storing its entry into its store row. No ring is copied: per request the
step reads the window's rows only when it closes and writes one ring row and at most one entry.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.ops.compressor import check_compress_args, check_in_place, check_ring_rows, check_step_state

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _compress_step_kernel(kv_ptr, score_ptr, pos_ptr, skv_ptr, ssc_ptr, ape_ptr, w_ptr,
                          cos_ptr, sin_ptr, out_ptr, emit_ptr, nkv_ptr, nsc_ptr,
                          slot_ptr, store_ptr, dest_ptr, stride_store,
                          R, D, RD, ratio, eps,
                          C: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
                          HAS_ROPE: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_STORE: tl.constexpr):
    b = tl.program_id(0)
    W = C * D
    p = tl.load(pos_ptr + b).to(tl.int64)
    # The request's ring: its own [R, W] block of the input / output states, or (in place) the
    # pool's ring of its slot, read and written through the same pointers.
    ring = tl.load(slot_ptr + b).to(tl.int64) if HAS_SLOTS else b.to(tl.int64)
    q = tl.arange(0, HALF)
    two = tl.arange(0, 2)
    ch = 2 * q[:, None] + two[None, :]                      # [HALF, 2] channel ids
    cmask = ch < D
    row_in = b.to(tl.int64) * W
    slot = p % ratio
    ring_row = (ring * R + p % R) * W
    # 1. the new ring row, all C parts.
    for part in range(0, C):
        v = tl.load(kv_ptr + row_in + part * D + ch, mask=cmask, other=0.0).to(tl.float32)
        s = tl.load(score_ptr + row_in + part * D + ch, mask=cmask, other=0.0).to(tl.float32)
        s = s + tl.load(ape_ptr + slot * W + part * D + ch, mask=cmask, other=0.0).to(tl.float32)
        tl.store(nkv_ptr + ring_row + part * D + ch, v, mask=cmask)
        tl.store(nsc_ptr + ring_row + part * D + ch, s, mask=cmask)
    closes = (p + 1) % ratio == 0
    y = tl.zeros([HALF, 2], dtype=tl.float32)
    if closes:
        w = p // ratio
        # The closing token is the last slot; its Cb (or only) part is at channel offset (C-1)*D.
        new_v = tl.load(kv_ptr + row_in + (C - 1) * D + ch, mask=cmask, other=0.0).to(tl.float32)
        new_s = tl.load(score_ptr + row_in + (C - 1) * D + ch, mask=cmask, other=0.0).to(tl.float32)
        new_s = new_s + tl.load(ape_ptr + slot * W + (C - 1) * D + ch, mask=cmask,
                                other=0.0).to(tl.float32)
        m_run = tl.full([HALF, 2], float("-inf"), tl.float32)
        l_run = tl.zeros([HALF, 2], dtype=tl.float32)
        acc = tl.zeros([HALF, 2], dtype=tl.float32)
        n_slots = C * ratio
        for s0 in range(0, n_slots, BS):
            sl = s0 + tl.arange(0, BS)
            # overlap: slots < m are window w-1's Ca halves (channel offset 0), the rest are
            # window w's Cb halves (offset D); no overlap: window w, offset 0.
            is_ca = (sl < ratio) & (C == 2)
            tok = tl.where(is_ca, (w - 1) * ratio + sl, w * ratio + sl - (C - 1) * ratio)
            off = tl.where(is_ca, 0, (C - 1) * D)
            ok = (sl < n_slots) & ~(is_ca & (w == 0))
            is_new = tok == p
            rows = (ring * R + tl.where(ok, tok, 0) % R) * W + off
            ptr = rows[:, None, None] + ch[None, :, :]
            m3 = ok[:, None, None] & ~is_new[:, None, None] & cmask[None, :, :]
            v = tl.load(skv_ptr + ptr, mask=m3, other=0.0)
            lg = tl.load(ssc_ptr + ptr, mask=m3, other=0.0)
            v = tl.where(is_new[:, None, None], new_v[None, :, :], v)
            lg = tl.where(is_new[:, None, None], new_s[None, :, :], lg)
            lg = tl.where(ok[:, None, None], lg, float("-inf"))
            v = tl.where(ok[:, None, None], v, 0.0)
            m_new = tl.maximum(m_run, tl.max(lg, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_run - m_safe)
            e = tl.exp(lg - m_safe[None, :, :])
            l_run = l_run * alpha + tl.sum(e, axis=0)
            acc = acc * alpha + tl.sum(e * v, axis=0)
            m_run = m_new
        pooled = tl.where(cmask, acc / l_run, 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(tl.sum(pooled * pooled, axis=1), axis=0) / D + eps)
        y = pooled * inv * tl.load(w_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
        if HAS_ROPE:
            x0, x1 = tl.split(y)
            i = q - (D - RD) // 2
            rot = (i >= 0) & (2 * q < D)
            c = tl.load(cos_ptr + b * (RD // 2) + i, mask=rot, other=1.0).to(tl.float32)
            sn = tl.load(sin_ptr + b * (RD // 2) + i, mask=rot, other=0.0).to(tl.float32)
            y = tl.join(x0 * c - x1 * sn, x1 * c + x0 * sn)
        if HAS_STORE:  # the cache write, fused: only a closing window writes its entry row
            dest = tl.load(dest_ptr + b).to(tl.int64)
            tl.store(store_ptr + dest * stride_store + ch, y.to(store_ptr.dtype.element_ty), mask=cmask)
    tl.store(out_ptr + b.to(tl.int64) * D + ch, y.to(out_ptr.dtype.element_ty), mask=cmask)
    tl.store(emit_ptr + b, closes)


def kv_compress_step(kv, score, positions, state_kv, state_score, ape, norm_weight, *, ratio: int,
                     overlap: bool, eps: float, rope=None, rope_dim: int = 64, state_slots=None,
                     entry_store=None, entry_rows=None):
    """Same contract as :func:`hwinfer.ops.compressor.kv_compress_step`: returns
    ``(entries [B, D] kv.dtype, emitted [B] bool, new_state_kv, new_state_score)`` (fp32
    [B, R, c*D] copies with one row per request replaced, or the pools themselves, updated in
    place, with ``state_slots``; ``entry_store`` / ``entry_rows``: emitted entries written in
    place by the kernel)."""
    c, d = check_compress_args(kv, score, ape, norm_weight, ratio, overlap, rope, rope_dim,
                               kv.shape[0] if kv.dim() == 2 else -1, "kv_compress_step")
    check_in_place(kv, state_kv, state_score, state_slots, entry_store, entry_rows, d)
    b = kv.shape[0]
    in_place = state_slots is not None
    if b == 0:
        return (kv.new_zeros(0, d), torch.zeros(0, dtype=torch.bool, device=kv.device),
                state_kv if in_place else state_kv.clone(), state_score if in_place else state_score.clone())
    # Shape checks only: check_step_state's positions >= 0 test would sync with the host.
    rows = state_kv.shape[1]
    if positions.shape != (b,) or positions.is_floating_point():
        raise ValueError(f"kv_compress_step: positions must be an integer [B={b}] tensor, got "
                         f"{positions.dtype} {tuple(positions.shape)}")
    if not in_place and (state_kv.shape != (b, rows, c * d) or state_score.shape != state_kv.shape):
        check_step_state(kv, positions, state_kv, state_score, ratio, c, "kv_compress_step")
    check_ring_rows(rows, c, ratio)
    if in_place:  # the kernel reads the window's rows and writes the new one in the same ring
        new_kv, new_score = state_kv, state_score
    else:
        new_kv = state_kv.contiguous().clone()
        new_score = state_score.contiguous().clone()
    entries = torch.empty(b, d, dtype=kv.dtype, device=kv.device)
    emitted = torch.empty(b, dtype=torch.bool, device=kv.device)
    cos, sin = (rope[0].contiguous(), rope[1].contiguous()) if rope is not None else (kv, kv)
    half = triton.next_power_of_2(d) // 2
    bs = max(1, min(triton.next_power_of_2(c * ratio), max(1, 4096 // (2 * half))))
    slots = state_slots.contiguous() if in_place else positions         # positions: unread stand-ins
    store = entry_store if entry_store is not None else entries
    dest = entry_rows.contiguous() if entry_rows is not None else positions
    _compress_step_kernel[(b,)](
        kv.contiguous(), score.contiguous(), positions.contiguous(),
        new_kv if in_place else state_kv.contiguous(), new_score if in_place else state_score.contiguous(),
        ape.contiguous(), norm_weight.contiguous(), cos, sin, entries,
        emitted, new_kv, new_score, slots, store, dest, store.stride(0),
        rows, d, rope_dim if rope is not None else 0, ratio, eps,
        C=c, HALF=half, BS=bs, HAS_ROPE=rope is not None, HAS_SLOTS=in_place,
        HAS_STORE=entry_store is not None, num_warps=4 if d <= 256 else 8)
    return entries, emitted, new_kv, new_score


def kv_compress_step_supported(kv: torch.Tensor, score: torch.Tensor, state_kv: torch.Tensor,
                               overlap: bool = False, **_: object) -> str | None:
    """Per-call check: float kv/score, fp32 state, an even entry width D <= 1024."""
    if kv.dim() != 2 or kv.dtype not in _FLOATS or score.dtype not in _FLOATS:
        return "kv, score must be float [B, c*D]"
    d = kv.shape[1] // (2 if overlap else 1)
    if d % 2 or d > 1024:
        return f"entry width D={d} must be even and <= 1024"
    if state_kv.dtype != torch.float32:
        return "state must be fp32"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # CSA (c=2, D=512 and the indexer's 128, m=4) and HCA (c=1, D=512, m=128), kv fp32 / bf16.
    for dtype in ("fp32", "bf16"):
        for c, d, bs in ((2, 512, 8), (2, 128, 8), (1, 512, 8)):
            sig = {"kv_ptr": f"*{dtype}", "score_ptr": f"*{dtype}", "pos_ptr": "*i64",
                   "skv_ptr": "*fp32", "ssc_ptr": "*fp32", "ape_ptr": "*fp32", "w_ptr": "*fp32",
                   "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": f"*{dtype}",
                   "emit_ptr": "*i1", "nkv_ptr": "*fp32", "nsc_ptr": "*fp32", "slot_ptr": "*i64",
                   "store_ptr": f"*{dtype}", "dest_ptr": "*i64", "stride_store": "i64", "R": "i32",
                   "D": "i32", "RD": "i32", "ratio": "i32", "eps": "fp32",
                   "C": "constexpr", "HALF": "constexpr", "BS": "constexpr",
                   "HAS_ROPE": "constexpr", "HAS_SLOTS": "constexpr", "HAS_STORE": "constexpr"}
            for fused in (False, True):  # fused: the decode's in-place rings + entry store write
                specs.append(AotSpec(f"compress_step[{dtype},c{c},D{d}{',in_place' if fused else ''}]",
                                     _compress_step_kernel, sig,
                                     {"C": c, "HALF": d // 2, "BS": bs, "HAS_ROPE": True,
                                      "HAS_SLOTS": fused, "HAS_STORE": fused},
                                     {"num_warps": 8 if d > 256 else 4}))
    return specs


AOT_SPECS = _aot_specs()
