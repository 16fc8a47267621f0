"""Triton grouped expert GEMMs (contracts: :mod:`hwinfer.ops.moe_experts`: ``moe_experts``,
``moe_experts_fp8``, ``moe_experts_fp4``; :mod:`hwinfer.ops.moe_latent`: ``latent_moe``, the
same pipeline between its two latent projections).

Pipeline (no host sync anywhere, so decode can be captured in a CUDA graph):

1. ``moe_tiles.route_tiles`` (torch ops on device): the T*k (token, slot) pairs are sorted by
   expert and every expert's segment is padded to a multiple of BM rows, so a BM-row tile
   belongs to one expert. The tile count has a fixed bound, ``min(T*k, ceil(T*k/BM) + E)``;
   tiles past the used ones carry expert -1 and their programs exit at once. Only experts some
   pair chose are ever read, which is what decode (weight-bandwidth bound) needs.
2. ``_gemm1_kernel``: h = glu(x_tok @ w13_e^T) for one tile x BN columns of I; gate and up are
   two accumulators over the same x tile; the activation (with its clamp) is fused.
3. ``_gemm2_kernel``: y_pair = weight_pair * (h @ w2_e^T), one fp32 row per (token, slot).
4. ``_sum_kernel``: y_t = sum over the token's valid slots (no atomics), cast once to x.dtype.

Calls of at most ``GEMV_MAX_PAIRS`` (token, slot) pairs (decode) run :mod:`.moe_gemv` instead
of steps 1-3 (``DECODE_FORM``): one program per pair, no sort.

Quantized weights are dequantized in registers, tile by tile (``moe_tiles.a_tile`` /
``w_step``): FP8 e4m3 bytes are decoded exactly to fp32 (one multiply) and the 128x128 block
scale multiplies the partial dot product (the K step never straddles a scale block); packed e2m1
codes are decoded the same way and scaled per 32-group (one scale load a group), and the even /
odd columns meet x's even / odd columns in two dots (no interleave). GEMM1's gate and up share
one activation tile. On sm_100 the FP4 path can instead hand the packed bytes and UE8M0 scales
to ``tl.dot_scaled``.
GEMM1 dots run in bf16 (fp32 accumulate) when x is bf16, in fp32 "ieee" otherwise and always
under the interpreter (whose bf16 dot is wrong); the activation h stays fp32 and GEMM2 meets it
as two bf16 parts (``moe_tiles.DOT_SPLIT``) on tensor cores.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, moe_gemv, num_sms, nvidia_capability
from hwinfer.kernels.triton.moe_gemv import gemv_ok, run_gemvs
from hwinfer.kernels.triton.moe_tiles import (
    ACT_CODES, DOT_BF16, DOT_IEEE, DOT_SPLIT, a_tile, align_small, gate_up_rows, glu_act, kstep,
    route_tiles, w_step,
)
from hwinfer.ops.moe_experts import check_activation, check_expert_shapes
from hwinfer.ops.moe_latent import check_latent

DENSE, FP8, FP4 = 0, 1, 2


@triton.jit
def _gemm1_kernel(x_ptr, pair_ptr, tile_e_ptr, w_ptr, s_ptr, h_ptr,
                  H, I, TOPK, TK, stride_x, stride_we, stride_wn, stride_se, stride_sn,
                  stride_sk, stride_h, up_srow, limit, alpha, beta, lin_beta,
                  WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB0: tl.constexpr,
                  SB1: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
                  HAS_LIN: tl.constexpr, DOT: tl.constexpr, SCALED: tl.constexpr,
                  GROUPS: tl.constexpr, A_PAIRS: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  SWAP: tl.constexpr = False):
    """h[tile rows, n-block] = glu(gate, up), gate/up = x[tok] @ w13_e[n | I+n]^T (with SWAP
    the accumulators are the transposes, [BN, BM])."""
    tile = tl.program_id(0)
    e = tl.load(tile_e_ptr + tile)
    if e < 0:
        return
    rows = tile * BM + tl.arange(0, BM)
    pair = tl.load(pair_ptr + rows)
    r_mask = (pair < TK)[:, None]
    tok = tl.where(pair < TK, pair // TOPK, 0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = (n < I)[None, :]
    a_rows = x_ptr + tok.to(tl.int64)[:, None] * stride_x
    g_w, u_w, g_s, u_s = gate_up_rows(w_ptr, s_ptr, e, n[None, :], I, up_srow, stride_we,
                                      stride_wn, stride_se, stride_sn, WFMT, SB0)
    shape: tl.constexpr = (BN, BM) if SWAP else (BM, BN)
    acc_g = tl.zeros(shape, dtype=tl.float32)
    acc_u = tl.zeros(shape, dtype=tl.float32)
    for k0 in range(0, H, BK):  # gate and up meet the same activation tile
        a0, a1 = a_tile(a_rows, r_mask, k0, H, WFMT, SCALED, A_PAIRS, BK)
        acc_g = w_step(acc_g, a0, a1, k0, H, g_w, g_s, stride_sk, n_mask,
                       WFMT, SCALE_U8, SB1, DOT, SCALED, GROUPS, BK, SWAP)
        acc_u = w_step(acc_u, a0, a1, k0, H, u_w, u_s, stride_sk, n_mask,
                       WFMT, SCALE_U8, SB1, DOT, SCALED, GROUPS, BK, SWAP)
    h = glu_act(acc_g, acc_u, limit, alpha, beta, lin_beta, ACT, HAS_LIMIT, HAS_LIN)
    if SWAP:
        tl.store(h_ptr + rows.to(tl.int64)[None, :] * stride_h + n[:, None],
                 h.to(h_ptr.dtype.element_ty), mask=(n < I)[:, None])
    else:
        tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_h + n[None, :],
                 h.to(h_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _gemm2_kernel(h_ptr, pair_ptr, tile_e_ptr, rw_ptr, w_ptr, s_ptr, y_ptr,
                  H, I, TK, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
                  stride_y, WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB0: tl.constexpr,
                  SB1: tl.constexpr, DOT: tl.constexpr, SCALED: tl.constexpr,
                  GROUPS: tl.constexpr, A_PAIRS: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  SWAP: tl.constexpr = False):
    """y[pair, n-block] = routing weight * (h[tile rows] @ w2_e[n]^T), valid pairs only (SWAP:
    accumulated transposed, [BN, BM])."""
    tile = tl.program_id(0)
    e = tl.load(tile_e_ptr + tile)
    if e < 0:
        return
    rows = tile * BM + tl.arange(0, BM)
    pair = tl.load(pair_ptr + rows)
    valid = pair < TK
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = (n < H)[None, :]
    a_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_h
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    if WFMT == 1:
        srow = n // SB0
    else:
        srow = n
    w_rows = w_e + n[None, :].to(tl.int64) * stride_wn
    s_rows = s_e + srow[None, :] * stride_sn
    acc = tl.zeros((BN, BM) if SWAP else (BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        acc = kstep(acc, a_rows, valid[:, None], k0, I, w_rows, s_rows, stride_sk, n_mask,
                    WFMT, SCALE_U8, SB1, DOT, SCALED, GROUPS, A_PAIRS, BK, SWAP)
    rw = tl.load(rw_ptr + pair, mask=valid, other=0.0).to(tl.float32)
    pair64 = tl.where(valid, pair, 0).to(tl.int64)
    if SWAP:
        tl.store(y_ptr + pair64[None, :] * stride_y + n[:, None], acc * rw[None, :],
                 mask=valid[None, :] & (n < H)[:, None])
    else:
        tl.store(y_ptr + pair64[:, None] * stride_y + n[None, :], acc * rw[:, None],
                 mask=valid[:, None] & n_mask)


@triton.jit
def _sum_kernel(y_ptr, ids_ptr, out_ptr, nw_ptr, H, TOPK, stride_y, stride_o, eps,
                BLOCK: tl.constexpr, NORM: tl.constexpr):
    """out[t] = sum over slots j with ids[t, j] >= 0 of y[t*k + j] (fp32), cast to out dtype.
    NORM (one program a row, BLOCK >= H): the sum's RMSNorm with weight ``nw`` [H] first (the
    latent MoE's ``routed_expert_norm``)."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOPK):
        eid = tl.load(ids_ptr + t * TOPK + j)
        row = (t * TOPK + j).to(tl.int64)
        acc += tl.load(y_ptr + row * stride_y + cols, mask=cmask & (eid >= 0), other=0.0)
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(acc * acc, axis=0) / H + eps)
        acc = acc * inv * tl.load(nw_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty),
             mask=cmask)


