"""Triton grouped expert GEMMs (contracts: :mod:`hwinfer.ops.moe_experts`: ``moe_experts``,
``moe_experts_fp8``, ``moe_experts_fp4``).

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

Quantized weights are dequantized in registers, tile by tile (``moe_tiles.kstep``): FP8 e4m3
bytes are decoded exactly to fp32 and the 128x128 block scale multiplies the partial dot
product (the K step never straddles a scale block); packed e2m1 codes are decoded and scaled
per 32-group, and the even / odd columns meet x's even / odd columns in two dots (no
interleave). On sm_100 the FP4 path can instead hand the packed bytes and UE8M0 scales to
``tl.dot_scaled``.
GEMM1 dots run in bf16 (fp32 accumulate) when x is bf16, in fp32 "ieee" otherwise and always
under the interpreter (whose bf16 dot is wrong); the activation h stays fp32 and GEMM2 meets it
as two bf16 parts (``moe_tiles.DOT_SPLIT``) on tensor cores.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET

from hwinfer.kernels.triton.moe_tiles import (
    ACT_CODES, DOT_BF16, DOT_IEEE, DOT_SPLIT, align_small, glu_act, kstep, route_tiles,
)
from hwinfer.ops.moe_experts import check_activation, check_expert_shapes

DENSE, FP8, FP4 = 0, 1, 2


@triton.jit
def _gemm1_kernel(x_ptr, pair_ptr, tile_e_ptr, w_ptr, s_ptr, h_ptr,
                  H, I, TOPK, TK, stride_x, stride_we, stride_wn, stride_se, stride_sn,
                  stride_sk, stride_h, up_srow, limit, alpha, beta, lin_beta,
                  WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB0: tl.constexpr,
                  SB1: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
                  HAS_LIN: tl.constexpr, DOT: tl.constexpr, SCALED: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """h[tile rows, n-block] = glu(gate, up), gate/up = x[tok] @ w13_e[n | I+n]^T."""
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
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    if WFMT == 1:  # block-row index in the stacked gate / up scale grids
        g_srow, u_srow = n // SB0, up_srow + n // SB0
    else:
        g_srow, u_srow = n, I + n
    g_w = w_e + n[None, :].to(tl.int64) * stride_wn
    u_w = w_e + (I + n)[None, :].to(tl.int64) * stride_wn
    g_s, u_s = s_e + g_srow[None, :] * stride_sn, s_e + u_srow[None, :] * stride_sn
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        acc_g = kstep(acc_g, a_rows, r_mask, k0, H, g_w, g_s, stride_sk, n_mask,
                       WFMT, SCALE_U8, SB1, DOT, SCALED, BK)
        acc_u = kstep(acc_u, a_rows, r_mask, k0, H, u_w, u_s, stride_sk, n_mask,
                       WFMT, SCALE_U8, SB1, DOT, SCALED, BK)
    h = glu_act(acc_g, acc_u, limit, alpha, beta, lin_beta, ACT, HAS_LIMIT, HAS_LIN)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_h + n[None, :],
             h.to(h_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _gemm2_kernel(h_ptr, pair_ptr, tile_e_ptr, rw_ptr, w_ptr, s_ptr, y_ptr,
                  H, I, TK, stride_h, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
                  stride_y, WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB0: tl.constexpr,
                  SB1: tl.constexpr, DOT: tl.constexpr, SCALED: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y[pair, n-block] = routing weight * (h[tile rows] @ w2_e[n]^T), valid pairs only."""
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
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        acc = kstep(acc, a_rows, valid[:, None], k0, I, w_rows, s_rows, stride_sk, n_mask,
                     WFMT, SCALE_U8, SB1, DOT, SCALED, BK)
    rw = tl.load(rw_ptr + pair, mask=valid, other=0.0).to(tl.float32)
    pair64 = tl.where(valid, pair, 0).to(tl.int64)
    tl.store(y_ptr + pair64[:, None] * stride_y + n[None, :], acc * rw[:, None],
             mask=valid[:, None] & n_mask)


