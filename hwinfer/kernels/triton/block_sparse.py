"""Triton MiniMax-M3 sparse decode (contract: :func:`hwinfer.ops.block_sparse.block_sparse_decode`).

Two kernels and a top-k, no host read (CUDA-graph safe):

1. ``_block_scores_kernel``, one program per (request, key block): the block's rows of the
   index-key store, gathered through ``rows``, scored against the request's index queries of
   every KV head (one fp32 dot, exact products: a selection must not flip on rounding), max over
   the block's visible keys -> block scores [N, Hkv, W / block_size]; rows past the request's
   length are masked (their loads issue no memory traffic), so the work follows the request's
   length, not W.
2. torch: the query's own ``local_blocks`` forced to +inf, ``topk``; blocks without a visible
   key become -1 (fixed shapes, on the device).
3. ``_sparse_attn_kernel``, one program per (request, KV head): the G query heads of that KV
   head attend over the selected blocks' keys with an online softmax (fp32 statistics; 16-bit
   operands go to the tensor cores, fp32 ones use exact fp32 dots).

The torch impl scores all W rows of every request with one einsum; here each block's keys are
read once and blocks past the request's end cost a masked program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET
from hwinfer.ops.block_sparse import check_decode_args


@triton.jit
def _block_scores_kernel(iq_ptr, ik_ptr, rows_ptr, out_ptr, W, NB, HKV, DI, BLOCK, stride_iqn,
                         stride_iqh, stride_ikr, stride_rn, BSP: tl.constexpr, HP: tl.constexpr,
                         DIP: tl.constexpr):
    n = tl.program_id(0)
    b = tl.program_id(1)
    j = tl.arange(0, BSP)
    pos = b * BLOCK + j
    inb = (j < BLOCK) & (pos < W)
    r = tl.load(rows_ptr + n.to(tl.int64) * stride_rn + pos, mask=inb, other=-1).to(tl.int64)
    valid = r >= 0
    dd = tl.arange(0, DIP)
    hh = tl.arange(0, HP)
    ik = tl.load(ik_ptr + r[:, None] * stride_ikr + dd[None, :],
                 mask=valid[:, None] & (dd < DI)[None, :], other=0.0).to(tl.float32)
    iq = tl.load(iq_ptr + n.to(tl.int64) * stride_iqn + hh[:, None] * stride_iqh + dd[None, :],
                 mask=(hh < HKV)[:, None] & (dd < DI)[None, :], other=0.0).to(tl.float32)
    s = tl.dot(iq, tl.trans(ik), input_precision="ieee")            # [HP, BSP]
    s = tl.where(valid[None, :], s, float("-inf"))
    tl.store(out_ptr + (n * HKV + hh) * NB + b, tl.max(s, axis=1), mask=hh < HKV)


@triton.jit
def attend_block(q, k, v, kmask, scale, m, l, acc, EXACT: tl.constexpr):
    """One online-softmax step of queries q [GP, DP] over a block of keys / values [BSP, DP]
    (``kmask`` [BSP]: the usable keys): the updated (row max m, row sum l, output acc). 16-bit
    operands go to the tensor cores, fp32 ones (EXACT) through exact fp32 dots."""
    if EXACT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q.to(k.dtype), tl.trans(k))
    s = tl.where(kmask[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    l = l * alpha + tl.sum(p, axis=1)
    if EXACT:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _sparse_attn_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, sel_ptr, len_ptr, o_ptr, HKV, G, D, BLOCK,
                        TOPK, scale, stride_qn, stride_qh, stride_kr, stride_kh, stride_rn,
                        stride_on, stride_oh, GP: tl.constexpr, DP: tl.constexpr,
                        BSP: tl.constexpr, EXACT: tl.constexpr):
    n = tl.program_id(0)
    h = tl.program_id(1)
    gg = tl.arange(0, GP)
    dd = tl.arange(0, DP)
    j = tl.arange(0, BSP)
    dmask = dd < D
    qmask = (gg < G)[:, None] & dmask[None, :]
    q = tl.load(q_ptr + n.to(tl.int64) * stride_qn + (h * G + gg)[:, None] * stride_qh + dd[None, :],
                mask=qmask, other=0.0)
    length = tl.load(len_ptr + n)
    m = tl.full([GP], -1.0e30, dtype=tl.float32)    # finite: an all-masked block leaves p = 0
    l = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, DP], dtype=tl.float32)
    for t in range(0, TOPK):
        blk = tl.load(sel_ptr + (n * HKV + h) * TOPK + t)
        if blk >= 0:
            pos = blk * BLOCK + j
            pmask = (j < BLOCK) & (pos < length)
            r = tl.load(rows_ptr + n.to(tl.int64) * stride_rn + pos, mask=pmask, other=0).to(tl.int64)
            kv = r[:, None] * stride_kr + h * stride_kh + dd[None, :]
            kvmask = pmask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + kv, mask=kvmask, other=0.0)
            v = tl.load(v_ptr + kv, mask=kvmask, other=0.0)
            m, l, acc = attend_block(q, k, v, pmask, scale, m, l, acc, EXACT)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(o_ptr + n.to(tl.int64) * stride_on + (h * G + gg)[:, None] * stride_oh + dd[None, :],
             out.to(o_ptr.dtype.element_ty), mask=qmask)


def block_sparse_decode(q: torch.Tensor, index_q: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, index_k_cache: torch.Tensor, rows: torch.Tensor, *,
                        block_size: int, topk_blocks: int, local_blocks: int = 1,
                        scale: float) -> torch.Tensor:
    """q [N, Hq, D], index_q [N, Hkv, Di], k/v caches [R, Hkv, D], index_k_cache [R, Di], rows
    [N, W] -> [N, Hq, D] in q.dtype (see the module docstring)."""
    check_decode_args(q, index_q, k_cache, v_cache, index_k_cache, rows, block_size,
                      topk_blocks, local_blocks)
    reason = block_sparse_decode_supported(q, index_q, k_cache, v_cache, index_k_cache, rows)
    if reason is not None:
        raise ValueError(f"block_sparse_decode (triton): {reason}")
    n, width = rows.shape
    hq, hkv, d = q.shape[1], k_cache.shape[1], q.shape[2]
    out = torch.empty_like(q)
    if n == 0:
        return out
    rows = rows.contiguous()
    q, index_q = q.contiguous(), index_q.contiguous()
    k_cache, v_cache, index_k_cache = (t.contiguous() for t in (k_cache, v_cache, index_k_cache))
    n_blocks = triton.cdiv(width, block_size)
    bsp = max(16, triton.next_power_of_2(block_size))
    scores = torch.empty(n, hkv, n_blocks, dtype=torch.float32, device=q.device)
    _block_scores_kernel[(n, n_blocks)](
        index_q, index_k_cache, rows, scores, width, n_blocks, hkv, index_q.shape[2], block_size,
        index_q.stride(0), index_q.stride(1), index_k_cache.stride(0), rows.stride(0),
        BSP=bsp, HP=max(16, triton.next_power_of_2(hkv)),
        DIP=max(16, triton.next_power_of_2(index_q.shape[2])), num_warps=4)
    length = (rows >= 0).sum(dim=1).to(torch.int32)                # [N], on the device
    own = (length.long() - 1) // block_size
    for back in range(local_blocks):
        scores.scatter_(-1, (own - back).clamp(min=0)[:, None, None].expand(-1, hkv, 1),
                        float("inf"))
    top, sel = scores.topk(min(topk_blocks, n_blocks), dim=-1)      # distinct blocks
    sel = sel.masked_fill(top == float("-inf"), -1).to(torch.int32).contiguous()
    g = hq // hkv
    exact = q.dtype == torch.float32 or INTERPRET   # the interpreter multiplies 16-bit floats wrongly
    _sparse_attn_kernel[(n, hkv)](
        q, k_cache, v_cache, rows, sel, length, out, hkv, g, d, block_size, sel.shape[-1],
        float(scale), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        rows.stride(0), out.stride(0), out.stride(1), GP=max(16, triton.next_power_of_2(g)),
        DP=max(16, triton.next_power_of_2(d)), BSP=bsp, EXACT=exact,
        num_warps=4 if d <= 64 else 8)
    return out


def block_sparse_decode_supported(q: torch.Tensor, index_q: torch.Tensor, k_cache: torch.Tensor,
                                  v_cache: torch.Tensor, index_k_cache: torch.Tensor,
                                  rows: torch.Tensor, **_: object) -> str | None:
    """Per-call check: one program holds a block's keys and the G query heads of a KV head."""
    d, di = q.shape[-1], index_q.shape[-1]
    if d > 256 or di > 256:
        return f"head dims D={d}, Di={di}: at most 256"
    if k_cache.dtype != v_cache.dtype:
        return f"k_cache {k_cache.dtype} and v_cache {v_cache.dtype} differ"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("bf16",):
        # MiniMax-M3: Hkv 4, Di 128, block 128; G 16, D 128.
        sig = {"iq_ptr": f"*{dtype}", "ik_ptr": f"*{dtype}", "rows_ptr": "*i32", "out_ptr": "*fp32",
               "W": "i32", "NB": "i32", "HKV": "i32", "DI": "i32", "BLOCK": "i32",
               "stride_iqn": "i32", "stride_iqh": "i32", "stride_ikr": "i32", "stride_rn": "i32",
               "BSP": "constexpr", "HP": "constexpr", "DIP": "constexpr"}
        specs.append(AotSpec(f"block_sparse_scores[{dtype},m3]", _block_scores_kernel, sig,
                             {"BSP": 128, "HP": 16, "DIP": 128}, {"num_warps": 4}))
        sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "rows_ptr": "*i32",
               "sel_ptr": "*i32", "len_ptr": "*i32", "o_ptr": f"*{dtype}", "HKV": "i32", "G": "i32",
               "D": "i32", "BLOCK": "i32", "TOPK": "i32", "scale": "fp32", "stride_qn": "i32",
               "stride_qh": "i32", "stride_kr": "i32", "stride_kh": "i32", "stride_rn": "i32",
               "stride_on": "i32", "stride_oh": "i32", "GP": "constexpr", "DP": "constexpr",
               "BSP": "constexpr", "EXACT": "constexpr"}
        specs.append(AotSpec(f"block_sparse_attn[{dtype},m3]", _sparse_attn_kernel, sig,
                             {"GP": 16, "DP": 128, "BSP": 128, "EXACT": False}, {"num_warps": 8}))
    return specs


AOT_SPECS = _aot_specs()