@triton.jit
def _mm_kernel(a_ptr, w_ptr, o_ptr, M, N, K, stride_a, stride_w, stride_o, DOT: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """o[M, N] = a[M, K] @ w[N, K]^T (dense w; ``kstep``'s products, fp32 accumulate), stored
    in o's dtype: the latent MoE's projections with an fp32 side (see ``latent_moe``)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    a_rows = a_ptr + rows[:, None].to(tl.int64) * stride_a
    w_rows = w_ptr + cols[None, :].to(tl.int64) * stride_w
    a_mask = rows[:, None] < M
    n_mask = cols[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        acc = kstep(acc, a_rows, a_mask, k0, K, w_rows, w_rows, 0, n_mask, WFMT=0,
                    SCALE_U8=False, SB1=1, DOT=DOT, SCALED=False, GROUPS=False, A_PAIRS=False,
                    BK=BK)
    tl.store(o_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=a_mask & n_mask)


def _mm(a: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, dot: int) -> torch.Tensor:
    """a [M, K] @ w [N, K]^T -> [M, N] in out_dtype through ``_mm_kernel``."""
    m, k = a.shape
    n = w.shape[0]
    a, w = a.contiguous(), w.contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    # decode rows: narrow column blocks, so that K3's [3584, 7168] projections spread over
    # 112 / 224 programs (weight-bandwidth bound; untimed so far)
    bm, bn, bk, warps = (16, 32, 128, 4) if m <= 16 else (64, 128, 64, 8)
    _mm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        a, w, out, m, n, k, a.stride(0), w.stride(0), out.stride(0), DOT=dot, BM=bm, BN=bn,
        BK=bk, num_warps=warps)
    return out


# Forms of the K step (moe_tiles.a_tile / w_step), module switches so that a benchmark can time
# each: packed FP4 scales loaded once per 32-wide group, FP4 activations as one contiguous load
# split into column pairs. TILE_OVERRIDE (BM, BN, BK, num_warps) replaces _tiles_for's choice.
FP4_GROUPS = True
A_PAIRS = True
TILE_OVERRIDE: tuple[int, int, int, int] | None = None
NUM_STAGES: int | None = None  # Triton's software pipelining depth (None: its default)
# SWAP_AB: the tiles' products transposed, weights as the MMA's left operand (moe_tiles._mm).
# None: on where it was timed, NVIDIA sm_90 (H100, 21st session: DSV4-size FP4 T=512 5.18 ->
# 4.31 ms, FP8 3.65 -> 3.31, T=32 FP8 1.66 -> 1.49; Kimi-K3 latent T=1024 42.0 -> 31.7 ms; its
# offline GEMM1 spills 644 B -> 0); True / False (HWINFER_MOE_SWAP_AB=1 / 0) forces it.
SWAP_AB: bool | None = {"1": True, "0": False}.get(os.environ.get("HWINFER_MOE_SWAP_AB", ""))
# The decode form (moe_gemv.py: one program per (token, slot) pair and BN weight rows, fp32 FMAs,
# the next K block's weights prefetched) for calls of at most GEMV_MAX_PAIRS pairs, instead of
# 16-row MMA tiles (H100, 21st session, against the tiles: Kimi-K3 latent T=1 668 -> 314 us,
# DSV4-size FP4 T=1 157 -> 86, T=4 462 -> 278; FP8 T=1 113 -> 95, T=4 329 -> 277; at T=32 (192
# pairs) the swapped tiles were faster). "tiles" (HWINFER_MOE_DECODE=tiles) turns it off.
DECODE_FORM = os.environ.get("HWINFER_MOE_DECODE", "gemv")
GEMV_MAX_PAIRS = 64
GEMV_TILE = moe_gemv.TILE  # BN weight rows, BK values a K block, warps


def _swap_ab(device) -> bool:
    """SWAP_AB, or where it is None, whether ``device`` is the NVIDIA sm_90 it was timed on."""
    if SWAP_AB is not None:
        return bool(SWAP_AB)
    return nvidia_capability(device) == (9, 0)


def _tiles_for(tk: int, num_experts: int, inter: int, sms: int,
               interpret: bool, swap: bool = False) -> tuple[int, int, int, int]:
    """(BM, BN, BK, num_warps) from the mean rows per expert (decode: BM 16, weight-bound) and,
    at decode, the programs GEMM1 would get (``inter`` = I columns, ``sms`` multiprocessors)."""
    if interpret:  # the interpreter's cost grows with programs x ops: few, wide tiles
        return 16, 128, 128, 4
    if TILE_OVERRIDE is not None:
        return TILE_OVERRIDE
    per_expert = tk / max(num_experts, 1)
    if per_expert <= 1 and min(tk, num_experts) * triton.cdiv(inter, 64) < 4 * sms:
        # too few 64-column programs to stream the experts' weights: halve the columns (H100,
        # DSV4-size experts at T=1 (192 programs): FP4 180 -> 158 us, FP8 123 -> 113; Kimi-K3's
        # 768 were better at 64: 655 us against 768 at 32)
        return 16, 32, 128, 4
    if per_expert <= 16:
        return 16, 64, 128, 4
    if per_expert <= 48:
        # swapped products: 128 weight rows feed a wgmma (H100, 21st session: DSV4-size experts
        # T=2048 (48 rows an expert) bf16 7.74 -> 6.62 ms, FP8 8.10 -> 7.16, FP4 equal; Kimi-K3
        # latent T=1024 (18 rows) 31.9 -> 29.6)
        return (32, 128, 64, 4) if swap else (32, 64, 128, 4)
    return 64, 128, 64, 8


def run_experts(x, weights, ids, w13, w2, s13, s2, *, wfmt: int, block=(1, 1),
                activation="swiglu", limit=None, swiglu_alpha=1.702, situ_beta=1.0,
                situ_linear_beta=None, scaled=False, norm_weight=None, eps=1e-5,
                split_x=False, out_dtype=None) -> torch.Tensor:
    """Shared driver; x [T, H], w13 [E, 2I, H or H/2], w2 [E, H, I or I/2]; returns [T, H] in
    ``out_dtype`` (default x.dtype). ``norm_weight`` [H]: the summed rows RMS-normalised (eps)
    and scaled by it, in fp32 before the cast (the latent MoE's norm). ``split_x``: an fp32 x
    that stands for 16-bit inputs meets the weights as two bf16 parts (``DOT_SPLIT``, tensor
    cores) instead of exact fp32 products, where the weights are exact in bf16."""
    t, hdim = x.shape
    k = ids.shape[1]
    e, i = w13.shape[0], w13.shape[1] // 2
    out = torch.empty((t, hdim), dtype=out_dtype or x.dtype, device=x.device)
    if t == 0 or k == 0:
        return out.zero_()
    interpret = INTERPRET
    swap = _swap_ab(x.device) and not scaled
    bm, bn, bk, warps = _tiles_for(t * k, e, i, num_sms(x.device, 8), interpret, swap)
    while wfmt == FP8 and block[1] % bk:  # a K step must stay inside one scale block
        bk //= 2
    if scaled:
        bk = max(bk, 64)
    dot_bf16 = x.dtype == torch.bfloat16 and not interpret
    # GEMM2's fp32 activation meets the weights through the bf16 split when bf16 holds the
    # weights exactly (bf16 experts; FP8 / FP4 codes), else through exact fp32 FMAs.
    w13_exact = wfmt != DENSE or w13.dtype == torch.bfloat16
    w2_exact = wfmt != DENSE or w2.dtype == torch.bfloat16
    split_x = split_x and x.dtype == torch.float32 and w13_exact and not interpret
    dot2 = DOT_SPLIT if (dot_bf16 or split_x) and w2_exact else DOT_IEEE
    dot1 = DOT_BF16 if dot_bf16 else DOT_SPLIT if split_x else DOT_IEEE
    x = x.contiguous()
    ids = ids.contiguous()
    rw = weights.contiguous()
    s13 = w13 if s13 is None else s13  # dummy pointers for dense weights
    s2 = w2 if s2 is None else s2
    act = {"floats": (float(limit or 0.0), float(swiglu_alpha), float(situ_beta),
                      float(situ_linear_beta or 1.0)),
           "flags": dict(ACT=ACT_CODES[activation], HAS_LIMIT=limit is not None,
                         HAS_LIN=situ_linear_beta is not None)}
    y = torch.empty((t * k, hdim), dtype=torch.float32, device=x.device)
    gbn, gbk, gwarps = GEMV_TILE
    if (DECODE_FORM == "gemv" and t * k <= GEMV_MAX_PAIRS and not scaled
            and gemv_ok(wfmt, block, gbk)):
        h = torch.empty((t * k, i), dtype=torch.float32, device=x.device)
        run_gemvs(x, ids, rw, w13, s13, w2, s2, h, y, wfmt=wfmt, block=block, act=act, bn=gbn,
                  bk=gbk, warps=gwarps)
        return _slot_sum(y, ids, out, norm_weight, eps)
    # decode sizes: one Triton launch; larger batches: device sort (launch cost is noise there)
    align = align_small if t * k <= 1024 else route_tiles
    pairs, tile_e, n_tiles = align(ids, e, bm)
    # The activation between the GEMMs stays fp32 and GEMM2 runs fp32 dots: rounding it to bf16
    # put the clamped / OAI / SiTU activations (large h) outside the bf16 tolerance on the H200.
    h = torch.empty((n_tiles * bm, i), dtype=torch.float32, device=x.device)
    sb0, sb1 = block
    common = dict(WFMT=wfmt, SB0=sb0, SB1=sb1, DOT=dot1, SCALED=scaled, GROUPS=FP4_GROUPS,
                  A_PAIRS=A_PAIRS, BM=bm, BN=bn, BK=bk, SWAP=swap,
                  num_warps=warps,
                  **({} if NUM_STAGES is None else {"num_stages": NUM_STAGES}))
    _gemm1_kernel[(n_tiles, triton.cdiv(i, bn))](
        x, pairs, tile_e, w13, s13, h, hdim, i, k, t * k, x.stride(0), w13.stride(0), w13.stride(1),
        s13.stride(0), s13.stride(1), s13.stride(2), h.stride(0), -(-i // sb0), *act["floats"],
        SCALE_U8=s13.dtype == torch.uint8, **act["flags"], **common)
    _gemm2_kernel[(n_tiles, triton.cdiv(hdim, bn))](
        h, pairs, tile_e, rw, w2, s2, y, hdim, i, t * k, h.stride(0), w2.stride(0), w2.stride(1),
        s2.stride(0), s2.stride(1), s2.stride(2), y.stride(0), SCALE_U8=s2.dtype == torch.uint8,
        **{**common, "DOT": dot2, "SCALED": False})
    return _slot_sum(y, ids, out, norm_weight, eps)


def _slot_sum(y, ids, out, norm_weight, eps) -> torch.Tensor:
    """out [T, H] = the sum of each token's valid slot rows of y [T*k, H] (then the latent MoE's
    norm when ``norm_weight`` is given), through ``_sum_kernel``."""
    (t, k), hdim = ids.shape, y.shape[1]
    norm = norm_weight is not None
    block_h = triton.next_power_of_2(hdim) if norm else min(1024, triton.next_power_of_2(hdim))
    _sum_kernel[(t, triton.cdiv(hdim, block_h))](
        y, ids, out, norm_weight if norm else y, hdim, k, y.stride(0), out.stride(0), float(eps),
        BLOCK=block_h, NORM=norm, num_warps=8 if block_h >= 4096 else 4)
    return out


# ---------------------------------------------------------------------------------------------
# Public wrappers (the op signatures), per-call checks, AOT configurations.

_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
_BYTES = {torch.int8, torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu} | (
    {_FP4X2} if _FP4X2 is not None else set())


def _u8(t: torch.Tensor) -> torch.Tensor:
    """1-byte containers (e4m3, e8m0, int8, packed fp4) as their uint8 bytes; fp32 as is."""
    return t.view(torch.uint8) if t.dtype in _BYTES else t


def _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta) -> dict:
    check_activation(activation, limit, situ_beta, situ_linear_beta)
    return dict(activation=activation, limit=limit, swiglu_alpha=swiglu_alpha,
                situ_beta=situ_beta, situ_linear_beta=situ_linear_beta)


def moe_experts(x, weights, ids, w13, w2, *, activation="swiglu", limit=None, swiglu_alpha=1.702,
                situ_beta=1.0, situ_linear_beta=None) -> torch.Tensor:
    """Dense experts: x [T, H], weights / ids [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H]."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts")
    return run_experts(x, weights, ids, w13.contiguous(), w2.contiguous(), None, None,
                       wfmt=DENSE, **act)


