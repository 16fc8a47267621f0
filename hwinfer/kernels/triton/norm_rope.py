"""Triton fused per-head RMSNorm + RoPE (contracts: :func:`hwinfer.ops.norm.rms_norm_rope` and
:func:`~hwinfer.ops.norm.rms_norm_rope_kv_store`, which also writes K and V into their cache rows:
q, k and v rows in one launch, a grid axis choosing each program's role).

One program normalises BLOCK_R (token, head) rows of x [T, H, D] and rotates their rotary slice
in the same pass: one read and one write of q / k instead of two of each. The rotation partner
of channel c (``c ^ 1`` relative to ``start`` when interleaved, ``c +- R/2`` for rotate-half) is
a second, cache-hot load of the same row rather than a register shuffle, which keeps one code
path for both layouts and any ``start``. fp32 from the load to the single final cast (the
reference rounds to x.dtype between norm and rope: at most one ulp apart).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# Warps of the decode kernel that also writes K/V (three programs at batch 1): a tuning constant.
KV_STORE_WARPS = 4


@triton.jit
def _normed_rows(src, w_ptr, cos_ptr, sin_ptr, t, rmask, D, eps, offset, start, HALF,
                 HAS_WEIGHT: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK: tl.constexpr):
    """RMSNorm + RoPE of the rows at ``src`` ([BLOCK_R] row pointers, token ``t`` each) in fp32:
    ([BLOCK_R, BLOCK] result, its load mask, the channel offsets)."""
    cols = tl.arange(0, BLOCK)
    cmask = cols < D
    m2 = rmask[:, None] & cmask[None, :]
    x = tl.load(src[:, None] + cols[None, :], mask=m2, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    # Rotary slice: pair index i, partner channel and sign (a' = a c - b s, b' = b c + a s).
    rel = cols - start
    in_rot = (rel >= 0) & (rel < 2 * HALF)
    if INTERLEAVED:
        i = rel // 2
        is_b = (rel % 2) == 1
        partner = tl.where(is_b, cols - 1, cols + 1)
    else:
        is_b = rel >= HALF
        i = tl.where(is_b, rel - HALF, rel)
        partner = tl.where(is_b, cols - HALF, cols + HALF)
    partner = tl.where(in_rot, partner, cols)
    xp = tl.load(src[:, None] + partner[None, :], mask=m2 & in_rot[None, :],
                 other=0.0).to(tl.float32)
    y = x * inv[:, None]
    yp = xp * inv[:, None]
    if HAS_WEIGHT:
        y = y * (tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32) + offset)[None, :]
        yp = yp * (tl.load(w_ptr + partner, mask=cmask & in_rot, other=0.0).to(tl.float32)
                   + offset)[None, :]
    tab = t[:, None] * HALF + i[None, :]
    rm = rmask[:, None] & in_rot[None, :]
    c = tl.load(cos_ptr + tab, mask=rm, other=1.0)
    s = tl.load(sin_ptr + tab, mask=rm, other=0.0)
    s = tl.where(is_b[None, :], s, -s)
    return tl.where(in_rot[None, :], y * c + yp * s, y), m2, cols


@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, H, D, stride_t, stride_h,
                      eps, offset, start, HALF,
                      HAS_WEIGHT: tl.constexpr, INTERLEAVED: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    t = rows // H
    src = x_ptr + t.to(tl.int64) * stride_t + (rows % H).to(tl.int64) * stride_h
    out, m2, cols = _normed_rows(src, w_ptr, cos_ptr, sin_ptr, t, rmask, D, eps, offset, start,
                                 HALF, HAS_WEIGHT, INTERLEAVED, BLOCK)
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :],
             out.to(y_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _norm_rope_kv_store_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr,
                               kc_ptr, vc_ptr, rows_ptr, T, HQ, HKV, D, DV,
                               sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, skc_r, skc_h, svc_r, svc_h,
                               eps, offset, start, HALF, HAS_WEIGHT: tl.constexpr,
                               INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr,
                               BLOCK: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr):
    """Axis 1 picks the role of the program's rows: 0 q heads (normed, roped, to qo), 1 k heads
    (normed, roped, to their cache rows), 2 v heads (copied to their cache rows)."""
    pdl_enter(PDL)
    role = tl.program_id(1)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    if role == 0:
        rmask = r < T * HQ
        t, h = r // HQ, r % HQ
        src = q_ptr + t.to(tl.int64) * sq_t + h.to(tl.int64) * sq_h
        out, m2, cols = _normed_rows(src, qw_ptr, cos_ptr, sin_ptr, t, rmask, D, eps, offset,
                                     start, HALF, HAS_WEIGHT, INTERLEAVED, BLOCK)
        tl.store(qo_ptr + r.to(tl.int64)[:, None] * D + cols[None, :],
                 out.to(qo_ptr.dtype.element_ty), mask=m2)
    else:
        rmask = r < T * HKV
        t, h = r // HKV, r % HKV
        dest_row = tl.load(rows_ptr + t, mask=rmask, other=0).to(tl.int64)
        if role == 1:
            src = k_ptr + t.to(tl.int64) * sk_t + h.to(tl.int64) * sk_h
            out, m2, cols = _normed_rows(src, kw_ptr, cos_ptr, sin_ptr, t, rmask, D, eps, offset,
                                         start, HALF, HAS_WEIGHT, INTERLEAVED, BLOCK)
            dst = kc_ptr + dest_row * skc_r + h.to(tl.int64) * skc_h
            tl.store(dst[:, None] + cols[None, :], out.to(kc_ptr.dtype.element_ty), mask=m2)
        else:
            cols = tl.arange(0, BLOCK_V)
            m2 = rmask[:, None] & (cols < DV)[None, :]
            src = v_ptr + t.to(tl.int64) * sv_t + h.to(tl.int64) * sv_h
            val = tl.load(src[:, None] + cols[None, :], mask=m2, other=0.0)
            dst = vc_ptr + dest_row * svc_r + h.to(tl.int64) * svc_h
            tl.store(dst[:, None] + cols[None, :], val.to(vc_ptr.dtype.element_ty), mask=m2)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor, *, eps: float = 1e-6, weight_offset: float = 0.0,
                  start: int = 0, interleaved: bool = False) -> torch.Tensor:
    """x [T, H, D] or [T, D] (last dim contiguous; tokens / heads may be strided views) ->
    contiguous same shape, x.dtype."""
    if x.dim() not in (2, 3):
        raise ValueError(f"rms_norm_rope: x must be [T, H, D] or [T, D], got {tuple(x.shape)}")
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    t, h, d = x3.shape
    half = cos.shape[-1]
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != t:
        raise ValueError(f"rms_norm_rope: cos/sin must be [T={t}, R/2], got {tuple(cos.shape)} "
                         f"and {tuple(sin.shape)}")
    if start < 0 or start + 2 * half > d:
        raise ValueError(f"rms_norm_rope: rotary slice [{start}, {start + 2 * half}) does not "
                         f"fit in head dim {d}")
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    y = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    n_rows = t * h
    if n_rows == 0:
        return y.reshape(x.shape)
    block = triton.next_power_of_2(d)
    block_r = max(1, min(8, 4096 // block, triton.next_power_of_2(n_rows)))
    w = weight.contiguous() if weight is not None else x3
    _norm_rope_kernel[(triton.cdiv(n_rows, block_r),)](
        x3, w, cos.float().contiguous(), sin.float().contiguous(), y, n_rows, h, d,
        x3.stride(0), x3.stride(1), eps, weight_offset, start, half,
        HAS_WEIGHT=weight is not None, INTERLEAVED=interleaved, BLOCK_R=block_r, BLOCK=block,
        num_warps=4, PDL=pdl_ok(x.device), **launch_kwargs(x.device))
    return y.reshape(x.shape)


def rms_norm_rope_kv_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                           cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, rows: torch.Tensor, *, eps: float = 1e-6,
                           weight_offset: float = 0.0, start: int = 0,
                           interleaved: bool = False) -> torch.Tensor:
    """Triton ``rms_norm_rope_kv_store`` (contract: :func:`hwinfer.ops.norm.rms_norm_rope_kv_store`):
    q, k, v [T, H, D] (views), caches [blocks, bs, Hkv, D], rows [T] -> q's result [T, Hq, D];
    one launch. Calls the kernel cannot take (one weight given and not the other, strided
    cache rows) run the composition of the Triton ``rms_norm_rope`` instead."""
    from hwinfer.ops.norm import compose_rms_norm_rope_kv_store

    kw = dict(eps=eps, weight_offset=weight_offset, start=start, interleaved=interleaved)
    t, hq, d = q.shape if q.dim() == 3 else (0, 0, 0)
    fused = (q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and k_cache.dim() == 4
             and v_cache.dim() == 4 and (q_weight is None) == (k_weight is None)
             and all(x.stride(-1) == 1 for x in (q, k, v, k_cache, v_cache))
             and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)
             and v_cache.stride(0) == v_cache.shape[1] * v_cache.stride(1)
             and k.shape[0] == t and v.shape[:2] == k.shape[:2] and k.shape[2] == d
             and k_cache.shape[2:] == k.shape[1:] and v_cache.shape[2:] == v.shape[1:]
             and rows.shape == (t,) and cos.dim() == 2 and cos.shape == sin.shape
             and cos.shape[0] == t and 0 <= start and start + 2 * cos.shape[1] <= d)
    if not fused:
        return compose_rms_norm_rope_kv_store(rms_norm_rope, q, k, v, q_weight, k_weight, cos, sin,
                                              k_cache, v_cache, rows, **kw)
    hkv, dv = k.shape[1], v.shape[2]
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    block = triton.next_power_of_2(d)
    block_r = max(1, min(8, 4096 // block, triton.next_power_of_2(t * max(hq, hkv))))
    qw = q_weight.contiguous() if q_weight is not None else q
    kwt = k_weight.contiguous() if k_weight is not None else q
    _norm_rope_kv_store_kernel[(triton.cdiv(t * max(hq, hkv), block_r), 3)](
        q, k, v, qw, kwt, cos.float().contiguous(), sin.float().contiguous(), out, k_cache,
        v_cache, rows, t, hq, hkv, d, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), k_cache.stride(1), k_cache.stride(2), v_cache.stride(1),
        v_cache.stride(2), eps, weight_offset, start, cos.shape[1],
        HAS_WEIGHT=q_weight is not None, INTERLEAVED=interleaved, BLOCK_R=block_r, BLOCK=block,
        BLOCK_V=triton.next_power_of_2(dv), num_warps=KV_STORE_WARPS, PDL=pdl_ok(q.device),
        **launch_kwargs(q.device))
    return out


def rms_norm_rope_supported(x: torch.Tensor, weight: torch.Tensor | None = None,
                            **_: object) -> str | None:
    """Per-call check: a whole head row in one program (D <= 8192), float x."""
    if x.dtype not in _FLOATS:
        return f"dtype {x.dtype} not in fp16/bf16/fp32"
    if x.shape[-1] > 8192:
        return f"head dim {x.shape[-1]} > 8192"
    if weight is not None and weight.dtype not in _FLOATS:
        return f"weight dtype {weight.dtype} not float"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # Qwen3.5 (D 256, rotate-half, weighted) and DeepSeek-V4 (D 512, interleaved, +/- weight).
    for dtype in ("fp32", "bf16"):
        for block, inter, weighted in ((256, False, True), (512, True, False), (512, True, True)):
            sig = {"x_ptr": f"*{dtype}", "w_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                   "y_ptr": f"*{dtype}", "n_rows": "i32", "H": "i32", "D": "i32",
                   "stride_t": "i32", "stride_h": "i32", "eps": "fp32", "offset": "fp32",
                   "start": "i32", "HALF": "i32", "HAS_WEIGHT": "constexpr",
                   "INTERLEAVED": "constexpr", "BLOCK_R": "constexpr", "BLOCK": "constexpr",
                   "PDL": "constexpr"}
            specs.append(AotSpec(f"norm_rope[{dtype},{block},{'il' if inter else 'rh'},"
                                 f"{'w' if weighted else 'nw'}]", _norm_rope_kernel, sig,
                                 {"HAS_WEIGHT": weighted, "INTERLEAVED": inter,
                                  "BLOCK_R": 4096 // block, "BLOCK": block, "PDL": False}))
    # Qwen3.5 decode: q, k (rotate-half, zero-centred weights) and v into bf16 caches
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "qw_ptr": "*fp32", "kw_ptr": "*fp32",
           "cos_ptr": "*fp32", "sin_ptr": "*fp32", "qo_ptr": "*bf16", "kc_ptr": "*bf16",
           "vc_ptr": "*bf16", "rows_ptr": "*i32", **{n: "i32" for n in (
               "T", "HQ", "HKV", "D", "DV", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h",
               "skc_r", "skc_h", "svc_r", "svc_h")},
           "eps": "fp32", "offset": "fp32", "start": "i32", "HALF": "i32",
           **{n: "constexpr" for n in ("HAS_WEIGHT", "INTERLEAVED", "BLOCK_R", "BLOCK", "BLOCK_V", "PDL")}}
    specs.append(AotSpec("norm_rope_kv_store[bf16,256]", _norm_rope_kv_store_kernel, sig,
                         {"HAS_WEIGHT": True, "INTERLEAVED": False, "BLOCK_R": 8, "BLOCK": 256,
                          "BLOCK_V": 256, "PDL": False}))
    return specs


AOT_SPECS = _aot_specs()


def rms_norm_rope_kv_store_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     q_weight: torch.Tensor | None = None,
                                     k_weight: torch.Tensor | None = None, k_cache=None,
                                     v_cache=None, **_: object) -> str | None:
    """Per-call check: rms_norm_rope's, for q and k; float caches."""
    for x, w in ((q, q_weight), (k, k_weight)):
        reason = rms_norm_rope_supported(x, w)
        if reason is not None:
            return reason
    if v.dtype not in _FLOATS or any(c is not None and c.dtype not in _FLOATS for c in (k_cache, v_cache)):
        return "v and the caches must be fp16 / bf16 / fp32"
    return None
