"""Warp-specialised sparse MLA decode for NVIDIA Hopper, written in Gluon (Triton's explicit
layout / warp language). Contract: :func:`hwinfer.ops.sparse_mla.sparse_mla_decode`; selected by
:mod:`hwinfer.kernels.triton.sparse_mla` where :func:`ws_supported` accepts the call.

Why a second kernel: the Triton split kernel (``sparse_mla_kernels._sparse_mla_split_kernel``)
runs one 8-warp program an SM whose two warp groups share every step: the 64 x 64 logits are
split between them (the softmax's row maxima and the P operand cross through shared memory
with a barrier each chunk), and the gathered rows of the next chunk are the only thing in
flight while the MMAs and the softmax run one after the other. On the H200 it read 37% of the
bandwidth at B = 128 (docs/kernels.md). Here one program (token, split) has three partitions:

* a **producer** (PRODUCER_WARPS warps, 4 by default) gathers each chunk's BLOCK_K rows
  (``cp.async``, 16 bytes a copy, rows that are absent or -1 zero-filled) and the chunk's
  indices into a ring of STAGES shared-memory slots, and signals the slot's ``full`` barrier
  when its copies land. It loads the next chunk's indices while issuing this chunk's copies
  (PREFETCH_IDX): each 8-row copy group used to wait for its own index load first;
* two **consumer** warp groups, one per half of the 512 channels. With QK_SPLIT (the default)
  each computes the logits of its own 256 key channels (one wgmma of K = 256), publishes them
  in shared memory and adds the other group's (``xfull`` / ``xempty`` barriers, 2 x 16 KB):
  the minimal MMA work, and each group reads only its half of q and of the rows. Without it,
  each group computes the whole 64 x BLOCK_K logit tile itself (two wgmma) and nothing
  crosses between them, for 1.5x the MMA work. Either way the online softmax stays inside
  the group, P goes to the PV product from registers (the [64, 256] fp32 accumulator is 128
  registers a thread) and the group releases the slot (``empty``) once that product has read
  it.

It writes the split's partials (max, sum, unnormalised accumulator, log2 domain) and the
Triton merge kernel finishes every call (sinks, normalisation, inverse RoPE, cast), also with
one split.

Covers: q bf16 / fp16 with 64 heads and D = v_dim = 512 (DeepSeek-V4's latent rows, values
= the rows' first 512 channels), bf16 / fp16 rows of the same dtype (not the packed FP8
caches), int32 / int64 indices, the main and extra row lists; D = 576 with v_dim 512 (GLM-5:
64 RoPE channels after the latent, in their own shared buffers, ``ROPE_TUNING``). NVIDIA sm_90
only (wgmma); it cannot run under the Triton interpreter, so CI compiles it ahead of time
(sm_90) and only a card runs it (tests/kernels/test_sparse_mla_ws.py, skipped without one).
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from hwinfer.kernels.triton import num_sms, nvidia_capability

# A barrier of the calling partition's threads: ``gl.barrier`` from Triton 3.7 (CI),
# ``gl.thread_barrier`` in 3.6 (the card's)
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

HEADS = 64
HALF = 256    # value channels per consumer warp group (and the K of each QK product)
# Rows a chunk and ring slots: the shared memory is q (64 KB) + STAGES x BLOCK_K rows x 1 KB
# (192 KB at 2 x 64 or 4 x 32) + the QK split's partial logits (2 x 64 x BLOCK_K fp32, 32 KB):
# 225 KB of Hopper's 227 at 2 x 64. SUB: rows a producer copy group;
# PRODUCER_WARPS: warps that issue the copies (1, 2 or 4: the 9 warps are padded to 12 anyway).
# Registers a thread of the consumer worker and of the producer's warps (setmaxnreg; the
# default partition, consumer 0, gets the rest). H200, 22nd session (V4 HCA, 128 + 8,192 rows,
# B = 128; the Triton split kernel 690 us), one producer warp, QK twice: 4 x 32-row slots 655
# us, **2 x 64 552-568** (224 / 56 registers: 552), 64-row chunks spill 56 bytes at 216 / 64.
# H100, 23rd session (split kernel 728-736 us; docs/kernels.md): indices prefetched 562 -> 482,
# QK split 460, 2 / 4 producer warps 456 / 429, **4 warps + QK split 405-422** (the default;
# 90% of the card's 3,024 GB/s copy bandwidth); 4 x 32-row slots 470, SUB = 16 408, OVERLAP 486.
BLOCK_K = 64
STAGES = 2
SUB = 8
PRODUCER_WARPS = 4
CONSUMER_REGS = 224
PRODUCER_REGS = 56
# Consumers keep their PV product in flight across the next slot's wait (see _consumer): 655 ->
# 613 us with 32-row chunks, 552 -> 639 us with 64-row ones (H200, 22nd session); with the
# QK split 411 -> 486 (H100, 23rd): off.
OVERLAP = False
# The producer loads each chunk's indices one chunk ahead (one coalesced load, staged through
# shared memory) instead of eight dependent loads a chunk, one before each 8-row copy group
# (its compiled code waited on each; H100: 562 -> 482 us with one producer warp, 435 -> 408
# with four and the QK split).
PREFETCH_IDX = True
# The consumers split the QK product by key channels (each its own 256, K = 256) and add the
# other's partial logits through shared memory (2 x 16 KB, two barriers a chunk): the minimal
# MMA work and half the q / row reads of shared memory, for the two groups in lockstep (H100:
# 482 -> 460 us with one producer warp, 429 -> 405-422 with four).
QK_SPLIT = True
# GLM-5's 576-wide rows (q and rows: 512 latent + 64 RoPE channels, values the first 512): the
# RoPE parts take q 8 KB and 8 KB a 64-row slot more, so the QK split's 32 KB of exchanged logits
# no longer fit beside 2 x 64-row slots (248 KB). These constants replace the ones above for
# them: 3 x 32-row slots with the QK split (197 KB). H100, 24th session (2,048 rows): B = 128
# Triton kernel 213.5 us -> 135.3 (78% of the copy bandwidth); 2 x 64-row slots with each group
# computing the whole logit tile (217 KB; 56 bytes a thread spilled) 159.1; B = 32 78.7 -> 48.3
# (52.8).
ROPE_TUNING = dict(BLOCK_K=32, STAGES=3, QK_SPLIT=True, CONSUMER_REGS=216, PRODUCER_REGS=64)


@gluon.jit
def _chunk_range(c, n_main, lo, hi, K1, BLOCK_K: gl.constexpr):
    """Chunk c's first list position and end: the main list's chunks, then the extra list's."""
    if c < n_main:
        p0 = lo + c * BLOCK_K
        end = gl.minimum(hi, K1)
    else:
        p0 = gl.maximum(lo, K1) - K1 + (c - n_main) * BLOCK_K
        end = hi - K1
    return p0, end


