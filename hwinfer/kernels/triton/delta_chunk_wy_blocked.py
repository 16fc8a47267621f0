"""The intra-chunk (WY) stage of :mod:`.delta_chunk_wy` with the key channels in blocks.

Same outputs as ``_wy_kernel`` (w, u, the decayed keys, G_end, KDA's off-diagonal Aqk blocks),
same math, but the program never holds whole [16, Dk] tiles. ``_wy_kernel`` keeps q, k and, for
KDA, the per-channel decay sums L and S of its four tiles live through the whole chunk, which
is far more than the register file holds at Dk = 128 (the H200's ptxas report: KDA 128
registers and 434 spilled, GDN 255 and 194 spilled). Here every quantity that depends on a key
channel is taken BK channels at a time:

1. the rows' L2 norms (a pass over the channel blocks of q and k);
2. per channel block: the decays (L, S, T of each tile), the decayed keys and G_end written
   out, and the blocks of ``A`` and KDA's ``Aqk`` accumulated as sums of [16, BK] x [BK, 16]
   products (the sum over channels is what a block is);
3. the block solve for X, as in ``_wy_kernel``;
4. per channel block again: ``w = X (beta k e^G)`` from reloaded k and g (cache hits), and
   ``u = X (beta v)`` per BK value channels.

KDA with ``RAW_K`` (the drivers' ``KDA_RAW_K``, the default with ``SPLIT``) skips step 1 and
the decayed keys of step 2: q and k enter the products as stored, their squared norms are summed
in the same channel loop and applied to the [16, 16] blocks after it, and ``_wu_kernel`` writes
the decayed keys (twenty-fifth session: those keys' spans and stores were what spilled this
kernel; 1,157 -> 855 us on an H100 at KDA 1 x 16k).

Every exponent is <= 0 and a sum of g over its own span, except, for 16-bit inputs with
``SPANS="cumsum"`` (the drivers' KDA_SPANS), KDA's decay after a row in its tile: the tile's
total less the row's running sum (``_kda_spans``), where L and T come from the tile cumsums
``_kda_diag_kernel`` wrote and the channel loop has no scan left. Selected by ``block_k`` in the
drivers (``gdn_chunked`` / ``kda_chunked``; the default). With ``SPLIT`` (the drivers'
``WY_SPLIT``, the default) step 4 is left to ``_wu_kernel`` (:mod:`.delta_chunk_wu`): X is
stored as rows [tokens, Hv, 64] instead.
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton.delta_chunk_wy import (
    _chunk_program, _g_rows, _head_rows, _head_rows_raw, _inv16, _inv16x4, _kb, _solve_off,
    _store_kgates, _store_off_blocks, _store_rows, _wy_rows, _x_diag,
)


@triton.jit
def _rsqrt_norm(ss, eps, USE_L2NORM: tl.constexpr):
    """1 / ||row|| from the row's sum of squares (1 without the norm)."""
    if USE_L2NORM:
        return tl.rsqrt(ss + eps)
    else:
        return ss * 0.0 + 1.0


@triton.jit
def _inv_norm(ptr, tok0, n, i_hk, Hk, eps, R0: tl.constexpr, NR: tl.constexpr,
              DK: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr):
    """1 / ||row|| of rows R0 .. R0+NR-1 of q or k (head i_hk), summed over channel blocks."""
    ss = tl.zeros([NR], dtype=tl.float32)
    if USE_L2NORM:
        for c0 in range(0, DK, BK):
            x = _head_rows(ptr, tok0, n, i_hk, Hk, c0, R0, NR, DK, BK)
            ss += tl.sum(x * x, axis=1)
    return _rsqrt_norm(ss, eps, USE_L2NORM)


