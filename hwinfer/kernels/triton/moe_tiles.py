"""Device-side helpers of the Triton MoE GEMMs (:mod:`hwinfer.kernels.triton.moe_gemm`): exact
in-register decoding of e4m3 / e2m1 / UE8M0, one dequantize-and-dot K step, the fused GLU;
and the host-side (device-resident, sync-free) sort of (token, slot) pairs into expert tiles.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Activation codes of the fused epilogue (names as in hwinfer.ops.moe_experts.ACTIVATIONS).
ACT_CODES = {"swiglu": 0, "swiglu_oai": 1, "situ": 2, "gelu_tanh": 3}


# The decoders move a code's sign / exponent / mantissa bits into the fp32 fields and rescale by
# the bias difference in one exact multiply, which also turns exponent 0 into the format's
# subnormals (the fp32 intermediate is then subnormal: Triton keeps IEEE denormals for fp32 on
# NVIDIA and AMD unless a kernel asks to flush). ~6 integer / float ops a value where a
# field-by-field decode with selects took ~15: on Hopper, which has no e2m1 conversion, the
# decode is what bounds a prefill MoE GEMM.
@triton.jit
def _e4m3(b):
    """uint8 e4m3fn bytes (as int32) -> fp32, exactly (the NaN codes 0x7f / 0xff read +-480)."""
    bits = ((b & 0x7F) << 20) | ((b & 0x80) << 24)
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^(127 - 7)


@triton.jit
def _e2m1(c):
    """The e2m1 code in c's low 4 bits (int32; higher bits ignored) -> fp32: sign bit 3,
    exponent bits 1-2 (bias 1), mantissa bit 0."""
    bits = ((c & 7) << 22) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^(127 - 1)


@triton.jit
def _scale(s_ptrs, mask, SCALE_U8: tl.constexpr):
    """Load scales: UE8M0 bytes b -> 2^(b-127) (b = 0 is the fp32 subnormal 2^-127), or fp32."""
    if SCALE_U8:
        b = tl.load(s_ptrs, mask=mask, other=127).to(tl.int32)
        v = (b << 23).to(tl.float32, bitcast=True)
        return tl.where(b == 0, 5.877471754111438e-39, v)
    else:
        return tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)


# How a K step multiplies (the ``DOT`` constexpr): exact fp32 FMAs (fp32 activations, the
# interpreter); bf16 tensor cores (bf16 activations, weights exact in bf16); or "split": an fp32
# activation a = hi + lo as two bf16 parts, two bf16 dots against weights that bf16 holds
# exactly (bf16, e4m3 and e2m1 values, UE8M0-scaled). The split keeps ~16 mantissa bits of a,
# which is what GEMM2's fp32 activation needs, on tensor cores: the fp32 FMA path it replaces
# reached 27 GB/s of expert weights at decode on the H200 (1.4 ms per layer for 8 experts).
DOT_IEEE, DOT_BF16, DOT_SPLIT = 0, 1, 2


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    if DOT == 1:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif DOT == 2:
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        wb = b.to(tl.bfloat16)
        return tl.dot(hi, wb) + tl.dot(lo, wb)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _mm(a, w, DOT: tl.constexpr, SWAP: tl.constexpr):
    """a [BM, K] @ w [K, BN] as ``_dot`` does it: [BM, BN]; or with SWAP its transpose,
    w^T @ a^T [BN, BM], so that the dequantized weights are the MMA's left operand (on Hopper
    a 64-row left operand can be a wgmma's register operand; 16 / 32-row activation tiles alone
    are too short for one) and the activations the right one, split into bf16 parts if asked."""
    if SWAP:
        if DOT == 1:
            return tl.dot(tl.trans(w).to(tl.bfloat16), tl.trans(a).to(tl.bfloat16))
        elif DOT == 2:
            hi = a.to(tl.bfloat16)
            lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
            wt = tl.trans(w).to(tl.bfloat16)
            return tl.dot(wt, tl.trans(hi)) + tl.dot(wt, tl.trans(lo))
        else:
            return tl.dot(tl.trans(w), tl.trans(a), input_precision="ieee")
    else:
        return _dot(a, w, DOT)


@triton.jit
def a_tile(a_rows, a_mask, k0, K, WFMT: tl.constexpr, SCALED: tl.constexpr,
           A_PAIRS: tl.constexpr, BK: tl.constexpr):
    """The activations of one K step, fp32: packed FP4 (unless SCALED) meets them as the even and
    the odd columns, (a0, a1) [BM, BK/2] each; every other format as (a, a) [BM, BK].

    A_PAIRS: one contiguous [BM, BK] load split into column pairs in registers, instead of two
    stride-2 loads (half of every fetched sector unused).
    """
    if WFMT == 2 and not SCALED:
        if A_PAIRS:
            kk = k0 + tl.arange(0, BK)
            a = tl.load(a_rows + kk[None, :], mask=a_mask & (kk < K)[None, :], other=0.0)
            a0, a1 = tl.split(tl.reshape(a.to(tl.float32), (a.shape[0], BK // 2, 2)))
        else:
            kb = k0 // 2 + tl.arange(0, BK // 2)
            am = a_mask & (kb < K // 2)[None, :]
            a0 = tl.load(a_rows + 2 * kb[None, :], mask=am, other=0.0).to(tl.float32)
            a1 = tl.load(a_rows + 2 * kb[None, :] + 1, mask=am, other=0.0).to(tl.float32)
    else:
        kk = k0 + tl.arange(0, BK)
        a0 = tl.load(a_rows + kk[None, :], mask=a_mask & (kk < K)[None, :], other=0.0)
        a0 = a0.to(tl.float32)
        a1 = a0
    return a0, a1


@triton.jit
def w_step(acc, a0, a1, k0, K, w_rows, s_rows, s_stride_k, n_mask,
           WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB1: tl.constexpr, DOT: tl.constexpr,
           SCALED: tl.constexpr, GROUPS: tl.constexpr, BK: tl.constexpr,
           SWAP: tl.constexpr = False):
    """acc[BM, BN] += A[:, k0:k0+BK] @ W[rows, k0:k0+BK]^T with A from :func:`a_tile` and W
    dequantized in registers. w_rows / s_rows [1, BN] are row base pointers (weights, scales);
    K the unpacked reduction length. SWAP (not with SCALED): acc is [BN, BM], += its transpose
    (:func:`_mm`).

    GROUPS (packed FP4): the weight bytes are read as [BK/32, 16, BN], so that each 32-wide
    group's UE8M0 scale is one [BK/32, 1, BN] load broadcast over its 16 bytes, instead of a
    [BK/2, BN] gather of the same byte per element.
    """
    if WFMT == 2:
        if SCALED:
            kb = k0 // 2 + tl.arange(0, BK // 2)
            wb = tl.load(w_rows + kb[:, None], mask=(kb < K // 2)[:, None] & n_mask, other=0)
            ks = k0 // 32 + tl.arange(0, BK // 32)
            sc = tl.load(s_rows + ks[:, None] * s_stride_k,
                         mask=(ks[:, None] < (K + 31) // 32) & n_mask, other=127)
            acc = tl.dot_scaled(a0.to(tl.bfloat16), None, "bf16", wb, tl.trans(sc), "e2m1", acc)
        elif GROUPS:
            g = tl.arange(0, BK // 32)[:, None, None]
            kb = k0 // 2 + g * 16 + tl.arange(0, 16)[None, :, None]
            n3 = n_mask[None, :, :]
            wb = tl.load(w_rows[None, :, :] + kb, mask=(kb < K // 2) & n3, other=0).to(tl.int32)
            ks = k0 // 32 + g
            sc = _scale(s_rows[None, :, :] + ks * s_stride_k, (ks < (K + 31) // 32) & n3,
                        SCALE_U8)
            lo = tl.reshape(_e2m1(wb) * sc, (BK // 2, wb.shape[2]))
            hi = tl.reshape(_e2m1(wb >> 4) * sc, (BK // 2, wb.shape[2]))
            acc += _mm(a0, lo, DOT, SWAP) + _mm(a1, hi, DOT, SWAP)
        else:
            kb = k0 // 2 + tl.arange(0, BK // 2)
            wmask = (kb < K // 2)[:, None] & n_mask
            wb = tl.load(w_rows + kb[:, None], mask=wmask, other=0).to(tl.int32)
            sc = _scale(s_rows + ((2 * kb[:, None]) // 32) * s_stride_k, wmask, SCALE_U8)
            acc += _mm(a0, _e2m1(wb) * sc, DOT, SWAP) + _mm(a1, _e2m1(wb >> 4) * sc, DOT, SWAP)
    else:
        kk = k0 + tl.arange(0, BK)
        km = kk < K
        if WFMT == 1:
            wb = tl.load(w_rows + kk[:, None], mask=km[:, None] & n_mask, other=0).to(tl.int32)
            sc = _scale(s_rows + (k0 // SB1) * s_stride_k, n_mask, SCALE_U8)
            if SWAP:
                acc += _mm(a0, _e4m3(wb), DOT, SWAP) * tl.trans(sc)
            else:
                acc += _mm(a0, _e4m3(wb), DOT, SWAP) * sc
        else:
            w = tl.load(w_rows + kk[:, None], mask=km[:, None] & n_mask, other=0.0).to(tl.float32)
            acc += _mm(a0, w, DOT, SWAP)
    return acc


@triton.jit
def kstep(acc, a_rows, a_mask, k0, K, w_rows, s_rows, s_stride_k, n_mask,
          WFMT: tl.constexpr, SCALE_U8: tl.constexpr, SB1: tl.constexpr,
          DOT: tl.constexpr, SCALED: tl.constexpr, GROUPS: tl.constexpr,
          A_PAIRS: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr = False):
    """One K step of one product: :func:`a_tile` then :func:`w_step`."""
    a0, a1 = a_tile(a_rows, a_mask, k0, K, WFMT, SCALED, A_PAIRS, BK)
    return w_step(acc, a0, a1, k0, K, w_rows, s_rows, s_stride_k, n_mask, WFMT, SCALE_U8, SB1,
                  DOT, SCALED, GROUPS, BK, SWAP)


@triton.jit
def gate_up_rows(w_ptr, s_ptr, e, n, I, up_srow, stride_we, stride_wn, stride_se, stride_sn,
                 WFMT: tl.constexpr, SB0: tl.constexpr):
    """Pointers to expert e's gate rows n and up rows I + n of the stacked w13 and to their scale
    rows (any shape of n): (gate weights, up weights, gate scales, up scales). FP8's block grid
    stacks the gate's ceil(I / b0) block rows (``up_srow``) above the up's."""
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = s_ptr + e.to(tl.int64) * stride_se
    if WFMT == 1:
        g_srow, u_srow = n // SB0, up_srow + n // SB0
    else:
        g_srow, u_srow = n, I + n
    return (w_e + n.to(tl.int64) * stride_wn, w_e + (I + n).to(tl.int64) * stride_wn,
            s_e + g_srow * stride_sn, s_e + u_srow * stride_sn)


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _tanh(v):
    """tanh without libdevice: sign(v) (1 - e^-2|v|) / (1 + e^-2|v|) (no overflow)."""
    z = tl.exp(-2.0 * tl.abs(v))
    r = (1.0 - z) / (1.0 + z)
    return tl.where(v < 0, -r, r)


@triton.jit
def glu_act(gate, up, limit, alpha, beta, lin_beta, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
            HAS_LIN: tl.constexpr):
    """The contract's glu on fp32 tiles (clamp first: gate from above, up both sides)."""
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    if ACT == 0:
        out = gate * _sigmoid(gate) * up
    elif ACT == 1:
        out = (up + 1.0) * gate * _sigmoid(alpha * gate)
    elif ACT == 2:
        if HAS_LIN:
            up = lin_beta * _tanh(up / lin_beta)
        out = beta * _tanh(gate / beta) * _sigmoid(gate) * up
    else:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = 0.5 * gate * (1.0 + _tanh(inner)) * up
    return out


