"""Triton paged-KV decode attention (contract: :func:`hwinfer.ops.attention_paged.paged_attention`).

Flash decoding without host syncs (the decode step is captured in a CUDA graph):

* ``_paged_split_kernel``, grid (B * Hkv * row blocks, splits): one program takes one sequence,
  one kv head, BLOCK_M of its (query head, new token) rows (the G = Hq/Hkv heads x Sq tokens, so
  every K/V row is read once per kv head) and one fixed-size range of key positions. seq_lens
  and block_table are read on the device only; a split that lies wholly past the sequence's end
  (or before its window) returns at once and writes nothing (the combine never reads it).
  Keys are gathered token by token through the block table (any block size), with the load
  masked to the visible range [first window position, L): table entries outside it are never
  dereferenced and unwritten (NaN) slots load as 0 and get a -inf logit before the softmax.
  Causality among the Sq new tokens and the window are applied per row. Softmax online, fp32,
  log2 domain. With one split the program finishes the rows itself (sinks, normalisation,
  sigmoid gate, cast); otherwise it writes fp32 partials (max, sum, unnormalised acc).
* ``_paged_combine_kernel``, grid (B * Hkv * row blocks, Dv column blocks): merges the splits
  that the sequence's own length makes live (recomputed from seq_lens), then sinks, gate, cast.
  With ``COMBINE_IN_SPLIT`` the split kernel does this itself: each live split takes a ticket
  after storing its partials, and the last one merges them (no second launch).

The number of splits depends on shapes only (block_table.shape[1] * block_size is the longest
possible sequence), so one graph capture serves every length; each sequence's visible keys are
shared among the splits on the device (``_split_span``), so a short sequence in a graph sized
for long ones still runs on many programs. Dot precision as in
sparse_mla.py: fp32 right after the load; bf16/fp16 dots on a GPU when q and the cache share
that dtype, fp32 ("ieee") dots otherwise and in the interpreter.
"""
from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton import num_sms
from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok
from hwinfer.kernels.triton.resting import last_arrival, resting_words

_LOG2E = 1.4426950408889634
MAX_SPLITS = 32
# Warps of the split kernel (None: 8 for head dims >= 256 or wide row blocks, else 4) and of the
# combine kernel: tuning constants, timed in a decode step by scripts/bench_ablation.py
# (docs/kernels.md, eleventh session).
SPLIT_WARPS: int | None = None
COMBINE_WARPS = 4
# Whether the split kernel's last live split of each row block merges the partials itself (a
# ticket per row block, .resting) in place of the combine kernel: one launch fewer per call.
# Off until timed on a card (scripts/device_issue6.sh s36a).
COMBINE_IN_SPLIT = False


@triton.jit
def _seq_bounds(seq_ptr, b, SQ, W, HAS_WINDOW: tl.constexpr):
    """(lo, L): the key positions some query of sequence b can see."""
    L = tl.load(seq_ptr + b).to(tl.int32)
    lo = tl.maximum(L * 0, L - SQ - W + 1) if HAS_WINDOW else L * 0
    return lo, L


@triton.jit
def _split_span(lo, L, SPLIT, NSPLIT, BLOCK_N: tl.constexpr):
    """Keys per split of sequence b: its visible range [lo, L) shared by the NSPLIT splits in
    whole BLOCK_N tiles, at least SPLIT. Read from the device, so a graph captured for the
    longest sequence still spreads a short one over many programs."""
    per = tl.cdiv(tl.cdiv(L - lo, NSPLIT), BLOCK_N) * BLOCK_N
    return tl.maximum(per, SPLIT)