@triton.jit
def _spans(g_ptr, tok0, n, i_h, Hv, c0, R0: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr,
           PER_CHANNEL: tl.constexpr):
    """The tile's decay sums over spans inside it: L (rows <= t), S (rows > t), T (all), for
    channels c0 .. c0+BK ([16, BK], [16, BK], [BK]; KDA) or per row ([16], [16], []; GDN)."""
    if PER_CHANNEL:
        g = _head_rows(g_ptr, tok0, n, i_h, Hv, c0, R0, 16, DK, BK)
        gs = _head_rows(g_ptr, tok0 + 1, tl.minimum(n - 1, R0 + 15), i_h, Hv, c0, R0, 16, DK, BK)
    else:
        g = _g_rows(g_ptr, tok0, n, i_h, Hv, R0, 16, DK, False)
        gs = _g_rows(g_ptr, tok0 + 1, tl.minimum(n - 1, R0 + 15), i_h, Hv, R0, 16, DK, False)
    return tl.cumsum(g, axis=0), tl.cumsum(gs, axis=0, reverse=True), tl.sum(g, axis=0)


@triton.jit
def _tile_cumsum(c_ptr, tok0, n, i_h, Hv, c0, R0: tl.constexpr, row, DK: tl.constexpr,
                 BK: tl.constexpr):
    """The running sum of g at ``row`` of the tile starting at R0 (channels c0 .. c0+BK, [BK];
    0 for a tile past n), from the tile cumsums of ``_kda_diag_kernel`` (``CS``)."""
    cols = c0 + tl.arange(0, BK)
    return tl.load(c_ptr + ((tok0 + row) * Hv + i_h) * DK + cols, mask=(cols < DK) & (R0 < n),
                   other=0.0)


@triton.jit
def _tile_total(c_ptr, tok0, n, i_h, Hv, c0, R0: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr):
    """A tile's sum of g over its rows: the running sum at its last row."""
    return _tile_cumsum(c_ptr, tok0, n, i_h, Hv, c0, R0, tl.minimum(n - 1, R0 + 15), DK, BK)


@triton.jit
def _tile_first(c_ptr, tok0, n, i_h, Hv, c0, R0: tl.constexpr, DK: tl.constexpr,
                BK: tl.constexpr):
    """g at a tile's first row: the running sum there."""
    return _tile_cumsum(c_ptr, tok0, n, i_h, Hv, c0, R0, R0, DK, BK)


@triton.jit
def _tile_starts(c_ptr, tok0, n, i_h, Hv, c0, DK: tl.constexpr, BK: tl.constexpr):
    """KDA's decay from the chunk's start to each row's 16-row tile's first row, e^{G[r0]} =
    e^{c[r0] + totals of the tiles before} ([64, BK], channels c0 .. c0+BK; four vectors
    exponentiated, then spread over their tiles' rows), from the tile cumsums."""
    t0 = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 0, DK, BK)
    t1 = t0 + _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 16, DK, BK)
    t2 = t1 + _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 32, DK, BK)
    e0 = tl.exp(_tile_first(c_ptr, tok0, n, i_h, Hv, c0, 0, DK, BK))
    e1 = tl.exp(_tile_first(c_ptr, tok0, n, i_h, Hv, c0, 16, DK, BK) + t0)
    e2 = tl.exp(_tile_first(c_ptr, tok0, n, i_h, Hv, c0, 32, DK, BK) + t1)
    e3 = tl.exp(_tile_first(c_ptr, tok0, n, i_h, Hv, c0, 48, DK, BK) + t2)
    r = tl.arange(0, 64)[:, None]
    return tl.where(r >= 48, e3[None, :], tl.where(r >= 32, e2[None, :],
                                                   tl.where(r >= 16, e1[None, :], e0[None, :])))


