"""Triton chunked gated delta rule for prefill (contracts:
:func:`hwinfer.ops.linear_attention.gdn_chunked`,
:func:`~hwinfer.ops.linear_attention.kda_chunked`).

Chunks of 64 tokens (never crossing a sequence boundary), four launches (five for KDA):

0. KDA only, ``_kda_diag_kernel`` (:mod:`.delta_chunk_wy`), one small program per (16-row
   tile, value head): the diagonal 16 x 16 blocks, whose per-channel decay needs a sequential
   loop over rows (on the H200 this made KDA 1.8x faster than the same loop inside the WY
   kernel); the same loop writes each tile's running sums of g, which the later stages read
   their decays from (``KDA_SPANS``);
1. ``_wy_blocked_kernel`` (:mod:`.delta_chunk_wy_blocked`; the key channels in blocks of 32,
   the default) or ``_wy_kernel`` (:mod:`.delta_chunk_wy`, whole tiles, ``block_k=0``), one
   program per (chunk, value head), all chunks in parallel: ``w``, ``u`` of the WY form (the
   chunk's deltas are ``u - w S0``), the decayed keys ``k e^{G_end - G}`` and ``G_end`` and,
   for KDA, the causal decayed ``q k^T`` block. By default (``WY_SPLIT``) the blocked kernel
   stops at ``X = (I + diag(beta) A)^-1`` and ``_wu_kernel`` (:mod:`.delta_chunk_wu`) forms
   ``w = X (beta k e^G)`` and ``u = X (beta v)`` as [64, 64] products (one launch more);
2. ``_state_kernel``, one program per (sequence, value head, BV value channels), the only
   sequential part, kept to what needs the state: walks the chunks, stores each chunk's start
   state ``S0`` and its deltas ``d = u - w S0``, steps ``S <- diag(e^{G_end}) S + (k e^{G_end
   - G})^T d`` (GDN with bf16 keys: the keys as stored, each row's decay and inverse norm
   applied to d instead, ``GDN_STATE_RAW_K``);
3. ``_out_kernel``, one program per (chunk, value head, BV value channels), all parallel:
   ``o = (q e^G) S0 + P d`` with ``P`` the causal decayed ``q k^T`` (rebuilt by one matmul for
   GDN, whose decay is one scalar per token: for 16-bit inputs from the raw rows on the 16-bit
   tensor cores, exact products, the row norms applied to the scores after, ``RAW_QK``; read
   back from stage 1 for KDA). ``_out_blocked_kernel`` (:mod:`.delta_chunk_out_blocked`,
   ``block_k_out``) is the same stage in key-channel blocks, measured no faster on the H200.

Intermediates are fp32 except, for 16-bit inputs, ``w``, ``u`` (``U_16BIT``) and the decayed keys,
stored in bf16: the state stage is bound by the bytes each program streams per chunk, and these are
most of them. The state stage takes w and the keys as stored into bf16 products against the fp32
state and deltas rounded to bf16 (``STATE_DOTS = "bf16"``, one product each, fla's form; the
carried state stays fp32) or split into bf16 hi + lo halves (``"split"``, two products, ~16 bits of
the fp32 operand); GDN's ``q S0`` takes q's raw bf16 rows against the split S0 (``OUT_QS``).
Measured under the interpreter on the conformance cases (relative RMSE against the fp32 token
loop): bf16 ``w`` / keys leave it at 3.3e-3, as all-fp32; bf16 deltas, chunk states or Aqk (fla
stores all of them in the input dtype) raise it to 6-9e-3, past the 5e-3 contract.

Every exponent is <= 0 (the decay from s to t, or from t to the chunk's end), so unbounded
softplus gates cannot overflow, and every exponent is a sum of g over its own span, never a
difference of two cumulative sums: at strong decay (g ~ -100 per token) such a difference loses
~|G| * 6e-8 of absolute precision, which measured 1e-4 relative error on the outputs before
this was done. The exceptions, for 16-bit inputs only, where the products they feed round to
tf32 or bf16 far above the cancellation: KDA's decayed keys (a chunk's total less G, in
``_wu_kernel``) and the WY kernel's decay after a row in its 16-row tile (the tile's total less
the running sum, ``KDA_SPANS``). KDA's stages after the diagonal kernel read their decays from
the running sums of g that kernel's row loop writes per 16-row tile (exact sums of their own
spans) instead of scanning g themselves (``KDA_SPANS = "cumsum"``).

Varlen: the chunk table (first token and length of every chunk) is built on the device by
``_chunk_table_kernel`` for an upper bound of the chunk count (T // 64 + N; the rows past the
real chunks have length 0), so a prefill does not wait on the host. A cu_seqlens in device
memory is trusted, as in the recurrent kernel (:mod:`.delta_rule`): checking its contents would
cost a host sync per layer (on the H200 the host-built table made an 8 x 2k GDN call ~600 us
longer than its kernels); one on the CPU is checked in full.

q, k and v may be token-strided views of one packed projection (``_token_rows``): the kernels
take their token strides (``QKR``, ``VR``, in units of Dk / Dv) instead of a contiguous copy of
each, which cost a Qwen3.5 prefill three copy kernels per GDN layer.

Supported (``delta_chunk_supported``): Dk, Dv powers of two in [16, 128]; q/k/v fp16 / bf16 /
fp32. ``chunk_size`` is ignored (always 64): the contract allows any chunking.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, num_sms

from hwinfer.kernels.triton.delta_chunk_out_blocked import (
    _out_blocked_kernel, _out_program, block_k_out_ok,
)
from hwinfer.kernels.triton.delta_chunk_wy import (
    _as_stored, _g_rows, _gdn_decay, _head_rows, _kda_diag_kernel, _mm, _mm_split, _qk_rows,
    _raw_rows, _row_scale, _store_rows, _wy_kernel,
)
from hwinfer.kernels.triton.delta_chunk_wu import _wu_kernel
from hwinfer.kernels.triton.delta_chunk_wy_blocked import (
    _chunk_decay, _tile_starts, _wy_blocked_kernel, block_k_ok,
)
from hwinfer.ops.linear_attention_chunked import L2NORM_EPS, check_inputs

_INTERPRET = INTERPRET
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
BT = 64  # chunk length (the WY kernel is written for four 16-row tiles)
# The output stage's products with 16-bit inputs on NVIDIA when a call names no ``dots``: "bf16"
# operands (fp32 inputs and AMD keep exact fp32 / tf32 products; a call's ``dots`` overrides). H100, 21st session, relative RMSE of o against the recurrent kernel 2.4-
# 2.5e-3 -> 3.3e-3 (contract 5e-3; fla-core 0.6.0 4.4e-3 on the same inputs): KDA 1 x 16k
# (Kimi-Linear heads) output kernel 1,012 -> 731 us, call 4,338 -> 4,063 us; GDN (Qwen3.5 heads)
# 316 -> 222 us, call 1 x 16k 1,225 -> 1,127 us, 8 x 2k 1,021 -> 925. None keeps tf32 (and GDN's
# split q S0 products).
OUT_DOTS_16BIT: str | None = "bf16"
# The output stage's inputs (chunk states, deltas, KDA's Aqk) stored in bf16 when its products
# take bf16 operands (``OUT_DOTS_16BIT`` or ``dots="bf16"``): they would be rounded to bf16 on
# load anyway, so the outputs are bit-equal and the stage hand-off moves half the bytes (KDA 1 x
# 16k, Kimi-Linear heads: 1.88 -> 0.94 GB of states, deltas and Aqk written and read back).
# False keeps them fp32 (the comparison the tests make).
HANDOFF_16BIT = True
# Key channels per block of the output stage when a call names no ``block_k_out``: 0 runs the
# whole-tile ``_out_kernel``, a power of two the blocked one (:mod:`.delta_chunk_out_blocked`).
OUT_BLOCK_K = 0
# The state stage's products (w S and k^T d) for 16-bit inputs on NVIDIA, where w and the
# decayed keys are stored in bf16: "bf16" (S and d rounded to bf16, one product; the carried
# state stays fp32; fla's form) or "split" (delta_chunk_wy._mm_split: S and d as bf16 hi + lo,
# two products, ~16 bits of the fp32 operand); None keeps tf32 with w and the keys converted to
# fp32. fp32 inputs and AMD always take exact fp32 products. H100, twenty-seventh session
# (docs/kernels.md): "bf16" took the KDA state stage from 765 to 605 us at 1 x 16k (710 -> 700
# at 8 x 2k), GDN's from 454 to 410 us, the final state's error against the token loop from
# 1.7e-3 to 2.4e-3 and the outputs' not at all (3.3e-3); the strict conformance passes with it.
STATE_DOTS: str | None = "bf16"
# u of the WY form (the deltas before the state's part, u - w S0) stored in bf16 for 16-bit
# inputs (True) or fp32: 256 fewer bytes a token and value head written by the WY stage and read
# by the state stage (Dv = 128). Interpreted conformance (bf16 cases, relative RMSE against the
# token loop): the outputs 3.1-3.6e-3 -> 3.2-3.6e-3 (GDN's no-norm case 3.25 -> 3.46e-3), GDN's
# final states 1.6-2.0e-3 -> 2.1-2.5e-3, KDA's unchanged; contract 5e-3.
U_16BIT = True
# The state stage's grid with the value blocks first, (Dv / BV, sequences x heads), as fla
# launches its h kernel: the Dv / BV programs of a head read the same w and decayed keys, and
# launched together they can share them in L2 (heads first puts them a wave apart once the
# grid is several waves: KDA 8 x 2k is 1,024 programs). H100, twenty-ninth session (s29c): the
# state kernel at 8 x 2k 700 -> 408 us for KDA (the call 2,838 -> 2,540), 227 -> 197 for GDN;
# one-wave grids (1 x 16k) unchanged.
STATE_VB_FIRST = True
# (The state stage's manual prefetch of the next chunk's w and keys into registers, on one-wave
# grids since the thirteenth session, was removed in the thirty-second: with the bf16 products
# Triton pipelines those loads itself (cp.async, num_stages deep), and the prefetch lost at
# every launch timed on an H100 (s32a; state kernel, us, prefetch / none at the launch _run now
# picks): GDN 1 x 16k 367 / 359, KDA 1 x 16k 477 / 427; it is in git history, e.g. 1805255.)
# The state step's chunk decay loaded a step ahead (see _state_kernel). H100, thirty-third
# session (device_issue6.sh s32c, state kernel, us, behind / ahead): GDN 1 x 16k 359 -> 235,
# KDA 1 x 16k 432 -> 368; 8 x 2k level (GDN 150 -> 153, KDA 304 -> 303). Bit-equal outputs.
STATE_DECAY_AHEAD = True
# How the output stage forms GDN's intra-chunk decay exponents (delta_chunk_wy._gdn_decay):
# "scan" (exact sums of each span), "dot" (the same sums by 3xTF32 products), "diff" (fla's
# differences of cumulative sums, ~|G| * 6e-8 absolute in the exponent: far below bf16's
# rounding of the products it feeds). H100, thirty-third session (s32c, GDN output kernel, us,
# scan / diff): 1 x 16k 173 -> 160, 8 x 2k 179 -> 166; the error against the recurrent kernel
# unchanged (3.7e-3).
GDN_SPAN = "diff"
# GDN's q k^T in the output stage from the raw 16-bit rows, norms applied to the scores after
# (exact products, half the operand bytes); False keeps the normalised fp32 rows at ``PREC``.
RAW_QK = True
# GDN's inter-chunk term (q e^G) S0 with bf16 q: "split" takes q's raw rows into two bf16
# products against S0 split hi + lo (delta_chunk_wy._mm_split) and scales the result's rows;
# "" forms q e^G in fp32 for a tf32 product.
OUT_QS = "split"
# GDN's inter-chunk term with the output stage's bf16 products (OUT_DOTS_16BIT, the NVIDIA
# default for 16-bit inputs) as diag(e^G / |q|) (q_raw S0): q's bf16 rows enter the product as
# loaded and the row scales go on its result, as fla scales its output rows, instead of q e^G
# formed in fp32 and rounded to bf16 for the product ([64, 128] fp32 multiplied, converted and
# held: the GDN output kernel is at 255 registers with 2 B spilled, sm_90). One rounding fewer
# (q's rows are exact). H100, thirty-third session (s32c, output kernel, us, off / on): 1 x 16k
# 181 -> 173, 8 x 2k 185 -> 178 (at 64 channels a program it took 227: 128 kept).
GDN_OUT_RAW_Q = True
# (num_warps, num_stages) of the state and output kernels on NVIDIA when a call names no
# num_warps (the state kernel's stages None: _run's rule; the output kernel's None: Triton's
# default); see _run for what was measured.
STATE_LAUNCH = (4, None)
OUT_LAUNCH = (4, None)
# The blocked WY stage as two kernels: ``_wy_blocked_kernel`` stops at X (written as [tokens,
# Hv, 64] fp32) and ``_wu_kernel`` (:mod:`.delta_chunk_wu`) forms w and u as [64, 64] products.
# False keeps w and u inside the WY program. X costs 256 bytes a token and value head while the
# call runs. SPLIT_LAUNCH[kind]: (num_warps of the WY kernel, num_warps of _wu_kernel, its
# channel block) when a call names no num_warps (AMD takes the H200's choice, untimed). On the
# H200 at 1 x 16k (docs/kernels.md, twelfth session) the split took GDN's WY stage from 570 us to
# 283 + 149 and KDA's from 1,976 to 1,148 + 401 with these launches (then 4 warps for KDA's WY
# kernel); 64-channel blocks cost _wu_kernel 175 / 584 us. KDA's WY kernel at 2 warps (raw rows,
# H100, twenty-seventh session): 856 -> 782 us at 1 x 16k, 861 -> 775 at 8 x 2k, although it
# spills 196 B there (36 at 4 warps; sm_90a, Triton 3.6): four programs an SM instead of two,
# and two warps share the work of four (its loop ~2,700 instructions a warp against ~1,800).
# With KDA_SPANS = "cumsum" the 16-bit form takes one warp (KDA_WY_WARPS_16BIT; at 4 warps it
# measured 810 / 844 us).
WY_SPLIT = True
# GDN's four diagonal 16 x 16 blocks of (I + diag(beta) A)^-1 in the blocked WY kernel: "x4"
# together (delta_chunk_wy._inv16x4: 15 substitution steps instead of 60), "x1" one after the
# other. GDN's k k^T in the split WY kernel from the 16-bit keys as stored (GDN_RAW_K: exact
# products in the tensor cores, the rows' norms applied to the blocks after, one pass over the
# channels; the decayed keys for the state stage then written by _wu_kernel); False: normalised
# fp32 rows in tf32 products after a norm pass. On the H200 (fifteenth session, s15a) the WY
# kernel went from 305 to 205 us with "x4", to 167 with both (_wu_kernel 150 -> 168): GDN 1 x 16k
# 1,268 -> 1,146 us, 8 x 2k 1,037 -> 917 us; outputs unchanged (rel. RMSE 2.4e-3 against the
# recurrent kernel either way).
GDN_SOLVE = "x4"
GDN_RAW_K = True
# GDN's state stage with bf16 keys (GDN_RAW_K's split form): the keys as stored, each row's
# decay e^{G_end - G} and inverse norm applied to the deltas in the step, k^T (s d), as fla
# does, instead of _wu_kernel writing the decayed keys: 256 fewer bytes a token and value head
# written (Dk = 128) and read the same. False writes the decayed keys (fp16 keys always do).
GDN_STATE_RAW_K = True
# GDN's _wu_kernel with bf16 keys and values (and GDN_STATE_RAW_K): the rows' scales put on X's
# columns, w = (X diag(beta e^G / |k|)) k and u = (X diag(beta)) v, the raw bf16 rows entering
# the products as loaded (no fp32 tile scaled and staged per channel block). "split": the scaled
# X as bf16 hi + lo, two bf16 products each (~16 bits of it); "bf16": rounded to bf16, one
# product (fla rounds its scaled rows instead; with X_16BIT X is rounded once already); None
# keeps the scaled rows' products (tf32, or bf16 with X_16BIT). sm_90 SASS with X in fp32 (4
# warps): "split"'s channel loops 137 -> 91 instructions and 4 -> 2 barriers an iteration, but
# 121 registers against 64 (four programs an SM, not eight). H100, thirty-second session
# (device_issue6.sh s31a, X_16BIT on): _wu_kernel at GDN 1 x 16k 125 us with "bf16", 132 with
# "split" (tf32 rows and X fp32, the form before: 153); 8 x 2k 124 / 131 / 155.
GDN_WU_RAW = "bf16"
# X = (I + diag(beta) A)^-1, handed from the split WY kernel to _wu_kernel, stored in bf16 for
# 16-bit inputs on NVIDIA (True), and w = X (beta k e^G), u = X (beta v) then bf16 products with
# the scaled rows rounded to bf16 (fla's form: its inverse is stored in the input dtype); False
# keeps X fp32 and tf32 products. X's lower blocks are what is stored: 80 fewer bytes a token and
# value head on average, written and read back.
# Interpreted (tests/kernels/test_delta_chunk.py; B 1, T 200, 2 heads of 64, relative RMSE
# against the token loop): GDN's outputs 2.9-3.0e-3 -> 3.2-3.3e-3 (with GDN_WU_RAW "split"
# unchanged), KDA's 2.9e-3 -> 3.2-3.3e-3 and its final state 2.6e-3 -> 2.9-3.5e-3 (contract
# 5e-3). H100, thirty-second session (s31a): KDA 1 x 16k _wu_kernel 428 -> 405 us and the WY
# kernel 393 -> 377; GDN (with GDN_WU_RAW "bf16") _wu_kernel 153 -> 125 us; on the card the
# outputs' error against the recurrent kernel 3.3e-3 -> 3.7e-3, the final state's 2.3-2.4e-3 ->
# 2.9e-3 (bench_delta_chunk.py's inputs), and the strict conformance passes.
X_16BIT = True
# KDA's output stage on q's rows normalised, scaled and decayed from their 16-row tile's first
# row, written by _kda_diag_kernel's row loop, which has all three (with the tile cumsums,
# KDA_SPANS "cumsum"), in place of q and the tile cumsums [tokens, Hv, Dk] fp32: the output
# kernel reads 48 -> 19.5 KB a chunk and head (Dk = 128; 16 of q and 32 of the cumsums against
# 16 of these rows and seven rows of the cumsums) for the diagonal kernel's 16 KB more, and
# forms no norms. q e^G is rounded twice (stored, then times the tile's decay from the chunk's start,
# for the bf16 product) instead of once: interpreted, KDA's outputs 3.3e-3 -> 3.4e-3 against the
# token loop; fp32 inputs within 1e-7 of the other form. sm_90 SASS (Triton 3.6): the diagonal
# kernel keeps 128 registers, its row loop 382 -> 428 instructions; the output kernel 196 -> 168
# registers (two -> three programs an SM), 1,816 -> 1,120 instructions. The blocked output
# kernel takes it too (block_k_out: its loads pipelined by Triton, 162 registers at 64-channel
# blocks). H100, thirty-second session (s31a, KDA 1 x 16k): the output kernel 417 -> 274 us,
# the diagonal kernel 779 -> 823; all kernels 2,454 -> 2,361 us. The blocked output kernel at
# 64-channel blocks measured 269 us (one run; the whole tile kept).
KDA_OUT_QG = True
# KDA's split WY kernel with q and k entering its products as stored, their norms summed in the
# same channel loop and applied to the [16, 16] blocks after (no norm pass first), and the
# decayed keys written by _wu_kernel (KG) instead of the WY kernel. H100, KDA 1 x 16k (s25c,
# 1f13277): WY kernel 1,157 -> 851 us (spilled 54 -> 10 B), _wu_kernel 415 -> 620 with an exact
# second scan for the keys' decay. Kept in the WY kernel (stored raw, their norms applied to the
# deltas by the state kernel; f6cb453) the WY kernel went back to 1,210 us: the decayed keys'
# spans and stores are what spilled it.
KDA_RAW_K = True
# KDA's _wu_kernel in 64-channel blocks since the thirty-third session (H100, s32c, X in bf16:
# 405 -> 381 us at 1 x 16k, 403 -> 379 at 8 x 2k); GDN's level (125 / 125 us), kept at 32.
SPLIT_LAUNCH = {"gdn": (2, 4, 32), "kda": (2, 4, 64)}
# KDA's WY kernel in its 16-bit NVIDIA form (tf32 products, KDA_SPANS "cumsum": no scan left in
# its channel loop) at one warp, eight programs an SM (twenty-eighth session, H100, 1 x 16k /
# 8 x 2k: 462 -> 393 / 474 -> 399 us). Its exact-product form (fp32 inputs, AMD) keeps
# SPLIT_LAUNCH's: at one warp ptxas spills 10.7 KB of it (sm_90, Triton 3.6; 776 B at two).
KDA_WY_WARPS_16BIT = 1
# KDA's diagonal blocks: ``_kda_diag_kernel``, a row at a time, in DIAG_WARPS warps. Measured
# against it on the H200 (KDA 1 x 16k, docs/kernels.md) and removed: all rows at once by a
# binary split of the tile (3,408 us with exact fp32 segment sums, 5,628 with 3xTF32, against
# 1,183) and every pair at once with decays e^{G_t - G_s} (2,042-2,164 us); on an H100, tiles of
# bounded decay as two products (1,674 against 1,174 us).
# A register cap (maxnreg 96: ten programs an SM instead of eight, 88 B spilled) to hide the row
# loop's load latency took the kernel from 780 to 802 us (H100, KDA 1 x 16k, thirtieth session):
# removed.
DIAG_WARPS = 2
# The row loop's (I + beta A)^-1 by its 4 x 4 diagonal blocks (delta_chunk_wy._inv16_blocks, six
# exact products) instead of 15 substitution steps: ~0.89x its instructions, and on an H100
# (twenty-seventh session) 901 -> 745 us at KDA 1 x 16k, 874 -> 720 us at 8 x 2k.
DIAG_BLOCK_INV = True
# How KDA's later stages get their decay sums. "scan": each stage scans g itself (the WY
# kernel two scans a 16-row tile and channel block, _wu_kernel and the output kernel one over
# the chunk). "cumsum": the diagonal kernel's row loop also writes each tile's running sums of
# g (exact, fp32, one more [tokens, Hv, Dk] tensor written), and the WY, _wu and output kernels
# read their decays from the chunk's or the tile's start there; for 16-bit inputs on NVIDIA the
# WY kernel takes the decay after row s in its tile as the tile's total less the running sum
# (clamped at 0; delta_chunk_wy_blocked._kda_spans), fp32 inputs and AMD keep one exact
# reverse scan for it ("cumsum_exact", which a call can also force). "half": no tile cumsums,
# the WY kernel's forward scan only (S = T - L for 16-bit inputs, "scan" otherwise). sm_90
# SASS of the WY kernel's channel loop (2 warps): "scan" 2,707 instructions and 44 barriers,
# "half" 2,303 / 40, "cumsum_exact" 2,241 / 19, "cumsum" 1,841 / 2. H100, twenty-eighth
# session (KDA 1 x 16k, us): WY kernel 866 -> 462, output kernel 553 -> 507, _wu_kernel 505 ->
# 508, the diagonal kernel 716 -> 780 for writing the sums; the call 3,332 -> 2,939.
KDA_SPANS = "cumsum"


@triton.jit
def _chunk_log_decay(ge_ptr, chunk, i_h, Hv, DK: tl.constexpr, PER_CHANNEL: tl.constexpr, ok):
    """G_end of one chunk and head: [DK] (KDA) or a scalar (GDN); 0 where not ``ok``."""
    if PER_CHANNEL:
        g = tl.load(ge_ptr + (chunk * Hv + i_h) * DK + tl.arange(0, DK), mask=ok, other=0.0)
    else:
        g = tl.load(ge_ptr + chunk * Hv + i_h, mask=ok, other=0.0)
    return g


@triton.jit
def _state_kernel(kg_ptr, ge_ptr, w_ptr, u_ptr, h0_ptr, hs_ptr, d_ptr, ht_ptr, seq_ptr, slot_ptr,
                  ks_ptr, Hk, Hv, KR, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                  PER_CHANNEL: tl.constexpr, HAS_H0: tl.constexpr, PREC: tl.constexpr,
                  HAS_SLOTS: tl.constexpr, VB_FIRST: tl.constexpr = False,
                  KS: tl.constexpr = False, DECAY_AHEAD: tl.constexpr = False):
    # KS (GDN): kg_ptr holds the keys as stored (key head i_h // (Hv / Hk), token stride KR in
    # units of DK) and ks_ptr each row's scale |k|^-1 e^{G_end - G} ([tokens, Hv] fp32), which
    # the step applies to its deltas: k^T (s d) = (s k)^T d, one decay a row. Otherwise kg_ptr
    # holds the decayed keys [tokens, Hv, DK] (KR = Hv) and ks_ptr is unused.
    # VB_FIRST: grid (value blocks, sequences x heads), so the programs of one head, which read
    # the same w and decayed keys, are launched together and share them in L2
    if VB_FIRST:
        i_vb = tl.program_id(0)
        i_nh = tl.program_id(1)
    else:
        i_nh = tl.program_id(0)
        i_vb = tl.program_id(1)
    i_n = i_nh // Hv
    i_h = i_nh % Hv
    # The state row read at the start and written at the end: the sequence's pool slot (the
    # in-place form; this program alone reads and writes its [DK, BV] block of it), or i_n.
    if HAS_SLOTS:
        row = tl.load(slot_ptr + i_n).to(tl.int64) * Hv + i_h
    else:
        row = i_nh.to(tl.int64)
    tok0 = tl.load(seq_ptr + 3 * i_n).to(tl.int64)
    seq_len = tl.load(seq_ptr + 3 * i_n + 1)
    chunk0 = tl.load(seq_ptr + 3 * i_n + 2).to(tl.int64)
    if KS:
        i_hk = i_h // (Hv // Hk)
    else:
        i_hk = i_h
    c0 = i_vb * BV
    offs_s = tl.arange(0, DK)[:, None] * DV + c0 + tl.arange(0, BV)[None, :]
    if HAS_H0:
        h = tl.load(h0_ptr + row * DK * DV + offs_s).to(tl.float32)
    else:
        h = tl.zeros([DK, BV], dtype=tl.float32)
    # The loop does only what needs the state; w, k e^{G_end - G}, G_end come precomputed.
    # w and the decayed keys as stored (bf16 for 16-bit inputs; _mm_split takes them so).
    # Triton 3.6 pipelines these loads for the bf16 forms (cp.async, num_stages deep; sm_90
    # SASS, GDN BV 16 at 4 warps: 19 cp.async a step, 120 registers).
    rows = tl.arange(0, 64)
    nch = tl.cdiv(seq_len, 64)
    if DECAY_AHEAD:
        g_next = _chunk_log_decay(ge_ptr, chunk0, i_h, Hv, DK, PER_CHANNEL, nch > 0)
    for c in range(0, nch):
        t0 = tok0 + c * 64
        n = seq_len - c * 64
        w = _raw_rows(w_ptr, t0, n, i_h, Hv, 0, 64, DK)
        kg = _raw_rows(kg_ptr, t0, n, i_hk, KR, 0, 64, DK)
        if KS:
            ks = tl.load(ks_ptr + (t0 + rows) * Hv + i_h, mask=rows < n, other=0.0)
        # The chunk's decay, loaded before the products: issued after the first one (where
        # Triton put it when it was read just before its use) its latency sat between the two
        # (H100, twenty-ninth session: KDA 1 x 16k 604 -> 497 us, GDN 414 -> 355). Triton 3.6
        # does not pipeline this load (it feeds the accumulator, not a product's operand; the
        # TTGIR has it as the step's one plain global load), so DECAY_AHEAD loads the next
        # chunk's a whole step before its use, as fla's pipelined g loads are.
        if DECAY_AHEAD:
            decay = tl.exp(g_next)
            g_next = _chunk_log_decay(ge_ptr, chunk0 + c + 1, i_h, Hv, DK, PER_CHANNEL,
                                      c + 1 < nch)
        else:
            decay = tl.exp(_chunk_log_decay(ge_ptr, chunk0 + c, i_h, Hv, DK, PER_CHANNEL, True))
        tl.store(hs_ptr + ((chunk0 + c) * Hv + i_h) * DK * DV + offs_s,
                 _as_stored(h, hs_ptr))
        d = _head_rows(u_ptr, t0, n, i_h, Hv, c0, 0, 64, DV, BV)
        d -= _mm_split(w, h, PREC)
        _store_rows(d_ptr, d, t0, n, i_h, Hv, c0, 0, 64, DV, BV)
        if PER_CHANNEL:
            h = h * decay[:, None]
        else:
            h = h * decay
        if KS:
            h += _mm_split(tl.trans(kg), d * ks[:, None], PREC)
        else:
            h += _mm_split(tl.trans(kg), d, PREC)
    tl.store(ht_ptr + row * DK * DV + offs_s, h)


@triton.jit
def _out_kernel(q_ptr, k_ptr, g_ptr, a_ptr, hs_ptr, d_ptr, o_ptr, c_ptr, qg_ptr, tab_ptr, Hk, Hv,
                QKR, scale, eps, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                PER_CHANNEL: tl.constexpr, USE_L2NORM: tl.constexpr, PREC: tl.constexpr,
                SPAN: tl.constexpr, RAW_QK: tl.constexpr, QS: tl.constexpr,
                CS: tl.constexpr = False, QG: tl.constexpr = False):
    i_c, i_h, i_hk, tok0, n, c0 = _out_program(tab_ptr, Hk, Hv, BV)
    r = tl.arange(0, 64)
    if QG:
        # KDA (KDA_OUT_QG): q's rows normalised, scaled and decayed from their 16-row tile's
        # first row (_kda_diag_kernel), times that row's decay from the chunk's start
        qg = (_head_rows(qg_ptr, tok0, n, i_h, Hv, 0, 0, 64, DK, DK)
              * _tile_starts(c_ptr, tok0, n, i_h, Hv, 0, DK, DK))
    elif CS:   # KDA: the decays from the chunk's start from _kda_diag_kernel's tile cumsums
        G, _ = _chunk_decay(c_ptr, tok0, n, i_h, Hv, 0, DK, DK)
    else:
        g = _g_rows(g_ptr, tok0, n, i_h, Hv, 0, 64, DK, PER_CHANNEL)
        G = tl.cumsum(g, axis=0)
    if PER_CHANNEL:
        if not QG:
            q = _qk_rows(q_ptr, tok0, n, i_hk, QKR, scale, eps, 0, 64, DK, USE_L2NORM)
            qg = q * tl.exp(G)
        # Aqk rows past n and entries above the diagonal were never written: mask them.
        p = tl.load(a_ptr + ((tok0 + r) * Hv + i_h)[:, None] * 64 + r[None, :],
                    mask=(r < n)[:, None] & (r[None, :] <= r[:, None]), other=0.0)
    else:
        # Decay from s to t (delta_chunk_wy._gdn_decay: a sum of its own span by default).
        e = _gdn_decay(g, 64, SPAN)
        if RAW_QK != "":
            # 16-bit inputs: q k^T of the raw rows (their products are exact in the fp32
            # accumulator) on the 16-bit tensor cores, both rows' norms applied to the scores
            # after; on the interpreter (no 16-bit dots) the same product in fp32.
            qr = _raw_rows(q_ptr, tok0, n, i_hk, QKR, 0, 64, DK)
            kr = _raw_rows(k_ptr, tok0, n, i_hk, QKR, 0, 64, DK)
            nq = _row_scale(qr, scale, eps, USE_L2NORM)
            nk = _row_scale(kr, 1.0, eps, USE_L2NORM)
            if RAW_QK == "native":
                s = tl.dot(qr, tl.trans(kr))
            else:
                s = tl.dot(qr.to(tl.float32), tl.trans(kr.to(tl.float32)), input_precision="ieee")
            p = s * (nq[:, None] * nk[None, :]) * e
            if QS == "":
                qg = qr.to(tl.float32) * (nq * tl.exp(G))[:, None]
        else:
            q = _qk_rows(q_ptr, tok0, n, i_hk, QKR, scale, eps, 0, 64, DK, USE_L2NORM)
            k = _qk_rows(k_ptr, tok0, n, i_hk, QKR, 1.0, eps, 0, 64, DK, USE_L2NORM)
            qg = q * tl.exp(G)[:, None]
            p = _mm(q, tl.trans(k), PREC) * e
    h = tl.load(hs_ptr + (i_c.to(tl.int64) * Hv + i_h) * DK * DV
                + tl.arange(0, DK)[:, None] * DV + c0 + tl.arange(0, BV)[None, :])
    d = _head_rows(d_ptr, tok0, n, i_h, Hv, c0, 0, 64, DV, BV)
    if QS != "":
        # GDN with bf16 q: (q e^G) S0 = diag(e^G / |q|) (q_raw S0), q_raw as stored against S0
        # split hi + lo (QS "split", _mm_split): no fp32 copy of q, more precise than tf32; or
        # against S0 in bf16 (QS "bf16", GDN_OUT_RAW_Q), one product.
        o = (nq * tl.exp(G))[:, None] * _mm_split(qr, h, QS) + _mm(p, d, PREC)
    else:
        o = _mm(qg, h, PREC) + _mm(p, d, PREC)
    _store_rows(o_ptr, o, tok0, n, i_h, Hv, c0, 0, 64, DV, BV)


def _kda_spans(prec: str) -> str:
    """KDA_SPANS as a call with products at ``prec`` runs it: the forms that take a span's sum
    as a difference ("cumsum", "half") only where the products are tf32 (16-bit inputs on
    NVIDIA); exact products keep exact spans."""
    if KDA_SPANS not in ("scan", "half", "cumsum", "cumsum_exact"):
        raise ValueError(f"kda_chunked (triton): KDA_SPANS={KDA_SPANS!r} must be 'scan', 'half', "
                         "'cumsum' or 'cumsum_exact'")
    if prec != "tf32":
        return {"half": "scan", "cumsum": "cumsum_exact"}.get(KDA_SPANS, KDA_SPANS)
    return KDA_SPANS


def _split_wy_warps(per_channel: bool, prec: str) -> int:
    """num_warps of the split WY kernel: SPLIT_LAUNCH's, or KDA_WY_WARPS_16BIT for KDA's 16-bit
    NVIDIA form with its decays from the tile cumsums (no scan left in its channel loop)."""
    if per_channel and prec == "tf32" and _kda_spans(prec) == "cumsum":
        return KDA_WY_WARPS_16BIT
    return SPLIT_LAUNCH["kda" if per_channel else "gdn"][0]


def _pow2_in_range(x: int) -> bool:
    return 16 <= x <= 128 and x & (x - 1) == 0


def delta_chunk_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                          state_slots: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check for both ops: what the kernels do not cover goes to the next impl."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v must be 4-D [B, T, H, D]"
    dk, dv = k.shape[-1], v.shape[-1]
    if not _pow2_in_range(dk) or not _pow2_in_range(dv):
        return f"Dk={dk}, Dv={dv}: each must be a power of two in [16, 128]"
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                    ("initial_state", initial_state)):
        if t is not None and t.dtype not in _FLOATS:
            return f"{name} dtype {t.dtype} not in fp16/bf16/fp32"
    if state_slots is not None and (
            initial_state is None or initial_state.dtype != torch.float32
            or not initial_state.is_contiguous()
            or state_slots.dtype not in (torch.int32, torch.int64) or state_slots.device != v.device):
        return "state_slots needs a contiguous fp32 state pool and int32 / int64 slots on v's device"
    return None


@triton.jit
def _chunk_table_kernel(cu_ptr, chunk_ptr, seq_ptr, N, NC, T, BLOCK: tl.constexpr,
                        UNIFORM: tl.constexpr):
    """Chunk table rows j of this program (first flat token, length; length 0 past the last real
    chunk) and, in program 0, the sequence table [N, 3] (first token, length, first chunk), from
    cu_seqlens [N+1] in device memory (UNIFORM: N sequences of T tokens each, cu_ptr unused):
    one walk over the sequences."""
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    start = tl.zeros([BLOCK], tl.int32)
    length = tl.zeros([BLOCK], tl.int32)
    first = 0
    for i in range(0, N):
        if UNIFORM:
            lo = i * T
            hi = lo + T
        else:
            lo = tl.load(cu_ptr + i).to(tl.int32)
            hi = tl.load(cu_ptr + i + 1).to(tl.int32)
        nch = (hi - lo + 63) // 64
        inside = (j >= first) & (j < first + nch)
        t = lo + (j - first) * 64
        start = tl.where(inside, t, start)
        length = tl.where(inside, tl.minimum(hi - t, 64), length)
        if tl.program_id(0) == 0:
            tl.store(seq_ptr + 3 * i, lo)
            tl.store(seq_ptr + 3 * i + 1, hi - lo)
            tl.store(seq_ptr + 3 * i + 2, first)
        first += nch
    tl.store(chunk_ptr + 2 * j, start, mask=j < NC)
    tl.store(chunk_ptr + 2 * j + 1, length, mask=j < NC)


def _tables(B: int, T: int, cu_seqlens: torch.Tensor | None, device: torch.device):
    """Chunk table [NC, 2] (first flat token, length) and sequence table [N, 3] (first token,
    length, first chunk), int32, built on the device without reading cu_seqlens on the host. With
    cu_seqlens, NC = T // 64 + N bounds the real chunk count (each sequence adds at most one
    partial chunk); the rows past the real chunks have length 0, so their programs store nothing.
    Without cu_seqlens: B sequences of T tokens, NC = B * ceil(T / 64) exactly (the same kernel:
    one launch where torch took nine small ones, ~11 us at 1 x 16k on an H100)."""
    n, nc = (B, B * triton.cdiv(T, BT)) if cu_seqlens is None else (
        cu_seqlens.numel() - 1, T // BT + cu_seqlens.numel() - 1)
    chunks = torch.empty(max(nc, 1), 2, dtype=torch.int32, device=device)
    seqs = torch.empty(max(n, 1), 3, dtype=torch.int32, device=device)
    block = 128
    cu = chunks if cu_seqlens is None else cu_seqlens.to(device, non_blocking=True)
    _chunk_table_kernel[(triton.cdiv(max(nc, 1), block),)](
        cu, chunks, seqs, n, nc, T, BLOCK=block, UNIFORM=cu_seqlens is None)
    return chunks, seqs, nc


def _check_device_cu(op: str, q: torch.Tensor, cu_seqlens: torch.Tensor,
                     initial_state: torch.Tensor | None, Hv: int, Dk: int, Dv: int) -> int:
    """Shape checks of a device cu_seqlens and of the initial state it implies; returns N."""
    if q.shape[0] != 1:
        raise ValueError(f"{op}: with cu_seqlens the batch dimension must be 1, got B={q.shape[0]}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError(f"{op}: cu_seqlens must be a 1-D integer tensor [N+1], got "
                         f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}")
    n = cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (n, Hv, Dk, Dv):
        raise ValueError(f"{op}: initial_state must be {[n, Hv, Dk, Dv]} ([N, Hv, Dk, Dv], "
                         f"k-first), got {list(initial_state.shape)}")
    return n


def _token_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(q, k, v, qkr, vr): the kernels address token t, head h of q / k at ``(t * qkr + h) * Dk``
    and of v at ``(t * vr + h) * Dv``. q, k, v [B, T, H, D] that are token-strided views of one
    projection (GDN / KDA layers split their conv output, packed q | k | v per token) are taken
    as they are, their token stride in units of D; anything else is made contiguous first (one
    copy kernel each, three a layer, that the views avoid)."""
    def rows(x: torch.Tensor) -> int | None:
        B, T, H, D = x.shape
        st = x.stride()
        ok = (st[3] == 1 and st[2] == D and st[1] % D == 0 and st[1] >= H * D
              and (B == 1 or st[0] == T * st[1]))
        return st[1] // D if ok else None
    qkr = rows(q) if q.stride() == k.stride() else None
    if qkr is None:
        q, k = q.contiguous(), k.contiguous()
        qkr = q.shape[2]
    vr = rows(v)
    if vr is None:
        v = v.contiguous()
        vr = v.shape[2]
    return q, k, v, qkr, vr


