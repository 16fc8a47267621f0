"""Triton varlen prefill attention (contract: :func:`hwinfer.ops.attention.attention`).

A flash-attention forward over packed sequences that reads the sequence bounds on the device
only, so its grid depends on shapes alone (no host read of ``cu_seqlens``, no per-sequence
launches as in the torch impl, which runs one SDPA call per sequence; a prefill step can be
captured in a CUDA graph once every other op of the step can).

``_varlen_attn_kernel``, grid (T // BM + N, Hq): program (m, h) takes BM queries of one
sequence and one query head. Sequence i owns the programs ``cu_q[i] // BM + i ..`` (one more
than its whole tiles: enough for ``ceil(q_len / BM)``, and the base rises with i), so a binary
search over the bases finds the program's sequence; a program past its sequence's queries
returns at once. The key range of its tile is cut in three: tiles every query of the program
sees whole (no mask), and the masked tiles on either side (the causal diagonal, the start of a
sliding window); tiles before a window or past the last query's position are not read.
Online softmax in the log2 domain with fp32 statistics; 16-bit q / k / v go to the tensor
cores (p rounded to v's dtype for the second product, as the contract's tolerance allows),
fp32 inputs through exact fp32 dots. Sinks join the softmax as one extra logit per head after
the loop, then the sigmoid gate and one cast. V = K (``v=None``, DeepSeek-V4) loads each key
tile once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import INTERPRET, to_device
from hwinfer.kernels.triton.aot import SHARED_BYTES
from hwinfer.ops.attention import check_extras, check_heads

_LOG2E = 1.4426950408889634


@triton.jit
def _tile_seq(cu_q_ptr, cu_k_ptr, pid, N, BM: tl.constexpr, STEPS: tl.constexpr):
    """Program pid's sequence: the last i with base(i) = cu_q[i] // BM + i <= pid; returns
    (pid's query block in it, first query, query count, first key, key count)."""
    lo = pid * 0
    hi = lo + N
    for _ in tl.static_range(STEPS):
        mid = (lo + hi) // 2
        below = tl.load(cu_q_ptr + mid) // BM + mid <= pid
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    q0 = tl.load(cu_q_ptr + lo)
    k0 = tl.load(cu_k_ptr + lo)
    q_len = tl.load(cu_q_ptr + lo + 1) - q0
    k_len = tl.load(cu_k_ptr + lo + 1) - k0
    return pid - (q0 // BM + lo), q0, q_len, k0, k_len


@triton.jit
def _attend_tile(q, k_ptr, v_ptr, k0, start, k_len, p, kv_off, vv_off, dk, dvv, DK, DV, W,
                 stride_kt, stride_vt, qk_scale, m, l, acc, BN: tl.constexpr,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 SHARED_KV: tl.constexpr, EXACT: tl.constexpr):
    """One online-softmax step of the BM queries q [BM, DKP] (positions p [BM]) over keys
    start .. start + BN - 1 of the sequence; MASKED: apply the causal / window / length mask
    (otherwise every query sees every key of the tile)."""
    j = start + tl.arange(0, BN)
    rows = (k0 + j).to(tl.int64)
    if MASKED:
        kin = j < k_len
    else:
        kin = j >= 0
    k = tl.load(k_ptr + rows[:, None] * stride_kt + kv_off + dk[None, :],
                mask=kin[:, None] & (dk < DK)[None, :], other=0.0)
    if EXACT:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * qk_scale
    if MASKED:
        visible = kin[None, :]
        if CAUSAL:
            visible = visible & (j[None, :] <= p[:, None])
        if HAS_WINDOW:
            visible = visible & (j[None, :] > p[:, None] - W)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    e = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m - m_new)
    l = l * alpha + tl.sum(e, axis=1)
    if SHARED_KV:
        v = k
    else:
        v = tl.load(v_ptr + rows[:, None] * stride_vt + vv_off + dvv[None, :],
                    mask=kin[:, None] & (dvv < DV)[None, :], other=0.0)
    if EXACT:
        pv = tl.dot(e, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(e.to(v.dtype), v)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _varlen_attn_kernel(q_ptr, k_ptr, v_ptr, gate_ptr, sinks_ptr, cu_q_ptr, cu_k_ptr, o_ptr,
                        N, G, DK, DV, W, qk_scale, stride_qt, stride_qh, stride_kt, stride_kh,
                        stride_vt, stride_vh, stride_gt, stride_gh, stride_ot, stride_oh,
                        STEPS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        DKP: tl.constexpr, DVP: tl.constexpr, CAUSAL: tl.constexpr,
                        HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
                        HAS_GATE: tl.constexpr, SHARED_KV: tl.constexpr, EXACT: tl.constexpr):
    h = tl.program_id(1)
    qb, q0, q_len, k0, k_len = _tile_seq(cu_q_ptr, cu_k_ptr, tl.program_id(0), N, BM, STEPS)
    if qb * BM < q_len:
        hk = h // G
        r = qb * BM + tl.arange(0, BM)
        rmask = r < q_len
        p = k_len - q_len + r                  # bottom-right alignment: positions in the sequence
        p_first = k_len - q_len + qb * BM
        p_last = k_len - q_len + tl.minimum(qb * BM + BM, q_len) - 1
        dk = tl.arange(0, DKP)
        dvv = tl.arange(0, DVP)
        q = tl.load(q_ptr + (q0 + r).to(tl.int64)[:, None] * stride_qt + h * stride_qh + dk[None, :],
                    mask=rmask[:, None] & (dk < DK)[None, :], other=0.0)
        # Keys some query of the tile sees: [lo, hi); keys all of them see: [lo_all, hi_all).
        hi = k_len
        hi_all = k_len
        if CAUSAL:
            hi = p_last + 1
            hi_all = p_first + 1
        lo = hi * 0
        lo_all = lo
        if HAS_WINDOW:
            lo = tl.maximum(lo, p_first - W + 1)
            lo_all = tl.maximum(lo, p_last - W + 1)
        start = lo // BN * BN
        mid_lo = tl.minimum(tl.maximum(tl.cdiv(lo_all, BN) * BN, start), hi)
        mid_hi = tl.maximum(hi_all // BN * BN, mid_lo)
        kv_off = hk * stride_kh
        vv_off = hk * stride_vh
        m = tl.full([BM], -1.0e30, dtype=tl.float32)    # finite: a fully masked tile adds 0
        l = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, DVP], dtype=tl.float32)
        for s0 in range(start, mid_lo, BN):             # the window's first keys (masked)
            m, l, acc = _attend_tile(q, k_ptr, v_ptr, k0, s0, k_len, p, kv_off, vv_off, dk, dvv,
                                     DK, DV, W, stride_kt, stride_vt, qk_scale, m, l, acc, BN,
                                     True, CAUSAL, HAS_WINDOW, SHARED_KV, EXACT)
        for s0 in range(mid_lo, mid_hi, BN):            # seen whole by every query of the tile
            m, l, acc = _attend_tile(q, k_ptr, v_ptr, k0, s0, k_len, p, kv_off, vv_off, dk, dvv,
                                     DK, DV, W, stride_kt, stride_vt, qk_scale, m, l, acc, BN,
                                     False, CAUSAL, HAS_WINDOW, SHARED_KV, EXACT)
        for s0 in range(mid_hi, hi, BN):                # the causal diagonal, the sequence's end
            m, l, acc = _attend_tile(q, k_ptr, v_ptr, k0, s0, k_len, p, kv_off, vv_off, dk, dvv,
                                     DK, DV, W, stride_kt, stride_vt, qk_scale, m, l, acc, BN,
                                     True, CAUSAL, HAS_WINDOW, SHARED_KV, EXACT)
        if HAS_SINKS:
            # The sink as one more softmax column (in logit space: not scaled), log2 domain.
            sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
            m_fin = tl.maximum(m, sink)
            alpha = tl.math.exp2(m - m_fin)
            l = l * alpha + tl.math.exp2(sink - m_fin)
            acc = acc * alpha[:, None]
        out = acc / tl.where(l > 0, l, 1.0)[:, None]     # a query with no key gives 0
        omask = rmask[:, None] & (dvv < DV)[None, :]
        if HAS_GATE:
            g = tl.load(gate_ptr + (q0 + r).to(tl.int64)[:, None] * stride_gt + h * stride_gh
                        + dvv[None, :], mask=omask, other=0.0).to(tl.float32)
            out = out * tl.sigmoid(g)
        tl.store(o_ptr + (q0 + r).to(tl.int64)[:, None] * stride_ot + h * stride_oh + dvv[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=omask)


def _steps(n: int) -> int:
    """Binary-search steps over n sequences (hi - lo halves from n down to 1)."""
    return max(1, (max(n, 1) - 1).bit_length())


# (BM, BN, warps, stages or None for Triton's default) by the padded head dim, per vendor and
# operand width (tuning constants). ("cuda", 2): 16-bit operands, the H200 sweep's best
# (`scripts/bench_attention.py --sweep`, 2026-12-05, docs/kernels.md: 128 x 32 at 8 warps took
# Qwen3.5's 1 x 8k call from 1,685 to 868 us, 64 x 32 V4's 512-wide one from 2,242 to 1,535).
# ("cuda", 4): fp32 operands (exact dots) in tiles whose staged loads fit Hopper's 227 KB of
# shared memory (172-205 KB by the sm_90 compile; 128 x 32 at head dim 256 needs 246 KB and
# failed on the card). "hip": never run on AMD hardware, sized for MI300's 64 KB of LDS (<= 52
# KB by the sm_90 compile's count); fp32 at head dims over 256 does not fit it (see
# attention_supported: the torch impl runs those).
TILES = {
    ("cuda", 2): {64: (64, 64, 4, None), 128: (64, 64, 4, None), 256: (128, 32, 8, None),
                  512: (64, 32, 8, None)},
    ("cuda", 4): {64: (64, 64, 4, None), 128: (64, 64, 4, None), 256: (64, 32, 8, None),
                  512: (32, 16, 8, None)},
    ("hip", 2): {64: (64, 64, 4, None), 128: (64, 64, 4, None), 256: (64, 32, 8, None),
                 512: (16, 32, 4, None)},
    ("hip", 4): {64: (32, 32, 4, 1), 128: (32, 32, 4, 1), 256: (32, 16, 4, 1)},
}


def launch_tile(vendor: str, dkp: int, dvp: int, width: int,
                shared_kv: bool) -> tuple[int, int, int, int | None] | None:
    """TILES' entry for a call, with 2 stages where Triton's default 3-deep staging of the K and
    V tiles (16-bit: q tile + 3 x (K + V) tiles, as the sm_90 compile counts them) would not fit
    CUDA shared memory: Gemma 4's full layers, V != K at head dim 512, need 256 KB at 3 stages
    (out of resource on the H100, nineteenth session), 192 KB at 2. None: no tile fits."""
    tile = TILES[vendor, min(width, 4)].get(max(64, dkp, dvp))
    if tile is None or vendor != "cuda" or width != 2 or tile[3] is not None:
        return tile
    bm, bn, warps, _ = tile
    if (bm * dkp + 3 * bn * (dkp + (0 if shared_kv else dvp))) * width > SHARED_BYTES["sm_90"]:
        return bm, bn, warps, 2
    return tile


def _tiles(dkp: int, dvp: int, width: int, shared_kv: bool) -> tuple[int, int, int, int | None] | None:
    """The tile of a call (None: no tile fits). The interpreter runs 16 x 16 tiles, so the
    small conformance cases cross tile edges and reach all three key loops."""
    if INTERPRET:
        return 16, 16, 4, None
    return launch_tile("hip" if torch.version.hip else "cuda", dkp, dvp, width, shared_kv)


def _check_bounds(cu_q: torch.Tensor, cu_k: torch.Tensor) -> int:
    """Shape checks of the two cu_seqlens (their contents are trusted: reading them is a sync);
    returns N."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if cu.dim() != 1 or cu.numel() < 1 or cu.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"attention (triton): {name} must be a 1-D int32 tensor [N+1], got "
                             f"{cu.dtype} {tuple(cu.shape)}")
    if cu_q.numel() != cu_k.numel():
        raise ValueError(f"attention (triton): cu_seqlens_q has {cu_q.numel() - 1} sequences, "
                         f"cu_seqlens_k {cu_k.numel() - 1}")
    return cu_q.numel() - 1


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, *, scale: float, causal: bool = True,
              window: int | None = None, sinks: torch.Tensor | None = None,
              gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, Dk], k [S, Hkv, Dk], v [S, Hkv, Dv] or None (V = K), cu_seqlens [N+1] on any
    device (a host copy is uploaded without a sync), sinks [Hq], gate [T, Hq, Dv]
    -> [T, Hq, Dv] in q.dtype (see the module docstring)."""
    for name, t, rank in (("q", q, 3), ("k", k, 3), ("v", v, 3)):
        if t is not None and t.dim() != rank:
            raise ValueError(f"attention (triton): {name} must have rank {rank}, got {tuple(t.shape)}")
    shared = v is None
    v = k if shared else v
    if v.shape[:2] != k.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(f"attention (triton): q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} do not fit [T, Hq, Dk], [S, Hkv, Dk], [S, Hkv, Dv]")
    t_len, hq, dk = q.shape
    dv = v.shape[2]
    g = check_heads(hq, k.shape[1], "attention")
    check_extras("attention", hq, (t_len, hq, dv), window, sinks, gate)
    if window is not None and not causal:
        raise ValueError("attention: window is only defined for causal attention")
    n = _check_bounds(cu_seqlens_q, cu_seqlens_k)
    out = torch.empty(t_len, hq, dv, dtype=q.dtype, device=q.device)
    if t_len == 0 or n == 0:
        return out.zero_()
    # Strided views are fine as long as the head dim is contiguous (q / k / v come as slices
    # of a projection's output).
    q, k, v = (x if x.stride(2) == 1 else x.contiguous() for x in (q, k, v))
    if gate is not None and gate.stride(2) != 1:
        gate = gate.contiguous()
    native = q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype == v.dtype
    exact = not native or INTERPRET      # the interpreter multiplies 16-bit floats wrongly
    dkp, dvp = max(16, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
    tile = _tiles(dkp, dvp, 2 if native else 4, shared)
    if tile is None:
        raise ValueError(f"attention (triton): no tile for head dims {dk} / {dv} with "
                         f"{q.dtype} operands on this device")
    bm, bn, warps, stages = tile
    cu_q, cu_k = to_device(cu_seqlens_q, q.device), to_device(cu_seqlens_k, q.device)
    gate_arg = gate if gate is not None else q
    _varlen_attn_kernel[(t_len // bm + n, hq)](
        q, k, v, gate_arg, sinks if sinks is not None else q, cu_q, cu_k, out,
        n, g, dk, dv, window or 0, float(scale) * _LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        gate_arg.stride(0), gate_arg.stride(1), out.stride(0), out.stride(1),
        STEPS=_steps(n), BM=bm, BN=bn, DKP=dkp, DVP=dvp, CAUSAL=bool(causal),
        HAS_WINDOW=window is not None, HAS_SINKS=sinks is not None, HAS_GATE=gate is not None,
        SHARED_KV=shared, EXACT=exact, num_warps=warps, **({} if stages is None else {"num_stages": stages}))
    return out


def attention_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None,
                        *args, **_: object) -> str | None:
    """Per-call check: one program holds a [BM, Dk] query tile and a [BM, Dv] fp32 accumulator
    (head dims up to 512: DeepSeek-V4's latent head) in a tile that fits the device (TILES)."""
    if q.dim() != 3 or k.dim() != 3 or (v is not None and v.dim() != 3):
        return "q, k, v must be [T, H, D]"
    dv = (v if v is not None else k).shape[-1]
    if q.shape[-1] > 512 or dv > 512:
        return f"head dims up to 512 (q {tuple(q.shape)}, v head dim {dv})"
    native = q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype and \
        (v is None or v.dtype == q.dtype)
    dkp, dvp = max(16, triton.next_power_of_2(q.shape[-1])), max(16, triton.next_power_of_2(dv))
    if _tiles(dkp, dvp, 2 if native else 4, v is None) is None:
        return f"no tile for head dims {q.shape[-1]} / {dv} with {q.dtype} operands on this device"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    def spec(label, dtype, dkp, dvp, causal, window, sinks, gate, shared, vendor="cuda"):
        bm, bn, warps, stages = launch_tile(vendor, dkp, dvp, 4 if dtype == "fp32" else 2, shared)
        sig = {**{p: f"*{dtype}" for p in ("q_ptr", "k_ptr", "v_ptr", "gate_ptr")},
               "sinks_ptr": "*fp32", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "o_ptr": f"*{dtype}",
               **{a: "i32" for a in ("N", "G", "DK", "DV", "W")}, "qk_scale": "fp32",
               **{a: "i32" for a in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt",
                                     "stride_vh", "stride_gt", "stride_gh", "stride_ot", "stride_oh")},
               **{a: "constexpr" for a in ("STEPS", "BM", "BN", "DKP", "DVP", "CAUSAL", "HAS_WINDOW",
                                           "HAS_SINKS", "HAS_GATE", "SHARED_KV", "EXACT")}}
        return AotSpec(f"varlen_attention[{dtype},{label},{vendor}]", _varlen_attn_kernel, sig,
                       {"STEPS": 5, "BM": bm, "BN": bn, "DKP": dkp, "DVP": dvp, "CAUSAL": causal,
                        "HAS_WINDOW": window, "HAS_SINKS": sinks, "HAS_GATE": gate,
                        "SHARED_KV": shared, "EXACT": dtype == "fp32"},
                       {"num_warps": warps, **({} if stages is None else {"num_stages": stages})},
                       targets=("gfx942", "gfx950") if vendor == "hip" else ("sm_90", "sm_100"),
                       check_shared=True)

    return [spec("qwen3.5_gated_256", "bf16", 256, 256, True, False, False, True, False),
            spec("gemma4_sliding_256", "bf16", 256, 256, True, True, False, False, False),
            spec("gemma4_full_512", "bf16", 512, 512, True, False, False, False, False),
            spec("dsv4_swa_sinks_512", "bf16", 512, 512, True, True, True, False, True),
            spec("hy4_sinks_gate_256", "bf16", 256, 256, True, False, True, True, False),
            spec("kimi_mla_192_128", "bf16", 256, 128, True, False, False, False, False),
            spec("minimax_gqa_128", "fp16", 128, 128, True, False, False, False, False),
            spec("vision_noncausal_64", "bf16", 64, 64, False, False, False, False, False),
            spec("kimi_mla_192_128", "fp32", 256, 128, True, False, False, False, False),
            spec("dsv4_swa_sinks_512", "fp32", 512, 512, True, True, True, False, True)] + [
        spec(label, dtype, dkp, dvp, *flags, vendor="hip")
        for label, dtype, dkp, dvp, flags in (
            ("qwen3.5_gated_256", "bf16", 256, 256, (True, False, False, True, False)),
            ("dsv4_swa_sinks_512", "bf16", 512, 512, (True, True, True, False, True)),
            ("gemma4_full_512", "bf16", 512, 512, (True, False, False, False, False)),
            ("minimax_gqa_128", "fp16", 128, 128, (True, False, False, False, False)),
            ("kimi_mla_192_128", "fp32", 256, 128, (True, False, False, False, False)))]


AOT_SPECS = _aot_specs()