def moe_experts_fp8(x, weights, ids, w13, w13_scale, w2, w2_scale, *, block=(128, 128),
                    activation="swiglu", limit=None, swiglu_alpha=1.702, situ_beta=1.0,
                    situ_linear_beta=None) -> torch.Tensor:
    """FP8-block experts: w13 [E, 2I, H] e4m3 + [E, 2*ceil(I/b0), ceil(H/b1)] scales,
    w2 [E, H, I] + [E, ceil(H/b0), ceil(I/b1)]; fp32 or UE8M0 scales. Returns [T, H]."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts_fp8")
    return run_experts(x, weights, ids, _u8(w13.contiguous()), _u8(w2.contiguous()),
                       _u8(w13_scale.contiguous()), _u8(w2_scale.contiguous()), wfmt=FP8,
                       block=(int(block[0]), int(block[1])), **act)


def moe_experts_fp4(x, weights, ids, w13, w13_scale, w2, w2_scale, *, activation="swiglu",
                    limit=None, swiglu_alpha=1.702, situ_beta=1.0, situ_linear_beta=None,
                    scaled: bool = False) -> torch.Tensor:
    """FP4 experts: w13 [E, 2I, H/2] packed e2m1 + [E, 2I, H/32] UE8M0, w2 [E, H, I/2] +
    [E, H, I/32]. ``scaled`` uses tl.dot_scaled (sm_100). Returns [T, H]."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    check_expert_shapes(x.shape[-1], w13.shape, w2.shape, "moe_experts_fp4", packed=2)
    return run_experts(x, weights, ids, _u8(w13.contiguous()), _u8(w2.contiguous()),
                       _u8(w13_scale.contiguous()), _u8(w2_scale.contiguous()), wfmt=FP4,
                       scaled=scaled, **act)


