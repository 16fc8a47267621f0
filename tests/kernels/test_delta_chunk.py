"""The Triton chunked delta-rule kernels' paths that the conformance cases do not reach,
interpreted: several chunks per sequence with a partial last one, packed sequences (one empty,
one crossing two chunk boundaries), GQA (Hv = 2 Hk), Dk != Dv, q/k as strided views of one
projection, no initial state, value blocks split over programs (``block_v=16``,
``block_v_out=16``), KDA's diagonal-block kernel (varlen with partial and empty tiles
above; strong decay below) and the WY stage both in key-channel blocks (``block_k``, the
default; as two kernels, ``WY_SPLIT``, and as one), and the WY stage whole (``block_k=0``), the output stage in key-channel blocks (``block_k_out``),
the output stage's bf16 products (``dots="bf16"``; the default for 16-bit inputs,
``OUT_DOTS_16BIT``), the split bf16 products of the state stage
(``STATE_DOTS``) and of GDN's q S0 (``OUT_QS``), GDN's diagonal blocks solved together or one by
one (``GDN_SOLVE``), GDN's k k^T from the raw keys (``GDN_RAW_K``), KDA's WY products from the
raw rows (``KDA_RAW_K``), KDA's diagonal blocks' row loop on varlen tiles with its inverse by
blocks (``DIAG_BLOCK_INV``) or by substitution, KDA's decays from the diagonal kernel's tile cumsums or
from scans (``KDA_SPANS``), the state stage's grid with the value blocks first
(``STATE_VB_FIRST``),
the output stage's inputs handed
over in bf16 (``HANDOFF_16BIT``, bit-equal). Checked
against the token-loop
reference and the fused recurrent Triton kernel. ``TRITON_INTERPRET`` is read when a kernel is decorated: a fresh interpreter process.
"""
from __future__ import annotations

import pytest

from tests.kernels.interpreted import run_interpreted

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter needs it

