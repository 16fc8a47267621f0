"""The output stage of :mod:`.delta_chunk` with the key channels in blocks.

Same output as ``_out_kernel``, ``o = (q e^G) S0 + P d`` per (chunk, value head, BV value
channels), but the program never holds a whole [64, Dk] tile of q or k, nor the [Dk, BV] chunk
state: ``_out_kernel`` keeps q, k (fp32, [64, 128] each at Dk = 128) and the state live together,
which spills at 4 warps (the H200's ptxas report) and made this stage 4.5x fla's ``chunk_o``
(601 vs 132 us at GDN 1 x 16k, docs/kernels.md). Here:

1. the rows' L2 norms of q (and, for GDN, k): a pass over the channel blocks;
2. per block of BK key channels: ``q_b S0[b]`` accumulated into [64, BV], and for GDN the
   causal score ``q_b k_b^T`` into [64, 64] (KDA's decayed scores come from the WY stage); KDA's
   per-channel decay ``e^{G}`` scales q_b inside the block (G a cumulative sum per channel);
3. GDN scales the rows by ``e^{G_t}`` (a scalar per token) after the product, then both add
   ``P d``.

Every exponent is <= 0, and GDN's intra-chunk decay is formed as in ``_out_kernel``
(``delta_chunk_wy._gdn_decay``). Selected by ``block_k_out`` in the drivers (module default ``OUT_BLOCK_K`` in
:mod:`.delta_chunk`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton.delta_chunk_wy import (
    _chunk_program, _g_rows, _gdn_decay, _head_rows, _mm, _store_rows,
)
from hwinfer.kernels.triton.delta_chunk_wy_blocked import _inv_norm, _tile_starts


@triton.jit
def _out_program(tab_ptr, Hk, Hv, BV: tl.constexpr):
    """An output-stage program's (chunk, value head, key head, first token, tokens, first value
    channel), from grid (chunks, value heads, value blocks) and the chunk table."""
    i_c, i_h, i_hk, tok0, n = _chunk_program(tab_ptr, Hk, Hv)
    return i_c, i_h, i_hk, tok0, n, tl.program_id(2) * BV


@triton.jit
def _out_blocked_kernel(q_ptr, k_ptr, g_ptr, a_ptr, hs_ptr, d_ptr, o_ptr, c_ptr, qg_ptr, tab_ptr,
                        Hk, Hv, QKR, scale, eps, DK: tl.constexpr, DV: tl.constexpr,
                        BV: tl.constexpr, BK: tl.constexpr, PER_CHANNEL: tl.constexpr,
                        USE_L2NORM: tl.constexpr, PREC: tl.constexpr, SPAN: tl.constexpr,
                        QG: tl.constexpr = False):
    # QG (KDA, delta_chunk.KDA_OUT_QG): q's rows come normalised, scaled and decayed from their
    # tile's first row (qg_ptr, from _kda_diag_kernel), times e^{G} at that row (the tile
    # cumsums c_ptr): no norm pass, and the loop's loads are plain rows Triton can pipeline
    i_c, i_h, i_hk, tok0, n, c0 = _out_program(tab_ptr, Hk, Hv, BV)
    r = tl.arange(0, 64)
    if not QG:
        nq = _inv_norm(q_ptr, tok0, n, i_hk, QKR, eps, 0, 64, DK, BK, USE_L2NORM) * scale
    if not PER_CHANNEL:
        nk = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 0, 64, DK, BK, USE_L2NORM)
        s = tl.zeros([64, 64], dtype=tl.float32)
    acc = tl.zeros([64, BV], dtype=tl.float32)
    h_base = hs_ptr + (i_c.to(tl.int64) * Hv + i_h) * DK * DV + c0 + tl.arange(0, BV)[None, :]
    for kb in range(0, DK, BK):
        if QG:
            qb = (_head_rows(qg_ptr, tok0, n, i_h, Hv, kb, 0, 64, DK, BK)
                  * _tile_starts(c_ptr, tok0, n, i_h, Hv, kb, DK, BK))
        else:
            qb = _head_rows(q_ptr, tok0, n, i_hk, QKR, kb, 0, 64, DK, BK) * nq[:, None]
            if PER_CHANNEL:
                gb = _head_rows(g_ptr, tok0, n, i_h, Hv, kb, 0, 64, DK, BK)
                qb = qb * tl.exp(tl.cumsum(gb, axis=0))
            else:
                kbk = _head_rows(k_ptr, tok0, n, i_hk, QKR, kb, 0, 64, DK, BK) * nk[:, None]
                s += _mm(qb, tl.trans(kbk), PREC)
        hb = tl.load(h_base + (kb + tl.arange(0, BK))[:, None] * DV)
        acc += _mm(qb, hb, PREC)
    if PER_CHANNEL:
        # Aqk rows past n and entries above the diagonal were never written: mask them.
        p = tl.load(a_ptr + ((tok0 + r) * Hv + i_h)[:, None] * 64 + r[None, :],
                    mask=(r < n)[:, None] & (r[None, :] <= r[:, None]), other=0.0)
    else:
        g = _g_rows(g_ptr, tok0, n, i_h, Hv, 0, 64, DK, False)
        acc = acc * tl.exp(tl.cumsum(g, axis=0))[:, None]
        p = s * _gdn_decay(g, 64, SPAN)
    d = _head_rows(d_ptr, tok0, n, i_h, Hv, c0, 0, 64, DV, BV)
    o = acc + _mm(p, d, PREC)
    _store_rows(o_ptr, o, tok0, n, i_h, Hv, c0, 0, 64, DV, BV)


def block_k_out_ok(block_k: int, dk: int) -> bool:
    """A key-channel block the kernel takes: a power of two >= 16 dividing Dk."""
    return block_k >= 16 and block_k & (block_k - 1) == 0 and dk % block_k == 0
