"""Decode form of the Triton expert FFN (contracts: :mod:`hwinfer.ops.moe_experts`,
:mod:`hwinfer.ops.moe_latent`; driver: :func:`hwinfer.kernels.triton.moe_gemm.run_experts`).

At decode a routed expert sees one row, so its GEMMs are matrix-vector products bound by the
weight bytes, and the tile form (16-row MMA tiles over expert-sorted pairs) streams them at a
fraction of the bandwidth (H100: 446 GB/s for DSV4-size FP4 experts at T=1, 13%). Here one program
takes one (token, slot) pair and BN weight rows of its expert, walks K in BK-wide blocks with the
next block's weight bytes already requested (software prefetch: the decode of block j overlaps
the loads of block j + 1), dequantizes in registers and reduces with fp32 FMAs (no MMA, no
rounding of the activation: at least as exact as the tile form's products). No sort of the pairs
either: the expert id is read per program, a skipped slot (id -1) exits.

* ``_gemv1_kernel``: h[pair, n] = glu(W13_e[n] . x_tok, W13_e[I + n] . x_tok), gate and up in one
  loop over the same x block;
* ``_gemv2_kernel``: y[pair, n] = weight_pair * (W2_e[n] . h[pair]); the caller's slot sum follows.

Formats as in :mod:`.moe_tiles`: dense (x's or fp32 weights), FP8 e4m3 bytes with block scales
(scale block b0 x b1, b1 a power of two), packed e2m1 with one UE8M0 / fp32 scale per 32 values;
a scale group's scale is loaded once and broadcast over the group ([BN, BK / GS, GS] views).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.moe_tiles import _e2m1, _e4m3, _scale, gate_up_rows, glu_act


@triton.jit
def _w_load(w_rows, k0, K, n_mask, WFMT: tl.constexpr, BK: tl.constexpr):
    """The weight bytes (or values) of K block [k0, k0 + BK) of rows ``w_rows`` [BN]: packed FP4
    [BN, BK/2], else [BN, BK]; zeros past K (a block wholly past K loads nothing)."""
    if WFMT == 2:
        kb = k0 // 2 + tl.arange(0, BK // 2)
        return tl.load(w_rows[:, None] + kb[None, :], mask=n_mask[:, None] & (kb < K // 2)[None, :],
                       other=0)
    else:
        kk = k0 + tl.arange(0, BK)
        return tl.load(w_rows[:, None] + kk[None, :], mask=n_mask[:, None] & (kk < K)[None, :],
                       other=0)


@triton.jit
def _x_block(x_row, k0, K, WFMT: tl.constexpr, BK: tl.constexpr):
    """x[k0:k0+BK] in fp32 (zeros past K): packed FP4 meets it as (even, odd) columns [BK/2]
    (one contiguous load split into pairs), every other format as (x, x) [BK]."""
    kk = k0 + tl.arange(0, BK)
    x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
    if WFMT == 2:
        x0, x1 = tl.split(tl.reshape(x, (BK // 2, 2)))
    else:
        x0, x1 = x, x
    return x0, x1


@triton.jit
def _w_fma(acc, wb, x0, x1, s_rows, s_stride_k, k0, K, n_mask, WFMT: tl.constexpr,
           SCALE_U8: tl.constexpr, GS: tl.constexpr, BK: tl.constexpr):
    """acc [BN, BK/2 (FP4) or BK] += W block * x block, elementwise (reduced once at the end).
    ``s_rows`` [BN]: each row's scale row; GS values share a scale along K (32 for FP4, b1 for
    FP8; unused for dense weights)."""
    BN: tl.constexpr = acc.shape[0]
    if WFMT == 0:
        acc += wb.to(tl.float32) * x0[None, :]
    else:
        ks = k0 // GS + tl.arange(0, BK // GS)
        sc = _scale(s_rows[:, None, None] + ks[None, :, None] * s_stride_k,
                    n_mask[:, None, None] & (ks < (K + GS - 1) // GS)[None, :, None], SCALE_U8)
        c = wb.to(tl.int32)
        if WFMT == 2:  # [BN, G, 16] bytes: the 32 values of a group are 16 bytes
            c3 = tl.reshape(c, (BN, BK // GS, GS // 2))
            lo = tl.reshape(_e2m1(c3) * sc, (BN, BK // 2))
            hi = tl.reshape(_e2m1(c3 >> 4) * sc, (BN, BK // 2))
            acc += lo * x0[None, :] + hi * x1[None, :]
        else:
            w = tl.reshape(_e4m3(tl.reshape(c, (BN, BK // GS, GS))) * sc, (BN, BK))
            acc += w * x0[None, :]
    return acc


@triton.jit
def _gemv1_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, h_ptr, H, I, TOPK, stride_x, stride_we, stride_wn,
                  stride_se, stride_sn, stride_sk, stride_h, up_srow, limit, alpha, beta, lin_beta,
                  WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB0: tl.constexpr,
                  GS: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
                  HAS_LIN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """h[pair, n-block] = glu(gate, up) of one (token, slot) pair; grid (T*k, cdiv(I, BN))."""
    pair = tl.program_id(0)
    e = tl.load(ids_ptr + pair)
    if e < 0:
        return
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = n < I
    x_row = x_ptr + (pair // TOPK).to(tl.int64) * stride_x
    g_w, u_w, g_s, u_s = gate_up_rows(w_ptr, s_ptr, e, n, I, up_srow, stride_we, stride_wn,
                                      stride_se, stride_sn, WFMT, SB0)
    KW: tl.constexpr = BK // 2 if WFMT == 2 else BK
    acc_g = tl.zeros((BN, KW), dtype=tl.float32)
    acc_u = tl.zeros((BN, KW), dtype=tl.float32)
    wg = _w_load(g_w, 0, H, n_mask, WFMT, BK)
    wu = _w_load(u_w, 0, H, n_mask, WFMT, BK)
    for k0 in range(0, H, BK):
        wg_next = _w_load(g_w, k0 + BK, H, n_mask, WFMT, BK)  # in flight during this block
        wu_next = _w_load(u_w, k0 + BK, H, n_mask, WFMT, BK)
        x0, x1 = _x_block(x_row, k0, H, WFMT, BK)
        acc_g = _w_fma(acc_g, wg, x0, x1, g_s, stride_sk, k0, H, n_mask, WFMT, SCALE_U8, GS, BK)
        acc_u = _w_fma(acc_u, wu, x0, x1, u_s, stride_sk, k0, H, n_mask, WFMT, SCALE_U8, GS, BK)
        wg, wu = wg_next, wu_next
    h = glu_act(tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1), limit, alpha, beta, lin_beta, ACT,
                HAS_LIMIT, HAS_LIN)
    tl.store(h_ptr + pair.to(tl.int64) * stride_h + n, h, mask=n_mask)


@triton.jit
def _gemv2_kernel(h_ptr, ids_ptr, rw_ptr, w_ptr, s_ptr, y_ptr, H, I, stride_h, stride_we, stride_wn,
                  stride_se, stride_sn, stride_sk, stride_y, WFMT: tl.constexpr,
                  SCALE_U8: tl.constexpr, SB0: tl.constexpr, GS: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr):
    """y[pair, n-block] = routing weight * (W2_e[n-block] . h[pair]); grid (T*k, cdiv(H, BN))."""
    pair = tl.program_id(0)
    e = tl.load(ids_ptr + pair)
    if e < 0:
        return
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = n < H
    h_row = h_ptr + pair.to(tl.int64) * stride_h
    w_rows = w_ptr + e.to(tl.int64) * stride_we + n.to(tl.int64) * stride_wn
    if WFMT == 1:
        srow = n // SB0
    else:
        srow = n
    s_rows = s_ptr + e.to(tl.int64) * stride_se + srow * stride_sn
    KW: tl.constexpr = BK // 2 if WFMT == 2 else BK
    acc = tl.zeros((BN, KW), dtype=tl.float32)
    wb = _w_load(w_rows, 0, I, n_mask, WFMT, BK)
    for k0 in range(0, I, BK):
        wb_next = _w_load(w_rows, k0 + BK, I, n_mask, WFMT, BK)
        x0, x1 = _x_block(h_row, k0, I, WFMT, BK)
        acc = _w_fma(acc, wb, x0, x1, s_rows, stride_sk, k0, I, n_mask, WFMT, SCALE_U8, GS, BK)
        wb = wb_next
    rw = tl.load(rw_ptr + pair).to(tl.float32)
    tl.store(y_ptr + pair.to(tl.int64) * stride_y + n, tl.sum(acc, axis=1) * rw, mask=n_mask)


# (BN weight rows, BK values a K block, warps). H100, 21st session: 8 x 256 the fastest of 4 x 512,
# 4 x 256 and 8 x 256 (Kimi-K3 latent T=1 334 / 361 / 314 us; DSV4-size FP4 T=4 289 / 321 / 278;
# FP8 T=1 equal within 1%). Offline (scripts/kernel_regs.py, sm_90) the FP4 GEMM1 takes 96
# registers at 4 x 512, 255 at 8 x 512, 40 at 4 x 256.
TILE = (8, 256, 4)


def gemv_ok(wfmt: int, block: tuple[int, int], bk: int) -> bool:
    """Whether the decode form takes these weights: FP8 scale blocks must tile a K block of BK
    (b1 a power of two, at most BK); every other format."""
    return wfmt != 1 or (block[1] & (block[1] - 1) == 0 and block[1] <= bk)


def run_gemvs(x, ids, rw, w13, s13, w2, s2, h, y, *, wfmt: int, block, act: dict, bn: int,
              bk: int, warps: int) -> None:
    """Both decode GEMVs into ``h`` [T*k, I] fp32 and ``y`` [T*k, H] fp32 (rows of skipped slots
    left unwritten: the slot sum never reads them). ``act``: the activation launch arguments."""
    t, hdim = x.shape
    k = ids.shape[1]
    i = w13.shape[1] // 2
    sb0, sb1 = block
    gs = 32 if wfmt == 2 else sb1
    common = dict(WFMT=wfmt, SB0=sb0, GS=gs, BN=bn, BK=bk, num_warps=warps)
    _gemv1_kernel[(t * k, triton.cdiv(i, bn))](
        x, ids, w13, s13, h, hdim, i, k, x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0),
        s13.stride(1), s13.stride(2), h.stride(0), -(-i // sb0), *act["floats"],
        SCALE_U8=s13.dtype == torch.uint8, **act["flags"], **common)
    _gemv2_kernel[(t * k, triton.cdiv(hdim, bn))](
        h, ids, rw, w2, s2, y, hdim, i, h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0),
        s2.stride(1), s2.stride(2), y.stride(0), SCALE_U8=s2.dtype == torch.uint8,
        **common)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec
    from hwinfer.kernels.triton.moe_tiles import ACT_CODES

    ints1 = ("H", "I", "TOPK", "stride_x", "stride_we", "stride_wn", "stride_se", "stride_sn",
             "stride_sk", "stride_h", "up_srow")
    ints2 = ("H", "I", "stride_h", "stride_we", "stride_wn", "stride_se", "stride_sn",
             "stride_sk", "stride_y")
    specs = []
    # (name, x, weights, scales, WFMT, SB0, GS, activation, clamp, linear beta): DSV4's FP4 and
    # FP8 experts (swiglu, clamped), Kimi-K3's latent FP4 experts over fp32 z (situ), bf16 ones.
    for name, xty, wty, sty, wfmt, sb0, gs, act, limit, lin in (
            ("fp4", "*bf16", "*u8", "*u8", 2, 1, 32, "swiglu", True, False),
            ("fp4_latent", "*fp32", "*u8", "*u8", 2, 1, 32, "situ", False, True),
            ("fp8_ue8m0", "*bf16", "*u8", "*u8", 1, 128, 128, "swiglu", True, False),
            ("dense", "*bf16", "*bf16", "*bf16", 0, 1, 1, "swiglu", False, False)):
        sig1 = {"x_ptr": xty, "ids_ptr": "*i32", "w_ptr": wty, "s_ptr": sty, "h_ptr": "*fp32",
                **{a: "i32" for a in ints1}, "stride_we": "i64",
                **{a: "fp32" for a in ("limit", "alpha", "beta", "lin_beta")},
                **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "GS", "ACT", "HAS_LIMIT",
                                            "HAS_LIN", "BN", "BK")}}
        sig2 = {"h_ptr": "*fp32", "ids_ptr": "*i32", "rw_ptr": "*fp32", "w_ptr": wty, "s_ptr": sty,
                "y_ptr": "*fp32", **{a: "i32" for a in ints2}, "stride_we": "i64",
                **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "GS", "BN", "BK")}}
        cx = {"WFMT": wfmt, "SCALE_U8": sty == "*u8", "SB0": sb0, "GS": gs, "BN": TILE[0],
              "BK": TILE[1]}
        specs.append(AotSpec(f"moe_gemv1[{name}]", _gemv1_kernel, sig1,
                             {**cx, "ACT": ACT_CODES[act], "HAS_LIMIT": limit, "HAS_LIN": lin},
                             {"num_warps": TILE[2]}))
        specs.append(AotSpec(f"moe_gemv2[{name}]", _gemv2_kernel, sig2, cx,
                             {"num_warps": TILE[2]}))
    return specs


AOT_SPECS = _aot_specs()