SCRIPT = r"""
import torch
from hwinfer.kernels.triton import delta_chunk as tc
from hwinfer.kernels.triton import delta_rule as tr
from hwinfer.ops import linear_attention as ref
torch.manual_seed(0)
def rel(a, b):
    return ((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()).item()
def split(f, wy):   # f with the module constants of wy ('one': WY_SPLIT off)
    def call(*args, **kw):
        tc.WY_SPLIT = not wy.get("one")
        try:
            return f(*args, **kw, **{k: v for k, v in wy.items() if k != "one"})
        finally:
            tc.WY_SPLIT = True
    return call
# the WY stage whole; in channel blocks as two kernels (w, u from X in memory); as one kernel
WYS = (dict(block_k=0), dict(block_k=16, block_k_out=16), dict(block_k=16, one=True))
for per_channel in (False, True):
    B, T, Hk, Hv, Dk, Dv = 1, 137, 1, 2, 16, 32
    # q | k | v packed per token as the layers' conv output (token-strided views, taken as
    # they are: _token_rows), with room for more channels after v
    proj = torch.randn(B, T, 2 * Hk * Dk + Hv * Dv + Dv)
    q, k = (proj[..., i * Hk * Dk:(i + 1) * Hk * Dk].reshape(B, T, Hk, Dk) for i in range(2))
    v = proj[..., 2 * Hk * Dk:2 * Hk * Dk + Hv * Dv].reshape(B, T, Hv, Dv)
    assert tc._token_rows(q, k, v)[3:] == (8, 4)   # row strides in units of Dk / Dv
    g = -torch.rand(B, T, Hv, Dk) if per_channel else -torch.rand(B, T, Hv)
    beta = torch.rand(B, T, Hv)
    cu = torch.tensor([0, 0, 130, 137], dtype=torch.int32)
    name = "kda" if per_channel else "gdn"
    f_c, f_t, f_r = (getattr(m, name + suffix) for m, suffix in
                     ((tc, "_chunked"), (tr, "_recurrent"), (ref, "_recurrent")))
    for kw in (dict(cu_seqlens=cu, initial_state=torch.randn(3, Hv, Dk, Dv)),
               dict(use_qk_l2norm=False, scale=0.3)):
        kk = k * 0.3 if "scale" in kw else k   # keep beta |k|^2 < 2 without the norm
        o2, s2 = f_r(q, kk, v, g, beta, **kw)
        o3, s3 = f_t(q, kk, v, g, beta, **kw)
        for wy in WYS:
            o1, s1 = split(f_c, wy)(q, kk, v, g, beta, block_v=16, block_v_out=16, **kw)
            assert o1.shape == o2.shape and s1.shape == s2.shape and s1.dtype == torch.float32
            assert rel(o1, o2) < 1e-5 and rel(s1, s2) < 1e-5, (name, list(kw), wy, rel(o1, o2))
            assert rel(o1, o3) < 1e-5 and rel(s1, s3) < 1e-5, (name, list(kw), wy, rel(o1, o3))
# KDA's diagonal-block kernel at weak, ordinary and strong decay (g down to -100 per
# token and channel, where differences of cumulative sums would cancel), fp32: within 2e-6 of
# the token loop.
# The channel-blocked WY stage (block_k=16 of D=32: two blocks) the same, KDA and GDN.
B, T, H, D = 1, 70, 2, 32
cu_odd = torch.tensor([0, 1, 18, 35], dtype=torch.int32)   # tiles of 1 row, 1 past 16, 1 past 32
q, k = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
v, beta = torch.randn(B, T, H, D), torch.rand(B, T, H)
s0 = torch.randn(1, H, D, D)
for g in (-0.02 * torch.rand(B, T, H, D), -torch.rand(B, T, H, D), -100 * torch.rand(B, T, H, D)):
    o2, s2 = ref.kda_recurrent(q, k, v, g, beta, s0)   # weak decay: every block of A counts
    for wy in WYS:
        o1, s1 = split(tc.kda_chunked, wy)(q, k, v, g, beta, s0)
        assert rel(o1, o2) < 2e-6 and rel(s1, s2) < 2e-6, (wy, rel(o1, o2), rel(s1, s2))
    o2, s2 = ref.gdn_recurrent(q, k, v, g[..., 0], beta, s0)
    for wy in WYS:
        o1, s1 = split(tc.gdn_chunked, wy)(q, k, v, g[..., 0], beta, s0)
        assert rel(o1, o2) < 2e-6 and rel(s1, s2) < 2e-6, ("gdn", wy, rel(o1, o2), rel(s1, s2))
    # the diagonal blocks' row loop on varlen tiles of 1 and 17 rows, every decay strength
    half = [x[:, :T // 2] for x in (q, k, v, g, beta)]
    out = tc.kda_chunked(*half, s0.repeat(3, 1, 1, 1), cu_seqlens=cu_odd)
    want = ref.kda_recurrent(*half, s0.repeat(3, 1, 1, 1), cu_seqlens=cu_odd)
    assert rel(out[0], want[0]) < 2e-6 and rel(out[1], want[1]) < 2e-6
    # DIAG_BLOCK_INV (the default): the row loop's inverse by 4 x 4 blocks, the same as the
    # 15 substitution steps within fp32 rounding
    blocks = tc.kda_chunked(q, k, v, g, beta, s0)
    tc.DIAG_BLOCK_INV = False
    subst = tc.kda_chunked(q, k, v, g, beta, s0)
    tc.DIAG_BLOCK_INV = True
    assert rel(subst[0], blocks[0]) < 1e-6 and rel(subst[1], blocks[1]) < 1e-6
    if g.min() > -50:   # (it ran; at g ~ -100 the blocks' off-diagonal entries vanish: X = I)
        assert not torch.equal(subst[0], blocks[0])
# STATE_DECAY_AHEAD: the state step's chunk decay loaded a step ahead (masked past the last
# chunk): the same loads in another order, bit-equal outputs and states, GDN and KDA, one
# sequence and varlen with partial chunks (value blocks of 16: several programs a head).
for f, gg in ((tc.gdn_chunked, g[..., 0]), (tc.kda_chunked, g)):
    for args, kw in (((q, k, v, gg, beta, s0), {}),
                     ((*(x[:, :T // 2] for x in (q, k, v, gg, beta)), s0.repeat(3, 1, 1, 1)),
                      dict(cu_seqlens=cu_odd))):
        res, default = {}, tc.STATE_DECAY_AHEAD
        for on in (True, False):
            tc.STATE_DECAY_AHEAD = on
            res[on] = f(*args, block_v=16, **kw)
        tc.STATE_DECAY_AHEAD = default
        assert all(map(torch.equal, res[True], res[False])), (f.__name__, list(kw))
# dots="bf16": the output stage's operands rounded to bf16 (emulated in fp32 here); the state
# recurrence untouched, the output moved by bf16 rounding only.
o1, s1 = tc.gdn_chunked(q, k, v, g[..., 0], beta, s0, dots="bf16")
assert rel(s1, s2) < 2e-6 and 1e-4 < rel(o1, o2) < 2e-2, (rel(o1, o2), rel(s1, s2))
o1, s1 = tc.gdn_chunked(q, k, v, g[..., 0], beta, s0, dots="bf16", block_k_out=16)
assert rel(s1, s2) < 2e-6 and 1e-4 < rel(o1, o2) < 2e-2, (rel(o1, o2), rel(s1, s2))
# STATE_DOTS applies to 16-bit inputs only: fp32 inputs keep exact state products, bit for bit.
outs = {}
for mode in ("bf16", None):
    tc.STATE_DOTS = mode
    outs[mode] = tc.kda_chunked(q, k, v, g, beta, s0)
tc.STATE_DOTS = "bf16"
assert all(map(torch.equal, outs["bf16"], outs[None]))
# 16-bit inputs, whose w and decayed keys are stored in bf16: "split" (S and d as bf16 hi + lo,
# two products each) within 1e-5 of exact fp32 products of the same stored operands (None, in
# the interpreter; o within a few bf16 ulps of its rounding); "bf16" (the default: S and d
# rounded, one product) is not, but stays within 2e-2 of the token loop. (Ordinary decay: at
# g ~ -100 the final state is the last token's update alone, whose deltas are u, stored in bf16
# already, so "bf16" rounds nothing.)
qb, kb, vb = (t.bfloat16() for t in (q, k, v))
go = -torch.rand(B, T, H, D)
for f, r, gg in ((tc.gdn_chunked, ref.gdn_recurrent, go[..., 0]),
                 (tc.kda_chunked, ref.kda_recurrent, go)):
    outs = {}
    for mode in ("split", None, "bf16"):
        tc.STATE_DOTS = mode
        outs[mode] = f(qb, kb, vb, gg, beta, s0)
    tc.STATE_DOTS = "bf16"
    (o1, s1), (o2, s2), (o3, s3) = outs["split"], outs[None], outs["bf16"]
    assert rel(s1, s2) < 1e-5 and rel(o1, o2) < 1e-3, (f.__name__, rel(s1, s2), rel(o1, o2))
    assert rel(s3, s2) > 1e-4, (f.__name__, rel(s3, s2))
    o4, s4 = r(qb.float(), kb.float(), vb.float(), gg, beta, s0)
    assert rel(s3, s4) < 2e-2 and rel(o3, o4) < 2e-2, (f.__name__, rel(s3, s4), rel(o3, o4))
    # U_16BIT (the default): u in bf16 for 16-bit inputs; against u in fp32, the outputs and
    # final state within the 5e-3 contract of the token loop, and not bit-equal (it ran)
    tc.U_16BIT = False
    o5, s5 = f(qb, kb, vb, gg, beta, s0)
    tc.U_16BIT = True
    assert not torch.equal(o3, o5)
    assert max(rel(o3, o4), rel(s3, s4), rel(o5, o4), rel(s5, s4)) < 5e-3, (
        f.__name__, rel(o3, o4), rel(s3, s4), rel(o5, o4), rel(s5, s4))
# KDA_SPANS: the later stages' decays from the diagonal kernel's tile cumsums ("cumsum", the
# default; "cumsum_exact") or from scans of their own ("scan", "half"). fp32 inputs keep exact
# spans: "cumsum" is "cumsum_exact" there, bit for bit, and "half" is "scan". 16-bit inputs take
# the decay after a row in its tile as a difference: at a chunk whose first rows decay by ~100
# (the tile's total cancels against the running sum) the outputs stay within bf16 rounding of
# the exact scans and of the token loop.
outs = {}
for mode in ("cumsum", "cumsum_exact", "half", "scan"):
    tc.KDA_SPANS = mode
    outs[mode] = tc.kda_chunked(q, k, v, g, beta, s0)
assert all(map(torch.equal, outs["cumsum"], outs["cumsum_exact"]))
assert all(map(torch.equal, outs["half"], outs["scan"]))
assert rel(outs["cumsum"][0], outs["scan"][0]) < 1e-6
rows = torch.arange(T)[None, :, None, None] % 64
gm = torch.where(rows < 4, -100.0, -0.01) * (0.5 + torch.rand(B, T, H, D))
o4, s4 = ref.kda_recurrent(qb.float(), kb.float(), vb.float(), gm, beta, s0)
outs = {}
for mode in ("scan", "half", "cumsum"):
    tc.KDA_SPANS = mode
    outs[mode] = tc.kda_chunked(qb, kb, vb, gm, beta, s0)
    assert rel(outs[mode][0], o4) < 5e-3 and rel(outs[mode][1], s4) < 5e-3, (mode, rel(outs[mode][0], o4))
    assert rel(outs[mode][0], outs["scan"][0]) < 1e-3, (mode, rel(outs[mode][0], outs["scan"][0]))
tc.KDA_SPANS = "cumsum"
assert not torch.equal(outs["cumsum"][0], outs["scan"][0])   # (the difference form ran)
# STATE_VB_FIRST: the state stage's grid with the value blocks first, the same programs: bit-equal
# (the default; two value blocks a head)
tc.STATE_VB_FIRST = False
heads_first = tc.kda_chunked(q, k, v, g, beta, s0, block_v=16)
tc.STATE_VB_FIRST = True
assert all(map(torch.equal, heads_first, tc.kda_chunked(q, k, v, g, beta, s0, block_v=16)))
# KDA_OUT_QG: the output stage on q normalised, scaled and decayed from its tile's first row,
# written by the diagonal kernel. fp32 inputs: the same math up to
# fp32 rounding, with and without the norm, on varlen tiles of 1 and 17 rows. bf16 inputs
# (q e^c stored in bf16 and rounded again for the product, once in the other form): both
# within the contract of the token loop, the new form's error at most 1.15x the other's.
# The output stage in key-channel blocks (block_k_out) takes it too.
for args, kw in (((q, k, v), {}), ((q, k * 0.3, v), dict(use_qk_l2norm=False, scale=0.3)),
                 ((q[:, :T // 2], k[:, :T // 2], v[:, :T // 2]), dict(cu_seqlens=cu_odd)),
                 ((q, k, v), dict(block_k_out=16)), ((qb, kb, vb), {}),
                 ((qb, kb, vb), dict(block_k_out=16))):
    gg, bb, ss = ((g[:, :T // 2], beta[:, :T // 2], s0.repeat(3, 1, 1, 1))
                  if "cu_seqlens" in kw else (go, beta, s0))
    res, default = {}, tc.KDA_OUT_QG
    for on in (True, False):
        tc.KDA_OUT_QG = on
        res[on] = tc.kda_chunked(*args, gg, bb, ss, **kw)
    tc.KDA_OUT_QG = default
    assert torch.equal(res[True][1], res[False][1])   # (the state stage is untouched)
    if args[0].dtype == torch.float32:
        assert rel(res[True][0], res[False][0]) < 1e-6, (kw, rel(res[True][0], res[False][0]))
    else:
        o4, _ = ref.kda_recurrent(qb.float(), kb.float(), vb.float(), gg, bb, ss)
        errs = rel(res[True][0], o4), rel(res[False][0], o4)
        assert errs[0] < 5e-3 and errs[0] < 1.15 * errs[1], errs
    assert not torch.equal(res[True][0], res[False][0])   # (it ran)
# GDN_SOLVE: the blocked WY kernel's four diagonal blocks solved together ("x4") or one after
# the other ("x1"): the same substitution, so the same outputs up to fp32 rounding
# (with a short last chunk, whose later blocks have no live rows).
res = {}
for solve in ("x4", "x1"):
    tc.GDN_SOLVE = solve
    res[solve] = tc.gdn_chunked(q, k, v, g[..., 0], beta, s0)
tc.GDN_SOLVE = "x4"
assert rel(res["x4"][0], res["x1"][0]) < 1e-5 and rel(res["x4"][1], res["x1"][1]) < 1e-5
# GDN_RAW_K (the default, with "x4"): GDN's k k^T from the bf16 keys as stored, norms applied
# after, the decayed keys written by _wu_kernel instead of the WY kernel: the same math up to fp32 rounding (and the
# bf16 rounding of the decayed keys), so within a few 1e-5 of the normalised-row form, which
# itself matches the token loop.
# (GDN_STATE_RAW_K off: the state stage reads the decayed keys, as the other form's does.)
res = {}
tc.GDN_STATE_RAW_K = False
for raw in (True, False):
    tc.GDN_RAW_K, tc.GDN_SOLVE = raw, "x4" if raw else "x1"
    res[raw] = tc.gdn_chunked(qb, kb, vb, g[..., 0], beta, s0)
tc.GDN_RAW_K, tc.GDN_SOLVE, tc.GDN_STATE_RAW_K = True, "x4", True   # the defaults
assert rel(res[True][0], res[False][0]) < 1e-4 and rel(res[True][1], res[False][1]) < 1e-4
o2, s2 = ref.gdn_recurrent(qb, kb, vb, g[..., 0], beta, s0)
assert rel(res[True][0], o2) < 5e-3 and rel(res[True][1], s2) < 5e-3, (rel(res[True][0], o2), rel(res[True][1], s2))
# GDN_STATE_RAW_K (the default): the state stage takes the bf16 keys as stored and scales its
# deltas by each row's decay and norm (_wu_kernel writes the scales, not the decayed keys). On
# contiguous heads and on GQA heads in a token-strided projection (two value heads a key
# head): against the token loop (fp32, on the bf16 values) within the contract and near the
# decayed keys' form (the roundings differ: bf16(s d) against bf16(s k) and bf16(d); with u in
# bf16 the latter's bf16(d) rounds little, so either form's state can be the closer one).
pb = torch.randn(1, 137, 4 * 32 + 32).bfloat16()   # q | k | v (two heads) | spare
for qq, kk, vv in ((qb, kb, vb), (pb[..., :32].reshape(1, 137, 1, 32),
                                  pb[..., 32:64].reshape(1, 137, 1, 32),
                                  pb[..., 64:128].reshape(1, 137, 2, 32))):
    gd, bt = -torch.rand(vv.shape[:3]), torch.rand(vv.shape[:3])
    sd = torch.randn(1, vv.shape[2], 32, 32)
    o2, s2 = ref.gdn_recurrent(qq.float(), kk.float(), vv.float(), gd, bt, sd)
    errs, outs, defaults = {}, {}, (tc.GDN_STATE_RAW_K, tc.GDN_WU_RAW, tc.X_16BIT)
    # GDN_WU_RAW: _wu_kernel's products from the scaled X, split into bf16 halves or rounded to
    # bf16, against the raw rows; None: the scaled rows' products. X_16BIT: X handed over in
    # bf16 (each form with X in fp32 too)
    forms = [(False, None, False)] + [(True, wu, x16) for wu in (None, "split", "bf16")
                                      for x16 in (False, True)]
    for scales, wu, x16 in forms:
        tc.GDN_STATE_RAW_K, tc.GDN_WU_RAW, tc.X_16BIT = scales, wu, x16
        outs[scales, wu, x16] = tc.gdn_chunked(qq, kk, vv, gd, bt, sd)
        errs[scales, wu, x16] = rel(outs[scales, wu, x16][0], o2), rel(outs[scales, wu, x16][1], s2)
    tc.GDN_STATE_RAW_K, tc.GDN_WU_RAW, tc.X_16BIT = defaults
    base = errs[False, None, False]
    for key in forms[1:]:
        assert errs[key][0] < 1.2 * base[0] and errs[key][1] < 1.5 * base[1], errs
        assert max(errs[key]) < 5e-3, errs
    # each form ran: none equals the fp32-X rows form (their roundings are independent, so
    # two forms differ by about as much as each differs from the token loop)
    for key in forms[2:]:
        assert not torch.equal(outs[True, None, False][0], outs[key][0]), key
# KDA_RAW_K (the default): KDA's WY kernel takes q and k as stored and scales its blocks by the
# rows' norms after; the decayed keys are written by _wu_kernel. fp32 inputs: the same math up
# to fp32 rounding (with and without the norms; varlen tiles of 1 and 17 rows). bf16 inputs
# (keys stored in bf16, their decay from the chunk's total less G): each form against the token
# loop, the raw one no further from it.
for args, kw in (((q, k, v), {}), ((q, k * 0.3, v), dict(use_qk_l2norm=False, scale=0.3)),
                 ((q[:, :T // 2], k[:, :T // 2], v[:, :T // 2]), dict(cu_seqlens=cu_odd)),
                 ((qb, kb, vb), {})):
    gm = -torch.rand(B, T, H, D)   # ordinary decay (at g ~ -100 the state hardly depends on it)
    gg, bb, ss = ((gm[:, :T // 2], beta[:, :T // 2], s0.repeat(3, 1, 1, 1)) if "cu_seqlens" in kw
                  else (gm, beta, s0))
    res = {}
    for raw in (True, False):
        tc.KDA_RAW_K = raw
        res[raw] = tc.kda_chunked(*args, gg, bb, ss, **kw)
    tc.KDA_RAW_K = True
    if args[0].dtype == torch.float32:
        assert rel(res[True][0], res[False][0]) < 1e-5 and rel(res[True][1], res[False][1]) < 1e-5, (
            list(kw), rel(res[True][0], res[False][0]), rel(res[True][1], res[False][1]))
        if not kw:   # both forms ran
            assert not all(map(torch.equal, res[True], res[False]))
    else:
        o_ref, s_ref = ref.kda_recurrent(*args, gg, bb, ss, **kw)
        err = {raw: (rel(res[raw][0], o_ref), rel(res[raw][1], s_ref)) for raw in res}
        assert err[True][0] < 1.1 * err[False][0] and err[True][1] < 1.1 * err[False][1], err
# OUT_QS="split" (the default; GDN with bf16 q): the output stage's q S0 from q's raw rows
# against S0 as hi + lo. Against the fp32 q e^G product (OUT_QS="", exact in the interpreter)
# under 1% of the bf16 outputs round differently; with S0 rounded to bf16 (lo dropped), 6%.
res = {}
tc.OUT_DOTS_16BIT = None             # OUT_QS applies where the output products are not bf16
for qs in ("split", ""):
    tc.OUT_QS = qs
    res[qs] = tc.gdn_chunked(qb, kb, vb, g[..., 0], beta, s0)[0]
tc.OUT_QS = "split"
tc.OUT_DOTS_16BIT = "bf16"
flips = (res["split"] != res[""]).float().mean().item()
assert flips < 0.01 and rel(res["split"], res[""]) < 1e-4, (flips, rel(res["split"], res[""]))
# GDN_OUT_RAW_Q: with the default bf16 output products, q S0 from q's raw rows and the row
# scales on the result: no further from the token loop than q e^G rounded first (contiguous and
# GQA token-strided heads); it ran (the outputs differ) and left the final state alone.
for qq, kk, vv in ((qb, kb, vb), (pb[..., :32].reshape(1, 137, 1, 32),
                                  pb[..., 32:64].reshape(1, 137, 1, 32),
                                  pb[..., 64:128].reshape(1, 137, 2, 32))):
    gd, bt = -torch.rand(vv.shape[:3]), torch.rand(vv.shape[:3])
    sd = torch.randn(1, vv.shape[2], 32, 32)
    o2 = ref.gdn_recurrent(qq.float(), kk.float(), vv.float(), gd, bt, sd)[0]
    res, default = {}, tc.GDN_OUT_RAW_Q
    for on in (True, False):
        tc.GDN_OUT_RAW_Q = on
        res[on] = tc.gdn_chunked(qq, kk, vv, gd, bt, sd)
    tc.GDN_OUT_RAW_Q = default
    assert not torch.equal(res[True][0], res[False][0]) and torch.equal(res[True][1], res[False][1])
    assert rel(res[True][0], o2) < 1.02 * rel(res[False][0], o2) < 5e-3, (
        rel(res[True][0], o2), rel(res[False][0], o2))
# OUT_DOTS_16BIT (the default "bf16"): 16-bit inputs get the output stage's bf16 products, the
# same as asking for dots="bf16"; fp32 inputs keep exact products.
for f, gg in ((tc.gdn_chunked, g[..., 0]), (tc.kda_chunked, g)):
    default = f(qb, kb, vb, gg, beta, s0)[0]
    assert torch.equal(default, f(qb, kb, vb, gg, beta, s0, dots="bf16")[0]), f.__name__
    tc.OUT_DOTS_16BIT = None
    assert not torch.equal(default, f(qb, kb, vb, gg, beta, s0)[0]), f.__name__
    o32 = f(q, k, v, gg, beta, s0)[0]
    tc.OUT_DOTS_16BIT = "bf16"
    assert torch.equal(o32, f(q, k, v, gg, beta, s0)[0]), f.__name__
# HANDOFF_16BIT (the default): where the output stage's products take bf16 operands, the chunk
# states, deltas and KDA's Aqk reach it stored in bf16 (the spy sees their dtypes): bit-equal
# outputs and states to the fp32 hand-off, whole-tile and key-blocked output kernels, bf16 and
# fp32 inputs; exact fp32 products keep the fp32 hand-off.
class Spy:
    def __init__(self, kernel):
        self.kernel, self.seen = kernel, []
    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.seen.append(tuple(t.dtype for t in args[3:6]))   # a (Aqk; GDN: u), hs, d
            return self.kernel[grid](*args, **kw)
        return launch
spies = {name: Spy(getattr(tc, name)) for name in ("_out_kernel", "_out_blocked_kernel")}
for name, spy in spies.items():
    setattr(tc, name, spy)
bf, f32 = torch.bfloat16, torch.float32
for f, gg, kda in ((tc.gdn_chunked, g[..., 0], False), (tc.kda_chunked, g, True)):
    for args, kw in (((qb, kb, vb), {}), ((qb, kb, vb), dict(block_k_out=16)),
                     ((q, k, v), dict(dots="bf16"))):
        res = {}
        for handoff in (False, True):
            tc.HANDOFF_16BIT = handoff
            res[handoff] = f(*args, gg, beta, s0, **kw)
            spy = spies["_out_blocked_kernel" if kw.get("block_k_out") else "_out_kernel"]
            want = bf if handoff else f32
            assert spy.seen.pop() == (want if kda else f32, want, want), (f.__name__, kw, handoff)
        assert all(torch.equal(x, y) for x, y in zip(res[False], res[True])), (f.__name__, kw)
    f(q, k, v, gg, beta, s0)   # fp32 inputs: exact products, fp32 hand-off
    assert spies["_out_kernel"].seen.pop() == (f32, f32, f32), f.__name__
for name, spy in spies.items():
    setattr(tc, name, spy.kernel)
try:
    tc.gdn_chunked(q, k, v, g[..., 0], beta, s0, dots="fp8")
    raise SystemExit("dots='fp8' was accepted")
except ValueError as err:
    assert "dots" in str(err)
print("ok")
"""