def moe_experts_fp4_blackwell(*args, **kwargs) -> torch.Tensor:
    """FP4 experts through tl.dot_scaled (bf16 x, e2m1 weights, UE8M0 scales); sm_100+."""
    return moe_experts_fp4(*args, scaled=True, **kwargs)


def latent_moe(x, weights, ids, down_proj, w13, w2, up_proj, norm_weight=None, *, w13_scale=None,
               w2_scale=None, eps=1e-5, activation="situ", limit=None, swiglu_alpha=1.702,
               situ_beta=1.0, situ_linear_beta=None) -> torch.Tensor:
    """Kimi-K3's latent MoE (contract: :func:`hwinfer.ops.moe_latent.latent_moe`): x [T, H] ->
    z = x down_proj^T [T, L] -> the expert pipeline above over z with dense or packed-FP4
    experts (w13 [E, 2I, L or L/2], w2 [E, L, I or I/2]), whose slot sum also applies the
    ``routed_expert_norm`` (norm_weight [L] or None) -> y up_proj^T [T, H] in x.dtype.

    z and y stay fp32, as the contract computes them: rounding either to bf16 put a case
    without the norm (where up_proj cancels large terms) outside the bf16 tolerance. So the
    projections run in ``_mm_kernel`` (z: exact bf16 products into fp32; y: fp32 rows against
    the bf16 weights as two bf16 parts) and the experts take fp32 z the same way (``split_x``);
    for fp32 inputs, and under the interpreter, exact fp32 products throughout. No host sync
    (the torch impl groups experts on the host), so K3's decode can be captured."""
    act = _act(activation, limit, swiglu_alpha, situ_beta, situ_linear_beta)
    lat = check_latent(x, down_proj, up_proj, norm_weight, w13_scale, w2_scale)
    half = x.dtype in (torch.bfloat16, torch.float16) and not INTERPRET
    z_dot = (DOT_BF16 if half and x.dtype == torch.bfloat16 and down_proj.dtype == torch.bfloat16
             else DOT_IEEE)
    z = _mm(x, down_proj, torch.float32, z_dot)
    nw = None if norm_weight is None else norm_weight.float().contiguous()
    common = dict(norm_weight=nw, eps=eps, split_x=half, out_dtype=torch.float32, **act)
    if w13_scale is None:
        check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe")
        y = run_experts(z, weights, ids, w13.contiguous(), w2.contiguous(), None, None,
                        wfmt=DENSE, **common)
    else:
        check_expert_shapes(lat, w13.shape, w2.shape, "latent_moe", packed=2)
        y = run_experts(z, weights, ids, _u8(w13.contiguous()), _u8(w2.contiguous()),
                        _u8(w13_scale.contiguous()), _u8(w2_scale.contiguous()), wfmt=FP4,
                        **common)
    split = DOT_SPLIT if half and up_proj.dtype == torch.bfloat16 else DOT_IEEE
    return _mm(y, up_proj, x.dtype, split)