@triton.jit
def _kda_spans(g_ptr, c_ptr, tok0, n, i_h, Hv, c0, R0: tl.constexpr, DK: tl.constexpr,
               BK: tl.constexpr, SPANS: tl.constexpr):
    """KDA's L, S, T of a tile (as ``_spans``, channels c0 .. c0+BK) by the drivers' KDA_SPANS:
    "scan" two scans of g; "half" one (S = T - L); "cumsum" / "cumsum_exact" none / one, L and
    T read from the tile cumsums ``_kda_diag_kernel`` wrote, S = T - L / S by a reverse scan.

    S = T - L is the one exponent here that is not a sum of its own terms: its cancellation
    costs |T| x 6e-8 of it, under the tf32 rounding (2^-11) of the products it feeds while the
    tile's decay sum |T| < ~8,000; it is clamped at 0 and taken for 16-bit inputs only."""
    if SPANS == "scan":
        L, S, T = _spans(g_ptr, tok0, n, i_h, Hv, c0, R0, DK, BK, True)
    elif SPANS == "half":
        g = _head_rows(g_ptr, tok0, n, i_h, Hv, c0, R0, 16, DK, BK)
        L = tl.cumsum(g, axis=0)
        T = tl.sum(g, axis=0)
        S = tl.minimum(T[None, :] - L, 0.0)
    else:
        L = _head_rows(c_ptr, tok0, n, i_h, Hv, c0, R0, 16, DK, BK)
        T = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, R0, DK, BK)
        if SPANS == "cumsum_exact":
            gs = _head_rows(g_ptr, tok0 + 1, tl.minimum(n - 1, R0 + 15), i_h, Hv, c0, R0, 16, DK,
                            BK)
            S = tl.cumsum(gs, axis=0, reverse=True)
        else:
            S = tl.minimum(T[None, :] - L, 0.0)
    return L, S, T


@triton.jit
def _chunk_decay(c_ptr, tok0, n, i_h, Hv, c0, DK: tl.constexpr, BC: tl.constexpr):
    """KDA's decay from the chunk's start through row t, G [64, BC] (channels c0 .. c0+BC), and
    the chunk's total [BC], from the tile cumsums of ``_kda_diag_kernel``: a row's running sum
    in its tile plus the totals of the tiles before it (sums of disjoint parts of its span)."""
    r = tl.arange(0, 64)
    G = _head_rows(c_ptr, tok0, n, i_h, Hv, c0, 0, 64, DK, BC)
    T0 = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 0, DK, BC)
    T1 = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 16, DK, BC)
    T2 = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 32, DK, BC)
    T3 = _tile_total(c_ptr, tok0, n, i_h, Hv, c0, 48, DK, BC)
    G = G + tl.where(r[:, None] >= 16, T0[None, :], 0.0)
    G = G + tl.where(r[:, None] >= 32, T1[None, :], 0.0)
    G = G + tl.where(r[:, None] >= 48, T2[None, :], 0.0)
    return G, T0 + T1 + T2 + T3


@triton.jit
def _gdn_factor(Li, Sj, mid):
    """GDN's decay of block (i, j), i > j: e^{L_i[t] + mid + S_j[s]} (exponent <= 0)."""
    return tl.exp(Li[:, None] + mid + Sj[None, :])


@triton.jit
def _gdn_diag(g_ptr, tok0, n, i_h, Hv, DK: tl.constexpr, R0: tl.constexpr):
    """GDN's decay inside a diagonal block, strictly lower: e^{g_{s+1} + .. + g_t}."""
    c16 = tl.arange(0, 16)
    g = _g_rows(g_ptr, tok0, n, i_h, Hv, R0, 16, DK, False)
    span = tl.cumsum(tl.where(c16[:, None] > c16[None, :], g[:, None], 0.0), axis=0)
    return tl.exp(tl.where(c16[:, None] > c16[None, :], span, float("-inf")))


@triton.jit
def _raw_kk(a, b, RAW: tl.constexpr):
    """a b^T of two [16, BK] tiles as stored (16-bit): "native" in the tensor cores (products
    of 16-bit values are exact in fp32), "fp32" the same exact products in fp32 (interpreter)."""
    if RAW == "native":
        return tl.dot(a, tl.trans(b))
    else:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")


@triton.jit
def _scale_lower(b10, b20, b21, b30, b31, b32, r1, r2, r3, c0, c1, c2):
    """The six blocks below the diagonal of a [64, 64] block matrix, block (i, j) scaled by
    r_i (its rows) and c_j (its columns): the rows' norms applied after raw products."""
    return (b10 * (r1[:, None] * c0[None, :]), b20 * (r2[:, None] * c0[None, :]),
            b21 * (r2[:, None] * c1[None, :]), b30 * (r3[:, None] * c0[None, :]),
            b31 * (r3[:, None] * c1[None, :]), b32 * (r3[:, None] * c2[None, :]))


