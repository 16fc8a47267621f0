"""KDA's diagonal 16 x 16 blocks without a loop over rows (driver: :mod:`.delta_chunk`,
``DIAG_FORM = "levels"``, opt-in; the default row loop is ``delta_chunk_wy._kda_diag_kernel``).

Same outputs as the loop: the decayed causal ``q k^T`` block (s <= t) into Aqk at the tile's
columns, and ``(I + diag(beta) A)^-1`` of the strictly lower decayed ``k k^T`` block into
``xd`` [tokens, Hv, 16]. The decay of a pair s < t is ``e^{g_{s+1} + .. + g_t}`` per channel;
it does not factor out of the channel sum, and ``e^{G_t} e^{-G_s}`` would overflow at strong
decay. So the pairs are taken by levels of a binary split of the tile: at level m (8, 4, 2, 1)
the pairs whose rows lie in adjacent m-row blocks of one 2m-row block. For such a pair the span
splits at the boundary b between the two blocks into ``L_m[t] = g_b + .. + g_t`` (t's block,
from its start) and ``S_m[s] = g_{s+1} + .. + g_{b-1}`` (s's block, after s): both sums of
their own terms, both <= 0. A level is then two products over the channels, ``(k e^{L_m})
(k e^{S_m})^T`` and ``(q e^{L_m}) (k e^{S_m})^T``, kept on that level's pairs; every pair
belongs to exactly one level. The segment sums are products of 0/1 matrices with g: exact fp32
("ieee") for fp32 inputs, 3xTF32 (fp32 accuracy on the tensor cores) for 16-bit ones.

Work a tile: 8 [16, DK] exponentials and 16 small products, all rows at once, where the loop
walks 16 dependent steps of row loads and cross-thread reductions. Measured on the H200 (KDA 1 x
16k, twelfth session): 3,408 us at 2 warps, 1,898 at 4, against the loop's 1,170, so it is not
the default. That run formed the segment sums as exact fp32 products (FMA units) for bf16
inputs too; the 3xTF32 form above was written after it and is not timed yet.
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton.delta_chunk_wy import (
    _g_rows, _head_rows, _inv16, _qk_rows, _tile_program,
)
from hwinfer.kernels.triton.delta_chunk_wy_blocked import _inv_norm


@triton.jit
def _level(k, q, g, M: tl.constexpr, PREC: tl.constexpr):
    """The pairs of level M: ([16, 16] decayed k k^T, [16, 16] decayed q k^T), 0 elsewhere."""
    r = tl.arange(0, 16)
    same = (r[:, None] // M) == (r[None, :] // M)
    upto = tl.where(same & (r[None, :] <= r[:, None]), 1.0, 0.0)   # [t, r]: r in t's block, <= t
    after = tl.where(same & (r[None, :] > r[:, None]), 1.0, 0.0)   # [s, r]: r in s's block, > s
    # The segment sums at fp32 accuracy: exact FMA products for fp32 inputs ("ieee"), 3xTF32
    # tensor-core products beside the 16-bit inputs' tf32 pair products.
    SUMS: tl.constexpr = "ieee" if PREC == "ieee" else "tf32x3"
    el = tl.exp(tl.dot(upto, g, input_precision=SUMS))
    right = k * tl.exp(tl.dot(after, g, input_precision=SUMS))
    pair = ((r[:, None] // (2 * M)) == (r[None, :] // (2 * M))) \
        & ((r[:, None] // M) % 2 == 1) & ((r[None, :] // M) % 2 == 0)
    akk = tl.dot(k * el, tl.trans(right), input_precision=PREC)
    aqk = tl.dot(q * el, tl.trans(right), input_precision=PREC)
    return tl.where(pair, akk, 0.0), tl.where(pair, aqk, 0.0)


@triton.jit
def _kda_diag_levels_kernel(q_ptr, k_ptr, g_ptr, b_ptr, a_ptr, xd_ptr, tab_ptr, Hk, Hv, QKR, scale,
                            eps, DK: tl.constexpr, USE_L2NORM: tl.constexpr,
                            PREC: tl.constexpr):
    """One program per (16-row tile, value head), as ``_kda_diag_kernel``."""
    r0, i_h, i_hk, tok0, live = _tile_program(tab_ptr, Hk, Hv)
    if live > 0:
        r = tl.arange(0, 16)
        k = _qk_rows(k_ptr, tok0, live, i_hk, QKR, 1.0, eps, 0, 16, DK, USE_L2NORM)
        q = _qk_rows(q_ptr, tok0, live, i_hk, QKR, scale, eps, 0, 16, DK, USE_L2NORM)
        g = _g_rows(g_ptr, tok0, live, i_h, Hv, 0, 16, DK, True)
        b = tl.load(b_ptr + (tok0 + r) * Hv + i_h, mask=r < live, other=0.0).to(tl.float32)
        # s = t: no decay
        aqk = tl.where(r[:, None] == r[None, :], tl.sum(q * k, axis=1)[:, None], 0.0)
        akk, p = _level(k, q, g, 8, PREC)
        aqk += p
        a, p = _level(k, q, g, 4, PREC)
        akk += a
        aqk += p
        a, p = _level(k, q, g, 2, PREC)
        akk += a
        aqk += p
        a, p = _level(k, q, g, 1, PREC)
        akk += a
        aqk += p
        x = _inv16(akk * b[:, None], live)
        out = ((tok0 + r) * Hv + i_h)[:, None]
        tl.store(xd_ptr + out * 16 + r[None, :], x, mask=(r < live)[:, None])
        tl.store(a_ptr + out * 64 + r0 + r[None, :], aqk, mask=(r < live)[:, None])


@triton.jit
def _kda_diag_pairs_kernel(q_ptr, k_ptr, g_ptr, b_ptr, a_ptr, xd_ptr, tab_ptr, Hk, Hv, QKR, scale,
                           eps, DK: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr):
    """KDA's diagonal blocks with every pair (t, s) of the tile at once (``DIAG_FORM =
    "pairs"``, opt-in, 16-bit inputs): per BK key channels, the decay of each pair as
    ``e^{G_t - G_s}`` with G the cumulative sum of g over the tile's 16 rows ([16, 16, BK]
    exponentials, the pairs with s > t set to e^-inf = 0, so no exponent is ever positive), and
    both blocks as sums over the channels of ``k_t k_s e^..`` / ``q_t k_s e^..``. No row loop:
    the exponentials run on all rows at once. The difference of two cumulative sums loses
    ~|G| 6e-8 of absolute precision, which the loop's products avoid; over 16 rows that is
    ~1e-4 relative at g ~ -100 per token, far inside a 16-bit input's tolerance (5e-3), not an
    fp32 one's (2e-5), so fp32 inputs keep the loop. Same outputs as ``_kda_diag_kernel``."""
    r0, i_h, i_hk, tok0, live = _tile_program(tab_ptr, Hk, Hv)
    if live > 0:
        r = tl.arange(0, 16)
        nk = _inv_norm(k_ptr, tok0, live, i_hk, QKR, eps, 0, 16, DK, BK, USE_L2NORM)
        nq = _inv_norm(q_ptr, tok0, live, i_hk, QKR, eps, 0, 16, DK, BK, USE_L2NORM) * scale
        b = tl.load(b_ptr + (tok0 + r) * Hv + i_h, mask=r < live, other=0.0).to(tl.float32)
        causal = (r[:, None] >= r[None, :])[:, :, None]          # [t, s, 1]
        akk = tl.zeros([16, 16], dtype=tl.float32)
        aqk = tl.zeros([16, 16], dtype=tl.float32)
        for c0 in range(0, DK, BK):
            k = _head_rows(k_ptr, tok0, live, i_hk, QKR, c0, 0, 16, DK, BK) * nk[:, None]
            q = _head_rows(q_ptr, tok0, live, i_hk, QKR, c0, 0, 16, DK, BK) * nq[:, None]
            G = tl.cumsum(_head_rows(g_ptr, tok0, live, i_h, Hv, c0, 0, 16, DK, BK), axis=0)
            e = tl.exp(tl.where(causal, G[:, None, :] - G[None, :, :], float("-inf")))
            ke = k[None, :, :] * e                                 # [t, s, c]: k_s e^{G_t - G_s}
            akk += tl.sum(k[:, None, :] * ke, axis=2)
            aqk += tl.sum(q[:, None, :] * ke, axis=2)
        akk = tl.where(r[:, None] > r[None, :], akk, 0.0)
        x = _inv16(akk * b[:, None], live)
        out = ((tok0 + r) * Hv + i_h)[:, None]
        tl.store(xd_ptr + out * 16 + r[None, :], x, mask=(r < live)[:, None])
        tl.store(a_ptr + out * 64 + r0 + r[None, :], aqk, mask=(r < live)[:, None])
