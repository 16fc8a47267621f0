"""Warp-specialised sparse MLA decode over DeepSeek-V4's packed FP8 cache rows, in Gluon, for
NVIDIA Hopper. Contract: :func:`hwinfer.ops.sparse_mla.sparse_mla_decode` with ``fp8_ds_mla``
caches (uint8 [..., 584], :mod:`hwinfer.ops.kv_pack`); selected by
:mod:`hwinfer.kernels.triton.sparse_mla` where :func:`ws_fp8_supported` accepts the call.

The structure of :mod:`.sparse_mla_ws` (its docstring says why), with the rows' bytes decoded
on the way in:

* the **producer** copies each row raw, in 8-byte pieces (rows are 8-byte aligned: 584 = 73 x
  8), into three regions of a 32-row ring slot: bytes 0-511 (the 448 e4m3 NoPE codes and the
  first half of the RoPE channels), bytes 448-575 (the 64 bf16 RoPE channels, 64 bytes fetched
  twice so that they lie contiguous) and bytes 576-583 (the seven UE8M0 group scales);
* each **consumer** step takes two slots (64 rows): it decodes its 256 channels of them (group
  0: NoPE groups 0-3; group 1: NoPE groups 4-6 and the RoPE channels; e4m3 x 2^(scale - 127),
  exact, the scale bytes shifted out of the row's scale word) into its own [64, 256] bf16 tile
  in shared memory, releases the slots at once, then runs the QK split, the online softmax and
  the PV product of :mod:`.sparse_mla_ws` on that tile. The next step's first slot is decoded
  into registers while the PV product runs (``DECODE_AHEAD``).

A 584-byte row is 57% of a bf16 row's bytes, but carries the same MMA work (64 heads x 512
channels, twice): this kernel is bound by its consumers, not the memory (docs/kernels.md,
twenty-fourth session: its floor with no rows read is 95% of its time). Shared memory: q 64
KB, 3 raw slots x 20.25 KB, the two bf16 tiles 64 KB, the exchanged logits 32 KB: 222 KB (a
64-row raw slot is 41.5 KB: two of them do not fit). H100, V4 HCA (128 + 8,192 rows), B = 128:
Triton kernel 1,314-1,377 us, 23rd session's one slot a step 549, two a step 497-505, decode
ahead **471-474**; B = 32 436 -> 150 -> 137 -> **131**. Covers q bf16 with 64 heads x 512,
v_dim 512, packed main and extra caches, int32 / int64 indices. NVIDIA sm_90 only; compiled
ahead of time in CI, run only on a card (tests/kernels/test_sparse_mla_ws.py).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from hwinfer.kernels.triton import nvidia_capability
from hwinfer.kernels.triton.sparse_mla_ws import (HEADS, _barrier, _chunk_indices, _chunk_range,
                                                  _chunk_source, _exchange_logits,
                                                  _init_barriers, _load_q, _softmax_step,
                                                  _split_bounds, _store_partials, split_partials)
from hwinfer.ops.kv_pack import FP8_DS_BYTES

WORDS = gl.constexpr(FP8_DS_BYTES // 8)   # 73 8-byte words a row
BLOCK_K = 32   # rows a raw slot; a consumer step takes two
STAGES = 3     # raw slots (2: 206 KB, as fast within 1%)
SUB = 8
PRODUCER_WARPS = 4
CONSUMER_REGS = 224
PRODUCER_REGS = 56
# DECODE_AHEAD: a step's PV product runs async while the consumer decodes the next step's first
# slot (1) or both (2) into registers (4 [32, 64] bf16 tiles a slot, 32 registers a thread),
# stored to its tile once the product is done; 0: every slot decoded at its step's start. The
# decode is ~1 us of a ~3.7 us step (bench --floor). H100, 24th session (HCA): one slot ahead
# B = 128 496.9 -> 474.1 us, B = 32 137.5 -> 131.3 (floor 477.8 -> 451.2); at 232 / 40
# registers (no spills) 500.0 / 130.1; both slots spill ~300 bytes a thread at any split.
DECODE_AHEAD = 1
NIDX = 4   # index ring entries (two steps; see the kernel)


@gluon.jit
def _producer(q_ptr, kv_ptr, idx_ptr, kv2_ptr, idx2_ptr, q_lo, q_hi, raw_a, raw_r, raw_s, idx_s,
              pidx, q_bar, full, empty, stride_kv, stride_kv2, lo, hi, K1, n_main, n_all,
              n_raw, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr,
              NIDX: gl.constexpr, WARPS: gl.constexpr):
    """q into shared memory (``q_bar``), then chunk c's rows, raw, into slot c % STAGES: words
    0-63 of a row to ``raw_a``, words 56-71 (the RoPE bytes) to ``raw_r``, word 72 (the scales)
    to ``raw_s``; its indices into ``idx_s[c % NIDX]``. Chunk n_all .. n_raw - 1 (a last step's
    padding) is all -1: zero-filled. kv pointers are int64 words; strides in words."""
    a_l: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [WARPS, 1], [1, 0])     # [SUB, 64]
    r_l: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [WARPS, 1], [1, 0])     # [SUB, 16]
    idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    _load_q(q_ptr, q_lo, q_hi, q_lo, q_bar, SUB, WARPS, 0)
    ac = gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
    rc = 56 + gl.arange(0, 16, layout=gl.SliceLayout(0, r_l))
    nxt = _chunk_indices(0, idx_ptr, idx2_ptr, n_main, n_all, lo, hi, K1, BLOCK_K, idx_l)
    for c in range(n_raw):
        cur = nxt
        # in flight while this chunk waits for its slot and issues its copies
        nxt = _chunk_indices(c + 1, idx_ptr, idx2_ptr, n_main, n_all, lo, hi, K1, BLOCK_K, idx_l)
        s = c % STAGES
        mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
        p0, end = _chunk_range(c, n_main, lo, hi, K1, BLOCK_K)
        ip, kp, sk = _chunk_source(c, n_main, idx_ptr, kv_ptr, stride_kv, idx2_ptr, kv2_ptr,
                                   stride_kv2)
        pos = p0 + gl.arange(0, BLOCK_K, layout=idx_l)
        async_copy.async_copy_global_to_shared(idx_s.index(c % NIDX), ip + pos, mask=pos < end)
        ok = cur >= 0
        async_copy.async_copy_global_to_shared(
            raw_s.index(s), kp + gl.where(ok, cur, 0).to(gl.int64) * sk + (WORDS - 1), mask=ok)
        _barrier()   # the last chunk's reads of pidx are done
        pidx.store(cur)
        _barrier()
        for j in gl.static_range(BLOCK_K // SUB):
            ia = pidx.slice(j * SUB, SUB).load(gl.SliceLayout(1, a_l))
            oka = ia >= 0
            rowa = kp + gl.where(oka, ia, 0).to(gl.int64) * sk
            async_copy.async_copy_global_to_shared(raw_a.index(s).slice(j * SUB, SUB),
                                                   rowa[:, None] + ac[None, :], mask=oka[:, None])
            ir = pidx.slice(j * SUB, SUB).load(gl.SliceLayout(1, r_l))
            okr = ir >= 0
            rowr = kp + gl.where(okr, ir, 0).to(gl.int64) * sk
            async_copy.async_copy_global_to_shared(raw_r.index(s).slice(j * SUB, SUB),
                                                   rowr[:, None] + rc[None, :], mask=okr[:, None])
        async_copy.mbarrier_arrive(full.index(s), increment_count=False)


@gluon.jit
def _decode_group(codes_u8, words, g: gl.constexpr, dec_l: gl.constexpr):
    """NoPE group g of a slot: its 64 e4m3 codes a row [BLOCK_K, 64] (shared uint8) times the
    row's power-of-two scale 2^(byte g of its scale word - 127), as bf16 (exact). ``words``:
    the rows' scale words [BLOCK_K] (int64, layout SliceLayout(1, dec_l))."""
    codes = codes_u8.slice(g * 64, 64, dim=1).load(dec_l)
    byte = ((words >> (8 * g)) & 255).to(gl.int32)
    # the exponent field of an fp32 is the biased exponent: byte << 23 is 2^(byte - 127)
    scale = (byte << 23).to(gl.float32, bitcast=True)
    vals = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, None]
    return vals.to(gl.bfloat16)