@triton.jit
def _gdn_raw_blocks(k_ptr, tok0, n, i_hk, QKR, eps, DK: tl.constexpr, BK: tl.constexpr,
                    USE_L2NORM: tl.constexpr, RAW: tl.constexpr):
    """GDN's ten lower 16 x 16 blocks of k k^T over a chunk, from the keys as stored, each
    scaled after by the rows' inverse norms (accumulated in the same pass): one pass over the
    key channels instead of a norm pass and a pass of normalised fp32 tf32 products."""
    z = tl.zeros([16, 16], dtype=tl.float32)
    a00, a11, a22, a33, a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z, z, z, z, z
    s0 = tl.zeros([16], dtype=tl.float32)
    s1, s2, s3 = s0, s0, s0
    for c0 in range(0, DK, BK):
        k0 = _head_rows_raw(k_ptr, tok0, n, i_hk, QKR, c0, 0, 16, DK, BK)
        k1 = _head_rows_raw(k_ptr, tok0, n, i_hk, QKR, c0, 16, 16, DK, BK)
        k2 = _head_rows_raw(k_ptr, tok0, n, i_hk, QKR, c0, 32, 16, DK, BK)
        k3 = _head_rows_raw(k_ptr, tok0, n, i_hk, QKR, c0, 48, 16, DK, BK)
        a00 += _raw_kk(k0, k0, RAW)
        a11 += _raw_kk(k1, k1, RAW)
        a22 += _raw_kk(k2, k2, RAW)
        a33 += _raw_kk(k3, k3, RAW)
        a10 += _raw_kk(k1, k0, RAW)
        a20 += _raw_kk(k2, k0, RAW)
        a21 += _raw_kk(k2, k1, RAW)
        a30 += _raw_kk(k3, k0, RAW)
        a31 += _raw_kk(k3, k1, RAW)
        a32 += _raw_kk(k3, k2, RAW)
        if USE_L2NORM:
            s0 += tl.sum(k0.to(tl.float32) * k0.to(tl.float32), axis=1)
            s1 += tl.sum(k1.to(tl.float32) * k1.to(tl.float32), axis=1)
            s2 += tl.sum(k2.to(tl.float32) * k2.to(tl.float32), axis=1)
            s3 += tl.sum(k3.to(tl.float32) * k3.to(tl.float32), axis=1)
    if USE_L2NORM:
        n0, n1, n2, n3 = tl.rsqrt(s0 + eps), tl.rsqrt(s1 + eps), tl.rsqrt(s2 + eps), tl.rsqrt(s3 + eps)
        a00 = a00 * (n0[:, None] * n0[None, :])
        a11 = a11 * (n1[:, None] * n1[None, :])
        a22 = a22 * (n2[:, None] * n2[None, :])
        a33 = a33 * (n3[:, None] * n3[None, :])
        a10, a20, a21, a30, a31, a32 = _scale_lower(a10, a20, a21, a30, a31, a32, n1, n2, n3,
                                                    n0, n1, n2)
    return a00, a11, a22, a33, a10, a20, a21, a30, a31, a32


@triton.jit
def _q_decayed(q_ptr, tok0, n, i_hk, QKR, c0, R0: tl.constexpr, DK: tl.constexpr,
               BK: tl.constexpr, L, nq, RAW_K: tl.constexpr):
    """A q tile decayed by e^L ([16, BK]) and the tile as loaded: normalised and scaled by nq
    first, or (RAW_K) raw, its norm applied to the blocks later."""
    q = _head_rows(q_ptr, tok0, n, i_hk, QKR, c0, R0, 16, DK, BK)
    if RAW_K == "":
        return q * (nq[:, None] * tl.exp(L)), q
    else:
        return q * tl.exp(L), q


@triton.jit
def _row_tile(q_ptr, tok0, n, i_hk, QKR, c0, R0: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr,
              k, L, nq, sq, RAW_K: tl.constexpr):
    """KDA's row tile i of blocks (i, j): k_i e^{L_i}, q_i e^{L_i} ([16, BK]) and, with RAW_K,
    the q rows' sum of squares so far (``sq``) with this channel block's added."""
    lk = k * tl.exp(L)
    lq, qr = _q_decayed(q_ptr, tok0, n, i_hk, QKR, c0, R0, DK, BK, L, nq, RAW_K)
    if RAW_K != "":
        sq += tl.sum(qr * qr, axis=1)
    return lk, lq, sq