@triton.jit
def _sum_kernel(y_ptr, ids_ptr, out_ptr, H, TOPK, stride_y, stride_o, BLOCK: tl.constexpr):
    """out[t] = sum over slots j with ids[t, j] >= 0 of y[t*k + j] (fp32), cast to out dtype."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOPK):
        eid = tl.load(ids_ptr + t * TOPK + j)
        row = (t * TOPK + j).to(tl.int64)
        acc += tl.load(y_ptr + row * stride_y + cols, mask=cmask & (eid >= 0), other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + cols, acc.to(out_ptr.dtype.element_ty),
             mask=cmask)


def _tiles_for(tk: int, num_experts: int, interpret: bool) -> tuple[int, int, int, int]:
    """(BM, BN, BK, num_warps) from the mean rows per expert (decode: BM 16, weight-bound)."""
    if interpret:  # the interpreter's cost grows with programs x ops: few, wide tiles
        return 16, 128, 128, 4
    per_expert = tk / max(num_experts, 1)
    if per_expert <= 16:
        return 16, 64, 128, 4
    if per_expert <= 48:
        return 32, 64, 128, 4
    return 64, 128, 64, 8


def run_experts(x, weights, ids, w13, w2, s13, s2, *, wfmt: int, block=(1, 1),
                activation="swiglu", limit=None, swiglu_alpha=1.702, situ_beta=1.0,
                situ_linear_beta=None, scaled=False) -> torch.Tensor:
    """Shared driver; x [T, H], w13 [E, 2I, H or H/2], w2 [E, H, I or I/2]; returns [T, H]."""
    t, hdim = x.shape
    k = ids.shape[1]
    e, i = w13.shape[0], w13.shape[1] // 2
    out = torch.empty((t, hdim), dtype=x.dtype, device=x.device)
    if t == 0 or k == 0:
        return out.zero_()
    interpret = INTERPRET
    bm, bn, bk, warps = _tiles_for(t * k, e, interpret)
    while wfmt == FP8 and block[1] % bk:  # a K step must stay inside one scale block
        bk //= 2
    if scaled:
        bk = max(bk, 64)
    dot_bf16 = x.dtype == torch.bfloat16 and not interpret
    # GEMM2's fp32 activation meets the weights through the bf16 split when bf16 holds the
    # weights exactly (bf16 experts; FP8 / FP4 codes), else through exact fp32 FMAs.
    split_ok = dot_bf16 and (wfmt != DENSE or w2.dtype == torch.bfloat16)
    dot2 = DOT_SPLIT if split_ok else DOT_IEEE
    x = x.contiguous()
    ids = ids.contiguous()
    rw = weights.contiguous()
    # decode sizes: one Triton launch; larger batches: device sort (launch cost is noise there)
    align = align_small if t * k <= 1024 else route_tiles
    pairs, tile_e, n_tiles = align(ids, e, bm)
    # The activation between the GEMMs stays fp32 and GEMM2 runs fp32 dots: rounding it to bf16
    # put the clamped / OAI / SiTU activations (large h) outside the bf16 tolerance on the H200.
    h = torch.empty((n_tiles * bm, i), dtype=torch.float32, device=x.device)
    y = torch.empty((t * k, hdim), dtype=torch.float32, device=x.device)
    s13 = w13 if s13 is None else s13  # dummy pointers for dense weights
    s2 = w2 if s2 is None else s2
    sb0, sb1 = block
    common = dict(WFMT=wfmt, SB0=sb0, SB1=sb1, DOT=DOT_BF16 if dot_bf16 else DOT_IEEE,
                  SCALED=scaled, BM=bm, BN=bn, BK=bk, num_warps=warps)
    _gemm1_kernel[(n_tiles, triton.cdiv(i, bn))](
        x, pairs, tile_e, w13, s13, h, hdim, i, k, t * k, x.stride(0), w13.stride(0), w13.stride(1),
        s13.stride(0), s13.stride(1), s13.stride(2), h.stride(0), -(-i // sb0),
        float(limit or 0.0), float(swiglu_alpha), float(situ_beta), float(situ_linear_beta or 1.0),
        SCALE_U8=s13.dtype == torch.uint8, ACT=ACT_CODES[activation], HAS_LIMIT=limit is not None,
        HAS_LIN=situ_linear_beta is not None, **common)
    _gemm2_kernel[(n_tiles, triton.cdiv(hdim, bn))](
        h, pairs, tile_e, rw, w2, s2, y, hdim, i, t * k, h.stride(0), w2.stride(0), w2.stride(1),
        s2.stride(0), s2.stride(1), s2.stride(2), y.stride(0), SCALE_U8=s2.dtype == torch.uint8,
        **{**common, "DOT": dot2, "SCALED": False})
    block_h = min(1024, triton.next_power_of_2(hdim))
    _sum_kernel[(t, triton.cdiv(hdim, block_h))](y, ids, out, hdim, k, y.stride(0), out.stride(0),
                                                BLOCK=block_h, num_warps=4)
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
        for bm, bn, bk, warps in [(16, 64, 128, 4)] + [(64, 128, 64, 8)] * prefill:
            bk = min(bk, sb1) if wfmt == FP8 else bk
            cx = {"WFMT": wfmt, "SCALE_U8": sty == "*u8", "SB0": sb0, "SB1": sb1,
                  "DOT": DOT_BF16, "SCALED": scaled, "BM": bm, "BN": bn, "BK": bk}
            sig1 = {"x_ptr": "*bf16", "pair_ptr": "*i32", "tile_e_ptr": "*i32", "w_ptr": wty,
                    "s_ptr": sty, "h_ptr": "*fp32", **{a: "i32" for a in (
                        "H", "I", "TOPK", "TK", "stride_x", "stride_we", "stride_wn", "stride_se",
                        "stride_sn", "stride_sk", "stride_h", "up_srow")},
                    **{a: "fp32" for a in ("limit", "alpha", "beta", "lin_beta")},
                    **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "SB1", "ACT",
                                                "HAS_LIMIT", "HAS_LIN", "DOT", "SCALED",
                                                "BM", "BN", "BK")}}
            sig1["stride_we"] = "i64"
            specs.append(AotSpec(f"moe_gemm1[{name},{bm}x{bn}x{bk}]", _gemm1_kernel, sig1,
                                 {**cx, "ACT": 0, "HAS_LIMIT": True, "HAS_LIN": False},
                                 {"num_warps": warps}))
            sig2 = {"h_ptr": "*fp32", "pair_ptr": "*i32", "tile_e_ptr": "*i32", "rw_ptr": "*fp32",
                    "w_ptr": wty, "s_ptr": sty, "y_ptr": "*fp32", **{a: "i32" for a in (
                        "H", "I", "TK", "stride_h", "stride_we", "stride_wn", "stride_se",
                        "stride_sn", "stride_sk", "stride_y")},
                    **{a: "constexpr" for a in ("WFMT", "SCALE_U8", "SB0", "SB1", "DOT",
                                                "SCALED", "BM", "BN", "BK")}}
            sig2["stride_we"] = "i64"
            if not scaled:  # GEMM2 never takes dot_scaled: its activation is fp32 (split dots)
                specs.append(AotSpec(f"moe_gemm2[{name},{bm}x{bn}x{bk}]", _gemm2_kernel, sig2,
                                     {**cx, "DOT": DOT_SPLIT}, {"num_warps": warps}))
    specs.append(AotSpec("moe_sum[bf16]", _sum_kernel,
                         {"y_ptr": "*fp32", "ids_ptr": "*i32", "out_ptr": "*bf16", "H": "i32",
                          "TOPK": "i32", "stride_y": "i32", "stride_o": "i32",
                          "BLOCK": "constexpr"},
                         {"BLOCK": 1024}))
    return specs


AOT_SPECS = _aot_specs()