@triton.jit
def _finish(acc, m, l, rows, row_ok, cols, b, hkv, G, SQ, DV, sink_ptr, gate_ptr, out_ptr,
            stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh,
            HAS_SINK: tl.constexpr, HAS_GATE: tl.constexpr):
    """out[b, j, head, cols] = sigmoid(gate) * acc / (l + exp(sink)), rows r = g * SQ + j."""
    g = rows // SQ
    j = rows % SQ
    head = hkv * G + g
    big = m
    if HAS_SINK:
        sink = tl.load(sink_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        big = tl.maximum(m, sink)
    w = tl.exp2(m - big)
    denom = l * w
    if HAS_SINK:
        denom += tl.exp2(sink - big)
    f = tl.where(denom > 0, w / tl.where(denom > 0, denom, 1.0), 0.0)
    o = acc * f[:, None]
    cmask = row_ok[:, None] & (cols < DV)[None, :]
    b64 = b.to(tl.int64)
    if HAS_GATE:
        gp = gate_ptr + b64 * stride_gb + j[:, None] * stride_gq + head[:, None] * stride_gh + cols[None, :]
        gt = tl.load(gp, mask=cmask, other=0.0).to(tl.float32)
        o = o / (1.0 + tl.exp(-gt))
    op = out_ptr + b64 * stride_ob + j[:, None] * stride_oq + head[:, None] * stride_oh + cols[None, :]
    tl.store(op, o.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _merge_splits(pm_ptr, pl_ptr, pacc_ptr, pid, NSPLIT, live, row_ok, cols, DV,
                  BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """(acc [BLOCK_M, BLOCK_C], max, sum) of row block ``pid`` merged over its first ``live``
    splits' partials (columns ``cols``), in split order. Loaded past L1 (``.cg``): in the split
    kernel's merge other SMs wrote them during this launch."""
    big = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    for sp in range(0, live):
        prow = (pid.to(tl.int64) * NSPLIT + sp) * BLOCK_M + tl.arange(0, BLOCK_M)
        mi = tl.load(pm_ptr + prow, cache_modifier=".cg")
        li = tl.load(pl_ptr + prow, cache_modifier=".cg")
        ai = tl.load(pacc_ptr + prow[:, None] * DV + cols[None, :],
                     mask=row_ok[:, None] & (cols < DV)[None, :], other=0.0, cache_modifier=".cg")
        new = tl.maximum(big, mi)
        a = tl.exp2(big - new)
        c = tl.exp2(mi - new)
        l = l * a + li * c
        acc = acc * a[:, None] + ai * c[:, None]
        big = new
    return acc, big, l


@triton.jit
def _paged_split_kernel(
        q_ptr, k_ptr, v_ptr, table_ptr, seq_ptr, sink_ptr, gate_ptr, out_ptr,
        pm_ptr, pl_ptr, pacc_ptr, ticket_ptr,
        HKV, G, SQ, DK, DV, BLOCK_SIZE, W, SPLIT, N_MB, qk_scale,
        stride_qb, stride_qq, stride_qh, stride_kb, stride_kt, stride_kh,
        stride_vb, stride_vt, stride_vh, stride_tb,
        stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
        SHARED_KV: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SINK: tl.constexpr,
        HAS_GATE: tl.constexpr, SINGLE: tl.constexpr, LOWP: tl.constexpr, COMBINE: tl.constexpr,
        PDL: tl.constexpr):
    pdl_enter(PDL)  # q and the new token's K/V come from the kernel just before
    pid = tl.program_id(0)
    sp = tl.program_id(1)
    nsplit = tl.num_programs(1)
    mb = pid % N_MB
    hkv = (pid // N_MB) % HKV
    b = pid // (N_MB * HKV)
    lo, L = _seq_bounds(seq_ptr, b, SQ, W, HAS_WINDOW)
    span = _split_span(lo, L, SPLIT, nsplit, BLOCK_N)
    start = lo + sp * span
    end = tl.minimum(L, start + span)
    if start >= end:
        if COMBINE and sp == 0:  # no key visible at all (L <= lo): no split takes a ticket
            zrows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
            _finish(tl.zeros((BLOCK_M, BDV), tl.float32), tl.full((BLOCK_M,), -1.0e30, tl.float32),
                    tl.zeros((BLOCK_M,), tl.float32), zrows, zrows < G * SQ, tl.arange(0, BDV),
                    b, hkv, G, SQ, DV,
                    sink_ptr, gate_ptr, out_ptr, stride_gb, stride_gq, stride_gh, stride_ob,
                    stride_oq, stride_oh, HAS_SINK, HAS_GATE)
        return  # nothing visible here; the combine skips this split

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < G * SQ
    g = rows // SQ
    j = rows % SQ
    head = hkv * G + g
    qpos = L - SQ + j  # absolute position of each row's query
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    b64 = b.to(tl.int64)
    qp = q_ptr + b64 * stride_qb + j[:, None] * stride_qq + head[:, None] * stride_qh + dk[None, :]
    q = tl.load(qp, mask=row_ok[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
    if LOWP:
        q = q.to(k_ptr.dtype.element_ty)

    m = tl.full((BLOCK_M,), -1.0e30, tl.float32)  # finite: exp2(m - m) = 1, never NaN
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BDV), tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for p0 in range(start, end, BLOCK_N):
        pos = p0 + offs_n
        ok = pos < end  # start >= lo: entries before the window are never read
        blk = tl.load(table_ptr + b64 * stride_tb + pos // BLOCK_SIZE, mask=ok, other=0)
        slot = tl.where(ok, blk, 0).to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_kt
        kp = k_ptr + slot[:, None] + hkv * stride_kh + dk[None, :]
        kt = tl.load(kp, mask=ok[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)
        if LOWP:
            kt = kt.to(k_ptr.dtype.element_ty)
        s = tl.dot(q, tl.trans(kt), input_precision="ieee") * qk_scale
        vis = ok[None, :] & (pos[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            vis = vis & (pos[None, :] > qpos[:, None] - W)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if SHARED_KV:
            vt = kt
        else:
            vslot = tl.where(ok, blk, 0).to(tl.int64) * stride_vb + (pos % BLOCK_SIZE) * stride_vt
            vp = v_ptr + vslot[:, None] + hkv * stride_vh + dv[None, :]
            vt = tl.load(vp, mask=ok[:, None] & (dv < DV)[None, :], other=0.0).to(tl.float32)
            if LOWP:
                vt = vt.to(v_ptr.dtype.element_ty)
        if LOWP:
            p = p.to(v_ptr.dtype.element_ty)
        acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
        m = m_new

    if SINGLE:
        _finish(acc, m, l, rows, row_ok, dv, b, hkv, G, SQ, DV, sink_ptr, gate_ptr, out_ptr,
                stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh,
                HAS_SINK, HAS_GATE)
    else:
        # partials: m, l [P, nsplit, BLOCK_M]; acc [P, nsplit, BLOCK_M, DV] (fp32)
        prow = (pid.to(tl.int64) * nsplit + sp) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(pm_ptr + prow, m)
        tl.store(pl_ptr + prow, l)
        tl.store(pacc_ptr + prow[:, None] * DV + dv[None, :], acc,
                 mask=row_ok[:, None] & (dv < DV)[None, :])  # padding rows: never read
        if COMBINE:
            # The live splits' last to arrive merges them (no combine kernel).
            live = tl.minimum(nsplit, tl.cdiv(L - lo, span))
            if last_arrival(ticket_ptr + pid, live):
                acc, m, l = _merge_splits(pm_ptr, pl_ptr, pacc_ptr, pid, nsplit, live, row_ok,
                                          dv, DV, BLOCK_M, BDV)
                _finish(acc, m, l, rows, row_ok, dv, b, hkv, G, SQ, DV, sink_ptr, gate_ptr,
                        out_ptr, stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh,
                        HAS_SINK, HAS_GATE)


@triton.jit
def _paged_combine_kernel(pm_ptr, pl_ptr, pacc_ptr, seq_ptr, sink_ptr, gate_ptr, out_ptr,
                          HKV, G, SQ, DV, W, SPLIT, N_MB, NSPLIT,
                          stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                          HAS_WINDOW: tl.constexpr, HAS_SINK: tl.constexpr, HAS_GATE: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    cb = tl.program_id(1)
    mb = pid % N_MB
    hkv = (pid // N_MB) % HKV
    b = pid // (N_MB * HKV)
    lo, L = _seq_bounds(seq_ptr, b, SQ, W, HAS_WINDOW)
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < G * SQ
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    # only the splits the split kernel wrote: those meeting [lo, L)
    span = _split_span(lo, L, SPLIT, NSPLIT, BLOCK_N)
    acc, big, l = _merge_splits(pm_ptr, pl_ptr, pacc_ptr, pid, NSPLIT,
                                tl.minimum(NSPLIT, tl.cdiv(L - lo, span)), row_ok, cols, DV,
                                BLOCK_M, BLOCK_C)
    _finish(acc, big, l, rows, row_ok, cols, b, hkv, G, SQ, DV, sink_ptr, gate_ptr, out_ptr,
            stride_gb, stride_gq, stride_gh, stride_ob, stride_oq, stride_oh, HAS_SINK, HAS_GATE)


def _num_sms(device: torch.device) -> int:
    return num_sms(device, 4)  # interpreter: small grids that still take the split + combine path


def _plan(b: int, hkv: int, rows: int, bdk: int, bdv: int, capacity: int, device: torch.device,
          lowp: bool, block_m: int | None, block_n: int | None, split: int | None):
    """(BLOCK_M, row blocks, BLOCK_N, fewest keys per split, splits): from shapes only, never
    from data (the kernels share each sequence's visible keys among the splits themselves)."""
    width = max(bdk, bdv)
    cap = max(16, (16384 if lowp else 8192) // width)  # [BLOCK_M, D] fp32 acc stays in registers
    bm = block_m or max(16, min(cap, triton.next_power_of_2(rows)))
    n_mb = triton.cdiv(rows, bm)
    bn = block_n or ((32 if width >= 512 else 64) if lowp  # fp32: fit MI300's 64 KB LDS
                     else (16 if width >= 256 else 32))
    if split is not None:  # a fixed split size: as many splits as the capacity needs
        split = max(bn, triton.cdiv(split, bn) * bn)
        return bm, n_mb, bn, split, max(1, triton.cdiv(capacity, split))
    # ~4 programs per SM over the batch's kv heads, each at least one tile of keys, and at most
    # MAX_SPLITS: the combine walks the splits one by one (H200, Qwen3.5 shapes as graph
    # replays, docs/kernels.md: B=1 x 8k keys took 69 us as 128 splits, 31 us as 32).
    want = max(1, min(MAX_SPLITS, (4 * _num_sms(device)) // (b * hkv * n_mb)))
    return bm, n_mb, bn, bn, max(1, min(want, triton.cdiv(capacity, bn)))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                    block_table: torch.Tensor, seq_lens: torch.Tensor, *, scale: float,
                    window: int | None = None, sinks: torch.Tensor | None = None,
                    gate: torch.Tensor | None = None, block_m: int | None = None,
                    block_n: int | None = None, split: int | None = None,
                    num_warps: int | None = None, num_stages: int = 2) -> torch.Tensor:
    """Triton paged attention: q [B, Sq, Hq, Dk], k_cache [blocks, bs, Hkv, Dk], v_cache
    [blocks, bs, Hkv, Dv] or None, block_table [B, max_blocks], seq_lens [B] -> [B, Sq, Hq, Dv].

    No host sync: seq_lens / block_table contents are trusted and read by the kernels only.
    Tuning (None = heuristic): block_m rows per program, block_n keys per step, split: a fixed
    number of keys per program (a multiple of block_n; one split = no combine kernel; None: the
    splits share each sequence's length, ~4 programs per SM), num_warps / num_stages.
    """
    bsz, sq, hq, dk = q.shape
    _, block_size, hkv, _ = k_cache.shape
    shared = v_cache is None
    vc = k_cache if shared else v_cache
    dv = vc.shape[3]
    if (block_table.shape[0] != bsz or seq_lens.shape[0] != bsz or hq % hkv or k_cache.shape[3] != dk
            or vc.shape[:3] != k_cache.shape[:3]
            or (gate is not None and tuple(gate.shape) != (bsz, sq, hq, dv))):
        raise ValueError(f"paged_attention: inconsistent shapes q {tuple(q.shape)}, caches "
                         f"{tuple(k_cache.shape)} / {tuple(vc.shape)}, block_table "
                         f"{tuple(block_table.shape)}, seq_lens {tuple(seq_lens.shape)}")
    out = torch.empty((bsz, sq, hq, dv), dtype=q.dtype, device=q.device)
    if bsz == 0 or sq == 0 or block_table.shape[1] == 0:
        return out.zero_()
    group = hq // hkv
    rows = group * sq
    bdk, bdv = max(16, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
    interp = q.device.type == "cpu"
    lowp = (not interp and q.dtype == k_cache.dtype == vc.dtype
            and q.dtype in (torch.bfloat16, torch.float16))
    capacity = block_table.shape[1] * block_size
    bm, n_mb, bn, split, nsplit = _plan(bsz, hkv, rows, bdk, bdv, capacity, q.device, lowp,
                                        block_m, block_n, split)
    # 8 warps from head dim 256 (Qwen3.5's decode step 10-11 us faster at b=1 and 32 than with 4
    # in paired rounds on the H200, docs/kernels.md), for wide row blocks, else 4.
    warps = num_warps or SPLIT_WARPS or (8 if max(bdk, bdv) >= 256 or bm * max(bdk, bdv) >= 8192 else 4)
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    sink = sinks.contiguous() if sinks is not None else out
    gt = gate if gate is not None else out
    f32 = dict(dtype=torch.float32, device=q.device)
    p0 = bsz * hkv * n_mb
    pm, pl, pacc = (torch.empty((p0, nsplit, bm), **f32), torch.empty((p0, nsplit, bm), **f32),
                    torch.empty((p0, nsplit, bm, dv), **f32)) if nsplit > 1 else (out, out, out)
    w = int(window) if window is not None else 0
    fused = nsplit > 1 and COMBINE_IN_SPLIT
    tickets = resting_words("paged_attention", p0, q.device, ((torch.int32, 0),))[0] if fused else out
    _paged_split_kernel[(p0, nsplit)](
        q, k_cache, vc, table, seq_lens, sink, gt, out, pm, pl, pacc, tickets,
        hkv, group, sq, dk, dv, block_size, w, split, n_mb, scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), table.stride(0),
        gt.stride(0), gt.stride(1), gt.stride(2), out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=bm, BLOCK_N=bn, BDK=bdk, BDV=bdv, SHARED_KV=shared, HAS_WINDOW=window is not None,
        HAS_SINK=sinks is not None, HAS_GATE=gate is not None, SINGLE=nsplit == 1, LOWP=lowp,
        COMBINE=fused, num_warps=warps, num_stages=num_stages, PDL=pdl_ok(q.device),
        **launch_kwargs(q.device))
    if nsplit > 1 and not fused:
        bc = min(128, bdv)
        _paged_combine_kernel[(p0, triton.cdiv(dv, bc))](
            pm, pl, pacc, seq_lens, sink, gt, out, hkv, group, sq, dv, w, split, n_mb, nsplit,
            gt.stride(0), gt.stride(1), gt.stride(2), out.stride(0), out.stride(1), out.stride(2),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_C=bc, HAS_WINDOW=window is not None, HAS_SINK=sinks is not None,
            HAS_GATE=gate is not None, num_warps=COMBINE_WARPS, PDL=pdl_ok(q.device),
            **launch_kwargs(q.device))
    return out


def paged_attention_supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None,
                              block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                              window: int | None = None, sinks: torch.Tensor | None = None,
                              gate: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check (shapes and dtypes only, no sync): refuse what the kernel does not cover."""
    if q.dim() != 4 or k_cache.dim() != 4 or (v_cache is not None and v_cache.dim() != 4):
        return "expects q [B, Sq, Hq, D], caches [blocks, block_size, Hkv, D]"
    if block_table.dim() != 2 or seq_lens.dim() != 1:
        return "expects block_table [B, max_blocks] and seq_lens [B]"
    if block_table.dtype not in (torch.int32, torch.int64) or seq_lens.dtype not in (torch.int32, torch.int64):
        return "block_table and seq_lens must be int32 or int64"
    floats = (torch.float32, torch.bfloat16, torch.float16)
    caches = [k_cache] + ([v_cache] if v_cache is not None else [])
    if q.dtype not in floats or any(c.dtype not in floats for c in caches):
        return f"dtypes q {q.dtype} / cache {k_cache.dtype} not supported"
    if v_cache is not None and v_cache.dtype != k_cache.dtype:
        return "k_cache and v_cache dtypes differ"
    for c in caches:
        d = c.shape[3]
        if d > 576:  # other widths are padded to a power of two (masked loads)
            return f"head dim {d} > 576"
        if c.stride(3) != 1:
            return "cache head dim must be contiguous"
    if q.shape[3] != k_cache.shape[3] or k_cache.shape[2] == 0 or q.shape[2] % k_cache.shape[2]:
        return "q / k_cache head shapes do not match"
    if q.shape[1] > 16:
        return f"Sq={q.shape[1]} > 16"
    if q.stride(3) != 1 or (gate is not None and gate.stride(3) != 1):
        return "q and gate head dim must be contiguous"
    return "window must be >= 1" if window is not None and window < 1 else None


def _sig(kernel, ptrs: dict[str, str]) -> dict[str, str]:
    """Triton signature of ``kernel``: pointers per ``ptrs`` (else *fp32), other scalars i32."""
    return {n: "constexpr" if "constexpr" in str(p.annotation) else
            ptrs.get(n, "*fp32") if n.endswith("_ptr") else ("fp32" if n == "qk_scale" else "i32")
            for n, p in inspect.signature(kernel.fn).parameters.items()}


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    # Qwen3.5 (D 256, G 4, gate, split and single), Gemma 4 global (D 512, K = V), DSV4-like SWA
    for name, dt, d, shared, gate, window_sink, single, bm in (
            ("qwen35", "bf16", 256, False, True, False, False, 16),
            ("qwen35_single", "bf16", 256, False, True, False, True, 16),
            ("qwen35_mtp", "bf16", 256, False, True, False, False, 64),
            ("gemma4_d512", "bf16", 512, True, False, False, False, 16),
            ("swa_sinks", "bf16", 256, False, False, True, False, 16),
            ("fp32", "fp32", 256, False, False, False, True, 16)):
        sig = _sig(_paged_split_kernel, {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}",
                                         "gate_ptr": f"*{dt}", "out_ptr": f"*{dt}",
                                         "table_ptr": "*i32", "seq_ptr": "*i32"})
        const = {"BLOCK_M": bm, "BLOCK_N": 16 if dt == "fp32" else 32 if d >= 512 else 64,
                 "BDK": d, "BDV": d,
                 "SHARED_KV": shared, "HAS_WINDOW": window_sink, "HAS_SINK": window_sink,
                 "HAS_GATE": gate, "SINGLE": single, "LOWP": dt != "fp32", "COMBINE": False,
                 "PDL": False}
        specs.append(AotSpec(f"paged_split[{name}]", _paged_split_kernel, sig, const,
                             {"num_warps": 8 if d >= 256 else 4, "num_stages": 2}))
        if name == "qwen35":  # the launch the decode step makes on sm_90+ (PDL)
            specs.append(AotSpec("paged_split[qwen35,pdl]", _paged_split_kernel, sig,
                                 {**const, "PDL": True}, {"num_warps": 8, "num_stages": 2},
                                 ("sm_90", "sm_100")))
            specs.append(AotSpec("paged_split[qwen35,combine in split]", _paged_split_kernel,
                                 {**sig, "ticket_ptr": "*i32"}, {**const, "COMBINE": True},
                                 {"num_warps": 8, "num_stages": 2}))
    specs.append(AotSpec("paged_combine[bf16,gate]", _paged_combine_kernel,
                         _sig(_paged_combine_kernel, {"out_ptr": "*bf16", "gate_ptr": "*bf16",
                                                      "seq_ptr": "*i32"}),
                         {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_C": 128, "HAS_WINDOW": False, "HAS_SINK": False,
                          "HAS_GATE": True, "PDL": False}))
    return specs


AOT_SPECS = _aot_specs()