@gluon.jit
def _chunk_indices(c, idx_ptr, idx2_ptr, n_main, n_all, lo, hi, K1, BLOCK_K: gl.constexpr,
                   layout: gl.constexpr):
    """Chunk c's BLOCK_K row indices, -1 past its list's end or past the last chunk."""
    p0, end = _chunk_range(c, n_main, lo, hi, K1, BLOCK_K)
    if c < n_main:
        ip = idx_ptr
    else:
        ip = idx2_ptr
    pos = p0 + gl.arange(0, BLOCK_K, layout=layout)
    return gl.load(ip + pos, mask=(pos < end) & (c < n_all), other=-1)


@gluon.jit
def _chunk_source(c, n_main, idx_ptr, kv_ptr, stride_kv, idx2_ptr, kv2_ptr, stride_kv2):
    """Chunk c's index list, rows and row stride: the main list's, then the extra list's."""
    if c < n_main:
        ip = idx_ptr
        kp = kv_ptr
        sk = stride_kv
    else:
        ip = idx2_ptr
        kp = kv2_ptr
        sk = stride_kv2
    return ip, kp, sk


@gluon.jit
def _load_q(q_ptr, q_lo, q_hi, q_r, q_bar, SUB: gl.constexpr, WARPS: gl.constexpr,
            ROPE: gl.constexpr):
    """The token's q (64 heads x (512 + ROPE), bf16 / fp16) into shared memory as two [64, 256]
    halves and (ROPE = 64) its [64, 64] RoPE channels; ``q_bar`` completes when the copies
    land."""
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])   # [SUB, 256]
    cols = gl.arange(0, 256, layout=gl.SliceLayout(0, q_l))
    for j in gl.static_range(64 // SUB):
        h = j * SUB + gl.arange(0, SUB, layout=gl.SliceLayout(1, q_l))
        qp = q_ptr + h[:, None] * (512 + ROPE) + cols[None, :]
        async_copy.async_copy_global_to_shared(q_lo.slice(j * SUB, SUB), qp)
        async_copy.async_copy_global_to_shared(q_hi.slice(j * SUB, SUB), qp + 256)
        if ROPE > 0:
            _copy_rope(q_r.slice(j * SUB, SUB), q_ptr + 512, j * SUB, 512 + ROPE, None, SUB,
                       WARPS)
    async_copy.mbarrier_arrive(q_bar, increment_count=False)


@gluon.jit
def _copy_rope(dst, base, r0, stride, rows_idx, SUB: gl.constexpr, WARPS: gl.constexpr):
    """SUB rows' 64 RoPE channels (8-byte pieces: a copy group's [SUB, 64] has no more than
    one piece a thread) into ``dst`` [SUB, 64]: row i at ``base + (r0 + i) * stride``, or
    (``rows_idx`` given: the rows' indices) at ``base + rows_idx[i] * stride``, zero-filled
    where the index is negative."""
    r_l: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [WARPS, 1], [1, 0])   # [SUB, 64]
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, r_l))
    if rows_idx is None:
        rows = (r0 + gl.arange(0, SUB, layout=gl.SliceLayout(1, r_l))).to(gl.int64) * stride
        async_copy.async_copy_global_to_shared(dst, base + rows[:, None] + c[None, :])
    else:
        idx = gl.convert_layout(rows_idx, gl.SliceLayout(1, r_l))
        rows = gl.where(idx >= 0, idx, 0).to(gl.int64) * stride
        async_copy.async_copy_global_to_shared(dst, base + rows[:, None] + c[None, :],
                                               mask=(idx >= 0)[:, None])


