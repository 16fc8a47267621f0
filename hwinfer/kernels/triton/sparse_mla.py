"""Triton sparse MLA decode (contract: :func:`hwinfer.ops.sparse_mla.sparse_mla_decode`).

Split-K flash decoding over one shared latent K=V head:

* ``_sparse_mla_split_kernel``, grid (head blocks, splits, tokens): one program takes one query
  token, BLOCK_H of its heads and one range of the token's index list (the main list, then the
  ``extra`` list, as one concatenated range). Every gathered row is loaded once per program and
  shared by all its heads through ``tl.dot`` ([BH, D] x [D, BK]); -1 entries are masked. The
  softmax runs online in fp32 in the log2 domain. With one split the program finishes the token
  itself (sink column, normalisation, inverse RoPE, cast); otherwise it writes its partial
  (max, sum, unnormalised acc) in fp32.
* ``_sparse_mla_merge_kernel``, grid (head blocks, column blocks, tokens): rescales and sums the
  partials, adds the sink column, normalises, applies the inverse RoPE, casts.

The inverse RoPE is done in the kernels (no extra pass over the output): pairs (2i, 2i+1) are
swapped in registers with reshape/split/join, so it needs an even v_dim (the per-call check
refuses odd ones). D that is not a power of two is split as BD1 (largest power of two <= D)
+ BD2 (the rest, padded to a power of two >= 16): 576 -> 512 + 64, 160 -> 128 + 32.

Dot precision: everything is upcast to fp32 right after the load (the interpreter computes bf16
math wrongly). On a GPU with bf16/fp16 inputs the dot operands are cast back to the input type
(exact for q and kv; p is rounded, as in every flash kernel) so the MMAs run at bf16 rate; fp32
inputs and the interpreter use fp32 dots with input_precision="ieee".
"""
from __future__ import annotations

import functools
import inspect

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _gather_chunk(q1, q2, m, l, acc1, acc2, idx_ptr, p0, p_end, kv_ptr, stride_kv, D, qk_scale,
                  offs_k, cols1, cols2, HAS_TAIL: tl.constexpr, V_TAIL: tl.constexpr,
                  LOWP: tl.constexpr):
    """One BK-row chunk: gather rows idx[p0:p0+BK] (masked at p_end and at -1), update the
    online softmax state (m, l in the log2 domain) and the accumulators."""
    pos = p0 + offs_k
    idx = tl.load(idx_ptr + pos, mask=pos < p_end, other=-1)
    ok = idx >= 0
    rows = kv_ptr + tl.where(ok, idx, 0).to(tl.int64)[:, None] * stride_kv
    k1 = tl.load(rows + cols1[None, :], mask=ok[:, None] & (cols1 < D)[None, :], other=0.0)
    k1 = k1.to(tl.float32)
    if LOWP:
        k1 = k1.to(kv_ptr.dtype.element_ty)
    s = tl.dot(q1, tl.trans(k1), input_precision="ieee")
    if HAS_TAIL:
        k2 = tl.load(rows + cols2[None, :], mask=ok[:, None] & (cols2 < D)[None, :], other=0.0)
        k2 = k2.to(tl.float32)
        if LOWP:
            k2 = k2.to(kv_ptr.dtype.element_ty)
        s += tl.dot(q2, tl.trans(k2), input_precision="ieee")
    s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if LOWP:
        p = p.to(kv_ptr.dtype.element_ty)
    acc1 = acc1 * alpha[:, None] + tl.dot(p, k1, input_precision="ieee")
    if V_TAIL:
        acc2 = acc2 * alpha[:, None] + tl.dot(p, k2, input_precision="ieee")
    return m_new, l, acc1, acc2