@triton.jit
def _acc_pair(a, p, lk, lq, r, PREC: tl.constexpr):
    """Block (i, j) of A and of Aqk, this channel block's part added: k_i e^{L_i} and q_i e^{L_i}
    against r = k_j e^{S_j + (tiles between)}, formed where its two products are (fewer live at
    once: the WY kernel's spills 304 -> 152 B at 2 warps on sm_90)."""
    return (a + tl.dot(lk, tl.trans(r), input_precision=PREC),
            p + tl.dot(lq, tl.trans(r), input_precision=PREC))


@triton.jit
def _wy_blocked_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, a_ptr, kg_ptr, ge_ptr,
                       tab_ptr, xd_ptr, x_ptr, c_ptr, Hk, Hv, QKR, VR, scale, eps,
                       DK: tl.constexpr, DV: tl.constexpr, PER_CHANNEL: tl.constexpr,
                       USE_L2NORM: tl.constexpr, PREC: tl.constexpr, BK: tl.constexpr,
                       SPLIT: tl.constexpr, SOLVE: tl.constexpr, RAW_K: tl.constexpr,
                       SPANS: tl.constexpr = "scan"):
    i_c, i_h, i_hk, tok0, n = _chunk_program(tab_ptr, Hk, Hv)
    r16 = tl.arange(0, 16)
    b0 = tl.load(b_ptr + (tok0 + r16) * Hv + i_h, mask=r16 < n, other=0.0).to(tl.float32)
    b1 = tl.load(b_ptr + (tok0 + 16 + r16) * Hv + i_h, mask=16 + r16 < n, other=0.0).to(tl.float32)
    b2 = tl.load(b_ptr + (tok0 + 32 + r16) * Hv + i_h, mask=32 + r16 < n, other=0.0).to(tl.float32)
    b3 = tl.load(b_ptr + (tok0 + 48 + r16) * Hv + i_h, mask=48 + r16 < n, other=0.0).to(tl.float32)
    if RAW_K == "":
        nk0 = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 0, 16, DK, BK, USE_L2NORM)
        nk1 = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 16, 16, DK, BK, USE_L2NORM)
        nk2 = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 32, 16, DK, BK, USE_L2NORM)
        nk3 = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 48, 16, DK, BK, USE_L2NORM)
    if PER_CHANNEL and RAW_K == "":
        nq1 = _inv_norm(q_ptr, tok0, n, i_hk, QKR, eps, 16, 16, DK, BK, USE_L2NORM) * scale
        nq2 = _inv_norm(q_ptr, tok0, n, i_hk, QKR, eps, 32, 16, DK, BK, USE_L2NORM) * scale
        nq3 = _inv_norm(q_ptr, tok0, n, i_hk, QKR, eps, 48, 16, DK, BK, USE_L2NORM) * scale
        sq1 = tl.zeros([16], dtype=tl.float32)   # (unused: the q rows are normalised first)
        sq2, sq3 = sq1, sq1
    elif PER_CHANNEL:
        # KDA with RAW_K: the rows enter the products as stored, their squared norms summed in
        # the same channel loop and applied to the [16, 16] blocks after it (a block is linear
        # in each row's scale); no norm pass first
        sk0 = tl.zeros([16], dtype=tl.float32)
        sk1, sk2, sk3, sq1, sq2, sq3 = sk0, sk0, sk0, sk0, sk0, sk0
        nq1, nq2, nq3 = sk0, sk0, sk0   # (unused until set from sq after the loop)
    else:
        # GDN's decays are one scalar per token: their span sums are taken once
        L0, S0, T0 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 0, DK, BK, False)
        L1, S1, T1 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 16, DK, BK, False)
        L2, S2, T2 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 32, DK, BK, False)
        L3, S3, T3 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 48, DK, BK, False)
    z = tl.zeros([16, 16], dtype=tl.float32)
    a00, a11, a22, a33 = z, z, z, z   # GDN's diagonal blocks (KDA's come from _kda_diag_kernel)
    a10, a20, a21, a30, a31, a32 = z, z, z, z, z, z
    p10, p20, p21, p30, p31, p32 = z, z, z, z, z, z
    if RAW_K != "" and not PER_CHANNEL:
        # GDN with 16-bit keys: A's blocks from the keys as stored (exact products), their
        # norms applied after; the decayed keys are stored by _wu_kernel (its KG).
        a00, a11, a22, a33, a10, a20, a21, a30, a31, a32 = _gdn_raw_blocks(
            k_ptr, tok0, n, i_hk, QKR, eps, DK, BK, USE_L2NORM, RAW_K)
    else:
        for c0 in range(0, DK, BK):
            k0 = _head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 0, 16, DK, BK)
            k1 = _head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 16, 16, DK, BK)
            k2 = _head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 32, 16, DK, BK)
            k3 = _head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 48, 16, DK, BK)
            if RAW_K == "":
                k0, k1, k2, k3 = (k0 * nk0[:, None], k1 * nk1[:, None], k2 * nk2[:, None],
                                  k3 * nk3[:, None])
            else:
                sk0 += tl.sum(k0 * k0, axis=1)
                sk1 += tl.sum(k1 * k1, axis=1)
                sk2 += tl.sum(k2 * k2, axis=1)
                sk3 += tl.sum(k3 * k3, axis=1)
            if PER_CHANNEL:
                L0, S0, T0 = _kda_spans(g_ptr, c_ptr, tok0, n, i_h, Hv, c0, 0, DK, BK, SPANS)
                L1, S1, T1 = _kda_spans(g_ptr, c_ptr, tok0, n, i_h, Hv, c0, 16, DK, BK, SPANS)
                L2, S2, T2 = _kda_spans(g_ptr, c_ptr, tok0, n, i_h, Hv, c0, 32, DK, BK, SPANS)
                L3, S3, T3 = _kda_spans(g_ptr, c_ptr, tok0, n, i_h, Hv, c0, 48, DK, BK, SPANS)
                tl.store(ge_ptr + (i_c.to(tl.int64) * Hv + i_h) * DK + c0 + tl.arange(0, BK),
                         T0 + T1 + T2 + T3)
                # k_j e^{S_j + (tiles between)} and k_i e^{L_i}, q_i e^{L_i}: block (i, j) is
                # their product summed over channels, here over this channel block.
                lk, lq, sq1 = _row_tile(q_ptr, tok0, n, i_hk, QKR, c0, 16, DK, BK, k1, L1, nq1,
                                        sq1, RAW_K)
                a10, p10 = _acc_pair(a10, p10, lk, lq, k0 * tl.exp(S0), PREC)
                lk, lq, sq2 = _row_tile(q_ptr, tok0, n, i_hk, QKR, c0, 32, DK, BK, k2, L2, nq2,
                                        sq2, RAW_K)
                a20, p20 = _acc_pair(a20, p20, lk, lq, k0 * tl.exp(S0 + T1[None, :]), PREC)
                a21, p21 = _acc_pair(a21, p21, lk, lq, k1 * tl.exp(S1), PREC)
                lk, lq, sq3 = _row_tile(q_ptr, tok0, n, i_hk, QKR, c0, 48, DK, BK, k3, L3, nq3,
                                        sq3, RAW_K)
                a30, p30 = _acc_pair(a30, p30, lk, lq, k0 * tl.exp(S0 + (T1 + T2)[None, :]), PREC)
                a31, p31 = _acc_pair(a31, p31, lk, lq, k1 * tl.exp(S1 + T2[None, :]), PREC)
                a32, p32 = _acc_pair(a32, p32, lk, lq, k2 * tl.exp(S2), PREC)
            else:
                a00 += tl.dot(k0, tl.trans(k0), input_precision=PREC)
                a11 += tl.dot(k1, tl.trans(k1), input_precision=PREC)
                a22 += tl.dot(k2, tl.trans(k2), input_precision=PREC)
                a33 += tl.dot(k3, tl.trans(k3), input_precision=PREC)
                a10 += tl.dot(k1, tl.trans(k0), input_precision=PREC)
                a20 += tl.dot(k2, tl.trans(k0), input_precision=PREC)
                a21 += tl.dot(k2, tl.trans(k1), input_precision=PREC)
                a30 += tl.dot(k3, tl.trans(k0), input_precision=PREC)
                a31 += tl.dot(k3, tl.trans(k1), input_precision=PREC)
                a32 += tl.dot(k3, tl.trans(k2), input_precision=PREC)
            if RAW_K == "":   # (with RAW_K, KDA's decayed keys are written by _wu_kernel)
                _store_kgates(kg_ptr, k0, k1, k2, k3, S0, S1, S2, S3, T1, T2, T3, tok0, n, i_h,
                              Hv, c0, DK, BK, PER_CHANNEL)
    if PER_CHANNEL:
        if RAW_K != "":
            nk0, nk1 = _rsqrt_norm(sk0, eps, USE_L2NORM), _rsqrt_norm(sk1, eps, USE_L2NORM)
            nk2, nk3 = _rsqrt_norm(sk2, eps, USE_L2NORM), _rsqrt_norm(sk3, eps, USE_L2NORM)
            a10, a20, a21, a30, a31, a32 = _scale_lower(a10, a20, a21, a30, a31, a32, nk1, nk2,
                                                        nk3, nk0, nk1, nk2)
            nq1 = _rsqrt_norm(sq1, eps, USE_L2NORM) * scale
            nq2 = _rsqrt_norm(sq2, eps, USE_L2NORM) * scale
            nq3 = _rsqrt_norm(sq3, eps, USE_L2NORM) * scale
            p10, p20, p21, p30, p31, p32 = _scale_lower(p10, p20, p21, p30, p31, p32, nq1, nq2,
                                                        nq3, nk0, nk1, nk2)
        _store_off_blocks(a_ptr, p10, p20, p21, p30, p31, p32, tok0, n, i_h, Hv)
        x00, x11, x22, x33 = _x_diag(xd_ptr, tok0, n, i_h, Hv)
    else:
        tl.store(ge_ptr + i_c.to(tl.int64) * Hv + i_h, T0 + T1 + T2 + T3)
        a10 = a10 * _gdn_factor(L1, S0, 0.0)
        a20 = a20 * _gdn_factor(L2, S0, T1)
        a21 = a21 * _gdn_factor(L2, S1, 0.0)
        a30 = a30 * _gdn_factor(L3, S0, T1 + T2)
        a31 = a31 * _gdn_factor(L3, S1, T2)
        a32 = a32 * _gdn_factor(L3, S2, 0.0)
        a00 = a00 * _gdn_diag(g_ptr, tok0, n, i_h, Hv, DK, 0) * b0[:, None]
        a11 = a11 * _gdn_diag(g_ptr, tok0, n, i_h, Hv, DK, 16) * b1[:, None]
        a22 = a22 * _gdn_diag(g_ptr, tok0, n, i_h, Hv, DK, 32) * b2[:, None]
        a33 = a33 * _gdn_diag(g_ptr, tok0, n, i_h, Hv, DK, 48) * b3[:, None]
        if SOLVE == "x4":   # the four blocks in one substitution (a third of the instructions)
            x00, x11, x22, x33 = _inv16x4(a00, a11, a22, a33, n)
        else:
            x00 = _inv16(a00, n)
            x11 = _inv16(a11, n - 16)
            x22 = _inv16(a22, n - 32)
            x33 = _inv16(a33, n - 48)
    x10, x20, x21, x30, x31, x32 = _solve_off(a10, a20, a21, a30, a31, a32, x00, x11, x22, x33,
                                              b1, b2, b3, PREC)
    if SPLIT:
        # X to memory; w and u are one [64, 64] product each in _wu_kernel (delta_chunk_wu.py)
        _store_off_blocks(x_ptr, x10, x20, x21, x30, x31, x32, tok0, n, i_h, Hv)
        _store_diag_blocks(x_ptr, x00, x11, x22, x33, tok0, n, i_h, Hv)
    else:
        _wu_here(k_ptr, v_ptr, g_ptr, w_ptr, u_ptr, tok0, n, i_h, i_hk, QKR, VR, Hv, nk0, nk1, nk2,
                 nk3, b0, b1, b2, b3, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33, DK, DV,
                 PER_CHANNEL, PREC, BK)