@gluon.jit
def _producer(q_ptr, kv_ptr, idx_ptr, kv2_ptr, idx2_ptr, q_lo, q_hi, q_r, k_lo, k_hi, k_r, idx_s,
              pidx, q_bar, full, empty, stride_kv, stride_kv2, lo, hi, K1, n_main, n_all,
              BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SUB: gl.constexpr,
              PREFETCH_IDX: gl.constexpr, WARPS: gl.constexpr, ROPE: gl.constexpr):
    """WARPS warps (1, 2 or 4; a copy group's SUB rows split between them): the token's q (its
    64 heads' 512 channels) into shared memory (``q_bar``), then chunk c's rows into slot
    c % STAGES once both consumers have released it. PREFETCH_IDX: the next chunk's indices are
    loaded while this chunk's copies are issued, and each copy group reads its rows' indices
    from ``pidx`` (shared memory, the producer's own). ROPE = 64: rows of 576 (GLM-5), whose
    last 64 channels go to ``k_r``."""
    rows_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])   # [SUB, 256]
    idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    cols = gl.arange(0, 256, layout=gl.SliceLayout(0, rows_l))
    _load_q(q_ptr, q_lo, q_hi, q_r, q_bar, SUB, WARPS, ROPE)
    if PREFETCH_IDX:
        nxt = _chunk_indices(0, idx_ptr, idx2_ptr, n_main, n_all, lo, hi, K1, BLOCK_K, idx_l)
    for c in range(n_all):
        if PREFETCH_IDX:
            cur = nxt
            # in flight while this chunk waits for its slot and issues its copies
            nxt = _chunk_indices(c + 1, idx_ptr, idx2_ptr, n_main, n_all, lo, hi, K1, BLOCK_K,
                                 idx_l)
        s = c % STAGES
        # a fresh barrier's "previous" phase counts as complete: the first round does not wait
        mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
        p0, end = _chunk_range(c, n_main, lo, hi, K1, BLOCK_K)
        ip, kp, sk = _chunk_source(c, n_main, idx_ptr, kv_ptr, stride_kv, idx2_ptr, kv2_ptr,
                                   stride_kv2)
        pos = p0 + gl.arange(0, BLOCK_K, layout=idx_l)
        async_copy.async_copy_global_to_shared(idx_s.index(s), ip + pos, mask=pos < end)
        if PREFETCH_IDX:
            _barrier()   # the last chunk's reads of pidx are done
            pidx.store(cur)
            _barrier()
        for j in gl.static_range(BLOCK_K // SUB):
            if PREFETCH_IDX:
                idx = pidx.slice(j * SUB, SUB).load(gl.SliceLayout(1, rows_l))
            else:
                r = p0 + j * SUB + gl.arange(0, SUB, layout=gl.SliceLayout(1, rows_l))
                idx = gl.load(ip + r, mask=r < end, other=-1)
            ok = idx >= 0
            row = kp + gl.where(ok, idx, 0).to(gl.int64) * sk
            ptr = row[:, None] + cols[None, :]
            async_copy.async_copy_global_to_shared(k_lo.index(s).slice(j * SUB, SUB), ptr,
                                                   mask=ok[:, None])
            async_copy.async_copy_global_to_shared(k_hi.index(s).slice(j * SUB, SUB), ptr + 256,
                                                   mask=ok[:, None])
            if ROPE > 0:
                _copy_rope(k_r.index(s).slice(j * SUB, SUB), kp + 512, 0, sk, idx, SUB, WARPS)
        # full[s] completes when every lane's copies so far have landed (count: 32 lanes)
        async_copy.mbarrier_arrive(full.index(s), increment_count=False)


@gluon.jit
def _split_bounds(K1, K2, CHUNKS_PER_SPLIT, BLOCK_K: gl.constexpr):
    """This program's split: its list positions [lo, hi) of the main + extra lists, and its
    chunks in the main list and in all."""
    lo = gl.program_id(0) * CHUNKS_PER_SPLIT * BLOCK_K
    hi = gl.minimum(lo + CHUNKS_PER_SPLIT * BLOCK_K, K1 + K2)
    n_main = (gl.maximum(gl.minimum(hi, K1) - lo, 0) + BLOCK_K - 1) // BLOCK_K
    n_all = n_main + (gl.maximum(hi - gl.maximum(lo, K1), 0) + BLOCK_K - 1) // BLOCK_K
    return lo, hi, n_main, n_all


@gluon.jit
def _init_barriers(q_bar, full, empty, xfull, xempty, STAGES: gl.constexpr,
                   PRODUCER_WARPS: gl.constexpr):
    """q and ``full`` complete on every producer thread's copies; ``empty`` on both consumers;
    the logit exchange's on one group each."""
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=32 * PRODUCER_WARPS)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(xfull.index(i), count=1)
        mbarrier.init(xempty.index(i), count=1)
    mbarrier.init(q_bar, count=32 * PRODUCER_WARPS)