def latent_moe_supported(x, weights, ids, down_proj, w13, w2, up_proj, norm_weight=None, *,
                         w13_scale=None, w2_scale=None, activation="situ", **_) -> str | None:
    """Per-call check of ``latent_moe``: float projections, dense or packed-FP4 experts, a
    latent row that one program normalises."""
    if down_proj.dim() != 2 or not (down_proj.is_floating_point() and up_proj.is_floating_point()):
        return "down_proj / up_proj must be float matrices"
    if triton.next_power_of_2(down_proj.shape[0]) > 16384:
        return f"latent width {down_proj.shape[0]} > 16384 (one program a normalised row)"
    if w13_scale is None:
        reason = moe_experts_supported(x, weights, ids, w13, w2, activation)
    else:
        reason = (_scales_ok(w13_scale, w2_scale)
                  or (None if w13.dtype in _BYTES and w2.dtype in _BYTES
                      else f"packed FP4 experts must be 1-byte containers, got {w13.dtype}"))
    return reason or _common_check(x, weights, ids, activation)


def _common_check(x, weights, ids, activation) -> str | None:
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"x must be [T, H] fp32 / bf16 / fp16, got {tuple(x.shape)} {x.dtype}"
    if ids.dim() != 2 or tuple(weights.shape) != tuple(ids.shape) or ids.shape[0] != x.shape[0]:
        return "weights / ids must both be [T, k]"
    if ids.is_floating_point() or not weights.is_floating_point():
        return "ids must be integer, weights floating point"
    if activation not in ACT_CODES:
        return f"activation {activation!r} has no fused epilogue"
    return None


