"""Intra-chunk stage of the Triton chunked gated delta rule (driver: :mod:`.delta_chunk`).

``_wy_kernel``: one program owns one chunk of up to 64 tokens of one sequence and one value
head. It works on four 16-row tiles (register tensors cannot be sliced, so each tile is its own
variable) and:

1. loads k (and q for KDA), L2-normalises them, scales q, and forms per tile the log-decay
   sums over spans inside it: ``L`` (rows up to t), ``S`` (rows after t), ``T`` (the tile);
2. builds the strictly lower ``A[t, s] = beta_t sum_d k_t[d] k_s[d] e^{G_t[d] - G_s[d]}`` in
   16 x 16 blocks. The exponent of every factor is <= 0, so nothing overflows however strong
   the decay, and each is a sum of g over its span (``L_i + T_between + S_j`` for block
   (i, j)), never the difference of two cumulative sums, which cancels at strong decay. GDN
   applies the exponent after the matmul; KDA (a decay per channel, which does not factor
   out of the sum) splits it, ``e^{L_i} e^{T_between + S_j}``, for off-diagonal blocks; its
   diagonal blocks need a sequential loop over rows, done by ``_kda_diag_kernel`` beforehand;
3. inverts ``I + A`` (unit lower triangular): forward substitution inside each diagonal block
   (for KDA, read back from ``_kda_diag_kernel``), then the off-diagonal blocks from
   ``X_ij = -X_ii sum_{j<=m<i} A_im X_mj``;
4. writes ``w = X (beta k e^G)`` [64, Dk] and ``u = X (beta v)`` [64, Dv]; the chunk's deltas
   are then ``u - w S0`` for its start state S0 (the recurrence kernel does that), and what
   that kernel needs to step the state: ``k e^{G_end - G}`` and ``G_end``. KDA also
   writes the causal ``Aqk[t, s] = sum_d q_t[d] k_s[d] e^{G_t[d] - G_s[d]}`` (s <= t) for
   the output kernel (its diagonal blocks written by ``_kda_diag_kernel``); GDN's output
   kernel rebuilds it with one matmul instead.

Tensors are addressed as ``[tokens, heads, D]`` rows; ``tab`` gives each chunk's first flat
token and its length, so a chunk never crosses a sequence boundary. All math is fp32 (the
matmuls run as tf32 for 16-bit inputs on NVIDIA, ``PREC``; the 16 x 16 inversions always as
exact fp32). Since both split factors are <= 1, one underflowing means the product would too.
"""
from __future__ import annotations

import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET

# The interpreter truncates fp32 -> bf16 conversions (see _round_bf16); _as_stored rounds to
# nearest there first, as the GPU's conversion does, so a bf16 store means the same on both.
_EMULATE_RNE = tl.constexpr(INTERPRET)