@triton.jit
def _finish_store(acc, f, t, heads, hmask, cols, DV, out_ptr, stride_ot, stride_oh,
                  cos_ptr, sin_ptr, stride_cs, ROPE_START, BH: tl.constexpr, BC: tl.constexpr,
                  HAS_ROPE: tl.constexpr):
    """out[t, heads, cols] = rope^-1(acc * f[:, None]); cols start at an even offset."""
    o = acc * f[:, None]
    if HAS_ROPE:
        # x' = x*cos + sign*partner*sin with partner = the other channel of the pair and
        # sign = +1 on even (x) / -1 on odd (y) channels: (x c + y s, y c - x s).
        rel = cols - ROPE_START
        in_rope = (rel >= 0) & (cols < DV)
        j = tl.where(in_rope, rel // 2, 0)
        c = tl.load(cos_ptr + t * stride_cs + j, mask=in_rope, other=1.0).to(tl.float32)
        sn = tl.load(sin_ptr + t * stride_cs + j, mask=in_rope, other=0.0).to(tl.float32)
        sn = tl.where((rel % 2) == 0, sn, -sn)
        even, odd = tl.split(tl.reshape(o, (BH, BC // 2, 2)))
        partner = tl.reshape(tl.join(odd, even), (BH, BC))
        o = o * c[None, :] + partner * sn[None, :]
    ptrs = out_ptr + t * stride_ot + heads[:, None] * stride_oh + cols[None, :]
    tl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & (cols < DV)[None, :])


@triton.jit
def _sparse_mla_split_kernel(
        q_ptr, kv_ptr, idx_ptr, kv2_ptr, idx2_ptr, sink_ptr, cos_ptr, sin_ptr,
        out_ptr, pm_ptr, pl_ptr, pacc_ptr,
        H, D, DV, K1, K2, CHUNKS_PER_SPLIT, qk_scale, ROPE_START,
        stride_qt, stride_qh, stride_kv, stride_kv2, stride_it, stride_i2t, stride_cs,
        stride_ot, stride_oh,
        BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BD1: tl.constexpr, BD2: tl.constexpr,
        HAS_TAIL: tl.constexpr, V_TAIL: tl.constexpr, SINGLE: tl.constexpr, HAS_SINK: tl.constexpr,
        HAS_ROPE: tl.constexpr, LOWP: tl.constexpr):
    hb = tl.program_id(0)
    sp = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)  # t * stride_qt can pass 2**31 (65535 x 64 x 576)
    nsplit = tl.num_programs(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    cols1 = tl.arange(0, BD1)
    cols2 = BD1 + tl.arange(0, BD2)
    offs_k = tl.arange(0, BLOCK_K)

    q_rows = q_ptr + t * stride_qt + heads[:, None] * stride_qh
    q1 = tl.load(q_rows + cols1[None, :], mask=hmask[:, None] & (cols1 < D)[None, :], other=0.0)
    q1 = q1.to(tl.float32)
    if HAS_TAIL:
        q2 = tl.load(q_rows + cols2[None, :], mask=hmask[:, None] & (cols2 < D)[None, :], other=0.0)
        q2 = q2.to(tl.float32)
    else:
        q2 = tl.zeros((BLOCK_H, BD2), tl.float32)  # unused placeholder
    if LOWP:
        q1 = q1.to(q_ptr.dtype.element_ty)
        q2 = q2.to(q_ptr.dtype.element_ty)

    m = tl.full((BLOCK_H,), -1.0e30, tl.float32)  # finite: exp2(m - m) = 1, not NaN
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc1 = tl.zeros((BLOCK_H, BD1), tl.float32)
    acc2 = tl.zeros((BLOCK_H, BD2), tl.float32)

    # this split's range of the concatenated list [main K1 | extra K2]
    lo = sp * CHUNKS_PER_SPLIT * BLOCK_K
    hi = tl.minimum(lo + CHUNKS_PER_SPLIT * BLOCK_K, K1 + K2)
    for p0 in range(lo, tl.minimum(hi, K1), BLOCK_K):
        m, l, acc1, acc2 = _gather_chunk(q1, q2, m, l, acc1, acc2, idx_ptr + t * stride_it, p0,
                                         tl.minimum(hi, K1), kv_ptr, stride_kv, D, qk_scale,
                                         offs_k, cols1, cols2, HAS_TAIL, V_TAIL, LOWP)
    for p0 in range(tl.maximum(lo, K1) - K1, hi - K1, BLOCK_K):
        m, l, acc1, acc2 = _gather_chunk(q1, q2, m, l, acc1, acc2, idx2_ptr + t * stride_i2t, p0,
                                         hi - K1, kv2_ptr, stride_kv2, D, qk_scale,
                                         offs_k, cols1, cols2, HAS_TAIL, V_TAIL, LOWP)

    if SINGLE:
        big = m
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
            big = tl.maximum(m, sink)
        w = tl.exp2(m - big)
        denom = l * w
        if HAS_SINK:
            denom += tl.exp2(sink - big)
        f = tl.where(denom > 0, w / tl.where(denom > 0, denom, 1.0), 0.0)
        _finish_store(acc1, f, t, heads, hmask, cols1, DV, out_ptr, stride_ot, stride_oh,
                      cos_ptr, sin_ptr, stride_cs, ROPE_START, BLOCK_H, BD1, HAS_ROPE)
        if V_TAIL:
            _finish_store(acc2, f, t, heads, hmask, cols2, DV, out_ptr, stride_ot, stride_oh,
                          cos_ptr, sin_ptr, stride_cs, ROPE_START, BLOCK_H, BD2, HAS_ROPE)
    else:
        # partials [T, nsplit, H] (m, l) and [T, nsplit, H, DV] (acc), fp32
        row = (t * nsplit + sp) * H + heads
        tl.store(pm_ptr + row, m, mask=hmask)
        tl.store(pl_ptr + row, l, mask=hmask)
        base = pacc_ptr + row.to(tl.int64)[:, None] * DV
        tl.store(base + cols1[None, :], acc1, mask=hmask[:, None] & (cols1 < DV)[None, :])
        if V_TAIL:
            tl.store(base + cols2[None, :], acc2, mask=hmask[:, None] & (cols2 < DV)[None, :])


@triton.jit
def _sparse_mla_merge_kernel(pm_ptr, pl_ptr, pacc_ptr, sink_ptr, cos_ptr, sin_ptr, out_ptr,
                             H, DV, NSPLIT, ROPE_START, stride_cs, stride_ot, stride_oh,
                             BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                             HAS_SINK: tl.constexpr, HAS_ROPE: tl.constexpr):
    hb = tl.program_id(0)
    cb = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)  # t * stride_qt can pass 2**31 (65535 x 64 x 576)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = hmask[:, None] & (cols < DV)[None, :]
    big = tl.full((BLOCK_H,), -1.0e30, tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_C), tl.float32)
    for sp in range(0, NSPLIT):
        row = (t * NSPLIT + sp) * H + heads
        mi = tl.load(pm_ptr + row, mask=hmask, other=-1.0e30)
        li = tl.load(pl_ptr + row, mask=hmask, other=0.0)
        ai = tl.load(pacc_ptr + row.to(tl.int64)[:, None] * DV + cols[None, :], mask=cmask, other=0.0)
        new = tl.maximum(big, mi)
        a = tl.exp2(big - new)
        b = tl.exp2(mi - new)
        l = l * a + li * b
        acc = acc * a[:, None] + ai * b[:, None]
        big = new
    w = tl.full((BLOCK_H,), 1.0, tl.float32)
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * 1.4426950408889634
        new = tl.maximum(big, sink)
        w = tl.exp2(big - new)
        l = l * w + tl.exp2(sink - new)
    f = tl.where(l > 0, w / tl.where(l > 0, l, 1.0), 0.0)
    _finish_store(acc, f, t, heads, hmask, cols, DV, out_ptr, stride_ot, stride_oh,
                  cos_ptr, sin_ptr, stride_cs, ROPE_START, BLOCK_H, BLOCK_C, HAS_ROPE)


def _dims(d: int) -> tuple[int, int, bool]:
    """(BD1, BD2, has_tail): D = BD1 + rest, BD1 the largest power of two <= D (>= 16), BD2 the
    rest padded to a power of two >= 16 (tl.dot's minimum; a 16-wide placeholder if no rest)."""
    if d <= 16:
        return 16, 16, False
    bd1 = 1 << (d.bit_length() - 1)
    rest = d - bd1
    return bd1, max(16, triton.next_power_of_2(rest)), rest > 0


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # interpreter: keep grids small but still exercise the split + merge path
    return torch.cuda.get_device_properties(device).multi_processor_count


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                      out_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                      extra_kv_cache: torch.Tensor | None = None,
                      extra_indices: torch.Tensor | None = None,
                      block_h: int | None = None, block_k: int | None = None,
                      num_splits: int | None = None, num_warps: int | None = None,
                      num_stages: int = 2) -> torch.Tensor:
    """Triton sparse MLA decode: q [B, S, H, D], kv_cache [blocks, bs, D], indices [B, S, K]
    (+ extra_kv_cache [blocks2, bs2, D], extra_indices [B, S, K2]) -> [B, S, H, v_dim or D].

    Tuning (None = heuristic): block_h heads per program (>= 16, tl.dot's minimum), block_k
    rows per chunk, num_splits of the index list (1 = no merge kernel), num_warps/num_stages.
    """
    b, s, h, d = q.shape
    dv = d if v_dim is None else int(v_dim)
    t = b * s
    out = torch.empty((b, s, h, dv), dtype=q.dtype, device=q.device)
    if t == 0 or h == 0:
        return out
    q3, idx = _rows_contiguous(q.reshape(t, h, d)), _rows_contiguous(indices.reshape(t, -1))
    k1 = idx.shape[1]
    if extra_kv_cache is not None:
        idx2 = _rows_contiguous(extra_indices.reshape(t, -1))
        kv2, k2, stride_kv2 = extra_kv_cache, idx2.shape[1], extra_kv_cache.stride(1)
    else:
        idx2, kv2, k2, stride_kv2 = idx, kv_cache, 0, 0
    interp = q.device.type == "cpu"
    bd1, bd2, tail = _dims(d)
    # [BH, BD1] fp32 accumulator: BH * BD1 <= 16384 (8192 for fp32 operands) kept spill-free
    # on sm_90 (ptxas -res-usage: BH 32 x 512 x 8 warps = 197 regs; BH 64 spills at any warps)
    cap = (16384 if q.dtype != torch.float32 else 8192) // bd1
    bh = block_h or max(16, min(cap, triton.next_power_of_2(h)))
    bk = block_k or (16 if interp else 32)
    n_hb = triton.cdiv(h, bh)
    chunks = max(1, triton.cdiv(k1 + k2, bk))
    if num_splits is None:
        num_splits = max(1, min(round(_num_sms(q.device) / (t * n_hb)), triton.cdiv(chunks, 2)))
    cps = triton.cdiv(chunks, max(1, min(num_splits, chunks)))
    nsplit = triton.cdiv(chunks, cps)
    warps = num_warps or (8 if bh * bd1 >= 8192 else 4)
    o3 = out.view(t, h, dv)
    has_rope = out_rope is not None  # unused pointers below get o3 as a placeholder
    cos, sin = (x.reshape(t, -1).contiguous() for x in out_rope) if has_rope else (o3, o3)
    rope_start, stride_cs = (dv - 2 * cos.shape[1], cos.stride(0)) if has_rope else (0, 0)
    sink = sinks.contiguous() if sinks is not None else o3
    f32 = dict(dtype=torch.float32, device=q.device)
    pm, pl, pacc = (torch.empty((t, nsplit, h), **f32), torch.empty((t, nsplit, h), **f32),
                    torch.empty((t, nsplit, h, dv), **f32)) if nsplit > 1 else (o3, o3, o3)
    lowp = q.dtype in (torch.bfloat16, torch.float16) and not interp
    _sparse_mla_split_kernel[(n_hb, nsplit, t)](
        q3, kv_cache, idx, kv2, idx2, sink, cos, sin, o3, pm, pl, pacc,
        h, d, dv, k1, k2, cps, scale * _LOG2E, rope_start,
        q3.stride(0), q3.stride(1), kv_cache.stride(1), stride_kv2, idx.stride(0), idx2.stride(0),
        stride_cs, o3.stride(0), o3.stride(1),
        BLOCK_H=bh, BLOCK_K=bk, BD1=bd1, BD2=bd2, HAS_TAIL=tail, V_TAIL=dv > bd1, SINGLE=nsplit == 1,
        HAS_SINK=sinks is not None, HAS_ROPE=has_rope, LOWP=lowp,
        num_warps=warps, num_stages=num_stages)
    if nsplit > 1:
        bc = min(64, triton.next_power_of_2(dv))
        _sparse_mla_merge_kernel[(triton.cdiv(h, 16), triton.cdiv(dv, bc), t)](
            pm, pl, pacc, sink, cos, sin, o3, h, dv, nsplit, rope_start, stride_cs,
            o3.stride(0), o3.stride(1), BLOCK_H=16, BLOCK_C=bc, HAS_SINK=sinks is not None,
            HAS_ROPE=has_rope, num_warps=4)
    return out