# the decode's register layout of a [BLOCK_K, 64] tile
DEC_L = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _slot_source(raw_a, raw_s, s, BLOCK_K: gl.constexpr):
    """Raw slot s's codes (uint8 [BLOCK_K, 512] view) and scale words (int64 [BLOCK_K])."""
    codes = raw_a.index(s)._reinterpret(gl.uint8, [BLOCK_K, 512],
                                        gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    return codes, raw_s.index(s).load(gl.SliceLayout(1, DEC_L))


@gluon.jit
def _decode_tile(codes, words, raw_r, s, t: gl.constexpr, PART: gl.constexpr,
                 BLOCK_K: gl.constexpr):
    """Tile t (columns 64t .. 64t + 63) of this group's 256 channels of slot s, bf16 [BLOCK_K,
    64]: group 0 NoPE groups 0-3, group 1 NoPE groups 4-6 and (t = 3) the RoPE channels."""
    if PART == 1 and t == 3:
        return raw_r.index(s)._reinterpret(gl.bfloat16, [BLOCK_K, 64],
                                           gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).load(DEC_L)
    else:
        return _decode_group(codes, words, 4 * PART + t, DEC_L)


@gluon.jit
def _decode_regs(raw_a, raw_r, raw_s, s, PART: gl.constexpr, BLOCK_K: gl.constexpr):
    """This group's 256 channels of raw slot s's BLOCK_K rows as four [BLOCK_K, 64] bf16 tiles
    (:func:`_decode_tile`), held in registers."""
    codes, words = _slot_source(raw_a, raw_s, s, BLOCK_K)
    return (_decode_tile(codes, words, raw_r, s, 0, PART, BLOCK_K),
            _decode_tile(codes, words, raw_r, s, 1, PART, BLOCK_K),
            _decode_tile(codes, words, raw_r, s, 2, PART, BLOCK_K),
            _decode_tile(codes, words, raw_r, s, 3, PART, BLOCK_K))


@gluon.jit
def _store_tiles(kb_rows, g0, g1, g2, g3):
    """Four [rows, 64] tiles into ``kb_rows`` [rows, 256]."""
    kb_rows.slice(0, 64, dim=1).store(g0)
    kb_rows.slice(64, 64, dim=1).store(g1)
    kb_rows.slice(128, 64, dim=1).store(g2)
    kb_rows.slice(192, 64, dim=1).store(g3)


@gluon.jit
def _decode_slot(raw_a, raw_r, raw_s, kb_rows, s, PART: gl.constexpr, BLOCK_K: gl.constexpr):
    """As :func:`_decode_regs`, into ``kb_rows`` (bf16 [BLOCK_K, 256]), each tile stored as
    soon as it is decoded (fewer registers live)."""
    codes, words = _slot_source(raw_a, raw_s, s, BLOCK_K)
    for t in gl.static_range(4):
        kb_rows.slice(t * 64, 64, dim=1).store(
            _decode_tile(codes, words, raw_r, s, t, PART, BLOCK_K))


@gluon.jit
def _consumer(q_lo, q_hi, raw_a, raw_r, raw_s, kb, idx_s, xbuf, q_bar, full, empty, xfull,
              xempty, pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main, n_raw,
              PART: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
              NIDX: gl.constexpr, AHEAD: gl.constexpr):
    """One warp group: channels [PART * 256, PART * 256 + 256) of all 64 heads. A step takes
    two raw slots (2 x BLOCK_K rows), decoded into ``kb`` (bf16 [2 * BLOCK_K, 256], this
    group's own), then as :func:`hwinfer.kernels.triton.sparse_mla_ws._consumer` with the QK
    split. AHEAD: the next step's first AHEAD slots are decoded into registers while this
    step's PV product runs, and stored to ``kb`` at the next step's start."""
    gl.static_assert(AHEAD <= 2)
    ROWS: gl.constexpr = 2 * BLOCK_K
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, ROWS, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    m = gl.full([64], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_l))  # finite: no NaN
    l = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, s_l))
    acc = gl.zeros([64, 256], gl.float32, layout=o_l)
    cols = gl.arange(0, ROWS, layout=gl.SliceLayout(0, s_l))
    second = cols >= BLOCK_K
    # a step's indices: two ring entries of idx_s
    idx_v = idx_s._reinterpret(idx_s.dtype, [NIDX // 2, ROWS],
                               gl.SwizzledSharedLayout(1, 1, 1, [0]))
    mbarrier.wait(q_bar, 0)
    n_steps = n_raw // 2
    if AHEAD > 0:   # step 0's first slots into registers
        mbarrier.wait(full.index(0), 0, pred=n_steps > 0)
        a0, a1, a2, a3 = _decode_regs(raw_a, raw_r, raw_s, 0, PART, BLOCK_K)
        if AHEAD == 2:
            mbarrier.wait(full.index(1 % STAGES), (1 // STAGES) & 1, pred=n_steps > 0)
            b0, b1, b2, b3 = _decode_regs(raw_a, raw_r, raw_s, 1 % STAGES, PART, BLOCK_K)
    for c in range(n_steps):
        if AHEAD > 0:
            _store_tiles(kb.slice(0, BLOCK_K), a0, a1, a2, a3)
        else:
            mbarrier.wait(full.index((2 * c) % STAGES), ((2 * c) // STAGES) & 1)
            _decode_slot(raw_a, raw_r, raw_s, kb.slice(0, BLOCK_K), (2 * c) % STAGES, PART,
                         BLOCK_K)
        if AHEAD == 2:
            _store_tiles(kb.slice(BLOCK_K, BLOCK_K), b0, b1, b2, b3)
        else:
            r = 2 * c + 1
            mbarrier.wait(full.index(r % STAGES), (r // STAGES) & 1)
            _decode_slot(raw_a, raw_r, raw_s, kb.slice(BLOCK_K, BLOCK_K), r % STAGES, PART,
                         BLOCK_K)
        idx = idx_v.index(c % (NIDX // 2)).load(gl.SliceLayout(0, s_l))
        # the slots' bytes are in kb now: back to the producer (after a barrier of this group);
        # kb was written through the generic proxy, wgmma reads it through the async one
        mbarrier.arrive(empty.index((2 * c) % STAGES))
        mbarrier.arrive(empty.index((2 * c + 1) % STAGES))
        hopper.fence_async_shared()
        _barrier()
        sc = gl.zeros([64, ROWS], gl.float32, layout=s_l)
        if PART == 0:
            sc = hopper.warpgroup_mma(q_lo, kb.permute((1, 0)), sc, use_acc=False)
        else:
            sc = hopper.warpgroup_mma(q_hi, kb.permute((1, 0)), sc, use_acc=False)
        sc = _exchange_logits(sc, xbuf, xfull, xempty, c, PART, s_l)
        # each half's list positions (the halves may lie in different lists)
        p0, end = _chunk_range(2 * c, n_main, lo, hi, K1, BLOCK_K)
        p0b, endb = _chunk_range(2 * c + 1, n_main, lo, hi, K1, BLOCK_K)
        ok = gl.where(second, p0b + cols - BLOCK_K < endb, p0 + cols < end) & (idx >= 0)
        p, alpha, m, l = _softmax_step(sc, ok, m, l, qk_scale)
        pa = gl.convert_layout(p.to(gl.bfloat16), p_l)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        if AHEAD > 0:
            acc = hopper.warpgroup_mma(pa, kb, acc, is_async=True)
            # under it: the next step's slots (if any; else stale ones, never stored)
            r = 2 * c + 2
            more = c + 1 < n_steps
            mbarrier.wait(full.index(r % STAGES), (r // STAGES) & 1, pred=more)
            a0, a1, a2, a3 = _decode_regs(raw_a, raw_r, raw_s, r % STAGES, PART, BLOCK_K)
            if AHEAD == 2:
                mbarrier.wait(full.index((r + 1) % STAGES), ((r + 1) // STAGES) & 1, pred=more)
                b0, b1, b2, b3 = _decode_regs(raw_a, raw_r, raw_s, (r + 1) % STAGES, PART,
                                              BLOCK_K)
            # kb is rewritten at the next step's start
            acc, pa = hopper.warpgroup_mma_wait(0, deps=[acc, pa])
        else:
            # synchronous: kb is rewritten by the next step's decode
            acc = hopper.warpgroup_mma(pa, kb, acc)
    _store_partials(acc, m, l, pm_ptr, pl_ptr, pacc_ptr, row0, PART, s_l, o_l)


@gluon.jit
def _sparse_mla_ws_fp8_kernel(q_ptr, kv_ptr, idx_ptr, kv2_ptr, idx2_ptr, pm_ptr, pl_ptr,
                              pacc_ptr, K1, K2, CHUNKS_PER_SPLIT, qk_scale, stride_qt,
                              stride_kv, stride_kv2, stride_it, stride_i2t,
                              BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr,
                              PRODUCER_WARPS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              PRODUCER_REGS: gl.constexpr, DECODE_AHEAD: gl.constexpr,
                              NIDX: gl.constexpr):
    t = gl.program_id(1).to(gl.int64)
    lo, hi, n_main, n_all = _split_bounds(K1, K2, CHUNKS_PER_SPLIT, BLOCK_K)
    # an even count of raw chunks (the last may be padding), and a ring of NIDX = 4 index
    # entries (two steps): chunk c + 4's indices overwrite chunk c's once the producer holds
    # chunk c + 4's slot, which the consumers release only after reading chunk c's step's
    # indices (so STAGES <= 4)
    gl.static_assert(STAGES <= 4 and NIDX == 4)
    n_raw = (n_all + 1) // 2 * 2

    bf16_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    q_lo = gl.allocate_shared_memory(gl.bfloat16, [64, 256], bf16_l)
    q_hi = gl.allocate_shared_memory(gl.bfloat16, [64, 256], bf16_l)
    raw_a = gl.allocate_shared_memory(gl.int64, [STAGES, BLOCK_K, 64], plain)
    raw_r = gl.allocate_shared_memory(gl.int64, [STAGES, BLOCK_K, 16], plain)
    raw_s = gl.allocate_shared_memory(gl.int64, [STAGES, BLOCK_K],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kb0 = gl.allocate_shared_memory(gl.bfloat16, [2 * BLOCK_K, 256], bf16_l)
    kb1 = gl.allocate_shared_memory(gl.bfloat16, [2 * BLOCK_K, 256], bf16_l)
    idx_s = gl.allocate_shared_memory(idx_ptr.dtype.element_ty, [NIDX, BLOCK_K],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pidx = gl.allocate_shared_memory(idx_ptr.dtype.element_ty, [BLOCK_K],
                                     gl.SwizzledSharedLayout(1, 1, 1, [0]))
    xbuf = gl.allocate_shared_memory(gl.float32, [2, 64, 2 * BLOCK_K], gl.NVMMASharedLayout(
        swizzle_byte_width=128, element_bitwidth=32, rank=2))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    xfull = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    xempty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    _init_barriers(q_bar, full, empty, xfull, xempty, STAGES, PRODUCER_WARPS)

    row0 = (t * gl.num_programs(0) + gl.program_id(0)) * 64
    gl.warp_specialize([
        (_consumer, (q_lo, q_hi, raw_a, raw_r, raw_s, kb0, idx_s, xbuf, q_bar, full, empty,
                     xfull, xempty, pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main,
                     n_raw, 0, BLOCK_K, STAGES, NIDX, DECODE_AHEAD)),
        (_consumer, (q_lo, q_hi, raw_a, raw_r, raw_s, kb1, idx_s, xbuf, q_bar, full, empty,
                     xfull, xempty, pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main,
                     n_raw, 1, BLOCK_K, STAGES, NIDX, DECODE_AHEAD)),
        (_producer, (q_ptr + t * stride_qt, kv_ptr, idx_ptr + t * stride_it, kv2_ptr,
                     idx2_ptr + t * stride_i2t, q_lo, q_hi, raw_a, raw_r, raw_s, idx_s, pidx,
                     q_bar, full, empty, stride_kv, stride_kv2, lo, hi, K1, n_main, n_all, n_raw,
                     BLOCK_K, STAGES, SUB, NIDX, PRODUCER_WARPS)),
    ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def ws_fp8_supported(q: torch.Tensor, kv_cache: torch.Tensor, v_dim: int | None,
                     extra_kv_cache: torch.Tensor | None) -> str | None:
    """Why this kernel cannot take a decode call (None: it can). q [B, S, H, D]."""
    cap = nvidia_capability(q.device)
    if cap != (9, 0):
        return "NVIDIA sm_90 only (wgmma)"
    if q.dtype != torch.bfloat16 or q.shape[-2:] != (HEADS, 512):
        return f"bf16 q with {HEADS} heads x 512 channels only, got {q.dtype} {tuple(q.shape[-2:])}"
    if (v_dim or 512) != 512:
        return f"v_dim 512 only, got {v_dim}"
    for name, cache in (("kv_cache", kv_cache), ("extra_kv_cache", extra_kv_cache)):
        if cache is not None and (cache.dtype != torch.uint8 or cache.shape[-1] != FP8_DS_BYTES
                                  or any(st % 8 for st in cache.stride()[:-1])
                                  or cache.data_ptr() % 16):
            return (f"{name}: packed fp8_ds_mla rows (uint8, {FP8_DS_BYTES} bytes, 8-byte "
                    "aligned) only")
    if q.stride(-1) != 1 or q.stride(-2) != 512 or q.data_ptr() % 16:
        return "q's heads must be contiguous rows of 512"
    return None


def sparse_mla_fp8_partials(q3: torch.Tensor, kv: torch.Tensor, stride_kv: int, idx: torch.Tensor,
                            kv2: torch.Tensor, stride_kv2: int, idx2: torch.Tensor, k2: int,
                            scale: float, num_splits: int | None = None):
    """As :func:`hwinfer.kernels.triton.sparse_mla_ws.sparse_mla_partials`, for packed rows:
    kv / kv2 uint8 caches [..., 584] (read as int64 words), row strides in bytes (multiples of
    8)."""
    t = q3.shape[0]
    k1 = idx.shape[1]
    if idx2.dtype != idx.dtype:
        idx, idx2 = idx.long(), idx2.long()
    cps, nsplit, pm, pl, pacc = split_partials(q3, k1 + k2, BLOCK_K, num_splits)
    _sparse_mla_ws_fp8_kernel[(nsplit, t)](
        q3, kv.view(torch.int64), idx, kv2.view(torch.int64), idx2, pm, pl, pacc, k1, k2, cps,
        scale * 1.4426950408889634, q3.stride(0), stride_kv // 8, stride_kv2 // 8, idx.stride(0),
        idx2.stride(0), **_constants(), num_warps=4)
    return pm, pl, pacc


def _constants(**change) -> dict:
    """The kernel's constexprs: the module constants, then ``change``."""
    return dict(dict(BLOCK_K=BLOCK_K, STAGES=STAGES, SUB=SUB, PRODUCER_WARPS=PRODUCER_WARPS,
                     CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
                     DECODE_AHEAD=DECODE_AHEAD, NIDX=NIDX), **change)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    names = set(_constants())
    sig = {n: ("constexpr" if n in names
               else "*bf16" if n == "q_ptr" else "*i64" if n in ("kv_ptr", "kv2_ptr")
               else "*i32" if n in ("idx_ptr", "idx2_ptr")
               else "*fp32" if n.endswith("_ptr") else "fp32" if n == "qk_scale" else "i32")
           for n in _sparse_mla_ws_fp8_kernel.arg_names}
    # row strides in words (73 a row) are not multiples of 16; pointers and q's stride are
    aligned = tuple(n for n in sig if n.endswith("_ptr") or n in ("stride_qt", "stride_it",
                                                                   "stride_i2t"))
    # the default and the other forms the bench times against it
    forms = {"": _constants(), ",decode_ahead0": _constants(DECODE_AHEAD=0)}
    return [AotSpec(f"sparse_mla_ws_fp8[dsv4{tag}]", _sparse_mla_ws_fp8_kernel, sig, consts,
                    {"num_warps": 4}, ("sm_90",), check_shared=True, divisible=aligned)
            for tag, consts in forms.items()]


AOT_SPECS = _aot_specs()