@triton.jit
def _round_bf16(x):
    """fp32 x rounded to the nearest bf16 (ties to even), kept in fp32, by integer arithmetic:
    Triton 3.7.1's interpreter truncates ``.to(tl.bfloat16)`` toward zero (half of all values
    off by one ulp, checked against torch), which doubled the emulated error of the bf16
    products."""
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _as_stored(x, ptr):
    """x converted to ``ptr``'s element type, fp32 -> bf16 rounded to nearest even everywhere."""
    if _EMULATE_RNE:
        if ptr.dtype.element_ty == tl.bfloat16:
            x = _round_bf16(x.to(tl.float32))
    return x.to(ptr.dtype.element_ty)


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a @ b accumulated in fp32: PREC "bf16" rounds both operands to bf16 first (the tensor
    cores' fastest input), else it is tl.dot's input_precision ("tf32" / "ieee")."""
    if PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PREC == "bf16_rounded":  # the same math in fp32: Triton 3.7's interpreter gets bf16 dots wrong
        return tl.dot(_round_bf16(a.to(tl.float32)), _round_bf16(b.to(tl.float32)),
                      input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _mm_split(a, b, PREC: tl.constexpr):
    """a @ b accumulated in fp32 for ``a`` holding bf16 values as stored (not converted) and
    ``b`` fp32. PREC "split": ``b = hi + lo``, both bf16, and two bf16 products: ~16 mantissa
    bits of b against tf32's 11, a exact, and both operands 16-bit, so the tensor cores take
    them without the fp32 conversion and staging a tf32 product of a needs ("split_rounded":
    the same math in fp32 for the interpreter). Any other PREC: :func:`_mm` of a in fp32."""
    if PREC == "split":
        hi = b.to(tl.bfloat16)
        lo = (b - hi.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(a, hi, acc=tl.dot(a, lo))
    elif PREC == "split_rounded":
        hi = _round_bf16(b)
        a32 = a.to(tl.float32)
        return (tl.dot(a32, hi, input_precision="ieee")
                + tl.dot(a32, _round_bf16(b - hi), input_precision="ieee"))
    else:
        return _mm(a.to(tl.float32), b, PREC)


@triton.jit
def _mm_split_left(a, b, PREC: tl.constexpr):
    """a @ b accumulated in fp32 for ``a`` fp32 and ``b`` holding bf16 values as stored: the
    mirror of :func:`_mm_split`, ``a = hi + lo`` both bf16, two bf16 products (``PREC``
    "split"; "split_rounded": the same math in fp32 for the interpreter), or ``a`` rounded to
    bf16 and one product ("bf16"; "bf16_rounded" interpreted)."""
    if PREC == "split":
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(hi, b, acc=tl.dot(lo, b))
    elif PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b)
    elif PREC == "bf16_rounded":
        return tl.dot(_round_bf16(a), b.to(tl.float32), input_precision="ieee")
    else:
        hi = _round_bf16(a)
        b32 = b.to(tl.float32)
        return (tl.dot(hi, b32, input_precision="ieee")
                + tl.dot(_round_bf16(a - hi), b32, input_precision="ieee"))


@triton.jit
def _gdn_decay(g, NR: tl.constexpr, SPAN: tl.constexpr):
    """GDN's causal decay inside a tile of NR rows: [NR, NR], e^{g_{s+1} + .. + g_t} for t >= s,
    0 above the diagonal. SPAN picks how the exponent is formed: "scan", a cumulative sum of g
    over each column's own span (exact to fp32 rounding of the terms at any decay); "dot", the
    same sums as a product of 0/1 masks with g (3xTF32 tensor-core products, ~fp32 accuracy);
    "diff", G_t - G_s of one cumulative sum, as fla does, which loses ~|G| * 6e-8 absolute when
    the decay is strong."""
    r = tl.arange(0, NR)
    if SPAN == "diff":
        G = tl.cumsum(g, axis=0)
        span = G[:, None] - G[None, :]
    elif SPAN == "dot":
        upto = tl.where(r[None, :] <= r[:, None], 1.0, 0.0)            # [t, k]: k <= t
        after = tl.where(r[:, None] > r[None, :], g[:, None], 0.0)     # [k, s]: g_k for k > s
        span = tl.dot(upto, after, input_precision="tf32x3")
    else:
        span = tl.cumsum(tl.where(r[:, None] > r[None, :], g[:, None], 0.0), axis=0)
    return tl.exp(tl.where(r[:, None] >= r[None, :], span, float("-inf")))


@triton.jit
def _raw_rows(ptr, tok0, n, i_hk, Hk, R0: tl.constexpr, NR: tl.constexpr, DK: tl.constexpr):
    """Rows R0..R0+NR of q or k (head i_hk) as stored: [NR, DK] in the input dtype; 0 past n.
    Hk: the token stride in units of DK (the head count of a contiguous tensor; more for a
    token-strided view, delta_chunk._token_rows), as in every row loader here."""
    r = R0 + tl.arange(0, NR)
    return tl.load(ptr + ((tok0 + r) * Hk + i_hk)[:, None] * DK + tl.arange(0, DK)[None, :],
                   mask=(r < n)[:, None], other=0.0)


@triton.jit
def _row_scale(x, scale, eps, USE_L2NORM: tl.constexpr):
    """scale / ||row|| of each row of x (scale alone without the norm): [rows] fp32."""
    if USE_L2NORM:
        xf = x.to(tl.float32)
        return scale * tl.rsqrt(tl.sum(xf * xf, axis=1) + eps)
    return tl.full([x.shape[0]], 1.0, tl.float32) * scale


@triton.jit
def _qk_rows(ptr, tok0, n, i_hk, Hk, scale, eps, R0: tl.constexpr, NR: tl.constexpr,
             DK: tl.constexpr, USE_L2NORM: tl.constexpr):
    """Rows R0..R0+NR of q or k (head i_hk): [NR, DK] fp32, normalised and scaled; 0 past n."""
    x = _raw_rows(ptr, tok0, n, i_hk, Hk, R0, NR, DK).to(tl.float32)
    return x * _row_scale(x, scale, eps, USE_L2NORM)[:, None]


@triton.jit
def _head_rows_raw(ptr, tok0, n, i_h, H, c0, R0: tl.constexpr, NR: tl.constexpr,
                   D: tl.constexpr, BC: tl.constexpr):
    """Rows R0..R0+NR, columns c0..c0+BC of a [tokens, H, D] tensor at head i_h, as stored (0
    past n)."""
    r = R0 + tl.arange(0, NR)
    tok = tok0 + r
    return tl.load(ptr + (tok * H + i_h)[:, None] * D + c0 + tl.arange(0, BC)[None, :],
                   mask=(r < n)[:, None], other=0.0)


@triton.jit
def _head_rows(ptr, tok0, n, i_h, H, c0, R0: tl.constexpr, NR: tl.constexpr, D: tl.constexpr,
               BC: tl.constexpr):
    """:func:`_head_rows_raw` in fp32."""
    return _head_rows_raw(ptr, tok0, n, i_h, H, c0, R0, NR, D, BC).to(tl.float32)


@triton.jit
def _store_rows(ptr, x, tok0, n, i_h, H, c0, R0: tl.constexpr, NR: tl.constexpr,
                D: tl.constexpr, BC: tl.constexpr):
    r = R0 + tl.arange(0, NR)
    tok = tok0 + r
    tl.store(ptr + (tok * H + i_h)[:, None] * D + c0 + tl.arange(0, BC)[None, :],
             _as_stored(x, ptr), mask=(r < n)[:, None])


@triton.jit
def _g_rows(g_ptr, tok0, n, i_h, Hv, R0: tl.constexpr, NR: tl.constexpr, DK: tl.constexpr,
            PER_CHANNEL: tl.constexpr):
    """Raw log-decays of rows R0..: [NR, DK] (KDA) or [NR] (GDN); 0 past n (no decay)."""
    r = R0 + tl.arange(0, NR)
    tok = tok0 + r
    if PER_CHANNEL:
        g = tl.load(g_ptr + (tok * Hv + i_h)[:, None] * DK + tl.arange(0, DK)[None, :],
                    mask=(r < n)[:, None], other=0.0).to(tl.float32)
    else:
        g = tl.load(g_ptr + tok * Hv + i_h, mask=r < n, other=0.0).to(tl.float32)
    return g


@triton.jit
def _tile(q_ptr, k_ptr, g_ptr, b_ptr, tok0, n, i_h, i_hk, QKR, Hv, scale, eps,
          R0: tl.constexpr, DK: tl.constexpr, PER_CHANNEL: tl.constexpr,
          USE_L2NORM: tl.constexpr, PREC: tl.constexpr):
    """One 16-row tile: q (KDA only, else 0), k, beta; its log-decays as sums of g over spans
    inside the tile, L (rows <= t), S (rows > t) and T (all rows); and, for GDN, its diagonal
    block (k k^T decayed, strictly lower). KDA's diagonal blocks come from ``_kda_diag_kernel``
    (zeros here, unused)."""
    r = R0 + tl.arange(0, 16)
    tok = tok0 + r
    cols = tl.arange(0, DK)
    c16 = tl.arange(0, 16)
    k = tl.load(k_ptr + (tok * QKR + i_hk)[:, None] * DK + cols[None, :],
                mask=(r < n)[:, None], other=0.0).to(tl.float32)
    if USE_L2NORM:
        k = k * tl.rsqrt(tl.sum(k * k, axis=1) + eps)[:, None]
    b = tl.load(b_ptr + tok * Hv + i_h, mask=r < n, other=0.0).to(tl.float32)
    g = _g_rows(g_ptr, tok0, n, i_h, Hv, R0, 16, DK, PER_CHANNEL)
    L = tl.cumsum(g, axis=0)
    T = tl.sum(g, axis=0)
    # S from g shifted up one row (the tile's last row has nothing after it), summed from the
    # end: a sum of its own terms, not T - L, which would cancel.
    gs = _g_rows(g_ptr, tok0 + 1, tl.minimum(n - 1, R0 + 15), i_h, Hv, R0, 16, DK, PER_CHANNEL)
    S = tl.cumsum(gs, axis=0, reverse=True)
    if PER_CHANNEL:
        q = _qk_rows(q_ptr, tok0, n, i_hk, QKR, scale, eps, R0, 16, DK, USE_L2NORM)
        akk = tl.zeros([16, 16], dtype=tl.float32)
    else:
        q = k * 0.0
        span = tl.cumsum(tl.where(c16[:, None] > c16[None, :], g[:, None], 0.0), axis=0)
        e = tl.exp(tl.where(c16[:, None] > c16[None, :], span, float("-inf")))
        akk = tl.dot(k, tl.trans(k), input_precision=PREC) * e
    return q, k, b, L, S, T, akk


@triton.jit
def _right(kj, Sj, mid, PER_CHANNEL: tl.constexpr):
    """KDA: the earlier tile j's factor k_j e^{S_j + mid} of block (i, j), mid = the decay of
    the tiles strictly between (exponent <= 0); GDN: k_j itself."""
    if PER_CHANNEL:
        return kj * tl.exp(Sj + mid[None, :])
    else:
        return kj


@triton.jit
def _off(left, kjr, Li, Sj, mid, PER_CHANNEL: tl.constexpr, PREC: tl.constexpr):
    """Block (i, j), i > j: left = k_i e^{L_i} (KDA) or k_i (GDN), whose decay from s in tile
    j to t in tile i is L_i[t] + mid + S_j[s]."""
    a = tl.dot(left, tl.trans(kjr), input_precision=PREC)
    if not PER_CHANNEL:
        a = a * tl.exp(Li[:, None] + mid + Sj[None, :])
    return a


@triton.jit
def _left(x, Li, PER_CHANNEL: tl.constexpr):
    if PER_CHANNEL:
        return x * tl.exp(Li)
    else:
        return x


@triton.jit
def _inv16(a, live):
    """(I + a)^-1 for a strictly lower 16 x 16 a whose rows from ``live`` on are 0, by forward
    substitution over the rows: row i of ``a x`` only reads rows < i of x, which are final
    (fp32 "ieee" dots, no tf32 rounding)."""
    r = tl.arange(0, 16)
    x = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, tl.minimum(live, 16)):
        x = tl.where(r[:, None] == i, x - tl.dot(a, x, input_precision="ieee"), x)
    return x


@triton.jit
def _inv16_blocks(a):
    """(I + a)^-1 for a strictly lower 16 x 16 ``a`` (zero rows stay identity rows), by its 4 x 4
    diagonal blocks: with ``d`` those blocks and ``o = a - d``, ``(I + a) = (I + d)(I + n)``, ``n
    = (I + d)^-1 o``; ``d^4 = 0`` and ``n^4 = 0`` (four block rows), so ``(I + d)^-1 = I - d + d^2
    - d^3`` and ``(I + n)^-1 = (I - n)(I + n^2)``: six exact fp32 [16, 16] products instead of
    the 15 substitution steps of ``_inv16``. As accurate as the substitution relative to the
    largest entry of the inverse (within 3e-7 on 200 random lower blocks in [-1, 1], 6e-8 where
    the inverse grows to 1.6e4)."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    blk = (r[:, None] // 4) == (r[None, :] // 4)
    d = tl.where(blk, a, 0.0)
    d2 = tl.dot(d, d, input_precision="ieee")
    xd = eye - d + d2 - tl.dot(d2, d, input_precision="ieee")
    n = tl.dot(xd, tl.where(blk, 0.0, a), input_precision="ieee")
    n2 = tl.dot(n, n, input_precision="ieee")
    return tl.dot(tl.dot(eye - n, eye + n2, input_precision="ieee"), xd, input_precision="ieee")


@triton.jit
def _inv16x4(a0, a1, a2, a3, live):
    """:func:`_inv16` of four 16 x 16 blocks at once (GDN's diagonal blocks of a chunk):
    stacked as [4, 16, 16], row i of every block is solved in the same step, so the loop runs 15
    times instead of 60 and each step does four blocks' work (its masks, reductions and, across
    warps, barriers are paid once). Rows past a block's ``live`` rows have zero rows in a, which
    the substitution turns into identity rows, as the per-block loop leaves them; ``live`` is
    the first block's live row count, the most of the four."""
    a = tl.reshape(tl.permute(tl.join(tl.join(a0, a1), tl.join(a2, a3)), (3, 2, 0, 1)), (4, 16, 16))
    r = tl.arange(0, 16)
    x = tl.where((r[:, None] == r[None, :])[None, :, :], 1.0, 0.0) + tl.zeros([4, 16, 16], tl.float32)
    for i in range(1, tl.minimum(live, 16)):
        sel = (r == i)[None, :, None]
        ai = tl.sum(tl.where(sel, a, 0.0), axis=1)            # [4, 16]: a[b, i, :]
        row = tl.sum(ai[:, :, None] * x, axis=1)              # [4, 16]: sum_j a[b, i, j] x[b, j, :]
        x = tl.where(sel, x - row[:, None, :], x)
    x01, x23 = tl.split(tl.permute(tl.reshape(x, (2, 2, 16, 16)), (2, 3, 1, 0)))
    x0, x1 = tl.split(x01)
    x2, x3 = tl.split(x23)
    return x0, x1, x2, x3


@triton.jit
def _kda_diag_kernel(q_ptr, k_ptr, g_ptr, b_ptr, a_ptr, xd_ptr, c_ptr, qg_ptr, tab_ptr, Hk, Hv,
                     QKR, scale, eps, DK: tl.constexpr, USE_L2NORM: tl.constexpr,
                     BLOCK_INV: tl.constexpr = False, CS: tl.constexpr = False,
                     QG: tl.constexpr = False):
    """KDA's diagonal 16 x 16 blocks, one program per (16-row tile, value head): the decayed
    q k^T block (lower), written into Aqk at the tile's columns, and ``(I + beta A)^-1`` with
    ``A`` the decayed k k^T block (strictly lower), written to ``xd`` [tokens, Hv, 16] fp32 for
    the WY kernel.

    Row by row: ``dec[s]`` holds ``e^{g_{s+1} + .. + g_t}`` per channel for the rows s <= t seen
    so far (0 for rows not yet reached), updated by one multiply with ``e^{g_t}`` per row: a
    product of factors <= 1, so no cancellation (unlike ``e^{G_t - G_s}``) and no overflow
    however strong the decay. Row t's k, q, g are read in the loop: taking them from the
    loaded tiles by masked reductions was 22% slower on the H200 (KDA 1 x 4k: 2,003 against
    1,647 us). The loop is sequential, so it lives here, in small programs (2 warps) of which
    many run per SM, not in the WY kernel (one 8-warp program per SM, stalled on each row's
    loads). Unrolling the 16 rows (so that every row's loads could be issued early) was 10%
    slower on the H200 (KDA 1 x 16k: 7,031 against 6,418 us) and was dropped. Fetching each
    row's loads a step ahead took the kernel from 1,147 to 870 us on an H100 while rows were
    loaded as vectors (nineteenth session); in the tiles' layout it costs four copies a thread
    and was 1.6x slower (twenty-ninth session, see ``_diag_rows``), and was removed.

    Measured and removed (eighteenth / nineteenth sessions): tiles whose decays stay within
    e^{+-16} formed as two products, ``(k e^{D}) (k e^{-D})^T`` (1,674 against 1,174 us on an
    H100 at g ~ -1 a token: 255 registers, 142 spilled, and few tiles qualify).

    ``CS``: the loop also writes the tile's running sums of g, ``c[t] = g_{r0} + .. + g_t`` per
    channel ([tokens, Hv, DK] fp32 at ``c_ptr``, rows of the tile only): exact sums of their own
    spans, from which the later stages read every decay from the tile's start (and, with the
    tile totals, from the chunk's start) without scans of their own (the drivers' KDA_SPANS).

    ``QG`` (with ``CS``): the loop also writes the output stage's q rows, normalised, scaled and
    decayed from the tile's first row, ``scale q_t / |q_t| e^{c[t] - c[r0]}`` (``qg_ptr``,
    [tokens, Hv, DK] in w's dtype): row 0 of ``dec`` is that decay, and ``qt`` holds the row
    already, so the loop adds one product and one store a row (no vector load or exponential);
    the output stage applies each tile's decay from the chunk's start, ``e^{G[r0]}``."""
    r0, i_h, i_hk, tok0, live = _tile_program(tab_ptr, Hk, Hv)
    if live > 0:
        r = tl.arange(0, 16)
        k = _qk_rows(k_ptr, tok0, live, i_hk, QKR, 1.0, eps, 0, 16, DK, USE_L2NORM)
        b = tl.load(b_ptr + (tok0 + r) * Hv + i_h, mask=r < live, other=0.0).to(tl.float32)
        _diag_rows(q_ptr, k_ptr, g_ptr, a_ptr, xd_ptr, c_ptr, qg_ptr, k, tok0, r0, live, i_h,
                   i_hk, Hv, QKR, scale, eps, DK, USE_L2NORM, CS, QG)
        tl.debug_barrier()   # the rows of A the loop wrote to xd, read back by other threads
        out = ((tok0 + r) * Hv + i_h)[:, None]
        akk = tl.load(xd_ptr + out * 16 + r[None, :], mask=(r < live)[:, None], other=0.0)
        if BLOCK_INV:   # six products instead of 15 substitution steps (_inv16_blocks)
            x = _inv16_blocks(akk * b[:, None])
        else:
            x = _inv16(akk * b[:, None], live)
        tl.debug_barrier()   # every thread has read A before x overwrites it
        tl.store(xd_ptr + out * 16 + r[None, :], x, mask=(r < live)[:, None])


@triton.jit
def _diag_rows(q_ptr, k_ptr, g_ptr, a_ptr, xd_ptr, c_ptr, qg_ptr, k, tok0, r0, live, i_h, i_hk,
               Hv, QKR, scale, eps, DK: tl.constexpr, USE_L2NORM: tl.constexpr,
               CS: tl.constexpr, QG: tl.constexpr):
    """The row loop of ``_kda_diag_kernel``, k [16, DK] the tile's normalised rows: row t of the
    decayed q k^T block (stored into Aqk) and of the decayed k k^T block (into ``xd``, where
    the kernel reads the block back), and with ``CS`` the running sum of g (into ``c_ptr``).

    Layouts (sm_90 SASS, 2 warps, with CS: 4 barriers a row, against 18 before): row t's k, q
    and g are loaded as [16, DK] tiles whose 16 rows all read row t, so they come in the layout
    of ``k`` and ``dec`` (a thread's channels the same in every row). Loaded as [DK] vectors
    they were moved there through shared memory, and their norms reduced across warps. The
    copies a thread holds are one load (unmasked, see ``_diag_row``), and so one exponential
    each. The norms scale the two reduced vectors instead of the rows. A row's results go to
    memory as they come, not into [16, 16] blocks in registers, which the row's layout would
    have made 8x replicated (and the reduced vector is indexed by s: its row of the block is a
    transpose of the tile's layout); their two stores are the barriers left. Row t of ``dec``
    is 0 until step t, so one fused multiply-add both decays the rows before and sets it to
    e^0 (the diagonal of k k^T this puts in ``akk`` is then zeroed in the reduced vector).
    H100 (twenty-ninth session, KDA 1 x 16k): 792 us with the barriers gone (785 before), 792
    again with the fused update (428 -> 382 instructions a row), 1,277 with rows fetched a step
    ahead (four copies a thread of each: 204 registers, 805 instructions a row). So neither
    barriers nor instruction count bound it: most likely each row's load latency, which eight
    programs an SM (128 registers) do not hide."""
    r = tl.arange(0, 16)
    cols = tl.arange(0, DK)
    dec = tl.zeros([16, DK], dtype=tl.float32)
    cs = tl.zeros([DK], dtype=tl.float32)
    for t in range(0, tl.minimum(live, 16)):
        kt, qt, gt = _diag_row(q_ptr, k_ptr, g_ptr, tok0 + t, i_h, i_hk, Hv, QKR, DK)
        row = (tok0 + t) * Hv + i_h
        if CS:   # (g's row again as a vector, from L1: a running sum carried as [16, DK]
            # copies would cost 32 registers)
            cs += tl.load(g_ptr + row * DK + cols)
            tl.store(c_ptr + row * DK + cols, cs)
        dec = dec * tl.exp(gt) + (r[:, None] == t).to(tl.float32)
        dk = dec * k
        akk = tl.where(r == t, 0.0, tl.sum(dk * kt, axis=1))
        aqk = tl.sum(dk * qt, axis=1)
        if USE_L2NORM:   # the norms of rows t, scaling the reduced vectors (all rows hold row t)
            akk = akk * tl.rsqrt(tl.sum(kt * kt, axis=1) + eps)
            nqt = tl.rsqrt(tl.sum(qt * qt, axis=1) + eps)
            aqk = aqk * nqt
            if QG:
                qt = qt * nqt[:, None]
        if QG:   # row t's q e^{c_t - c_0} (dec's row 0), normalised and scaled: one copy stored
            tl.store(qg_ptr + row * DK + cols[None, :] + 0 * r[:, None],
                     _as_stored(qt * dec * scale, qg_ptr), mask=(r == 0)[:, None])
        tl.store(xd_ptr + row * 16 + r, akk)
        tl.store(a_ptr + row * 64 + r0 + r, _as_stored(aqk * scale, a_ptr))


@triton.jit
def _diag_row(q_ptr, k_ptr, g_ptr, tok, i_h, i_hk, Hv, QKR, DK: tl.constexpr):
    """Token tok's k, q (as fp32) and g, each as a [16, DK] tile whose rows all hold it.
    Unmasked: the copies of a row a thread holds are then one load instruction (identical
    unpredicated loads are merged; masked ones stayed four, each converted)."""
    cols = tl.arange(0, DK)[None, :] + tl.zeros([16, 1], tl.int32)
    k = tl.load(k_ptr + (tok * QKR + i_hk) * DK + cols).to(tl.float32)
    q = tl.load(q_ptr + (tok * QKR + i_hk) * DK + cols).to(tl.float32)
    g = tl.load(g_ptr + (tok * Hv + i_h) * DK + cols).to(tl.float32)
    return k, q, g


@triton.jit
def _x_rows(xd_ptr, tok0, n, i_h, Hv, R0: tl.constexpr):
    """A tile's (I + A_ii)^-1 from ``_kda_diag_kernel``; the identity for rows past n."""
    r = tl.arange(0, 16)
    x = tl.load(xd_ptr + ((tok0 + R0 + r) * Hv + i_h)[:, None] * 16 + r[None, :],
                mask=(R0 + r < n)[:, None], other=0.0)
    return tl.where((R0 + r >= n)[:, None] & (r[:, None] == r[None, :]), 1.0, x)


@triton.jit
def _x_diag(xd_ptr, tok0, n, i_h, Hv):
    """The four diagonal blocks of X (KDA: from ``_kda_diag_kernel``)."""
    return (_x_rows(xd_ptr, tok0, n, i_h, Hv, 0), _x_rows(xd_ptr, tok0, n, i_h, Hv, 16),
            _x_rows(xd_ptr, tok0, n, i_h, Hv, 32), _x_rows(xd_ptr, tok0, n, i_h, Hv, 48))


@triton.jit
def _store_off_blocks(ptr, p10, p20, p21, p30, p31, p32, tok0, n, i_h, Hv):
    """The six 16 x 16 blocks below the diagonal of a chunk's lower [64, 64] matrix (KDA's causal
    Aqk, X) into rows [tokens, Hv, 64] (rows past n masked; the blocks above the diagonal are
    never written, the reader masks them on load)."""
    _store_rows(ptr, p10, tok0, n, i_h, Hv, 0, 16, 16, 64, 16)
    _store_rows(ptr, p20, tok0, n, i_h, Hv, 0, 32, 16, 64, 16)
    _store_rows(ptr, p21, tok0, n, i_h, Hv, 16, 32, 16, 64, 16)
    _store_rows(ptr, p30, tok0, n, i_h, Hv, 0, 48, 16, 64, 16)
    _store_rows(ptr, p31, tok0, n, i_h, Hv, 16, 48, 16, 64, 16)
    _store_rows(ptr, p32, tok0, n, i_h, Hv, 32, 48, 16, 64, 16)


@triton.jit
def _chunk_program(tab_ptr, Hk, Hv):
    """A program's (chunk, value head, key head, first token, tokens) from grid axes (chunks,
    value heads) and the chunk table."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    return (i_c, i_h, i_h // (Hv // Hk), tl.load(tab_ptr + 2 * i_c).to(tl.int64),
            tl.load(tab_ptr + 2 * i_c + 1))


@triton.jit
def _tile_program(tab_ptr, Hk, Hv):
    """A diagonal-block program's (first row in its chunk, value head, key head, first token,
    rows left in the chunk from it) from grid axes (4 x chunks, value heads)."""
    i_c = tl.program_id(0) // 4
    r0 = (tl.program_id(0) % 4) * 16
    i_h = tl.program_id(1)
    return (r0, i_h, i_h // (Hv // Hk), tl.load(tab_ptr + 2 * i_c).to(tl.int64) + r0,
            tl.load(tab_ptr + 2 * i_c + 1) - r0)


@triton.jit
def _store_kgates(kg_ptr, k0, k1, k2, k3, S0, S1, S2, S3, T1, T2, T3, tok0, n, i_h, Hv, c0,
                  DK: tl.constexpr, BC: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """The decayed keys k e^{G_end - G} of the four tiles (columns c0 .. c0+BC) for the state
    kernel: the decay after each row is S in its tile plus the totals T of the tiles after."""
    _store_rows(kg_ptr, _kgate(k0, S0, T1 + T2 + T3, PER_CHANNEL), tok0, n, i_h, Hv, c0, 0, 16, DK, BC)
    _store_rows(kg_ptr, _kgate(k1, S1, T2 + T3, PER_CHANNEL), tok0, n, i_h, Hv, c0, 16, 16, DK, BC)
    _store_rows(kg_ptr, _kgate(k2, S2, T3, PER_CHANNEL), tok0, n, i_h, Hv, c0, 32, 16, DK, BC)
    _store_rows(kg_ptr, _kgate(k3, S3, T3 * 0.0, PER_CHANNEL), tok0, n, i_h, Hv, c0, 48, 16, DK, BC)


@triton.jit
def _kb(k, b, R, L, PER_CHANNEL: tl.constexpr):
    """beta k e^G (the right-hand side of w), G = R + L from the chunk's start, exponent <= 0."""
    if PER_CHANNEL:
        return k * tl.exp(R[None, :] + L) * b[:, None]
    else:
        return k * (b * tl.exp(R + L))[:, None]


