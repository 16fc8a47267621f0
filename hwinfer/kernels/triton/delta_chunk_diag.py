"""KDA's diagonal 16 x 16 blocks by quarters (``delta_chunk.DIAG_FORM = "quarters"``; the row
loop, ``delta_chunk_wy._kda_diag_kernel``, stays the default until a card has timed this).

The same outputs as ``_kda_diag_kernel``: per (16-row tile, value head), the decayed q k^T block
(lower, diagonal included) written into Aqk at the tile's columns, and ``(I + beta A)^-1``
written to ``xd`` [tokens, Hv, 16] fp32, ``A`` the decayed k k^T block (strictly lower). The
decay from row s to row t (s < t) is ``e^{g_{s+1} + .. + g_t}`` per channel.

How: the tile is four quarters of 4 rows. One loop of 4 steps walks the quarters together
(step j works row j of each quarter, the rows' loads [4, 1, DK] issued a step ahead), with the
row loop's recurrence inside each quarter (``dec[s]`` the product of the factors ``e^{g_u}`` of
the rows after s seen so far): the four 4 x 4 diagonal blocks. The pairs across quarters are
products over the channels, because each such decay splits at a quarter boundary b between s
and t into a factor of t and a factor of s, both products of factors <= 1 (no positive
exponent, no difference of cumulative sums, as everywhere in these kernels):

* quarter 1 against 0 and 3 against 2 (b their boundary): ``(k_t a_t) . (k_s dec_s)`` with
  ``a_t = e^{g_b + .. + g_t}`` (a running product the loop keeps) and ``dec_s = e^{g_{s+1} + ..
  + g_{b-1}}`` (what the loop leaves in ``dec``);
* half 1 against half 0 (b = 8): the same with quarter 3's ``a`` times quarter 2's total and
  quarter 0's ``dec`` times quarter 1's total.

The two levels are four [16, DK] x [DK, 16] products (k k^T and q k^T each), in PREC: tf32, as
the WY kernel's blocks between tiles already are for 16-bit inputs on NVIDIA, the calls that
take this form (exact fp32 products of these tiles spill it: fp32 inputs and AMD keep the row
loop); the interpreter runs it for every input, with exact products.

Why (an estimate from sm_90a compiles with Triton 3.6, the card's, read as SASS: loop bodies
times trip counts; not a timing): the row loop's step (two reductions over the channels, its
rows' layout conversions and norms) is ~441 instructions with 18 barriers, 16 steps: ~18,300
warp-instructions a program (2 warps, 128 registers, 8 programs an SM), ~3,100 of them the 15
substitution steps of ``_inv16``. This form: ~8,600 (2 warps, 255 registers with 232 bytes
spilled, 4 programs an SM; 4 warps: ~12,900), no loop left (its 4 steps unrolled, no barrier
among them), the inverse by ``_inv16_blocks`` (six products; with ``_inv16``: ~10,400).
``python scripts/kernel_regs.py --sass kda_diag`` prints what these come from.
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton.delta_chunk_wy import _as_stored, _inv16_blocks, _tile_program


@triton.jit
def _quarter_rows(q_ptr, k_ptr, g_ptr, tok0, t, live, i_h, i_hk, Hv, QKR, DK: tl.constexpr):
    """Row t of each quarter of a tile (rows t, 4 + t, 8 + t, 12 + t): k, q as stored, g fp32,
    [4, 1, DK] each; zeros for rows past ``live``."""
    row = tl.arange(0, 4)[:, None, None] * 4 + t
    c = tl.arange(0, DK)[None, None, :]
    m = (row < live) & (c < DK)
    off = ((tok0 + row) * QKR + i_hk) * DK + c
    kt = tl.load(k_ptr + off, mask=m, other=0.0)
    qt = tl.load(q_ptr + off, mask=m, other=0.0)
    gt = tl.load(g_ptr + ((tok0 + row) * Hv + i_h) * DK + c, mask=m, other=0.0)
    return kt, qt, gt.to(tl.float32)


@triton.jit
def _normalised(x, scale, eps, USE_L2NORM: tl.constexpr):
    """Rows of q or k, [4, R, DK] fp32 (R rows of each quarter), normalised and scaled."""
    if USE_L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=2) + eps)[:, :, None]
    return x * scale


@triton.jit
def _flat(x, keep):
    """[4, 4, DK] -> [16, DK] with the rows where ``keep`` is false zeroed."""
    return tl.reshape(tl.where(keep, x, 0.0), (16, x.shape[2]))


@triton.jit
def _levels(x, ea, a8, r4, r8, up4, up8, m4, m8, PREC: tl.constexpr):
    """The pairs across quarters of rows x (k or q, [4, 4, DK]) against the keys' s factors
    (r4, r8: [DK, 16]): quarter 1 against 0 and 3 against 2 (masked by m4), half 1 against
    half 0 (m8), as [16, 16] rows t."""
    return (tl.where(m4, tl.dot(_flat(x * ea, up4), r4, input_precision=PREC), 0.0)
            + tl.where(m8, tl.dot(_flat(x * a8, up8), r8, input_precision=PREC), 0.0))


@triton.jit
def _kda_diag_quarters_kernel(q_ptr, k_ptr, g_ptr, b_ptr, a_ptr, xd_ptr, tab_ptr, Hk, Hv, QKR,
                              scale, eps, DK: tl.constexpr, USE_L2NORM: tl.constexpr,
                              PREC: tl.constexpr):
    """See the module docstring; grid (4 x chunks, value heads), as ``_kda_diag_kernel``."""
    r0, i_h, i_hk, tok0, live = _tile_program(tab_ptr, Hk, Hv)
    if live > 0:
        qi = tl.arange(0, 4)[:, None, None]   # quarter
        j = tl.arange(0, 4)[None, :, None]    # row in the quarter
        c = tl.arange(0, DK)[None, None, :]
        rows = (qi * 4 + j < live) & (c < DK)
        off = ((tok0 + qi * 4 + j) * QKR + i_hk) * DK + c
        k = _normalised(tl.load(k_ptr + off, mask=rows, other=0.0).to(tl.float32), 1.0, eps,
                        USE_L2NORM)
        dec = tl.zeros([4, 4, DK], dtype=tl.float32)
        run = tl.full([4, 1, DK], 1.0, tl.float32)   # e^{g_b + .. + g_t}, b the quarter's first row
        ea = tl.zeros([4, 4, DK], dtype=tl.float32)  # run after each row
        akk = tl.zeros([4, 4, 4], dtype=tl.float32)  # [quarter, s, t]
        aqk = tl.zeros([4, 4, 4], dtype=tl.float32)
        col = tl.arange(0, 4)[None, None, :]
        kn, qn, gn = _quarter_rows(q_ptr, k_ptr, g_ptr, tok0, 0, live, i_h, i_hk, Hv, QKR, DK)
        for t in tl.static_range(4):
            kt = _normalised(kn.to(tl.float32), 1.0, eps, USE_L2NORM)
            qt = _normalised(qn.to(tl.float32), scale, eps, USE_L2NORM)
            et = tl.exp(gn)
            if t < 3:
                kn, qn, gn = _quarter_rows(q_ptr, k_ptr, g_ptr, tok0, t + 1, live, i_h, i_hk, Hv,
                                           QKR, DK)
            run = run * et
            ea = tl.where(j == t, run, ea)
            dec = dec * et
            akk = tl.where(col == t, tl.sum(dec * k * kt, axis=2)[:, :, None], akk)
            dec = tl.where(j == t, 1.0, dec)
            aqk = tl.where(col == t, tl.sum(dec * k * qt, axis=2)[:, :, None], aqk)
        # dec[s]: the factors from s + 1 to its quarter's end; run: each quarter's total
        t1 = tl.sum(tl.where(qi == 1, run, 0.0), axis=0)[None, :, :]
        t2 = tl.sum(tl.where(qi == 2, run, 0.0), axis=0)[None, :, :]
        upper = qi % 2 == 1
        a8 = tl.where(qi == 3, ea * t2, ea)                              # from row 8
        r4 = tl.trans(_flat(k * dec, qi % 2 == 0))                       # quarters 0, 2
        r8 = tl.trans(_flat(tl.where(qi == 0, dec * t1, dec) * k, qi < 2))   # to row 7
        r = tl.arange(0, 16)
        m4 = ((r[:, None] // 8) == (r[None, :] // 8)) & ((r[:, None] // 4) % 2 == 1) & (
            (r[None, :] // 4) % 2 == 0)
        m8 = (r[:, None] >= 8) & (r[None, :] < 8)
        okk = _levels(k, ea, a8, r4, r8, upper, qi >= 2, m4, m8, PREC)
        q = _normalised(tl.load(q_ptr + off, mask=rows, other=0.0).to(tl.float32), scale, eps,
                        USE_L2NORM)
        oqk = _levels(q, ea, a8, r4, r8, upper, qi >= 2, m4, m8, PREC)
        # the quarters' own 4 x 4 blocks, from [quarter, s, t] to [16, 16] rows t
        same = tl.arange(0, 4)[:, None, None, None] == tl.arange(0, 4)[None, None, :, None]
        dkk = tl.reshape(tl.where(same, tl.trans(akk, (0, 2, 1))[:, :, None, :], 0.0), (16, 16))
        dqk = tl.reshape(tl.where(same, tl.trans(aqk, (0, 2, 1))[:, :, None, :], 0.0), (16, 16))
        b = tl.load(b_ptr + (tok0 + r) * Hv + i_h, mask=r < live, other=0.0).to(tl.float32)
        x = _inv16_blocks((dkk + okk) * b[:, None])
        out = ((tok0 + r) * Hv + i_h)[:, None]
        tl.store(xd_ptr + out * 16 + r[None, :], x, mask=(r < live)[:, None])
        tl.store(a_ptr + out * 64 + r0 + r[None, :], _as_stored(dqk + oqk, a_ptr),
                 mask=(r < live)[:, None])