@gluon.jit
def _exchange_logits(sc, xbuf, xfull, xempty, c, PART: gl.constexpr, s_l: gl.constexpr):
    """QK split: publish this group's partial logits of chunk c, return them plus the other
    group's. A group overwrites its buffer only once the other has read the last one."""
    # a fresh barrier's "previous" phase counts as complete: chunk 0 does not wait
    mbarrier.wait(xempty.index(PART), (c & 1) ^ 1)
    xbuf.index(PART).store(sc)
    mbarrier.arrive(xfull.index(PART))   # after a barrier of this group: all stored
    mbarrier.wait(xfull.index(1 - PART), c & 1)
    sc = sc + xbuf.index(1 - PART).load(s_l)
    mbarrier.arrive(xempty.index(1 - PART))
    return sc


@gluon.jit
def _softmax_step(sc, ok, m, l, qk_scale):
    """One chunk of the online softmax (log2 domain): logits sc [64, BLOCK_K] where ``ok``
    [BLOCK_K] -> (P, the accumulator's rescale factor, the new row max and sum)."""
    sc = gl.where(ok[None, :], sc * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(sc, axis=1))
    alpha = gl.exp2(m - m_new)
    p = gl.exp2(sc - m_new[:, None])
    return p, alpha, m_new, l * alpha + gl.sum(p, axis=1)