@triton.jit
def _kgate(k, S, after, PER_CHANNEL: tl.constexpr):
    """k e^{G_end - G}: the decay after each row, S within the tile plus ``after`` the tiles
    that follow it."""
    if PER_CHANNEL:
        return k * tl.exp(S + after[None, :])
    else:
        return k * tl.exp(S + after)[:, None]


@triton.jit
def _wy_rows(ptr, tok0, n, i_h, H, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
             y0, y1, y2, y3, D: tl.constexpr, PREC: tl.constexpr, c0=0, BC: tl.constexpr = None):
    """Store the 64 rows of X Y (X block lower triangular, Y as four 16-row tiles of columns
    c0 .. c0 + BC of a width-D tensor; BC None = all D)."""
    o0 = tl.dot(x00, y0, input_precision=PREC)
    o1 = tl.dot(x10, y0, input_precision=PREC) + tl.dot(x11, y1, input_precision=PREC)
    o2 = tl.dot(x20, y0, input_precision=PREC) + tl.dot(x21, y1, input_precision=PREC)
    o2 += tl.dot(x22, y2, input_precision=PREC)
    o3 = tl.dot(x30, y0, input_precision=PREC) + tl.dot(x31, y1, input_precision=PREC)
    o3 += tl.dot(x32, y2, input_precision=PREC) + tl.dot(x33, y3, input_precision=PREC)
    bc: tl.constexpr = D if BC is None else BC
    _store_rows(ptr, o0, tok0, n, i_h, H, c0, 0, 16, D, bc)
    _store_rows(ptr, o1, tok0, n, i_h, H, c0, 16, 16, D, bc)
    _store_rows(ptr, o2, tok0, n, i_h, H, c0, 32, 16, D, bc)
    _store_rows(ptr, o3, tok0, n, i_h, H, c0, 48, 16, D, bc)