def test_chunks_varlen_gqa_split_blocks_interpreted():
    run_interpreted(SCRIPT, timeout=900)


def test_per_call_check_refuses_unsupported_shapes():
    import torch

    from hwinfer.kernels.triton.delta_chunk import delta_chunk_supported

    q = torch.randn(1, 2, 2, 64)
    g, beta = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)
    assert delta_chunk_supported(q, q, torch.randn(1, 2, 2, 64), g, beta) is None
    assert delta_chunk_supported(q, q, torch.randn(1, 2, 2, 96), g, beta) is not None   # not 2^n
    assert delta_chunk_supported(q, q, torch.randn(1, 2, 2, 256), g, beta) is not None  # > 128
    assert delta_chunk_supported(q.double(), q.double(), torch.randn(1, 2, 2, 64), g,
                                 beta) is not None


def test_token_strided_views_are_taken_without_copies():
    """q / k / v split from one packed projection (as the GDN and KDA layers pass them) reach the
    kernels as they are, with their token stride; other layouts are copied first. (The outputs
    of such views are checked against the token loop in the interpreted test above.)"""
    import torch

    from hwinfer.kernels.triton.delta_chunk import _token_rows

    T, H, D = 5, 2, 16
    mixed = torch.randn(1, T, 3 * H * D + D)          # q | k | v | D more channels per token
    q, k, v = (mixed[..., i * H * D:(i + 1) * H * D].reshape(1, T, H, D) for i in range(3))
    q2, k2, v2, qkr, vr = _token_rows(q, k, v)
    assert (q2.data_ptr(), k2.data_ptr(), v2.data_ptr()) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert qkr == vr == 3 * H + 1
    odd = torch.randn(1, T, H * D + 3)[..., :H * D].reshape(1, T, H, D)   # stride not a multiple of D
    heads_first = torch.randn(1, H, T, D).transpose(1, 2)                  # [1, T, H, D] view
    q3, k3, v3, qkr, vr = _token_rows(odd, odd, heads_first)
    assert q3.is_contiguous() and k3.is_contiguous() and v3.is_contiguous() and qkr == vr == H
    q4, k4, _, qkr, _ = _token_rows(q, k.contiguous(), v)                    # q, k strides differ
    assert q4.is_contiguous() and k4.is_contiguous() and qkr == H
