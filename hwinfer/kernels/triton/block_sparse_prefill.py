"""Triton MiniMax-M3 sparse prefill (contracts: :func:`hwinfer.ops.block_sparse.block_sparse_indexer`,
:func:`~hwinfer.ops.block_sparse.block_sparse_attention`), without a host read.

The torch impls walk the sequences on the host (``cu_seqlens.tolist()``) and size each chunk's
union of blocks there: six host syncs a MiniMax-M3 prefill step (s15b, ``find_syncs.py``). Here
every program finds its token's sequence in ``cu_seqlens_q`` on the device (a binary search), so
the grids depend on shapes only:

* ``_prefill_scores_kernel``, one program per (tile of 64 / H tokens, key block): the block's
  keys (the single index key head) against the tile's index queries of every head as the 64 rows
  of one fp32 dot (exact products: a selection must not flip on rounding; a tile across two
  sequences goes token by token), max over the keys at or before each token's position;
  -inf for blocks with no such key (past the token, past its sequence), +inf for the forced
  local blocks. Blocks are counted up to ``cdiv(S, block_size)`` (S = all keys of the call, a
  bound on any sequence's blocks). Then ``torch.topk`` and -inf -> -1, as the decode path does.
* ``_prefill_attn_kernel``, one program per (token, KV head): the G query heads of that KV head
  attend over the token's selected blocks with an online softmax (fp32 statistics; 16-bit
  operands on the tensor cores, fp32 ones with exact fp32 dots). A block listed twice is
  attended once (the contract's set semantics); block entries are trusted (no host check):
  one outside the sequence only meets masked keys.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, to_device
from hwinfer.kernels.triton.block_sparse import attend_block
from hwinfer.ops.block_sparse import check_attention_args, check_indexer_args


@triton.jit
def _token_seq(cu_q_ptr, cu_k_ptr, t, N, STEPS: tl.constexpr):
    """Token t's sequence: (its index, first query, first key, query count, key count), found by
    a binary search for the last i with cu_q[i] <= t (empty sequences before it are skipped)."""
    lo = t * 0
    hi = lo + N
    for _ in tl.static_range(STEPS):
        mid = (lo + hi) // 2
        below = tl.load(cu_q_ptr + mid) <= t
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    q0 = tl.load(cu_q_ptr + lo)
    k0 = tl.load(cu_k_ptr + lo)
    return lo, q0, k0, tl.load(cu_q_ptr + lo + 1) - q0, tl.load(cu_k_ptr + lo + 1) - k0


@triton.jit
def _rows_block_scores(q_ptr, k_ptr, out_ptr, tok, head, rmask, q0, k0, q_len, k_len, b, H, D,
                       BLOCK, NB, LOCAL, stride_qt, stride_qh, stride_k, BSP: tl.constexpr,
                       DP: tl.constexpr):
    """Scores of key block b for rows (token ``tok``, index head ``head``) of one sequence (q0,
    k0, q_len, k_len): one exact fp32 dot against the block's keys, the max over the keys at or
    before each row's position, -inf with none, +inf for its forced local blocks; stored at
    out[tok, head, b]."""
    p = k_len - q_len + (tok - q0)                   # each row's position in the sequence
    j = tl.arange(0, BSP)
    pos = b * BLOCK + j
    dd = tl.arange(0, DP)
    key = tl.load(k_ptr + (k0 + pos).to(tl.int64)[:, None] * stride_k + dd[None, :],
                  mask=((j < BLOCK) & (pos < k_len))[:, None] & (dd < D)[None, :],
                  other=0.0).to(tl.float32)
    qv = tl.load(q_ptr + tok.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
                 + dd[None, :], mask=rmask[:, None] & (dd < D)[None, :], other=0.0).to(tl.float32)
    s = tl.dot(qv, tl.trans(key), input_precision="ieee")             # [rows, BSP]
    visible = (j < BLOCK)[None, :] & (pos[None, :] <= p[:, None])
    best = tl.max(tl.where(visible, s, float("-inf")), axis=1)
    own = p // BLOCK          # forced: own - l for l < LOCAL, clamped at 0 (so 0 counts too)
    best = tl.where((b <= own) & (b >= own - LOCAL + 1), float("inf"), best)
    tl.store(out_ptr + (tok.to(tl.int64) * H + head) * NB + b, best, mask=rmask)


@triton.jit
def _prefill_scores_kernel(q_ptr, k_ptr, cu_q_ptr, cu_k_ptr, out_ptr, T, N, H, D, BLOCK, NB, LOCAL,
                           stride_qt, stride_qh, stride_k, STEPS: tl.constexpr,
                           BT: tl.constexpr, HP: tl.constexpr, BSP: tl.constexpr,
                           DP: tl.constexpr):
    t_first = tl.program_id(0) * BT
    b = tl.program_id(1)
    t_last = tl.minimum(t_first + BT, T) - 1
    seq, q0, k0, q_len, k_len = _token_seq(cu_q_ptr, cu_k_ptr, t_first, N, STEPS)
    seq_last, _, _, _, _ = _token_seq(cu_q_ptr, cu_k_ptr, t_last, N, STEPS)
    if seq == seq_last:
        # The tile's BT tokens x HP heads as the rows of one product over the shared key block.
        r = tl.arange(0, BT * HP)
        tok = t_first + r // HP
        head = r % HP
        rmask = (tok <= t_last) & (head < H)
        if b * BLOCK <= k_len - q_len + (t_last - q0):
            _rows_block_scores(q_ptr, k_ptr, out_ptr, tok, head, rmask, q0, k0, q_len, k_len, b,
                               H, D, BLOCK, NB, LOCAL, stride_qt, stride_qh, stride_k, BSP, DP)
        else:   # a block after every token of the tile (causal: about half of them): no loads
            tl.store(out_ptr + (tok.to(tl.int64) * H + head) * NB + b,
                     tl.full([BT * HP], float("-inf"), tl.float32), mask=rmask)
    else:
        # A tile across sequences (at most N - 1 of them): token by token, heads padded to 16.
        hh = tl.arange(0, 16)
        for i in range(0, BT):
            t = t_first + i
            if t <= t_last:
                _, q0, k0, q_len, k_len = _token_seq(cu_q_ptr, cu_k_ptr, t, N, STEPS)
                _rows_block_scores(q_ptr, k_ptr, out_ptr, t + hh * 0, hh, hh < H, q0, k0, q_len,
                                   k_len, b, H, D, BLOCK, NB, LOCAL, stride_qt, stride_qh,
                                   stride_k, BSP, DP)


@triton.jit
def _prefill_attn_kernel(q_ptr, k_ptr, v_ptr, sel_ptr, cu_q_ptr, cu_k_ptr, o_ptr, N, HKV, G, D,
                         BLOCK, NSEL, scale, stride_qt, stride_qh, stride_ks, stride_kh,
                         stride_st, stride_sh, stride_ot, stride_oh, STEPS: tl.constexpr,
                         GP: tl.constexpr, DP: tl.constexpr, BSP: tl.constexpr,
                         NSP: tl.constexpr, EXACT: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    _, q0, k0, q_len, k_len = _token_seq(cu_q_ptr, cu_k_ptr, t, N, STEPS)
    p = k_len - q_len + (t - q0)
    gg = tl.arange(0, GP)
    dd = tl.arange(0, DP)
    j = tl.arange(0, BSP)
    dmask = dd < D
    qmask = (gg < G)[:, None] & dmask[None, :]
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + (h * G + gg)[:, None] * stride_qh + dd[None, :],
                mask=qmask, other=0.0)
    sel_row = sel_ptr + t.to(tl.int64) * stride_st + h * stride_sh
    ii = tl.arange(0, NSP)
    row = tl.load(sel_row + ii, mask=ii < NSEL, other=-1)
    m = tl.full([GP], -1.0e30, dtype=tl.float32)    # finite: an all-masked block leaves p = 0
    l = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, DP], dtype=tl.float32)
    for i in range(0, NSEL):
        blk = tl.load(sel_row + i)
        repeated = tl.sum(((row == blk) & (ii < i)).to(tl.int32), axis=0) > 0
        if (blk >= 0) & (blk * BLOCK <= p) & (repeated == 0):
            pos = blk * BLOCK + j
            pmask = (j < BLOCK) & (pos <= p) & (pos < k_len)
            kv = (k0 + pos).to(tl.int64)[:, None] * stride_ks + h * stride_kh + dd[None, :]
            kvmask = pmask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + kv, mask=kvmask, other=0.0)
            v = tl.load(v_ptr + kv, mask=kvmask, other=0.0)
            m, l, acc = attend_block(q, k, v, pmask, scale, m, l, acc, EXACT)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]          # a row with no usable key gives 0
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + (h * G + gg)[:, None] * stride_oh + dd[None, :],
             out.to(o_ptr.dtype.element_ty), mask=qmask)


def _steps(n: int) -> int:
    """Binary-search steps over n sequences (hi - lo halves from n down to 1)."""
    return max(1, (max(n, 1) - 1).bit_length())


def _check_cu(op: str, cu_q: torch.Tensor, cu_k: torch.Tensor, device: torch.device) -> int:
    """Shape checks of the two cu_seqlens (their contents are trusted: reading them is a sync);
    returns N."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if cu.dim() != 1 or cu.numel() < 2 or cu.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{op} (triton): {name} must be a 1-D int32 tensor [N+1], got "
                             f"{cu.dtype} {tuple(cu.shape)}")
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"{op} (triton): cu_seqlens_q and cu_seqlens_k describe different "
                         "sequence counts")
    return cu_q.numel() - 1