@triton.jit
def _solve_off(a10, a20, a21, a30, a31, a32, x00, x11, x22, x33, b1, b2, b3,
               PREC: tl.constexpr):
    """The off-diagonal blocks of X = (I + diag(beta) A)^-1 from the diagonal ones:
    X_ij = -X_ii sum_{j <= m < i} beta_i A_im X_mj, one block diagonal further at a time."""
    a10 = a10 * b1[:, None]
    a20 = a20 * b2[:, None]
    a21 = a21 * b2[:, None]
    a30 = a30 * b3[:, None]
    a31 = a31 * b3[:, None]
    a32 = a32 * b3[:, None]
    x10 = -tl.dot(x11, tl.dot(a10, x00, input_precision=PREC), input_precision=PREC)
    x21 = -tl.dot(x22, tl.dot(a21, x11, input_precision=PREC), input_precision=PREC)
    x32 = -tl.dot(x33, tl.dot(a32, x22, input_precision=PREC), input_precision=PREC)
    t20 = tl.dot(a20, x00, input_precision=PREC) + tl.dot(a21, x10, input_precision=PREC)
    x20 = -tl.dot(x22, t20, input_precision=PREC)
    t31 = tl.dot(a31, x11, input_precision=PREC) + tl.dot(a32, x21, input_precision=PREC)
    x31 = -tl.dot(x33, t31, input_precision=PREC)
    t30 = tl.dot(a30, x00, input_precision=PREC) + tl.dot(a31, x10, input_precision=PREC)
    x30 = -tl.dot(x33, t30 + tl.dot(a32, x20, input_precision=PREC), input_precision=PREC)
    return x10, x20, x21, x30, x31, x32