def _scales_ok(*scales) -> str | None:
    for s in scales:
        if s.dtype not in (torch.float32, torch.uint8, torch.float8_e8m0fnu):
            return f"scale dtype {s.dtype} (need fp32 or UE8M0)"
    return None


def moe_experts_supported(x, weights, ids, w13, w2, activation="swiglu", **_) -> str | None:
    """Per-call check of ``moe_experts``: float weights, known activation."""
    if w13.dtype not in (torch.float32, torch.bfloat16, torch.float16) or w2.dtype != w13.dtype:
        return f"dense weights must be fp32 / bf16 / fp16, got {w13.dtype}, {w2.dtype}"
    return _common_check(x, weights, ids, activation)


def moe_experts_fp8_supported(x, weights, ids, w13, w13_scale, w2, w2_scale, block=(128, 128),
                              activation="swiglu", **_) -> str | None:
    """Per-call check of ``moe_experts_fp8``: a K step of 32/64 must fit inside a scale block."""
    if len(block) != 2 or int(block[0]) <= 0 or int(block[1]) % 32:
        return f"block {block!r}: b1 must be a positive multiple of 32"
    if w13.dtype not in (torch.float8_e4m3fn, torch.uint8) or w2.dtype != w13.dtype:
        return f"FP8 weights must be e4m3fn or uint8, got {w13.dtype}, {w2.dtype}"
    return _scales_ok(w13_scale, w2_scale) or _common_check(x, weights, ids, activation)