@gluon.jit
def _store_partials(acc, m, l, pm_ptr, pl_ptr, pacc_ptr, row0, PART: gl.constexpr,
                    s_l: gl.constexpr, o_l: gl.constexpr):
    """This group's [64, 256] accumulator, and (group 0) the row max and sum, of one split."""
    heads = gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
    ch = PART * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, o_l))
    gl.store(pacc_ptr + (row0 + heads).to(gl.int64)[:, None] * 512 + ch[None, :], acc)
    if PART == 0:
        hs = gl.arange(0, 64, layout=gl.SliceLayout(1, s_l))
        gl.store(pm_ptr + row0 + hs, m)
        gl.store(pl_ptr + row0 + hs, l)


@gluon.jit
def _consumer(q_lo, q_hi, q_r, k_lo, k_hi, k_r, idx_s, xbuf, q_bar, full, empty, xfull, xempty,
              pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main, n_all,
              PART: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
              OVERLAP: gl.constexpr, QK_SPLIT: gl.constexpr, ROPE: gl.constexpr):
    """One warp group: value channels [PART * 256, PART * 256 + 256) of all 64 heads.
    OVERLAP: the PV product is left in flight while the next chunk's slot is awaited and its QK
    products issued (the slot goes back to the producer one chunk later); else every product
    is waited for where it is issued. QK_SPLIT: the logits from this group's 256 key channels
    plus the other group's partial (``xbuf[1 - PART]``, ready on ``xfull``; a group overwrites
    its own partial once the other has read it, ``xempty``). ROPE = 64: the RoPE channels'
    product q_r k_r^T joins the logits (group 0's with the QK split; not with OVERLAP)."""
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_K, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 256, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    m = gl.full([64], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_l))  # finite: no NaN
    l = gl.zeros([64], gl.float32, layout=gl.SliceLayout(1, s_l))
    acc = gl.zeros([64, 256], gl.float32, layout=o_l)
    if OVERLAP:
        acc = hopper.warpgroup_mma_init(acc)
        pa = gl.zeros([64, BLOCK_K], q_lo.dtype, layout=p_l)
        prev = 0
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, s_l))
    mbarrier.wait(q_bar, 0)
    for c in range(n_all):
        s = c % STAGES
        mbarrier.wait(full.index(s), (c // STAGES) & 1)
        # cp.async wrote the slot (and q) through the generic proxy; wgmma reads it through the
        # async one
        hopper.fence_async_shared()
        kl = k_lo.index(s)
        kh = k_hi.index(s)
        sc = gl.zeros([64, BLOCK_K], gl.float32, layout=s_l)
        if QK_SPLIT:
            if PART == 0:
                sc = hopper.warpgroup_mma(q_lo, kl.permute((1, 0)), sc, use_acc=False)
                if ROPE > 0:
                    sc = hopper.warpgroup_mma(q_r, k_r.index(s).permute((1, 0)), sc)
            else:
                sc = hopper.warpgroup_mma(q_hi, kh.permute((1, 0)), sc, use_acc=False)
            if OVERLAP:   # the previous chunk's PV product is done: its slot goes back
                acc, pa = hopper.warpgroup_mma_wait(0, deps=[acc, pa])
                mbarrier.arrive(empty.index(prev), pred=c > 0)
            sc = _exchange_logits(sc, xbuf, xfull, xempty, c, PART, s_l)
        elif OVERLAP:
            sc = hopper.warpgroup_mma(q_lo, kl.permute((1, 0)), sc, use_acc=False, is_async=True)
            sc = hopper.warpgroup_mma(q_hi, kh.permute((1, 0)), sc, is_async=True)
            # the previous chunk's PV product went in before these two: with at most two in
            # flight it is done, and its slot goes back to the producer
            acc, pa = hopper.warpgroup_mma_wait(2, deps=[acc, pa])
            mbarrier.arrive(empty.index(prev), pred=c > 0)
            sc = hopper.warpgroup_mma_wait(0, deps=[sc])
        else:
            sc = hopper.warpgroup_mma(q_lo, kl.permute((1, 0)), sc, use_acc=False)
            sc = hopper.warpgroup_mma(q_hi, kh.permute((1, 0)), sc)
            if ROPE > 0:
                sc = hopper.warpgroup_mma(q_r, k_r.index(s).permute((1, 0)), sc)
        p0, end = _chunk_range(c, n_main, lo, hi, K1, BLOCK_K)
        idx = idx_s.index(s).load(gl.SliceLayout(0, s_l))
        ok = (p0 + cols < end) & (idx >= 0)
        p, alpha, m, l = _softmax_step(sc, ok, m, l, qk_scale)
        pa = gl.convert_layout(p.to(q_lo.dtype), p_l)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        if PART == 0:
            v = kl
        else:
            v = kh
        if OVERLAP:
            acc = hopper.warpgroup_mma(pa, v, acc, is_async=True)
            prev = s
        else:
            acc = hopper.warpgroup_mma(pa, v, acc)
            mbarrier.arrive(empty.index(s))
    if OVERLAP:
        acc, pa = hopper.warpgroup_mma_wait(0, deps=[acc, pa])
    _store_partials(acc, m, l, pm_ptr, pl_ptr, pacc_ptr, row0, PART, s_l, o_l)


@gluon.jit
def _sparse_mla_ws_kernel(q_ptr, kv_ptr, idx_ptr, kv2_ptr, idx2_ptr, pm_ptr, pl_ptr, pacc_ptr,
                          K1, K2, CHUNKS_PER_SPLIT, qk_scale, stride_qt, stride_kv, stride_kv2,
                          stride_it, stride_i2t, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                          SUB: gl.constexpr, PRODUCER_WARPS: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr,
                          PRODUCER_REGS: gl.constexpr, OVERLAP: gl.constexpr,
                          PREFETCH_IDX: gl.constexpr, QK_SPLIT: gl.constexpr,
                          XROWS: gl.constexpr, ROPE: gl.constexpr):
    t = gl.program_id(1).to(gl.int64)
    lo, hi, n_main, n_all = _split_bounds(K1, K2, CHUNKS_PER_SPLIT, BLOCK_K)

    smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dt: gl.constexpr = q_ptr.dtype.element_ty
    q_lo = gl.allocate_shared_memory(dt, [64, 256], smem_l)
    q_hi = gl.allocate_shared_memory(dt, [64, 256], smem_l)
    k_lo = gl.allocate_shared_memory(dt, [STAGES, BLOCK_K, 256], smem_l)
    k_hi = gl.allocate_shared_memory(dt, [STAGES, BLOCK_K, 256], smem_l)
    if ROPE > 0:   # GLM-5's 576-wide rows: their RoPE channels (else unused stand-ins)
        gl.static_assert(ROPE == 64 and not OVERLAP)
        q_r = gl.allocate_shared_memory(dt, [64, ROPE], smem_l)
        k_r = gl.allocate_shared_memory(dt, [STAGES, BLOCK_K, ROPE], smem_l)
    else:
        q_r = q_lo
        k_r = k_lo
    idx_s = gl.allocate_shared_memory(idx_ptr.dtype.element_ty, [STAGES, BLOCK_K],
                                      gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pidx = gl.allocate_shared_memory(idx_ptr.dtype.element_ty, [BLOCK_K],
                                     gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # the consumers' partial logits (QK_SPLIT; else a token [2, 1, BLOCK_K] that is never used)
    # (128-byte swizzle: 1 bank conflict a wavefront from the wgmma layout, an unswizzled 3)
    xbuf = gl.allocate_shared_memory(gl.float32, [2, XROWS, BLOCK_K], gl.NVMMASharedLayout(
        swizzle_byte_width=128, element_bitwidth=32, rank=2))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    xfull = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    xempty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    _init_barriers(q_bar, full, empty, xfull, xempty, STAGES, PRODUCER_WARPS)

    row0 = (t * gl.num_programs(0) + gl.program_id(0)) * 64
    # default partition (this program's 4 warps): consumer 0; workers: consumer 1, the producer
    gl.warp_specialize([
        (_consumer, (q_lo, q_hi, q_r, k_lo, k_hi, k_r, idx_s, xbuf, q_bar, full, empty, xfull,
                     xempty, pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main, n_all,
                     0, BLOCK_K, STAGES, OVERLAP, QK_SPLIT, ROPE)),
        (_consumer, (q_lo, q_hi, q_r, k_lo, k_hi, k_r, idx_s, xbuf, q_bar, full, empty, xfull,
                     xempty, pm_ptr, pl_ptr, pacc_ptr, row0, qk_scale, lo, hi, K1, n_main, n_all,
                     1, BLOCK_K, STAGES, OVERLAP, QK_SPLIT, ROPE)),
        (_producer, (q_ptr + t * stride_qt, kv_ptr, idx_ptr + t * stride_it, kv2_ptr,
                     idx2_ptr + t * stride_i2t, q_lo, q_hi, q_r, k_lo, k_hi, k_r, idx_s, pidx,
                     q_bar, full, empty, stride_kv, stride_kv2, lo, hi, K1, n_main, n_all,
                     BLOCK_K, STAGES, SUB, PREFETCH_IDX, PRODUCER_WARPS, ROPE)),
    ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


# Splits of a token's rows: FILL_WAVES picks the count that fills the last wave of programs best
# (one program an SM: 225 KB of shared memory), else the old rule, ceil(WAVES x SMs / tokens)
# (B = 32 on 132 SMs: 5 splits, 160 programs, a second wave 21% full; H100, HCA B = 32: 168.7
# -> 112.9 us, B = 128 425.1 -> 408.2). A split takes at least MIN_ROWS index rows (each
# writes a [64, 512] fp32 partial).
FILL_WAVES = True
WAVES = 1.0
MIN_ROWS = 256


def pick_splits(tokens: int, rows: int, sms: int) -> int:
    """Splits per token: among 1 .. rows // MIN_ROWS (and at most two waves' worth: each split
    costs a partial), the one whose programs (tokens x splits) leave the fewest SMs idle in
    their last wave, the smallest on a tie. Asked on every decode call: cached per shape (and
    the module constants, which the bench changes)."""
    return _pick_splits(tokens, rows, sms, FILL_WAVES, WAVES, MIN_ROWS)


@functools.lru_cache(maxsize=4096)
def _pick_splits(tokens: int, rows: int, sms: int, fill: bool, waves: float,
                 min_rows: int) -> int:
    most = max(1, rows // min_rows)
    if not fill:
        return max(1, min(triton.cdiv(int(waves * sms), tokens), most))
    most = min(most, triton.cdiv(2 * sms, tokens))

    def used(n: int) -> float:   # the fraction of the SM-waves that run a program
        programs = tokens * n
        return programs / (sms * triton.cdiv(programs, sms))
    return max(range(1, most + 1), key=lambda n: (round(used(n), 2), -n))


def split_partials(q3: torch.Tensor, rows: int, block_k: int, num_splits: int | None):
    """Chunks a split and splits (``pick_splits`` unless given) for ``rows`` index rows a token
    in chunks of block_k, and the empty fp32 partials (m, l [t, n, 64], acc [t, n, 64, 512])."""
    t = q3.shape[0]
    chunks = max(1, triton.cdiv(rows, block_k))
    if num_splits is None:
        num_splits = pick_splits(t, rows, num_sms(q3.device, 132))
    cps = triton.cdiv(chunks, max(1, min(num_splits, chunks)))
    nsplit = triton.cdiv(chunks, cps)
    f32 = dict(dtype=torch.float32, device=q3.device)
    return (cps, nsplit, torch.empty((t, nsplit, HEADS), **f32),
            torch.empty((t, nsplit, HEADS), **f32), torch.empty((t, nsplit, HEADS, 512), **f32))


def ws_supported(q: torch.Tensor, kv_cache: torch.Tensor, v_dim: int | None,
                 extra_kv_cache: torch.Tensor | None) -> str | None:
    """Why this kernel cannot take a decode call (None: it can). q [B, S, H, D]."""
    cap = nvidia_capability(q.device)
    if cap is None:
        return "NVIDIA GPUs only"
    if cap != (9, 0):
        return f"sm_90 only (wgmma), got sm_{cap[0]}{cap[1]}"
    d = q.shape[-1]
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-2] != HEADS or d not in (512, 576):
        return (f"bf16 / fp16 q with {HEADS} heads x 512 or 576 channels only, got {q.dtype} "
                f"{tuple(q.shape[-2:])}")
    if (v_dim or d) != 512:
        return f"v_dim 512 only (the rows' first 512 channels), got {v_dim or d}"
    for name, cache in (("kv_cache", kv_cache), ("extra_kv_cache", extra_kv_cache)):
        if cache is not None and (cache.dtype != q.dtype or cache.shape[-1] != d
                                  or cache.stride(1) % 16 or cache.data_ptr() % 16):
            return f"{name}: {q.dtype} rows of {d} channels, 32-byte aligned, only"
    if q.stride(-1) != 1 or q.stride(-2) != d or q.data_ptr() % 16:
        return f"q's heads must be contiguous rows of {d}"
    return None


def sparse_mla_partials(q3: torch.Tensor, kv: torch.Tensor, stride_kv: int, idx: torch.Tensor,
                        kv2: torch.Tensor, stride_kv2: int, idx2: torch.Tensor, k2: int,
                        scale: float, num_splits: int | None = None):
    """The split partials of one decode call: q3 [t, 64, D] (D 512, or 576 with 64 RoPE
    channels: GLM-5), rows kv [*, D] (row stride
    ``stride_kv``) picked by idx [t, K1], kv2 by idx2 [t, k2] (k2 may be 0) -> (m [t, n, 64],
    l [t, n, 64], acc [t, n, 64, 512]) fp32 with n splits, m in the log2 domain (what
    ``sparse_mla_kernels._sparse_mla_merge_kernel`` reads)."""
    t = q3.shape[0]
    k1 = idx.shape[1]
    if idx2.dtype != idx.dtype:   # one index type a kernel (the lists share its loads)
        idx, idx2 = idx.long(), idx2.long()
    consts = _constants(q3.shape[2] - 512)
    cps, nsplit, pm, pl, pacc = split_partials(q3, k1 + k2, consts["BLOCK_K"], num_splits)
    _sparse_mla_ws_kernel[(nsplit, t)](
        q3, kv, idx, kv2, idx2, pm, pl, pacc, k1, k2, cps, scale * 1.4426950408889634,
        q3.stride(0), stride_kv, stride_kv2, idx.stride(0), idx2.stride(0), **consts,
        num_warps=4)
    return pm, pl, pacc


def _constants(rope: int, **change) -> dict:
    """The kernel's constexprs: the module constants (ROPE_TUNING's over them for rope > 0),
    then ``change``."""
    consts = dict(BLOCK_K=BLOCK_K, STAGES=STAGES, SUB=SUB, PRODUCER_WARPS=PRODUCER_WARPS,
                  CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, OVERLAP=OVERLAP,
                  PREFETCH_IDX=PREFETCH_IDX, QK_SPLIT=QK_SPLIT)
    consts.update(ROPE_TUNING if rope else {}, **change)
    return dict(consts, XROWS=64 if consts["QK_SPLIT"] else 1, ROPE=rope)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    consts = _constants(0)
    sig = {n: ("constexpr" if n in consts
               else "*bf16" if n in ("q_ptr", "kv_ptr", "kv2_ptr")
               else "*i32" if n in ("idx_ptr", "idx2_ptr")
               else "*fp32" if n.endswith("_ptr") else "fp32" if n == "qk_scale" else "i32")
           for n in _sparse_mla_ws_kernel.arg_names}
    aligned = tuple(n for n in sig if n.endswith("_ptr") or n.startswith("stride"))
    # the default, and the forms the bench times against it; GLM-5's 576-wide rows
    forms = {"dsv4,bf16": _constants(0), "dsv4,bf16,overlap": _constants(0, OVERLAP=not OVERLAP),
             f"dsv4,bf16,{'qk_twice' if QK_SPLIT else 'qk_split'}": _constants(
                 0, QK_SPLIT=not QK_SPLIT),
             "glm5,bf16": _constants(64),
             "glm5,bf16,k64,qk_twice": _constants(64, BLOCK_K=64, STAGES=2, QK_SPLIT=False,
                                                  CONSUMER_REGS=232, PRODUCER_REGS=40)}
    return [AotSpec(f"sparse_mla_ws[{tag}]", _sparse_mla_ws_kernel, sig, consts,
                    {"num_warps": 4}, ("sm_90",), check_shared=True, divisible=aligned)
            for tag, consts in forms.items()]


AOT_SPECS = _aot_specs()