@triton.jit
def _wy_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, w_ptr, u_ptr, a_ptr, kg_ptr, ge_ptr, tab_ptr,
               xd_ptr, Hk, Hv, QKR, VR, scale, eps, DK: tl.constexpr, DV: tl.constexpr,
               PER_CHANNEL: tl.constexpr, USE_L2NORM: tl.constexpr, PREC: tl.constexpr):
    i_c, i_h, i_hk, tok0, n = _chunk_program(tab_ptr, Hk, Hv)
    q0, k0, b0, L0, S0, T0, a00 = _tile(q_ptr, k_ptr, g_ptr, b_ptr, tok0, n, i_h, i_hk, QKR, Hv,
                                        scale, eps, 0, DK, PER_CHANNEL, USE_L2NORM, PREC)
    q1, k1, b1, L1, S1, T1, a11 = _tile(q_ptr, k_ptr, g_ptr, b_ptr, tok0, n, i_h, i_hk, QKR, Hv,
                                        scale, eps, 16, DK, PER_CHANNEL, USE_L2NORM, PREC)
    q2, k2, b2, L2, S2, T2, a22 = _tile(q_ptr, k_ptr, g_ptr, b_ptr, tok0, n, i_h, i_hk, QKR, Hv,
                                        scale, eps, 32, DK, PER_CHANNEL, USE_L2NORM, PREC)
    q3, k3, b3, L3, S3, T3, a33 = _tile(q_ptr, k_ptr, g_ptr, b_ptr, tok0, n, i_h, i_hk, QKR, Hv,
                                        scale, eps, 48, DK, PER_CHANNEL, USE_L2NORM, PREC)
    # Every decay below is a sum of g over one span (never a difference of two cumulative sums,
    # which cancels badly when the decay is strong): tile totals T, in-tile L / S.
    none = T0 * 0.0
    T12 = T1 + T2
    # For the sequential state kernel, everything that does not depend on the state: the
    # decayed keys k e^{G_end - G} (exponent <= 0) and the chunk's total log-decay G_end.
    _store_kgates(kg_ptr, k0, k1, k2, k3, S0, S1, S2, S3, T1, T2, T3, tok0, n, i_h, Hv, 0, DK, DK,
                  PER_CHANNEL)
    g_end = T0 + T1 + T2 + T3
    if PER_CHANNEL:
        tl.store(ge_ptr + (i_c.to(tl.int64) * Hv + i_h) * DK + tl.arange(0, DK), g_end)
    else:
        tl.store(ge_ptr + i_c.to(tl.int64) * Hv + i_h, g_end)
    # Off-diagonal blocks (i, j): decay L_i + (tiles between) + S_j.
    lk1 = _left(k1, L1, PER_CHANNEL)
    r10 = _right(k0, S0, none, PER_CHANNEL)
    a10 = _off(lk1, r10, L1, S0, none, PER_CHANNEL, PREC)
    lk2 = _left(k2, L2, PER_CHANNEL)
    r20 = _right(k0, S0, T1, PER_CHANNEL)
    r21 = _right(k1, S1, none, PER_CHANNEL)
    a20 = _off(lk2, r20, L2, S0, T1, PER_CHANNEL, PREC)
    a21 = _off(lk2, r21, L2, S1, none, PER_CHANNEL, PREC)
    lk3 = _left(k3, L3, PER_CHANNEL)
    r30 = _right(k0, S0, T12, PER_CHANNEL)
    r31 = _right(k1, S1, T2, PER_CHANNEL)
    r32 = _right(k2, S2, none, PER_CHANNEL)
    a30 = _off(lk3, r30, L3, S0, T12, PER_CHANNEL, PREC)
    a31 = _off(lk3, r31, L3, S1, T2, PER_CHANNEL, PREC)
    a32 = _off(lk3, r32, L3, S2, none, PER_CHANNEL, PREC)
    if PER_CHANNEL:
        # Causal q k^T for the output kernel (rows past n are masked on store; the blocks
        # above the diagonal are never written, the output kernel masks them on load).
        lq1 = _left(q1, L1, PER_CHANNEL)
        lq2 = _left(q2, L2, PER_CHANNEL)
        lq3 = _left(q3, L3, PER_CHANNEL)
        p10 = tl.dot(lq1, tl.trans(r10), input_precision=PREC)
        p20 = tl.dot(lq2, tl.trans(r20), input_precision=PREC)
        p21 = tl.dot(lq2, tl.trans(r21), input_precision=PREC)
        p30 = tl.dot(lq3, tl.trans(r30), input_precision=PREC)
        p31 = tl.dot(lq3, tl.trans(r31), input_precision=PREC)
        p32 = tl.dot(lq3, tl.trans(r32), input_precision=PREC)
        _store_off_blocks(a_ptr, p10, p20, p21, p30, p31, p32, tok0, n, i_h, Hv)
        # (the diagonal blocks come from _kda_diag_kernel)
    # The diagonal blocks' inverses; beta scales the rows of A (the written strength of token t)
    if PER_CHANNEL:
        x00, x11, x22, x33 = _x_diag(xd_ptr, tok0, n, i_h, Hv)
    else:
        x00 = _inv16(a00 * b0[:, None], n - 0)
        x11 = _inv16(a11 * b1[:, None], n - 16)
        x22 = _inv16(a22 * b2[:, None], n - 32)
        x33 = _inv16(a33 * b3[:, None], n - 48)
    x10, x20, x21, x30, x31, x32 = _solve_off(a10, a20, a21, a30, a31, a32, x00, x11, x22, x33,
                                              b1, b2, b3, PREC)
    # w = X (beta k e^G) and u = X (beta v), block row by block row.
    y0 = _kb(k0, b0, none, L0, PER_CHANNEL)
    y1 = _kb(k1, b1, T0, L1, PER_CHANNEL)
    y2 = _kb(k2, b2, T0 + T1, L2, PER_CHANNEL)
    y3 = _kb(k3, b3, T0 + T1 + T2, L3, PER_CHANNEL)
    _wy_rows(w_ptr, tok0, n, i_h, Hv, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
             y0, y1, y2, y3, DK, PREC)
    y0 = _head_rows(v_ptr, tok0, n, i_h, VR, 0, 0, 16, DV, DV) * b0[:, None]
    y1 = _head_rows(v_ptr, tok0, n, i_h, VR, 0, 16, 16, DV, DV) * b1[:, None]
    y2 = _head_rows(v_ptr, tok0, n, i_h, VR, 0, 32, 16, DV, DV) * b2[:, None]
    y3 = _head_rows(v_ptr, tok0, n, i_h, VR, 0, 48, 16, DV, DV) * b3[:, None]
    _wy_rows(u_ptr, tok0, n, i_h, Hv, x00, x10, x11, x20, x21, x22, x30, x31, x32, x33,
             y0, y1, y2, y3, DV, PREC)