def route_tiles(ids: torch.Tensor, num_experts: int, bm: int):
    """(pair index per padded row [tiles*BM] (T*k = padding), expert per tile [tiles] (-1 = none)).

    Device-only torch ops with shapes fixed by (T*k, E, BM): safe inside a CUDA graph.
    """
    tk = ids.numel()
    flat = ids.reshape(-1).long()
    flat = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # skipped -> bucket E
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    tiles_per = (counts[:num_experts] + bm - 1) // bm
    tile_end = torch.cumsum(tiles_per, 0)
    tile_begin = tile_end - tiles_per
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    seg_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(tk, device=ids.device) - seg_start[sorted_e]
    n_tiles = min(tk, -(-tk // bm) + num_experts)
    dump = n_tiles * bm  # skipped pairs land in one extra slot past the end
    dest = torch.where(sorted_e < num_experts,
                       tile_begin[sorted_e.clamp(max=num_experts - 1)] * bm + rank,
                       torch.full_like(rank, dump))
    pairs = torch.full((dump + 1,), tk, dtype=torch.int32, device=ids.device)
    pairs.scatter_(0, dest, order.to(torch.int32))
    tile_e = torch.searchsorted(tile_end, torch.arange(n_tiles, device=ids.device), right=True)
    tile_e = torch.where(tile_e < num_experts, tile_e, torch.full_like(tile_e, -1)).to(torch.int32)
    return pairs, tile_e, n_tiles


@triton.jit
def _align_kernel(ids_ptr, pairs_ptr, tile_e_ptr, TK, E, N_TILES, BM: tl.constexpr,
                  TK_P: tl.constexpr, E_P: tl.constexpr, NT_P: tl.constexpr, CH: tl.constexpr):
    """route_tiles in one program for small T*k (decode): one launch instead of ~15 torch ops.

    Per-expert counts and per-pair ranks come from chunked equality matrices (O(T*k * (E + T*k))
    compares, nothing sorted); skipped pairs (id -1) count as expert E, which owns no tile.
    """
    p = tl.arange(0, TK_P)
    e = tl.load(ids_ptr + p, mask=p < TK, other=-1).to(tl.int32)
    e = tl.where(e < 0, E, e)
    ex = tl.arange(0, E_P)
    counts = tl.zeros((E_P,), dtype=tl.int32)
    rank = tl.zeros((TK_P,), dtype=tl.int32)
    for q0 in range(0, TK_P, CH):
        q = q0 + tl.arange(0, CH)
        eq = tl.load(ids_ptr + q, mask=q < TK, other=-1).to(tl.int32)
        eq = tl.where(eq < 0, E, eq)
        counts += tl.sum((eq[None, :] == ex[:, None]).to(tl.int32), axis=1)
        earlier = (eq[None, :] == e[:, None]) & (q[None, :] < p[:, None])
        rank += tl.sum(earlier.to(tl.int32), axis=1)
    tiles_per = (counts + BM - 1) // BM
    tile_end = tl.cumsum(tiles_per, axis=0)
    tile_begin = tile_end - tiles_per
    valid = (p < TK) & (e < E)
    begin = tl.gather(tile_begin, tl.where(valid, e, 0), axis=0)
    rows = tl.arange(0, NT_P * BM)
    tl.store(pairs_ptr + rows, tl.full((NT_P * BM,), 0, tl.int32) + TK, mask=rows < N_TILES * BM)
    tl.debug_barrier()  # the padding fill must land before the scatter below
    tl.store(pairs_ptr + begin * BM + rank, p, mask=valid)
    for m0 in range(0, NT_P, CH):
        m = m0 + tl.arange(0, CH)
        owner = tl.sum((tile_end[None, :] <= m[:, None]).to(tl.int32), axis=1)
        tl.store(tile_e_ptr + m, tl.where(owner < E, owner, -1), mask=m < N_TILES)


def align_small(ids: torch.Tensor, num_experts: int, bm: int):
    """Same result as :func:`route_tiles` (padding rows hold T*k) for T*k <= 1024, one launch."""
    tk = ids.numel()
    n_tiles = min(tk, -(-tk // bm) + num_experts)
    pairs = torch.empty(n_tiles * bm + 1, dtype=torch.int32, device=ids.device)
    tile_e = torch.empty(n_tiles, dtype=torch.int32, device=ids.device)
    ch = 16
    _align_kernel[(1,)](ids, pairs, tile_e, tk, num_experts, n_tiles, BM=bm,
                        TK_P=max(ch, triton.next_power_of_2(tk)),
                        E_P=triton.next_power_of_2(num_experts + 1),
                        NT_P=max(ch, triton.next_power_of_2(n_tiles)), CH=ch, num_warps=4)
    return pairs, tile_e, n_tiles


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for tk_p, nt_p in ((16, 16), (1024, 1024)):  # decode T*k: from one token to 1024 pairs
        specs.append(AotSpec(f"moe_align[{tk_p}]", _align_kernel,
                             {"ids_ptr": "*i32", "pairs_ptr": "*i32", "tile_e_ptr": "*i32",
                              "TK": "i32", "E": "i32", "N_TILES": "i32", "BM": "constexpr",
                              "TK_P": "constexpr", "E_P": "constexpr", "NT_P": "constexpr",
                              "CH": "constexpr"},
                             {"BM": 16, "TK_P": tk_p, "E_P": 512, "NT_P": nt_p, "CH": 16}))
    return specs


AOT_SPECS = _aot_specs()
