"""The WY stage's products ``w = X (beta k e^G)`` and ``u = X (beta v)`` as a kernel of their own
(driver: :mod:`.delta_chunk`, ``WY_SPLIT``).

``_wy_blocked_kernel`` with ``SPLIT`` on stops after the solve and writes ``X = (I + diag(beta)
A)^-1`` (unit lower triangular, [64, 64] a chunk and value head) as rows ``[tokens, Hv, 64]``
fp32, or bf16 with ``delta_chunk.X_16BIT``, whose products here then take bf16 operands
(``PREC`` "bf16"). Here one program a (chunk, value head) reads it once and forms both products
as whole [64, 64] x [64, BC] matrix products, channel block by channel block: one tensor-core
product of M = 64 instead of ten 16 x 16 blocks, and the WY program no longer holds X, k, v and
the decay sums at once (255 registers and spills on the H200 when it did).

``G`` is the decay from the chunk's start through row t, a cumulative sum of g over the rows (each
exponent <= 0, a sum of its own terms, as everywhere in these kernels); KDA with ``CS`` reads it
from the tile cumsums of ``_kda_diag_kernel`` instead of scanning g. Shapes: k [tokens, Hk, Dk] and
v [tokens, Hv, Dv] in the input dtype, g [tokens, Hv(, Dk)] and beta [tokens, Hv] any float, w
[tokens, Hv, Dk] and u [tokens, Hv, Dv] (bf16 for 16-bit inputs, u fp32 without
``delta_chunk.U_16BIT``). With ``KG`` (a WY kernel that read the keys raw: GDN_RAW_K, KDA_RAW_K)
the decayed keys kg [tokens, Hv, Dk] for the state stage are written here too; GDN with ``KS``
writes only their row scales ``|k_t|^-1 e^{G_end - G_t}`` (kg [tokens, Hv] fp32), which the state
stage applies to its deltas instead (``delta_chunk.GDN_STATE_RAW_K``). The one exponent here that
is not a sum of its own terms: KDA's keys stored in bf16 take their decay as the chunk's total less
G (clamped at 0), whose cancellation is far under their bf16 rounding; fp32 keys keep the exact
reverse sum.
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton.delta_chunk_wy import (
    _chunk_program, _g_rows, _head_rows, _head_rows_raw, _mm, _mm_split_left, _store_rows,
)
from hwinfer.kernels.triton.delta_chunk_wy_blocked import _chunk_decay, _inv_norm


@triton.jit
def _wu_kernel(k_ptr, v_ptr, g_ptr, b_ptr, x_ptr, w_ptr, u_ptr, kg_ptr, c_ptr, tab_ptr, Hk, Hv,
               QKR, VR, eps, DK: tl.constexpr, DV: tl.constexpr, BC: tl.constexpr,
               PER_CHANNEL: tl.constexpr, USE_L2NORM: tl.constexpr, PREC: tl.constexpr,
               KG: tl.constexpr, CS: tl.constexpr = False, KS: tl.constexpr = False,
               XS: tl.constexpr = ""):
    i_c, i_h, i_hk, tok0, n = _chunk_program(tab_ptr, Hk, Hv)
    r = tl.arange(0, 64)
    live = r < n
    # X's blocks above the diagonal and rows past n were never written: masked here.
    x = tl.load(x_ptr + ((tok0 + r) * Hv + i_h)[:, None] * 64 + r[None, :],
                mask=live[:, None] & (r[None, :] <= r[:, None]), other=0.0)
    b = tl.load(b_ptr + (tok0 + r) * Hv + i_h, mask=live, other=0.0).to(tl.float32)
    nk = _inv_norm(k_ptr, tok0, n, i_hk, QKR, eps, 0, 64, DK, BC, USE_L2NORM)
    bk = b * nk
    if not PER_CHANNEL:   # GDN: one decay a row
        bk = bk * tl.exp(tl.cumsum(_g_rows(g_ptr, tok0, n, i_h, Hv, 0, 64, DK, False), axis=0))
    if KG and not PER_CHANNEL:
        # The decayed keys k e^{G_end - G} for the state stage (the WY kernel leaves them here
        # when it reads the keys raw): the decay after row t, a sum of g over rows t+1 .. n-1
        # (GDN: one a row; KDA: per channel, in the loop).
        kgs = nk * tl.exp(tl.cumsum(_g_rows(g_ptr, tok0 + 1, n - 1, i_h, Hv, 0, 64, DK, False),
                                    axis=0, reverse=True))
        if KS:   # the state stage scales its deltas by them and reads the keys as stored
            tl.store(kg_ptr + (tok0 + r) * Hv + i_h, kgs, mask=live)
    if XS != "":
        # GDN, bf16 k and v: the row scales go onto X's columns, w = (X diag(bk)) k and
        # u = (X diag(beta)) v, and the fp32 left factor is split into bf16 hi + lo against the
        # raw 16-bit rows (delta_chunk_wy._mm_split_left): ~16 bits of X where tf32 kept 11,
        # and the rows enter the products as loaded (no fp32 tile scaled and staged per block).
        xw = x * bk[None, :]
        for c0 in range(0, DK, BC):
            kr = _head_rows_raw(k_ptr, tok0, n, i_hk, QKR, c0, 0, 64, DK, BC)
            _store_rows(w_ptr, _mm_split_left(xw, kr, XS), tok0, n, i_h, Hv, c0, 0, 64, DK, BC)
        xu = x * b[None, :]
        for c0 in range(0, DV, BC):
            vr = _head_rows_raw(v_ptr, tok0, n, i_h, VR, c0, 0, 64, DV, BC)
            _store_rows(u_ptr, _mm_split_left(xu, vr, XS), tok0, n, i_h, Hv, c0, 0, 64, DV, BC)
    else:
        for c0 in range(0, DK, BC):
            kr = _head_rows(k_ptr, tok0, n, i_hk, QKR, c0, 0, 64, DK, BC)
            y = kr * bk[:, None]
            if PER_CHANNEL:
                if CS:   # from the tile cumsums of _kda_diag_kernel (no scan here)
                    G, total = _chunk_decay(c_ptr, tok0, n, i_h, Hv, c0, DK, BC)
                else:
                    gb = _head_rows(g_ptr, tok0, n, i_h, Hv, c0, 0, 64, DK, BC)
                    G = tl.cumsum(gb, axis=0)
                    total = tl.sum(gb, axis=0)
                y = y * tl.exp(G)
                if KG:   # the decay after row t, per channel
                    if kg_ptr.dtype.element_ty == tl.float32:
                        # exact: a sum of its own terms (rows t+1 .. n-1)
                        after = tl.cumsum(_head_rows(g_ptr, tok0 + 1, n - 1, i_h, Hv, c0, 0,
                                                     64, DK, BC), axis=0, reverse=True)
                    else:
                        # bf16 keys: the chunk's total less G (no second scan). Its cancellation
                        # costs |G_end| x 6e-8 of the exponent (<= 1e-5 at |g| <= 2 a token), far
                        # under the 2^-9 of the bf16 rounding the stored keys take anyway.
                        after = tl.minimum(total[None, :] - G, 0.0)
                    _store_rows(kg_ptr, kr * nk[:, None] * tl.exp(after), tok0, n, i_h, Hv,
                                c0, 0, 64, DK, BC)
            elif KG and not KS:
                _store_rows(kg_ptr, kr * kgs[:, None], tok0, n, i_h, Hv, c0, 0, 64, DK, BC)
            _store_rows(w_ptr, _mm(x, y, PREC), tok0, n, i_h, Hv, c0, 0, 64, DK, BC)
        for c0 in range(0, DV, BC):
            y = _head_rows(v_ptr, tok0, n, i_h, VR, c0, 0, 64, DV, BC) * b[:, None]
            _store_rows(u_ptr, _mm(x, y, PREC), tok0, n, i_h, Hv, c0, 0, 64, DV, BC)