def moe_experts_fp4_supported(x, weights, ids, w13, w13_scale, w2, w2_scale,
                              activation="swiglu", **_) -> str | None:
    """Per-call check of ``moe_experts_fp4``: packed bytes, fp32 / UE8M0 scales."""
    if w13.dtype not in _BYTES or w2.dtype not in _BYTES:
        return f"FP4 weights must be packed bytes, got {w13.dtype}, {w2.dtype}"
    return _scales_ok(w13_scale, w2_scale) or _common_check(x, weights, ids, activation)


def moe_experts_fp4_blackwell_supported(x, weights, ids, w13, w13_scale, w2, w2_scale,
                                        **kw) -> str | None:
    """tl.dot_scaled takes UE8M0 byte scales only, and x must be bf16 (the lhs format)."""
    if w13_scale.dtype == torch.float32 or w2_scale.dtype == torch.float32:
        return "dot_scaled needs UE8M0 scales, not fp32"
    if x.dtype != torch.bfloat16:
        return "dot_scaled path takes bf16 activations"
    return moe_experts_fp4_supported(x, weights, ids, w13, w13_scale, w2, w2_scale, **kw)


def _gemm1_sig(xty: str, wty: str, sty: str) -> dict[str, str]:
    """``_gemm1_kernel``'s AOT signature for these x / weight / scale pointer types."""
    return {"x_ptr": xty, "pair_ptr": "*i32", "tile_e_ptr": "*i32", "w_ptr": wty, "s_ptr": sty,
            "h_ptr": "*fp32", **{a: "i32" for a in (
                "H", "I", "TOPK", "TK", "stride_x", "stride_we", "stride_wn", "stride_se",
                "stride_sn", "stride_sk", "stride_h", "up_srow")}, "stride_we": "i64",
            **{a: "fp32" for a in ("limit", "alpha", "beta", "lin_beta")},
            **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "SB1", "ACT", "HAS_LIMIT",
                                        "HAS_LIN", "DOT", "SCALED", "GROUPS", "A_PAIRS", "BM",
                                        "BN", "BK", "SWAP")}}


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # Every format at the decode tiles, the main formats also at the prefill tiles (compile time).
    formats = [("dense", DENSE, "*bf16", "*bf16", 1, 1, False, False),
               ("fp8_ue8m0", FP8, "*u8", "*u8", 128, 128, False, True),
               ("fp8_fp32", FP8, "*u8", "*fp32", 128, 128, False, False),
               ("fp4", FP4, "*u8", "*u8", 1, 1, False, True),
               ("fp4_dot_scaled", FP4, "*u8", "*u8", 1, 1, True, True)]
    for name, wfmt, wty, sty, sb0, sb1, scaled, prefill in formats:
        for bm, bn, bk, warps in [(16, 32, 128, 4), (16, 64, 128, 4)] + [(64, 128, 64, 8)] * prefill:
            bk = min(bk, sb1) if wfmt == FP8 else bk
            cx = {"WFMT": wfmt, "SCALE_U8": sty == "*u8", "SB0": sb0, "SB1": sb1,
                  "DOT": DOT_BF16, "SCALED": scaled, "GROUPS": FP4_GROUPS, "A_PAIRS": A_PAIRS,
                  "BM": bm, "BN": bn, "BK": bk, "SWAP": False}
            sig1 = _gemm1_sig("*bf16", wty, sty)
            specs.append(AotSpec(f"moe_gemm1[{name},{bm}x{bn}x{bk}]", _gemm1_kernel, sig1,
                                 {**cx, "ACT": 0, "HAS_LIMIT": True, "HAS_LIN": False},
                                 {"num_warps": warps}))
            sig2 = {"h_ptr": "*fp32", "pair_ptr": "*i32", "tile_e_ptr": "*i32", "rw_ptr": "*fp32",
                    "w_ptr": wty, "s_ptr": sty, "y_ptr": "*fp32", **{a: "i32" for a in (
                        "H", "I", "TK", "stride_h", "stride_we", "stride_wn", "stride_se",
                        "stride_sn", "stride_sk", "stride_y")},
                    **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "SB1", "DOT",
                                                "SCALED", "GROUPS", "A_PAIRS", "BM", "BN",
                                                "BK", "SWAP")}}
            sig2["stride_we"] = "i64"
            if not scaled:  # GEMM2 never takes dot_scaled: its activation is fp32 (split dots)
                specs.append(AotSpec(f"moe_gemm2[{name},{bm}x{bn}x{bk}]", _gemm2_kernel, sig2,
                                     {**cx, "DOT": DOT_SPLIT}, {"num_warps": warps}))
    # The latent MoE (Kimi-K3): its projections (bf16 x -> fp32 z, fp32 y -> bf16 out) and the
    # FP4 experts' GEMM1 over fp32 z as two bf16 parts.
    for name, aty, oty, dot in (("z", "*bf16", "*fp32", DOT_BF16), ("up", "*fp32", "*bf16", DOT_SPLIT)):
        for bm, bn, bk, warps in ((16, 32, 128, 4), (64, 128, 64, 8)):
            specs.append(AotSpec(
                f"latent_mm[{name},{bm}x{bn}x{bk}]", _mm_kernel,
                {"a_ptr": aty, "w_ptr": "*bf16", "o_ptr": oty, **{a: "i32" for a in (
                    "M", "N", "K", "stride_a", "stride_w", "stride_o")},
                 **{a: "constexpr" for a in ("DOT", "BM", "BN", "BK")}},
                {"DOT": dot, "BM": bm, "BN": bn, "BK": bk}, {"num_warps": warps}))
    # K3's experts over fp32 z: the decode tile, and its prefill tile (1,024 tokens: ~18 rows an
    # expert) as written and transposed (SWAP_AB, weights as the left operand; sm_90's default).
    for bm, bn, bk, swap in ((16, 64, 128, False), (32, 64, 128, False), (32, 128, 64, True)):
        cx = {"WFMT": FP4, "SCALE_U8": True, "SB0": 1, "SB1": 1, "DOT": DOT_SPLIT, "SCALED": False,
              "GROUPS": FP4_GROUPS, "A_PAIRS": A_PAIRS, "BM": bm, "BN": bn, "BK": bk, "SWAP": swap}
        tag = f"fp4,latent_split,{bm}x{bn}x{bk}{',swap' if swap else ''}"
        specs.append(AotSpec(f"moe_gemm1[{tag}]", _gemm1_kernel,
                             _gemm1_sig("*fp32", "*u8", "*u8"),
                             {**cx, "ACT": ACT_CODES["situ"], "HAS_LIMIT": False, "HAS_LIN": True},
                             {"num_warps": 4}))
        if bm == 32:
            specs.append(AotSpec(f"moe_gemm2[{tag}]", _gemm2_kernel,
                                 {**sig2, "w_ptr": "*u8", "s_ptr": "*u8"}, cx,
                                 {"num_warps": 4}))
    for norm, block in ((False, 1024), (True, 4096)):  # the latent MoE's norm: one row a program
        specs.append(AotSpec(f"moe_sum[bf16{',norm' if norm else ''}]", _sum_kernel,
                             {"y_ptr": "*fp32", "ids_ptr": "*i32", "out_ptr": "*bf16",
                              "nw_ptr": "*fp32", "H": "i32", "TOPK": "i32", "stride_y": "i32",
                              "stride_o": "i32", "eps": "fp32", "BLOCK": "constexpr",
                              "NORM": "constexpr"},
                             {"BLOCK": block, "NORM": norm}, {"num_warps": 8 if norm else 4}))
    return specs


AOT_SPECS = _aot_specs()
