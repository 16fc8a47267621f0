"""Triton kernels of sparse MLA; wrappers, tuning tables and per-call checks live in
:mod:`hwinfer.kernels.triton.sparse_mla` (its docstring describes the design)."""
from __future__ import annotations

import inspect

import triton
import triton.language as tl


@triton.jit
def _row_tile(rows, cols, ok, D, FP8_DS: tl.constexpr, FP8_NATIVE: tl.constexpr):
    """Channels ``cols`` of the gathered rows (``rows``: [BK, 1] row pointers) as fp32, 0 where
    masked. FP8_DS: the rows are fp8_ds_mla entries (uint8, :mod:`hwinfer.ops.kv_pack`; ``cols``
    a 64-aligned run of a multiple of 64 channels): channels < 448 are e4m3 bytes times their
    group's UE8M0 scale, channels 448-511 bf16. FP8_NATIVE converts e4m3 with the hardware's
    instruction; otherwise integer ops decode it exactly (every target and the interpreter)."""
    if FP8_DS:
        BK: tl.constexpr = rows.shape[0]
        BC: tl.constexpr = cols.shape[0]
        G: tl.constexpr = BC // 64
        nope = cols < 448
        b = tl.load(rows + cols[None, :], mask=ok[:, None] & nope[None, :], other=0)
        if FP8_NATIVE:
            mag = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            bi = b.to(tl.int32)
            e = (bi >> 3) & 15
            mant = (bi & 7).to(tl.float32)
            # e4m3: (8 + m) * 2^(e - 10), subnormals m * 2^-9; powers of two built from their bits
            mag = tl.where(e == 0, mant * 0.001953125,
                           (mant + 8.0) * ((e + 117) << 23).to(tl.float32, bitcast=True))
            mag = tl.where(bi >= 128, -mag, mag)
        # one scale byte per (row, 64-channel group), broadcast over the group in registers
        grp = tl.min(tl.reshape(cols, (G, 64)), axis=1) // 64
        sb = tl.load(rows + 576 + grp[None, :], mask=ok[:, None] & (grp < 7)[None, :], other=127)
        scale = (sb.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        val = tl.reshape(tl.reshape(mag, (BK, G, 64)) * scale[:, :, None], (BK, BC))
        # the RoPE channels: bf16 = the high half of an fp32
        rel = cols - 448
        r16 = (rows + 448).to(tl.pointer_type(tl.int16))
        h = tl.load(r16 + rel[None, :], mask=ok[:, None] & ((rel >= 0) & (cols < 512))[None, :], other=0)
        rope = (h.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        return tl.where(nope[None, :], val, rope)
    else:
        return tl.load(rows + cols[None, :], mask=ok[:, None] & (cols < D)[None, :],
                       other=0.0).to(tl.float32)


@triton.jit
def _gather_chunk(q1, q2, m, l, acc, idx_ptr, p0, p_end, kv_ptr, stride_kv, D, DV, qk_scale,
                  offs_k, cols1, cols2, vcols, HAS_TAIL: tl.constexpr, V_IS_K: tl.constexpr,
                  LOWP: tl.constexpr, FP8_DS: tl.constexpr, FP8_NATIVE: tl.constexpr):
    """One BK-row chunk: gather rows idx[p0:p0+BK] (masked at p_end and at -1), update the
    online softmax state (m, l in the log2 domain) and the accumulator of this value tile.
    LOWP: the dot operands in q's 16-bit type (exact for kv rows, also when decoded from FP8)."""
    pos = p0 + offs_k
    idx = tl.load(idx_ptr + pos, mask=pos < p_end, other=-1)
    ok = idx >= 0
    off = tl.where(ok, idx, 0).to(tl.int64) * stride_kv
    if FP8_DS:
        off = tl.multiple_of(off, 8)  # 584-byte rows: 8-byte vector loads (the wrapper checks)
    rows = kv_ptr + off[:, None]
    k1 = _row_tile(rows, cols1, ok, D, FP8_DS, FP8_NATIVE)
    if LOWP:
        k1 = k1.to(q1.dtype)
    s = tl.dot(q1, tl.trans(k1), input_precision="ieee")
    if HAS_TAIL:
        k2 = _row_tile(rows, cols2, ok, D, FP8_DS, FP8_NATIVE)
        if LOWP:
            k2 = k2.to(q1.dtype)
        s += tl.dot(q2, tl.trans(k2), input_precision="ieee")
    s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if LOWP:
        p = p.to(q1.dtype)
    if V_IS_K:
        v = k1  # one value tile = the first BD1 channels: reuse the loaded rows
    else:
        # the program's value tile (an L1/L2 hit: the same rows were just read for QK)
        v = _row_tile(rows, vcols, ok, DV, FP8_DS, FP8_NATIVE)
        if LOWP:
            v = v.to(q1.dtype)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return m_new, l, acc


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
        H, D, DV, K1, K2, NV, CHUNKS_PER_SPLIT, qk_scale, ROPE_START,
        stride_qt, stride_qh, stride_kv, stride_kv2, stride_it, stride_i2t, stride_cs,
        stride_ot, stride_oh,
        BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BD1: tl.constexpr, BD2: tl.constexpr,
        BLOCK_V: tl.constexpr, HAS_TAIL: tl.constexpr, V_IS_K: tl.constexpr, SINGLE: tl.constexpr,
        HAS_SINK: tl.constexpr, HAS_ROPE: tl.constexpr, LOWP: tl.constexpr,
        FP8_DS: tl.constexpr, FP8_NATIVE: tl.constexpr):
    pid = tl.program_id(0)
    vt = pid % NV  # value tiles of one head block are adjacent: they share rows through L2
    hb = pid // NV
    sp = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)  # t * stride_qt can pass 2**31 (65535 x 64 x 576)
    nsplit = tl.num_programs(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    cols1 = tl.arange(0, BD1)
    cols2 = BD1 + tl.arange(0, BD2)
    vcols = vt * BLOCK_V + tl.arange(0, BLOCK_V)
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
    acc = tl.zeros((BLOCK_H, BLOCK_V), tl.float32)

    # this split's range of the concatenated list [main K1 | extra K2]
    lo = sp * CHUNKS_PER_SPLIT * BLOCK_K
    hi = tl.minimum(lo + CHUNKS_PER_SPLIT * BLOCK_K, K1 + K2)
    for p0 in range(lo, tl.minimum(hi, K1), BLOCK_K):
        m, l, acc = _gather_chunk(q1, q2, m, l, acc, idx_ptr + t * stride_it, p0,
                                  tl.minimum(hi, K1), kv_ptr, stride_kv, D, DV, qk_scale,
                                  offs_k, cols1, cols2, vcols, HAS_TAIL, V_IS_K, LOWP, FP8_DS, FP8_NATIVE)
    for p0 in range(tl.maximum(lo, K1) - K1, hi - K1, BLOCK_K):
        m, l, acc = _gather_chunk(q1, q2, m, l, acc, idx2_ptr + t * stride_i2t, p0,
                                  hi - K1, kv2_ptr, stride_kv2, D, DV, qk_scale,
                                  offs_k, cols1, cols2, vcols, HAS_TAIL, V_IS_K, LOWP, FP8_DS, FP8_NATIVE)

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
        _finish_store(acc, f, t, heads, hmask, vcols, DV, out_ptr, stride_ot, stride_oh,
                      cos_ptr, sin_ptr, stride_cs, ROPE_START, BLOCK_H, BLOCK_V, HAS_ROPE)
    else:
        # partials [T, nsplit, H] (m, l; written by value tile 0) and [T, nsplit, H, DV] (acc)
        row = (t * nsplit + sp) * H + heads
        tl.store(pm_ptr + row, m, mask=hmask & (vt == 0))
        tl.store(pl_ptr + row, l, mask=hmask & (vt == 0))
        base = pacc_ptr + row.to(tl.int64)[:, None] * DV
        tl.store(base + vcols[None, :], acc, mask=hmask[:, None] & (vcols < DV)[None, :])


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
    # DeepSeek-V4 (D 512, sinks, rope): the CUDA default (64 heads x one value tile of 512,
    # NV = 1, 64-row chunks), split and single, and 64 heads x 256 channels (NV = 2, the AMD
    # default); GLM-5 absorbed (D 576 = 512 + 64, v 512); fp32.
    for name, dt, d, bh, bv, bk, nv1, single, rope_sink in (
            ("dsv4", "bf16", 512, 64, 512, 64, True, False, True),
            ("dsv4_single", "bf16", 512, 64, 512, 64, True, True, True),
            ("dsv4_nv2", "bf16", 512, 64, 256, 32, False, False, True),
            ("glm5", "bf16", 576, 64, 512, 64, True, False, False),
            ("dsv4_fp32", "fp32", 512, 32, 512, 32, True, True, True),
            ("dsv4_fp8_cache", "bf16", 512, 64, 512, 64, True, False, True),
            ("dsv4_fp8_cache_native", "bf16", 512, 64, 512, 64, True, False, True)):
        bd1, bd2, tail = _dims(d)
        fp8 = "fp8_cache" in name   # fp8_ds_mla rows: uint8 caches
        native = name.endswith("native")  # hardware e4m3 conversion: NVIDIA only (sm_89+)
        kv = "*u8" if fp8 else f"*{dt}"
        sig = _sig(_sparse_mla_split_kernel, {"q_ptr": f"*{dt}", "kv_ptr": kv, "kv2_ptr": kv,
                                              "out_ptr": f"*{dt}", "idx_ptr": "*i32", "idx2_ptr": "*i32"})
        const = {"BLOCK_H": bh, "BLOCK_K": bk, "BD1": bd1, "BD2": bd2, "BLOCK_V": bv,
                 "HAS_TAIL": tail, "V_IS_K": nv1, "SINGLE": single, "HAS_SINK": rope_sink,
                 "HAS_ROPE": rope_sink, "LOWP": dt != "fp32", "FP8_DS": fp8,
                 "FP8_NATIVE": native}
        specs.append(AotSpec(f"sparse_mla_split[{name}]", _sparse_mla_split_kernel, sig, const,
                             {"num_warps": 8, "num_stages": 2},
                             ("sm_90", "sm_100") if native else None))
    specs.append(AotSpec("sparse_mla_merge[bf16,rope,sink]", _sparse_mla_merge_kernel,
                         _sig(_sparse_mla_merge_kernel, {"out_ptr": "*bf16"}),
                         {"BLOCK_H": 16, "BLOCK_C": 64, "HAS_SINK": True, "HAS_ROPE": True}))
    return specs


AOT_SPECS = _aot_specs()