def block_sparse_indexer(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, *, block_size: int, topk_blocks: int,
                         local_blocks: int = 1) -> torch.Tensor:
    """q [T, H, D], k [S, D] -> [T, H, topk_blocks] int32 (see the module docstring)."""
    check_indexer_args(q, k, topk_blocks, local_blocks, block_size)
    n = _check_cu("block_sparse_indexer", cu_seqlens_q, cu_seqlens_k, q.device)
    t_len, heads, dim = q.shape
    out = torch.full((t_len, heads, topk_blocks), -1, dtype=torch.int32, device=q.device)
    nb = triton.cdiv(k.shape[0], block_size)
    if t_len == 0 or nb == 0:
        return out
    q, k = q.contiguous(), k.contiguous()
    scores = torch.empty(t_len, heads, nb, dtype=torch.float32, device=q.device)
    hp = triton.next_power_of_2(heads)
    bt = max(1, 64 // hp)            # 64 rows a product (M3: 16 tokens x 4 heads)
    _prefill_scores_kernel[(triton.cdiv(t_len, bt), nb)](
        q, k, to_device(cu_seqlens_q, q.device), to_device(cu_seqlens_k, q.device), scores, t_len, n, heads, dim,
        block_size, nb, local_blocks, q.stride(0), q.stride(1), k.stride(0), STEPS=_steps(n),
        BT=bt, HP=hp, BSP=max(16, triton.next_power_of_2(block_size)),
        DP=max(16, triton.next_power_of_2(dim)), num_warps=8)
    top, sel = scores.topk(min(topk_blocks, nb), dim=-1)
    out[..., : sel.shape[-1]] = sel.masked_fill(top == float("-inf"), -1).to(torch.int32)
    return out


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_indices: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, *, block_size: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D], k / v [S, Hkv, D], block_indices [T, Hkv, n_sel] -> [T, Hq, D] in q.dtype
    (see the module docstring)."""
    hq, hkv = check_attention_args(q, k, v, block_indices, block_size)
    n = _check_cu("block_sparse_attention", cu_seqlens_q, cu_seqlens_k, q.device)
    out = torch.empty_like(q)
    t_len, _, d = q.shape
    if t_len == 0:
        return out
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    sel = block_indices.to(torch.int32).contiguous()
    n_sel = sel.shape[-1]
    g = hq // hkv
    exact = q.dtype == torch.float32 or INTERPRET   # the interpreter multiplies 16-bit floats wrongly
    _prefill_attn_kernel[(t_len, hkv)](
        q, k, v, sel, to_device(cu_seqlens_q, q.device), to_device(cu_seqlens_k, q.device), out, n, hkv, g, d,
        block_size, n_sel, float(scale), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        sel.stride(0), sel.stride(1), out.stride(0), out.stride(1), STEPS=_steps(n),
        GP=max(16, triton.next_power_of_2(g)), DP=max(16, triton.next_power_of_2(d)),
        BSP=max(16, triton.next_power_of_2(block_size)),
        NSP=max(2, triton.next_power_of_2(max(n_sel, 1))), EXACT=exact,
        num_warps=4 if d <= 64 else 8)
    return out


def block_sparse_prefill_supported(q: torch.Tensor, *args, **_: object) -> str | None:
    """Per-call check of both prefill ops: one program holds a block of keys and a token's
    query heads of one KV head (head dims up to 256)."""
    if q.dim() != 3 or q.shape[-1] > 256:
        return f"q must be [T, H, D] with D <= 256, got {tuple(q.shape)}"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    # MiniMax-M3: 4 index heads and KV heads, D = Di = 128, blocks of 128, G = 16, 16 blocks.
    dtype = "bf16"
    scores = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
              "out_ptr": "*fp32", **{a: "i32" for a in ("T", "N", "H", "D", "BLOCK", "NB", "LOCAL",
                                                      "stride_qt", "stride_qh", "stride_k")},
              **{a: "constexpr" for a in ("STEPS", "BT", "HP", "BSP", "DP")}}
    attn = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "sel_ptr": "*i32",
            "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "o_ptr": f"*{dtype}",
            **{a: "i32" for a in ("N", "HKV", "G", "D", "BLOCK", "NSEL")}, "scale": "fp32",
            **{a: "i32" for a in ("stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_st",
                                  "stride_sh", "stride_ot", "stride_oh")},
            **{a: "constexpr" for a in ("STEPS", "GP", "DP", "BSP", "NSP", "EXACT")}}
    return [AotSpec(f"block_sparse_prefill_scores[{dtype},m3]", _prefill_scores_kernel, scores,
                    {"STEPS": 3, "BT": 16, "HP": 4, "BSP": 128, "DP": 128}, {"num_warps": 8}),
            AotSpec(f"block_sparse_prefill_attn[{dtype},m3]", _prefill_attn_kernel, attn,
                    {"STEPS": 3, "GP": 16, "DP": 128, "BSP": 128, "NSP": 16, "EXACT": False},
                    {"num_warps": 8})]


AOT_SPECS = _aot_specs()