@triton.jit
def _store_diag_blocks(x_ptr, x00, x11, x22, x33, tok0, n, i_h, Hv):
    """The four diagonal 16 x 16 blocks of X into rows [tokens, Hv, 64]."""
    _store_rows(x_ptr, x00, tok0, n, i_h, Hv, 0, 0, 16, 64, 16)
    _store_rows(x_ptr, x11, tok0, n, i_h, Hv, 16, 16, 16, 64, 16)
    _store_rows(x_ptr, x22, tok0, n, i_h, Hv, 32, 32, 16, 64, 16)
    _store_rows(x_ptr, x33, tok0, n, i_h, Hv, 48, 48, 16, 64, 16)


@triton.jit
def _wu_here(k_ptr, v_ptr, g_ptr, w_ptr, u_ptr, tok0, n, i_h, i_hk, QKR, VR, Hv, nk0, nk1, nk2, nk3,
             b0, b1, b2, b3, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
             DK: tl.constexpr, DV: tl.constexpr, PER_CHANNEL: tl.constexpr, PREC: tl.constexpr,
             BK: tl.constexpr):
    """w and u in the WY program itself (``SPLIT`` off), from X's sixteen-row blocks."""
    if not PER_CHANNEL:   # GDN: one decay a row, its span sums taken once
        L0, S0, T0 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 0, DK, BK, False)
        L1, S1, T1 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 16, DK, BK, False)
        L2, S2, T2 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 32, DK, BK, False)
        L3, S3, T3 = _spans(g_ptr, tok0, n, i_h, Hv, 0, 48, DK, BK, False)
    # w = X (beta k e^G), G from the chunk's start: channel block by channel block.
    for c0 in range(0, DK, BK):
        if PER_CHANNEL:
            L0, S0, T0 = _spans(g_ptr, tok0, n, i_h, Hv, c0, 0, DK, BK, True)
            L1, S1, T1 = _spans(g_ptr, tok0, n, i_h, Hv, c0, 16, DK, BK, True)
            L2, S2, T2 = _spans(g_ptr, tok0, n, i_h, Hv, c0, 32, DK, BK, True)
            L3, S3, T3 = _spans(g_ptr, tok0, n, i_h, Hv, c0, 48, DK, BK, True)
        y0 = _kb(_head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 0, 16, DK, BK) * nk0[:, None], b0,
                 T0 * 0.0, L0, PER_CHANNEL)
        y1 = _kb(_head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 16, 16, DK, BK) * nk1[:, None], b1,
                 T0, L1, PER_CHANNEL)
        y2 = _kb(_head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 32, 16, DK, BK) * nk2[:, None], b2,
                 T0 + T1, L2, PER_CHANNEL)
        y3 = _kb(_head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 48, 16, DK, BK) * nk3[:, None], b3,
                 T0 + T1 + T2, L3, PER_CHANNEL)
        _wy_rows(w_ptr, tok0, n, i_h, Hv, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
                 y0, y1, y2, y3, DK, PREC, c0, BK)
    # u = X (beta v)
    for c0 in range(0, DV, BK):
        y0 = _head_rows(v_ptr, tok0, n, i_h, VR, c0, 0, 16, DV, BK) * b0[:, None]
        y1 = _head_rows(v_ptr, tok0, n, i_h, VR, c0, 16, 16, DV, BK) * b1[:, None]
        y2 = _head_rows(v_ptr, tok0, n, i_h, VR, c0, 32, 16, DV, BK) * b2[:, None]
        y3 = _head_rows(v_ptr, tok0, n, i_h, VR, c0, 48, 16, DV, BK) * b3[:, None]
        _wy_rows(u_ptr, tok0, n, i_h, Hv, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
                 y0, y1, y2, y3, DV, PREC, c0, BK)


def block_k_ok(block_k: int, dk: int, dv: int) -> bool:
    """A channel block must be a power of two >= 16 dividing both Dk and Dv."""
    return block_k >= 16 and block_k & (block_k - 1) == 0 and dk % block_k == 0 and dv % block_k == 0