def sparse_mla_decode_supported(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                                sinks: torch.Tensor | None = None, *, v_dim: int | None = None,
                                out_rope=None, extra_kv_cache: torch.Tensor | None = None,
                                extra_indices: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check: refuse what the kernel does not cover (the dispatcher falls back)."""
    if q.dim() != 4 or kv_cache.dim() != 3 or indices.dim() != 3:
        return "expects q [B, S, H, D], kv_cache [blocks, block_size, D], indices [B, S, K]"
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {q.dtype} not supported"
    d = q.shape[-1]
    if d > 1024:
        return f"D={d} > 1024 (a program holds whole rows)"
    dv = d if v_dim is None else int(v_dim)
    if out_rope is not None and dv % 2:
        return f"inverse RoPE needs an even v_dim, got {dv}"
    if q.shape[0] * q.shape[1] > 65535:
        return f"B*S={q.shape[0] * q.shape[1]} > 65535 (grid axis limit)"
    for name, cache in (("kv_cache", kv_cache), ("extra_kv_cache", extra_kv_cache)):
        if cache is not None and (cache.stride(2) != 1 or cache.stride(0) != cache.shape[1] * cache.stride(1)):
            return f"{name} must be viewable as rows [blocks * block_size, D] without a copy"
    if any(ix is not None and ix.dtype not in (torch.int32, torch.int64) for ix in (indices, extra_indices)):
        return "indices must be int32 or int64"
    return None


def _sig(kernel, ptrs: dict[str, str]) -> dict[str, str]:
    """Triton signature of ``kernel``: pointers per ``ptrs`` (else *fp32), other scalars i32."""
    def kind(n: str, p) -> str:
        if "constexpr" in str(p.annotation):  # works for JITFunction and InterpretedFunction
            return "constexpr"
        return ptrs.get(n, "*fp32") if n.endswith("_ptr") else ("fp32" if n == "qk_scale" else "i32")
    return {n: kind(n, p) for n, p in inspect.signature(kernel.fn).parameters.items()}


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # DeepSeek-V4 (D 512, sinks, rope; split and single) and GLM-5 absorbed (D 576 = 512 + 64, v 512)
    for name, dt, d, dv, single, rope_sink in (
            ("dsv4", "bf16", 512, 512, False, True), ("dsv4_single", "bf16", 512, 512, True, True),
            ("glm5", "bf16", 576, 512, False, False), ("dsv4_fp32", "fp32", 512, 512, True, True)):
        bd1, bd2, tail = _dims(d)
        sig = _sig(_sparse_mla_split_kernel, {"q_ptr": f"*{dt}", "kv_ptr": f"*{dt}", "kv2_ptr": f"*{dt}",
                                              "out_ptr": f"*{dt}", "idx_ptr": "*i32", "idx2_ptr": "*i32"})
        const = {"BLOCK_H": 32 if dt != "fp32" else 16, "BLOCK_K": 32, "BD1": bd1, "BD2": bd2,
                 "HAS_TAIL": tail, "V_TAIL": dv > bd1, "SINGLE": single, "HAS_SINK": rope_sink,
                 "HAS_ROPE": rope_sink, "LOWP": dt != "fp32"}
        specs.append(AotSpec(f"sparse_mla_split[{name}]", _sparse_mla_split_kernel, sig, const,
                             {"num_warps": 8, "num_stages": 2}))
    specs.append(AotSpec("sparse_mla_merge[bf16,rope,sink]", _sparse_mla_merge_kernel,
                         _sig(_sparse_mla_merge_kernel, {"out_ptr": "*bf16"}),
                         {"BLOCK_H": 16, "BLOCK_C": 64, "HAS_SINK": True, "HAS_ROPE": True}))
    return specs


AOT_SPECS = _aot_specs()
