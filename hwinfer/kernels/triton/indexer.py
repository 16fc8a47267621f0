"""Triton lightning indexer (contract: :func:`hwinfer.ops.indexer.lightning_indexer`).

Two kernels:

* ``_index_scores_kernel``, grid (key blocks, tokens): one program scores BLOCK_N visible keys of
  one query token for all index heads at once: logits [Hi, BN] = q[t] [Hi, Di] x k^T (one MMA,
  each key row loaded once for every head), then ``sum_h w[t, h] * ReLU(logit) * scale`` ->
  [BN] fp32, written to a scratch row (-inf past the token's visible range).
* ``_index_topk_kernel``, grid (tokens / TB,): streams the token's scores in blocks of KP (the top-k
  width rounded up to a power of two) and keeps a running top-KP: each score is packed with its
  position into one int64 (order-preserving integer image of the fp32 score in the high word,
  position in the low word), a block is sorted ascending and merged into the descending buffer
  with an elementwise max (the classic bitonic top-k step: the max of a descending and an
  ascending sequence holds the KP largest of both), then the buffer is re-sorted descending.
  Blocks whose best score cannot enter the buffer are skipped. Output: absolute rows in
  descending score order, -1 past min(topk, visible rows); ties break towards the higher row.

The scratch is [tokens, L] fp32 with L the widest visible range, taken from the key ranges with
one host sync (pass ``max_len`` to avoid it, e.g. under CUDA graphs); tokens are processed in
slices that keep the scratch under 256 MB.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _index_scores_kernel(q_ptr, k_ptr, kr_ptr, w_ptr, ks_ptr, ke_ptr, s_ptr, HI, DI, L, scale,
                         stride_qt, stride_qh, stride_k, stride_wt, stride_st,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                         LOWP: tl.constexpr, HAS_ROWS: tl.constexpr):
    nb = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    s0 = tl.load(ks_ptr + t).to(tl.int64)
    n_vis = tl.load(ke_ptr + t).to(tl.int64) - s0
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    if nb * BLOCK_N < n_vis:
        heads = tl.arange(0, BLOCK_H)
        cols = tl.arange(0, BLOCK_D)
        hm = heads < HI
        cm = cols < DI
        ok = offs_n < n_vis
        q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + cols[None, :],
                    mask=hm[:, None] & cm[None, :], other=0.0).to(tl.float32)
        if HAS_ROWS:  # key j lives in row kr[j] of k (a paged store read in place)
            rows = tl.load(kr_ptr + s0 + offs_n, mask=ok, other=0).to(tl.int64)
        else:
            rows = s0 + offs_n
        kk = tl.load(k_ptr + rows[:, None] * stride_k + cols[None, :],
                     mask=ok[:, None] & cm[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + t * stride_wt + heads, mask=hm, other=0.0).to(tl.float32)
        if LOWP:  # bf16 / fp16 MMA with fp32 accumulation (q and k are exact in the input type)
            q = q.to(q_ptr.dtype.element_ty)
            kk = kk.to(k_ptr.dtype.element_ty)
        logits = tl.dot(q, tl.trans(kk), input_precision="ieee")          # [BH, BN]
        score = tl.sum(tl.maximum(logits, 0.0) * w[:, None], axis=0) * scale
        score = tl.where(ok, score, float("-inf"))
    else:
        score = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    tl.store(s_ptr + t * stride_st + offs_n, score, mask=offs_n < L)


@triton.jit
def _pack(score, pos):
    """int64 whose signed order is (score, pos)'s order: the fp32 bits with the low 31 bits
    flipped for negatives (monotone as int32), shifted up, the position below."""
    bits = score.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (key.to(tl.int64) << 32) | pos.to(tl.int64)


@triton.jit
def _rank_merge(a, b, KP: tl.constexpr):
    """Top KP of the rows of a and b [TB, KP] in descending order, by rank counting (ties
    broken by position, a before b, so the ranks are a permutation)."""
    i = tl.arange(0, KP)
    before = (i[None, :] < i[:, None])[None, :, :]                           # [1, i, j]: j < i
    ai, aj, bi, bj = a[:, :, None], a[:, None, :], b[:, :, None], b[:, None, :]
    rank_a = tl.sum(((aj > ai) | ((aj == ai) & before)).to(tl.int32), axis=2) + \
        tl.sum((bj > ai).to(tl.int32), axis=2)
    rank_b = tl.sum((aj >= bi).to(tl.int32), axis=2) + \
        tl.sum(((bj > bi) | ((bj == bi) & before)).to(tl.int32), axis=2)
    r = i[None, :, None]
    return tl.sum(tl.where(rank_a[:, None, :] == r, a[:, None, :], 0), axis=2) + \
        tl.sum(tl.where(rank_b[:, None, :] == r, b[:, None, :], 0), axis=2)


@triton.jit
def _index_topk_kernel(s_ptr, ks_ptr, ke_ptr, out_ptr, T, TOPK, stride_st, stride_ot,
                       KP: tl.constexpr, TB: tl.constexpr, RANK: tl.constexpr):
    """TB tokens per program (1 on a GPU; more under the interpreter, whose cost is per op).
    RANK: merge by counting ranks (O(KP^2), the interpreter: its tl.sort is very slow)."""
    t = tl.program_id(0) * TB + tl.arange(0, TB)
    tm = t < T
    s0 = tl.load(ks_ptr + t, mask=tm, other=0)
    n_vis = tl.load(ke_ptr + t, mask=tm, other=0) - s0
    offs = tl.arange(0, KP)
    row_s = s_ptr + t.to(tl.int64)[:, None] * stride_st
    # start from -inf keys: every visible (finite) score ranks above them
    buf = _pack(tl.full((TB, KP), float("-inf"), tl.float32), offs[None, :])
    for b0 in range(0, tl.max(n_vis, axis=0), KP):
        pos = b0 + offs
        sc = tl.load(row_s + pos[None, :], mask=pos[None, :] < n_vis[:, None], other=float("-inf"))
        blk = _pack(sc, pos[None, :])
        need = (tl.max(blk, axis=1) > tl.min(buf, axis=1)).to(tl.int32)
        if tl.max(need, axis=0) > 0:  # a row where the block can enter (merging others is a no-op)
            if RANK:
                buf = _rank_merge(buf, blk, KP)
            else:
                buf = tl.sort(tl.maximum(buf, tl.sort(blk)), descending=True)
    rows = (buf & 0xFFFFFFFF).to(tl.int32) + s0[:, None]
    keep = offs[None, :] < tl.minimum(n_vis, TOPK)[:, None]
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_ot + offs[None, :], tl.where(keep, rows, -1),
             mask=tm[:, None] & (offs < TOPK)[None, :])


def lightning_indexer(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                      k_end: torch.Tensor, *, topk: int, scale: float, max_len: int | None = None,
                      k_rows: torch.Tensor | None = None, block_n: int | None = None,
                      num_warps: int | None = None, topk_warps: int | None = None) -> torch.Tensor:
    """Triton lightning indexer: q [T, Hi, Di], k [N, Di], weights [T, Hi], k_start/k_end [T]
    -> [T, topk] int32 (absolute rows of k, or of k_rows when given; descending score, -1 padded).

    max_len: an upper bound on k_end - k_start (None: read from the tensors, one host sync).
    k_rows: [M] rows of k holding the keys (read in place: the scoring program loads its block's
    row ids, then those rows).
    Tuning: block_n keys per scoring program, num_warps (scoring), topk_warps (selection).
    """
    t_len, hi, di = q.shape
    out = torch.full((t_len, topk), -1, dtype=torch.int32, device=q.device)
    if t_len == 0:
        return out
    ks, ke = k_start.to(torch.int32).contiguous(), k_end.to(torch.int32).contiguous()
    width = int((ke - ks).max()) if max_len is None else int(max_len)
    if width <= 0:
        return out
    interp = q.device.type == "cpu"
    q3 = q if q.stride(-1) == 1 else q.contiguous()
    k2 = k if k.stride(-1) == 1 else k.contiguous()
    w = weights if weights.stride(-1) == 1 else weights.contiguous()
    kr = k_rows.to(torch.int32).contiguous() if k_rows is not None else ks  # ks: an unread stand-in
    bn = block_n or (128 if interp else 64)  # the interpreter pays per program: few, wide ones
    tb = 32 if interp else 1
    bh, bd = max(16, triton.next_power_of_2(hi)), max(16, triton.next_power_of_2(di))
    kp = max(16, triton.next_power_of_2(topk))
    lowp = q.dtype in (torch.bfloat16, torch.float16) and not interp and k.dtype == q.dtype
    rows_per_slice = max(1, min(t_len, 65535, (256 << 20) // (4 * width)))
    scores = torch.empty((rows_per_slice, width), dtype=torch.float32, device=q.device)
    for a in range(0, t_len, rows_per_slice):
        z = min(t_len, a + rows_per_slice)
        _index_scores_kernel[(triton.cdiv(width, bn), z - a)](
            q3[a:z], k2, kr, w[a:z], ks[a:z], ke[a:z], scores, hi, di, width, scale,
            q3.stride(0), q3.stride(1), k2.stride(0), w.stride(0), scores.stride(0),
            BLOCK_H=bh, BLOCK_D=bd, BLOCK_N=bn, LOWP=lowp, HAS_ROWS=k_rows is not None,
            num_warps=num_warps or (4 if bh * bn <= 4096 else 8))
        _index_topk_kernel[(triton.cdiv(z - a, tb),)](
            scores, ks[a:z], ke[a:z], out[a:z], z - a, topk, scores.stride(0), out.stride(0),
            KP=kp, TB=tb, RANK=interp, num_warps=topk_warps or (4 if kp <= 512 else 8))
    return out


def lightning_indexer_supported(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor,
                                k_start: torch.Tensor, k_end: torch.Tensor, *, topk: int,
                                k_rows: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check: top-k up to 2048 (one program's sort buffer), Hi <= 128, Di <= 256."""
    if q.dim() != 3 or k.dim() != 2 or weights.dim() != 2:
        return "expects q [T, Hi, Di], k [N, Di], weights [T, Hi]"
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or k.dtype != q.dtype:
        return f"dtypes q {q.dtype} / k {k.dtype} not supported"
    if not 1 <= topk <= 2048:
        return f"topk={topk} outside 1..2048"
    if q.shape[1] > 128 or q.shape[2] > 256:
        return f"Hi={q.shape[1]} > 128 or Di={q.shape[2]} > 256"
    if k.shape[0] >= 2 ** 31:
        return "more than 2**31 key rows"
    if k_rows is not None and (k_rows.dim() != 1 or k_rows.is_floating_point()):
        return "k_rows must be a 1-D integer tensor"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dt, hi, rows in (("bf16", 64, False), ("bf16", 64, True), ("bf16", 32, True), ("fp32", 64, False)):
        sig = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "kr_ptr": "*i32", "w_ptr": f"*{dt}", "ks_ptr": "*i32",
               "ke_ptr": "*i32", "s_ptr": "*fp32", "HI": "i32", "DI": "i32", "L": "i32",
               "scale": "fp32", "stride_qt": "i32", "stride_qh": "i32", "stride_k": "i32",
               "stride_wt": "i32", "stride_st": "i32", "BLOCK_H": "constexpr",
               "BLOCK_D": "constexpr", "BLOCK_N": "constexpr", "LOWP": "constexpr",
               "HAS_ROWS": "constexpr"}
        specs.append(AotSpec(f"index_scores[{dt},h{hi}{',rows' if rows else ''}]", _index_scores_kernel, sig,
                             {"BLOCK_H": hi, "BLOCK_D": 128, "BLOCK_N": 64, "LOWP": dt != "fp32",
                              "HAS_ROWS": rows},
                             {"num_warps": 4 if hi * 64 <= 4096 else 8}))
    for kp in (512, 2048):
        sig = {"s_ptr": "*fp32", "ks_ptr": "*i32", "ke_ptr": "*i32", "out_ptr": "*i32", "T": "i32",
               "TOPK": "i32", "stride_st": "i32", "stride_ot": "i32", "KP": "constexpr",
               "TB": "constexpr", "RANK": "constexpr"}
        specs.append(AotSpec(f"index_topk[{kp}]", _index_topk_kernel, sig, {"KP": kp, "TB": 1, "RANK": False},
                             {"num_warps": 4 if kp <= 512 else 8}))
    return specs


AOT_SPECS = _aot_specs()