def _check_pool(op: str, pool: torch.Tensor | None, state_slots: torch.Tensor, n: int, Hv: int,
                Dk: int, Dv: int, device: torch.device) -> None:
    """Shape checks of the in-place form: pool [S, Hv, Dk, Dv] fp32 contiguous, slots [N]
    integer on the device (their values are trusted: reading them costs a sync)."""
    if (pool is None or pool.dtype != torch.float32 or pool.dim() != 4 or not pool.is_contiguous()
            or tuple(pool.shape[1:]) != (Hv, Dk, Dv) or pool.device != device):
        raise ValueError(f"{op} (triton): state_slots needs initial_state = a contiguous fp32 "
                         f"state pool [S, {Hv}, {Dk}, {Dv}] on {device}, got "
                         f"{None if pool is None else (pool.dtype, list(pool.shape))}")
    if (state_slots.dim() != 1 or state_slots.shape[0] != n
            or state_slots.dtype not in (torch.int32, torch.int64) or state_slots.device != device):
        raise ValueError(f"{op} (triton): state_slots must be int32 / int64 [N={n}] on {device}, "
                         f"got {state_slots.dtype} {list(state_slots.shape)} on {state_slots.device}")


def _run(op: str, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens,
         per_channel: bool, block_v: int | None, block_v_out: int | None,
         num_warps: int | None, block_k: int | None = None, dots: str | None = None,
         block_k_out: int | None = None, state_slots: torch.Tensor | None = None):
    # cu_seqlens in device memory is trusted, as in the recurrent kernels (checking its contents
    # would cost a host sync per layer of every prefill); one on the CPU is checked in full.
    on_device = cu_seqlens is not None and cu_seqlens.device.type != "cpu"
    pool = initial_state if state_slots is not None else None
    h0_in = None if pool is not None else initial_state
    n = check_inputs(op, q, k, v, g, beta, None if on_device else h0_in,
                     None if on_device else cu_seqlens, per_channel=per_channel)
    if on_device:
        n = _check_device_cu(op, q, cu_seqlens, h0_in, v.shape[2], k.shape[3], v.shape[3])
    if state_slots is not None:
        _check_pool(op, pool, state_slots, n, v.shape[2], k.shape[3], v.shape[3], v.device)
    reason = delta_chunk_supported(q, k, v, g, beta, initial_state)
    if reason is not None:
        raise ValueError(f"{op} (triton): {reason}")
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    q, k, v, qkr, vr = _token_rows(q, k, v)
    g, beta = g.contiguous(), beta.contiguous()
    o = torch.empty(B, T, Hv, Dv, dtype=v.dtype, device=v.device)
    # In place (state_slots): each sequence's state program reads and writes its pool row.
    ht = pool if pool is not None else torch.empty(n, Hv, Dk, Dv, dtype=torch.float32,
                                                   device=v.device)
    if n * Hv == 0:
        return o, ht
    h0 = pool if pool is not None else (
        None if initial_state is None else initial_state.to(torch.float32).contiguous())
    chunks, seqs, nc = _tables(B, T, cu_seqlens, v.device)
    f32 = dict(dtype=torch.float32, device=v.device)
    # w, u and the decayed keys in bf16 for 16-bit inputs (see the module docstring).
    half = dict(f32, dtype=torch.float32 if v.dtype == torch.float32 else torch.bfloat16)
    w = torch.empty(B * T, Hv, Dk, **half)
    u = torch.empty(B * T, Hv, Dv, **(half if U_16BIT else f32))
    ge = torch.empty(max(nc, 1), Hv, Dk if per_channel else 1, **f32)
    scale = float(Dk ** -0.5 if scale is None else scale)
    l2 = bool(use_qk_l2norm)
    # The interpreter pays per program: one value block per head there unless asked. On the
    # GPU the state stage, the only sequential one, takes the widest value block (64, 32, 16)
    # whose grid (N * Hv * Dv / BV programs) still fills the SMs, else 16: each program reads
    # all of w and the keys, so wider blocks read them fewer times, and narrower ones run more
    # chains side by side where there are few. H100, thirty-second session (s32a, state kernel,
    # us, no manual prefetch, 4 warps, 2 / 3 stages): GDN 1 x 16k (16 sequence-heads) BV 16:
    # 470 / 359, 32: 483 / 377, 64: 561 / 447; KDA 1 x 16k (32) BV 16: - / 427, 32: 562 / 474,
    # 64: 624 / 490; GDN 8 x 2k (128) BV 16: - / 236, 32: 192 / 237, 64: 150 / 172. With the
    # decay loaded ahead (thirty-third session, s32c) KDA 1 x 16k took 332 us at BV 32 (128
    # programs, 3 stages) against 368 at 16, GDN 1 x 16k 293 against 235 (64 programs): a
    # grid within 1/8 of the SMs counts as filling them.
    sms = num_sms(v.device, 8)
    wide = next((b for b in (64, 32) if 8 * n * Hv * triton.cdiv(Dv, b) >= 7 * sms), 16)
    bv_state = min(block_v or (Dv if _INTERPRET else wide), Dv)
    # The output stage: 128 value channels a program for GDN's split q S0 (293 against 332 us
    # at 64 on the H200, GDN 1 x 16k; 294 / 334 at 8 x 2k) and for KDA, whose decays now come
    # from the tile cumsums (H100, twenty-eighth session: 507 -> 416 us at 1 x 16k, 510 -> 423
    # at 8 x 2k; with its own scan it was 945 at 64, 1,028 at 128 on the H200), 64 otherwise.
    wide_out = not per_channel and OUT_QS == "split"
    bv_out = min(block_v_out or (Dv if _INTERPRET else 128 if wide_out or per_channel else 64), Dv)
    if bv_state & (bv_state - 1) or bv_out & (bv_out - 1) or min(bv_state, bv_out) < 16:
        raise ValueError(f"{op} (triton): block_v={block_v}, block_v_out={block_v_out} must be "
                         "powers of two >= 16")
    # The WY stage in key-channel blocks of 32 by default: on the H200 it beat the whole-tile
    # kernel (whose [64, 128] fp32 tiles spill) by 6-12% for GDN and 20% for KDA (1 x 16k,
    # 8 x 2k). block_k=0 asks for the whole-tile kernel (kept for comparison).
    if block_k is None:
        block_k = min(32, Dk, Dv)
    if block_k and not block_k_ok(block_k, Dk, Dv):
        raise ValueError(f"{op} (triton): block_k={block_k} must be a power of two >= 16 dividing "
                         f"Dk={Dk} and Dv={Dv}")
    # 4 warps for the state and output kernels: on the H200 faster
    # than 8 at every shape timed (tenth session: GDN 1 x 16k / 8 x 2k: 14% / 13%, KDA 1 x 16k:
    # 4%); the whole-tile WY kernel of KDA (q, k, G tiles) keeps 8.
    warps_wy = num_warps or (8 if per_channel else 4)
    # The state kernel's loads pipelined 3 deep where its programs are few enough to run side
    # by side (one wave, or two of 16 / 32 channels, whose stages are smaller), else 2 deep, so
    # that more of them share an SM (the measurements above; 2 warps were 2-3x slower
    # throughout).
    state_warps, state_stages = STATE_LAUNCH
    state_programs = n * Hv * (Dv // bv_state)
    if state_stages is None:
        state_stages = 3 if state_programs <= sms * (2 if bv_state <= 32 else 1) else 2
    stages = {} if torch.version.hip else {"num_stages": state_stages}
    out_warps, out_stages = OUT_LAUNCH
    out_stages = {} if torch.version.hip or not out_stages else {"num_stages": out_stages}
    # tf32 matmuls for 16-bit inputs on NVIDIA (their own rounding is coarser); exact fp32
    # ("ieee") for fp32 inputs, and on AMD, where tf32 is not available on every chip.
    prec = "ieee" if v.dtype == torch.float32 or torch.version.hip else "tf32"
    if dots is None and v.dtype != torch.float32 and not torch.version.hip:
        dots = OUT_DOTS_16BIT
    if dots not in (None, "bf16", "tf32", "ieee"):
        raise ValueError(f"{op} (triton): dots={dots!r} must be 'bf16', 'tf32' or 'ieee'")
    # The output stage's products may take bf16 operands (a tuning knob, measured against the
    # contract's tolerance); the WY inversion and the state recurrence always keep ``prec``.
    prec_out = "bf16_rounded" if dots == "bf16" and _INTERPRET else dots or prec
    if STATE_DOTS not in (None, "bf16", "split"):
        raise ValueError(f"{op} (triton): STATE_DOTS={STATE_DOTS!r} must be None, 'bf16' or "
                         "'split'")
    prec_state = prec
    # "bf16" / "split" need w and the keys in bf16: 16-bit inputs on NVIDIA (and interpreted).
    if STATE_DOTS is not None and prec == "tf32":
        prec_state = STATE_DOTS + ("_rounded" if _INTERPRET else "")
    # What the output stage reads (the chunk states S0, the deltas d, KDA's Aqk) in bf16 where
    # its products round them to bf16 anyway: the same outputs bit for bit, half the bytes.
    handoff = dict(f32, dtype=torch.bfloat16) if (
        HANDOFF_16BIT and prec_out in ("bf16", "bf16_rounded")) else f32
    d = torch.empty(B * T, Hv, Dv, **handoff)
    # (ge, fp32, stands in for the buffers a kind never touches: Aqk, xd for GDN, X unsplit)
    a = torch.empty(B * T, Hv, BT, **handoff) if per_channel else ge   # Aqk (KDA only)
    hs = torch.empty(max(nc, 1), Hv, Dk, Dv, **handoff)
    raw_qk = (("fp32" if _INTERPRET else "native")
              if RAW_QK and q.dtype in (torch.bfloat16, torch.float16) else "")
    # GDN's q S0 by split products: bf16 q (whose raw rows are exact bf16), default products.
    qs = ""
    if OUT_QS == "split" and not per_channel and raw_qk and q.dtype == torch.bfloat16 and not dots:
        qs = "split_rounded" if _INTERPRET else "split"
    elif (GDN_OUT_RAW_Q and not per_channel and raw_qk and q.dtype == torch.bfloat16
          and prec_out in ("bf16", "bf16_rounded")):
        qs = prec_out   # (q_raw S0) in one bf16 product, S0 being bf16 already
    block_k_out = OUT_BLOCK_K if block_k_out is None else block_k_out
    if block_k_out and not block_k_out_ok(block_k_out, Dk):
        raise ValueError(f"{op} (triton): block_k_out={block_k_out} must be a power of two >= 16 "
                         f"dividing Dk={Dk}")
    xd = torch.empty(B * T, Hv, 16, **f32) if per_channel else ge  # KDA's diagonal inverses
    spans = _kda_spans(prec) if per_channel else "scan"
    cs = spans.startswith("cumsum")
    gc = torch.empty(B * T, Hv, Dk, **f32) if cs else g   # KDA's tile cumsums of g
    # KDA_OUT_QG: q normalised, scaled, decayed from its tile's first row ([tokens, Hv, Dk],
    # w's dtype)
    qg_on = bool(KDA_OUT_QG and per_channel and cs)
    qg = torch.empty(B * T, Hv, Dk, **half) if qg_on else ge
    if nc and per_channel:
        _kda_diag_kernel[(4 * nc, Hv)](q, k, g, beta, a, xd, gc, qg, chunks, Hk, Hv, qkr,
                                       scale, L2NORM_EPS, DK=Dk, USE_L2NORM=l2,
                                       BLOCK_INV=bool(DIAG_BLOCK_INV), CS=cs, QG=qg_on,
                                       num_warps=DIAG_WARPS)
    # The blocked WY stage as two kernels (WY_SPLIT). GDN's k k^T from the keys as stored
    # (exact 16-bit products), its decayed keys then written by _wu_kernel: split WY stage,
    # 16-bit keys (GDN_RAW_K).
    split = bool(block_k) and WY_SPLIT
    raw_k = ""
    if GDN_RAW_K and split and not per_channel and k.dtype in (torch.bfloat16, torch.float16):
        raw_k = "fp32" if _INTERPRET else "native"
    if KDA_RAW_K and split and per_channel:   # (KDA's products stay fp32 / tf32 ones)
        raw_k = "fp32"
    # GDN's state stage on the bf16 keys as stored and _wu_kernel's row scales
    # (GDN_STATE_RAW_K): kg holds the scales [tokens, Hv], else the decayed keys.
    key_scales = bool(GDN_STATE_RAW_K and raw_k and not per_channel
                      and k.dtype == torch.bfloat16)
    kg = (torch.empty(B * T, Hv, **f32) if key_scales
          else torch.empty(B * T, Hv, Dk, **half))
    # GDN_WU_RAW: w and u from the scaled X against the raw bf16 rows
    if GDN_WU_RAW not in (None, "split", "bf16"):
        raise ValueError(f"{op} (triton): GDN_WU_RAW={GDN_WU_RAW!r} must be None, 'split' or "
                         "'bf16'")
    xs_split = ""
    if GDN_WU_RAW and key_scales and v.dtype == torch.bfloat16:
        xs_split = GDN_WU_RAW + ("_rounded" if _INTERPRET else "")
    if nc and not block_k:
        _wy_kernel[(nc, Hv)](q, k, v, g, beta, w, u, a, kg, ge, chunks, xd, Hk, Hv, qkr, vr,
                             scale, L2NORM_EPS, DK=Dk, DV=Dv, PER_CHANNEL=per_channel, USE_L2NORM=l2,
                             PREC=prec, num_warps=warps_wy)
    elif nc:  # the same stage with the key channels in blocks (delta_chunk_wy_blocked.py)
        # X_16BIT: X in bf16 and _wu_kernel's products bf16 (16-bit inputs on NVIDIA)
        x16 = split and X_16BIT and prec == "tf32"
        xs = torch.empty(B * T, Hv, BT, **(half if x16 else f32)) if split else ge
        prec_wu = ("bf16_rounded" if _INTERPRET else "bf16") if x16 else prec
        wy_warps, wu_warps, wu_block = 4, None, None
        if split:
            wy_warps = _split_wy_warps(per_channel, prec)
            _, wu_warps, wu_block = SPLIT_LAUNCH["kda" if per_channel else "gdn"]
        _wy_blocked_kernel[(nc, Hv)](q, k, v, g, beta, w, u, a, kg, ge, chunks, xd, xs, gc, Hk,
                                     Hv, qkr, vr, scale, L2NORM_EPS, DK=Dk, DV=Dv,
                                     PER_CHANNEL=per_channel, USE_L2NORM=l2, PREC=prec, BK=block_k,
                                     SPLIT=split, SOLVE=GDN_SOLVE, RAW_K=raw_k, SPANS=spans,
                                     num_warps=num_warps or wy_warps)
        if split:
            _wu_kernel[(nc, Hv)](k, v, g, beta, xs, w, u, kg, gc, chunks, Hk, Hv, qkr, vr,
                                 L2NORM_EPS, DK=Dk, DV=Dv, BC=min(wu_block, Dk, Dv),
                                 PER_CHANNEL=per_channel, USE_L2NORM=l2, PREC=prec_wu,
                                 KG=bool(raw_k), CS=cs, KS=key_scales, XS=xs_split,
                                 num_warps=num_warps or wu_warps)
    grid = (Dv // bv_state, n * Hv) if STATE_VB_FIRST else (n * Hv, Dv // bv_state)
    keys, key_stride = (k, qkr) if key_scales else (kg, Hv)
    _state_kernel[grid](
        keys, ge, w, u, h0 if h0 is not None else ht, hs, d, ht, seqs,
        state_slots if pool is not None else seqs, kg, Hk, Hv, key_stride,
        DK=Dk, DV=Dv, BV=bv_state, PER_CHANNEL=per_channel, HAS_H0=h0 is not None, PREC=prec_state,
        HAS_SLOTS=pool is not None, VB_FIRST=bool(STATE_VB_FIRST),
        KS=key_scales, DECAY_AHEAD=bool(STATE_DECAY_AHEAD),
        num_warps=num_warps or state_warps, **stages)
    if nc and block_k_out:
        _out_blocked_kernel[(nc, Hv, Dv // bv_out)](
            q, k, g, a, hs, d, o, gc, qg, chunks, Hk, Hv, qkr, scale, L2NORM_EPS,
            DK=Dk, DV=Dv, BV=bv_out, BK=block_k_out, PER_CHANNEL=per_channel, USE_L2NORM=l2,
            PREC=prec_out, SPAN=GDN_SPAN, QG=qg_on, num_warps=num_warps or out_warps,
            **out_stages)
    elif nc:
        _out_kernel[(nc, Hv, Dv // bv_out)](
            q, k, g, a, hs, d, o, gc, qg, chunks, Hk, Hv, qkr, scale, L2NORM_EPS,
            DK=Dk, DV=Dv, BV=bv_out, PER_CHANNEL=per_channel, USE_L2NORM=l2, PREC=prec_out,
            SPAN=GDN_SPAN, RAW_QK=raw_qk, QS=qs, CS=cs, QG=qg_on,
            num_warps=num_warps or out_warps,
            **out_stages)
    return o, ht


def gdn_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                scale: float | None = None, use_qk_l2norm: bool = True,
                cu_seqlens: torch.Tensor | None = None, chunk_size: int = 64,
                state_slots: torch.Tensor | None = None,
                block_v: int | None = None, block_v_out: int | None = None,
                num_warps: int | None = None, block_k: int | None = None,
                dots: str | None = None, block_k_out: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``gdn_chunked``: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [N, Hv, Dk, Dv] fp32 or None. Returns o [B, T, Hv, Dv] (v.dtype) and the
    final state [N, Hv, Dk, Dv] fp32. With ``state_slots`` [N] (int32 / int64, distinct, on the
    device): initial_state is the contiguous fp32 pool [S, Hv, Dk, Dv], read and written in
    place by the state stage (no gather or scatter), and returned. ``chunk_size`` is ignored (64); ``block_v`` (value
    channels per state program), ``block_v_out`` (per output program) and ``num_warps`` are
    tuning knobs; ``block_k``: the WY stage's key channels in blocks of that many
    (:mod:`.delta_chunk_wy_blocked`; default min(32, Dk, Dv), 0 for the whole-tile kernel);
    ``dots``: "bf16" rounds the output stage's product operands to bf16, "tf32" / "ieee" do not
    (default: ``OUT_DOTS_16BIT``, bf16, for 16-bit inputs on NVIDIA, exact fp32 otherwise);
    ``block_k_out``: the output stage's key
    channels in blocks of that many (:mod:`.delta_chunk_out_blocked`; default ``OUT_BLOCK_K``,
    0 for the whole-tile kernel)."""
    return _run("gdn_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, False, block_v, block_v_out, num_warps, block_k, dots, block_k_out,
                state_slots)


def kda_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, initial_state: torch.Tensor | None = None, *,
                scale: float | None = None, use_qk_l2norm: bool = True,
                cu_seqlens: torch.Tensor | None = None, chunk_size: int = 64,
                state_slots: torch.Tensor | None = None,
                block_v: int | None = None, block_v_out: int | None = None,
                num_warps: int | None = None, block_k: int | None = None,
                dots: str | None = None, block_k_out: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``kda_chunked``: as :func:`gdn_chunked` with g [B, T, Hv, Dk] (a log-decay per
    key channel)."""
    return _run("kda_chunked", q, k, v, g, beta, initial_state, scale, use_qk_l2norm,
                cu_seqlens, True, block_v, block_v_out, num_warps, block_k, dots, block_k_out,
                state_slots)


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = [AotSpec(f"delta_chunk_table[{'uniform' if uniform else 'cu'}]", _chunk_table_kernel,
                     {"cu_ptr": "*i32", "chunk_ptr": "*i32", "seq_ptr": "*i32", "N": "i32",
                      "NC": "i32", "T": "i32", "BLOCK": "constexpr", "UNIFORM": "constexpr"},
                     {"BLOCK": 128, "UNIFORM": uniform}, {"num_warps": 4})
             for uniform in (False, True)]
    for per_channel in (False, True):
        kind = "kda" if per_channel else "gdn"
        tile_cs = per_channel and KDA_SPANS.startswith("cumsum")   # KDA's tile cumsums read
        # What prefill launches in the models (bf16, D = 128, tf32 on NVIDIA / ieee on AMD).
        for dtype, d in (("bf16", 128),):
            ptr, f32, half = f"*{dtype}", "*fp32", "*bf16"  # half: w, kg
            u16 = half if U_16BIT else f32
            flags = {"DK": d, "DV": d, "PER_CHANNEL": per_channel, "USE_L2NORM": True,
                     "PREC": "ieee"}
            wy = {"q_ptr": ptr, "k_ptr": ptr, "v_ptr": ptr, "g_ptr": f32, "b_ptr": f32,
                  "w_ptr": half, "u_ptr": u16, "a_ptr": f32, "kg_ptr": half, "ge_ptr": f32,
                  "tab_ptr": "*i32", "xd_ptr": f32, "Hk": "i32",
                  "Hv": "i32", "QKR": "i32", "VR": "i32", "scale": "fp32", "eps": "fp32",
                  "DK": "constexpr",
                  "DV": "constexpr", "PER_CHANNEL": "constexpr", "USE_L2NORM": "constexpr",
                  "PREC": "constexpr"}
            specs.append(AotSpec(f"delta_chunk_wy[{kind},{dtype},{d}]", _wy_kernel, wy, flags,
                                 {"num_warps": 8 if per_channel else 4}))
            # the split form: KDA's Aqk handed over in bf16 (HANDOFF_16BIT), its rows raw
            # (KDA_RAW_K); exact products (AMD) and, as NVIDIA runs it, tf32 ones
            # (X handed over in fp32 or, X_16BIT, in bf16 on NVIDIA: both compiled)
            nv = ("sm_90", "sm_100")
            for split, prec, x16, targets in ((False, "ieee", False, None),
                                              (True, "ieee", False, None),
                                              (True, "tf32", False, nv), (True, "tf32", True, nv)):
                if prec == "tf32" and not per_channel:
                    continue   # (GDN's NVIDIA form is the raw x4 spec below)
                specs.append(AotSpec(
                    f"delta_chunk_wy_blocked[{kind},{dtype},{d},bk32{',split' if split else ''}"
                    f"{',tf32' if prec == 'tf32' else ''}{',x16' if x16 else ''}]",
                    _wy_blocked_kernel, {**wy, "x_ptr": half if split and x16 else f32,
                                         "c_ptr": f32, "BK": "constexpr",
                                         "SPLIT": "constexpr", "SOLVE": "constexpr",
                                         "RAW_K": "constexpr", "SPANS": "constexpr",
                                         **({"a_ptr": half} if split and per_channel else {})},
                    {**flags, "PREC": prec, "BK": 32, "SPLIT": split, "SOLVE": GDN_SOLVE,
                     "RAW_K": "fp32" if split and per_channel and KDA_RAW_K else "",
                     "SPANS": _kda_spans(prec) if per_channel else "scan"},
                    {"num_warps": _split_wy_warps(per_channel, prec) if split else 4}, targets))
            wu = {"k_ptr": ptr, "v_ptr": ptr, "g_ptr": f32, "b_ptr": f32, "x_ptr": f32,
                  "w_ptr": half, "u_ptr": u16, "kg_ptr": half, "c_ptr": f32, "tab_ptr": "*i32",
                  "Hk": "i32", "Hv": "i32", "QKR": "i32", "VR": "i32", "eps": "fp32",
                  "DK": "constexpr", "DV": "constexpr",
                  "BC": "constexpr", "PER_CHANNEL": "constexpr", "USE_L2NORM": "constexpr",
                  "PREC": "constexpr", "KG": "constexpr", "CS": "constexpr", "KS": "constexpr",
                  "XS": "constexpr"}
            # KG: the decayed keys written here (GDN / KDA_RAW_K), for GDN on NVIDIA their row
            # scales only (GDN_STATE_RAW_K) and the scaled X against the raw rows (GDN_WU_RAW);
            # tf32: as NVIDIA runs it
            # (X_16BIT: X in bf16 and bf16 products there; GDN's GDN_WU_RAW forms with X in
            # fp32 ("split") and bf16 ("bf16"): all compiled whatever the defaults)
            for raw, prec, x16, xs, targets in ((False, "ieee", False, "", None),
                                                (True, "ieee", False, "", None),
                                                (True, "tf32", False, "", nv),
                                                (True, "tf32", True, "", nv),
                                                (True, "tf32", False, "split", nv),
                                                (True, "tf32", True, "bf16", nv)):
                scales = raw and prec == "tf32" and not per_channel and GDN_STATE_RAW_K
                if xs and not scales:
                    continue
                specs.append(AotSpec(f"delta_chunk_wu[{kind},{dtype},{d}{',kg' if raw else ''}"
                                     f"{',tf32' if prec == 'tf32' else ''}{',x16' if x16 else ''}"
                                     f"{',ks' if scales else ''}{',x' + xs if xs else ''}]",
                                     _wu_kernel, {**wu, "x_ptr": half if x16 else f32,
                                                  **({"kg_ptr": f32} if scales else {})},
                                     {"DK": d, "DV": d, "BC": SPLIT_LAUNCH[kind][2],
                                      "PER_CHANNEL": per_channel, "USE_L2NORM": True,
                                      "PREC": "bf16" if x16 else prec, "KG": raw,
                                      "CS": tile_cs, "KS": scales, "XS": xs},
                                     {"num_warps": SPLIT_LAUNCH[kind][1]}, targets))
            for x16 in (False, True) if not per_channel else ():
                # GDN's default form on NVIDIA: raw 16-bit keys, "x4" solve (X in fp32 / bf16)
                specs.append(AotSpec(
                    f"delta_chunk_wy_blocked[{kind},{dtype},{d},bk32,split,raw,x4"
                    f"{',x16' if x16 else ''}]",
                    _wy_blocked_kernel, {**wy, "x_ptr": half if x16 else f32,
                                         "c_ptr": f32, "BK": "constexpr",
                                         "SPLIT": "constexpr", "SOLVE": "constexpr",
                                         "RAW_K": "constexpr", "SPANS": "constexpr"},
                    {**flags, "PREC": "tf32", "BK": 32, "SPLIT": True, "SOLVE": "x4",
                     "RAW_K": "native", "SPANS": "scan"}, {"num_warps": SPLIT_LAUNCH[kind][0]},
                    nv))
            if per_channel:
                dg = {"q_ptr": ptr, "k_ptr": ptr, "g_ptr": f32, "b_ptr": f32, "a_ptr": f32,
                      "xd_ptr": f32, "c_ptr": f32, "qg_ptr": half, "tab_ptr": "*i32",
                      "Hk": "i32", "Hv": "i32",
                      "QKR": "i32", "scale": "fp32", "eps": "fp32", "DK": "constexpr",
                      "USE_L2NORM": "constexpr", "BLOCK_INV": "constexpr", "CS": "constexpr",
                      "QG": "constexpr"}
                # Aqk in bf16 (NVIDIA's hand-off) or fp32; the inverse by blocks
                # (DIAG_BLOCK_INV); the tile cumsums written (KDA_SPANS), and q e^c (KDA_OUT_QG)
                for a16, inv, cs, qgw in ((True, False, False, False), (False, False, False, False),
                                          (True, True, False, False), (True, True, True, False),
                                          (True, True, True, True)):
                    tag = (f"{'a16' if a16 else 'a32'}{',blockinv' if inv else ''}"
                           f"{',cs' if cs else ''}{',qg' if qgw else ''}")
                    specs.append(AotSpec(f"kda_diag[{dtype},{d},{tag}]", _kda_diag_kernel,
                                         {**dg, "a_ptr": half if a16 else f32},
                                         {"DK": d, "USE_L2NORM": True, "BLOCK_INV": inv,
                                          "CS": cs, "QG": qgw}, {"num_warps": 2}))
            st = {"kg_ptr": half, "ge_ptr": f32, "w_ptr": half, "u_ptr": u16, "h0_ptr": f32,
                  "hs_ptr": f32, "d_ptr": f32, "ht_ptr": f32, "seq_ptr": "*i32",
                  "slot_ptr": "*i32", "ks_ptr": f32, "Hk": "i32", "Hv": "i32", "KR": "i32",
                  "DK": "constexpr", "DV": "constexpr", "BV": "constexpr",
                  "PER_CHANNEL": "constexpr", "HAS_H0": "constexpr", "PREC": "constexpr",
                  "HAS_SLOTS": "constexpr", "VB_FIRST": "constexpr",
                  "KS": "constexpr", "DECAY_AHEAD": "constexpr"}
            # At the value blocks and stages _run picks (16 / 32 channels 3 deep, 64 2 deep; AMD
            # the same blocks at Triton's stages), 4 warps. On NVIDIA (bf16, the default STATE_DOTS,
            # or split) the states and deltas are handed over in bf16 (HANDOFF_16BIT).
            nv = ("sm_90", "sm_100")
            # GDN on NVIDIA: the keys as stored with their row scales (GDN_STATE_RAW_K)
            ks = not per_channel and GDN_STATE_RAW_K
            # (the decay loaded a step ahead or not, as STATE_DECAY_AHEAD has it)
            ahead = bool(STATE_DECAY_AHEAD)
            for prec, bv, stages, targets in (
                    ("ieee", 16, 2, None), ("ieee", 32, 2, None), ("ieee", 64, 2, None),
                    ("bf16", 16, 3, nv), ("bf16", 32, 3, nv), ("bf16", 64, 2, nv),
                    ("split", 16, 3, nv)):
                handoff = {"hs_ptr": half, "d_ptr": half} if prec != "ieee" else {}
                raw = ks and prec != "ieee"
                specs.append(AotSpec(
                    f"delta_chunk_state[{kind},{dtype},{d},{prec},bv{bv}s{stages}"
                    f"{',ks' if raw else ''}{',ahead' if ahead else ''}]",
                    _state_kernel, {**st, **handoff, **({"kg_ptr": ptr} if raw else {})},
                    {"DK": d, "DV": d, "BV": min(bv, d), "PER_CHANNEL": per_channel,
                     "HAS_H0": True, "PREC": prec, "HAS_SLOTS": True,
                     "VB_FIRST": bool(STATE_VB_FIRST), "KS": raw, "DECAY_AHEAD": ahead},
                    {"num_warps": 4, "num_stages": stages}, targets))
            out = {"q_ptr": ptr, "k_ptr": ptr, "g_ptr": f32, "a_ptr": f32, "hs_ptr": f32,
                   "d_ptr": f32, "o_ptr": ptr, "c_ptr": f32, "qg_ptr": half,
                   "tab_ptr": "*i32", "Hk": "i32",
                   "Hv": "i32", "QKR": "i32", "scale": "fp32", "eps": "fp32", "DK": "constexpr",
                   "DV": "constexpr",
                   "BV": "constexpr", "PER_CHANNEL": "constexpr", "USE_L2NORM": "constexpr",
                   "PREC": "constexpr", "SPAN": "constexpr", "RAW_QK": "constexpr",
                   "QS": "constexpr", "CS": "constexpr", "QG": "constexpr"}
            # exact products (AMD), GDN's split q S0, and bf16 products (NVIDIA's default for
            # 16-bit inputs, OUT_DOTS_16BIT); KDA's on q e^c from the diagonal kernel
            # (KDA_OUT_QG) in its exact and NVIDIA forms
            for qs, prec, qg, targets in (("", "ieee", False, None), ("", "ieee", True, None),
                                          ("split", "ieee", False, nv), ("", "bf16", False, nv),
                                          ("", "bf16", True, nv), ("bf16", "bf16", False, nv)):
                if (qs and per_channel) or (qg and not tile_cs):
                    continue
                tag = (f"{',' + qs if qs else ''}{',bf16dots' if prec == 'bf16' else ''}"
                       f"{',qg' if qg else ''}")
                # bf16 products read the hand-off in bf16 (HANDOFF_16BIT; GDN's a_ptr is ge, fp32)
                handoff = {}
                if prec == "bf16":
                    handoff = {"hs_ptr": half, "d_ptr": half, "a_ptr": half if per_channel else f32}
                specs.append(AotSpec(f"delta_chunk_out[{kind},{dtype},{d}{tag}]",
                                     _out_kernel, {**out, **handoff}, {**flags, "PREC": prec,
                                                        "BV": 128,   # as _run launches them
                                                        "SPAN": GDN_SPAN, "RAW_QK": "native",
                                                        "QS": qs, "CS": tile_cs,
                                                        "QG": qg},
                                     {"num_warps": 4}, targets))
            blocked = {**{k: v for k, v in out.items() if k not in ("RAW_QK", "QS", "CS")},
                       "BK": "constexpr"}
            specs.append(AotSpec(f"delta_chunk_out_blocked[{kind},{dtype},{d},bk32]",
                                 _out_blocked_kernel, blocked,
                                 {**flags, "BV": 64, "BK": 32, "SPAN": "scan", "QG": False},
                                 {"num_warps": 4}))
            if tile_cs:   # KDA's on q e^c (KDA_OUT_QG), as NVIDIA would run it
                specs.append(AotSpec(
                    f"delta_chunk_out_blocked[{kind},{dtype},{d},bk64,bf16dots,qg]",
                    _out_blocked_kernel, {**blocked, "hs_ptr": half, "d_ptr": half, "a_ptr": half},
                    {**flags, "PREC": "bf16", "BV": 128, "BK": 64, "SPAN": "scan", "QG": True},
                    {"num_warps": 4}, nv))
    return specs


AOT_SPECS = _aot_specs()
