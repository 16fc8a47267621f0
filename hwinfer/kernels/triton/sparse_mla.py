"""Triton sparse MLA (contracts: :func:`hwinfer.ops.sparse_mla.sparse_mla_decode` and
:func:`hwinfer.ops.sparse_mla.sparse_mla_prefill`).

Split-K flash decoding over one shared latent K=V head:

* ``_sparse_mla_split_kernel``, grid (head blocks x value tiles, splits, tokens): one program
  takes one query token, BLOCK_H of its heads (by default ALL of them, so each gathered row is
  used by every head of the program), one BLOCK_V-wide tile of the output channels and one range
  of the token's index list (the main list, then the ``extra`` list, as one concatenated range).
  Logits need the whole row (QK over D), values only the program's tile: with NV = dv / BLOCK_V
  value tiles, the NV programs of one (token, split) are adjacent in the grid and read the same
  rows, so only the first read comes from HBM and the others hit L2; they cost NV x the QK
  MMAs. NV = 1 keeps the [H, dv] fp32 accumulator in one program (no recompute, most
  registers). -1 entries are masked. The softmax runs online in fp32 in the log2 domain. With
  one split the program finishes the token itself (sink column, normalisation, inverse RoPE,
  cast); otherwise it writes its partial (max, sum, unnormalised acc) in fp32.
* ``_sparse_mla_merge_kernel``, grid (head blocks, column blocks, tokens): rescales and sums the
  partials, adds the sink column, normalises, applies the inverse RoPE, casts.

Prefill is the same kernel with the [N, D] rows as a one-block cache and one split.

The inverse RoPE is done in the kernels (no extra pass over the output): pairs (2i, 2i+1) are
swapped in registers with reshape/split/join, so it needs an even v_dim (the per-call check
refuses odd ones). D that is not a power of two is split as BD1 (largest power of two <= D)
+ BD2 (the rest, padded to a power of two >= 16): 576 -> 512 + 64, 160 -> 128 + 32.

Dot precision: everything is upcast to fp32 right after the load (the interpreter computes bf16
math wrongly). On a GPU with bf16/fp16 inputs the dot operands are cast back to the input type
(exact for q and kv; p is rounded, as in every flash kernel) so the MMAs run at bf16 rate; fp32
inputs and the interpreter use fp32 dots with input_precision="ieee".

Tuning defaults live in ``DECODE_TUNING`` / ``PREFILL_TUNING`` per vendor ("cuda", "hip"); the
wrappers' keyword arguments override them per call (scripts/bench_sparse_mla.py --sweep).
"""
from __future__ import annotations

import os

import torch
import triton

from hwinfer.kernels.triton import num_sms, nvidia_capability
from hwinfer.kernels.triton.sparse_mla_kernels import _dims, _sparse_mla_merge_kernel, _sparse_mla_split_kernel
from hwinfer.ops.sparse_mla import check_packed_caches

_LOG2E = 1.4426950408889634

# Per-vendor defaults. block_v: output channels per program (None = all of v_dim -> NV = 1);
# acc_budget caps block_h * block_v (the fp32 accumulator); waves: target programs / SMs when
# picking the number of splits; min_rows: fewest index rows per split (a split writes an
# [H, dv] fp32 partial, so short splits cost more than they gain).
# "cuda" is the H200 sweep's best (scripts/bench_sparse_mla.py --sweep-focused, docs/kernels.md):
# all 64 heads x all 512 channels per program (each gathered row read once, QK not recomputed),
# 64-row chunks (222 KB of shared memory: Hopper's 227 KB fits it, smaller parts need block_k
# 32), up to two programs per SM but at least 256 rows a split (fewer, longer splits won at
# B = 32 and 128; only a B = 1 CSA call, 640 rows, lost: 31 us against 19 with 128-row splits).
# "hip" is untuned (never run on AMD hardware).
DECODE_TUNING = {
    "cuda": dict(block_v=512, block_k=64, acc_budget=32768, num_warps=8, num_stages=2, waves=2.0,
                 min_rows=256),
    "hip": dict(block_v=256, block_k=32, acc_budget=16384, num_warps=8, num_stages=2, waves=1.0,
                min_rows=256),
}
# Packed (fp8_ds_mla) caches: the uint8 rows are staged besides the decoded bf16 tile, so the
# CUDA default's two stages need 246 KB of shared memory (over Hopper's 227 KB): one stage.
PACKED_DECODE_TUNING = {"cuda": dict(num_stages=1), "hip": {}}
# The warp-specialised Gluon decode (:mod:`.sparse_mla_ws`) for the calls it covers: None = by
# device (NVIDIA sm_90, where a card validated and timed it), True / False force it (so does a
# call's ``ws=`` keyword); ``HWINFER_SPARSE_MLA_WS=1`` / ``0`` (read at import) sets it.
WS_DECODE: bool | None = {"1": True, "0": False}.get(os.environ.get("HWINFER_SPARSE_MLA_WS", ""))
# Its packed-cache form (:mod:`.sparse_mla_ws_fp8`), the same way (H100, 24th session: V4 HCA
# B = 128 over fp8_ds_mla rows 1,314 -> 471 us; card test and strict conformance passed);
# ``HWINFER_SPARSE_MLA_WS_FP8=1`` / ``0`` sets it.
WS_FP8_DECODE: bool | None = {"1": True, "0": False}.get(
    os.environ.get("HWINFER_SPARSE_MLA_WS_FP8", ""))
PREFILL_TUNING = {
    "cuda": dict(block_v=512, block_k=64, acc_budget=32768, num_warps=8, num_stages=2),
    "hip": dict(block_v=256, block_k=32, acc_budget=16384, num_warps=8, num_stages=2),
}


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _num_sms(device: torch.device) -> int:
    return num_sms(device, 8)  # interpreter: small grids that still take the split + merge path


def _native_fp8(device: torch.device) -> bool:
    """Whether the e4m3 bytes of packed caches convert with the GPU's own instruction (NVIDIA
    sm_89+; AMD's fp8 types differ, the interpreter has none: both decode with integer ops)."""
    return device.type == "cuda" and not torch.version.hip and \
        torch.cuda.get_device_capability(device) >= (8, 9)


def _tuning(table: dict, device: torch.device, overrides: dict, packed: bool = False) -> dict:
    vendor = "hip" if torch.version.hip else "cuda"
    tune = dict(table[vendor])
    if packed:
        tune.update(PACKED_DECODE_TUNING[vendor])
    tune.update({k: v for k, v in overrides.items() if v is not None})
    return tune


def _launch(q3, kv, stride_kv, idx, kv2, stride_kv2, idx2, k2, sinks, out_rope, o3, scale, tune,
            num_splits):
    """Launch split (+ merge) for q3 [t, H, D] -> o3 [t, H, dv]; idx [t, K1], idx2 [t, K2]."""
    t, h, d = q3.shape
    dv = o3.shape[-1]
    k1 = idx.shape[1]
    interp = q3.device.type == "cpu"
    bd1, bd2, tail = _dims(d)
    wide = 2 if q3.dtype == torch.float32 else 1  # fp32 operands: twice the bytes per element
    bk = max(16, tune["block_k"] // wide) if not interp else 16
    packed = kv.dtype == torch.uint8
    # packed rows decode 64-channel scale groups: value tiles of at least one group
    bv = max(64 if packed else 16, min(tune["block_v"] or 1 << 30, triton.next_power_of_2(dv)))
    nv = triton.cdiv(dv, bv)
    # fp32 accumulator [BH, BV] capped at acc_budget (halved with fp32 operands, as block_k is)
    budget = tune["acc_budget"] // wide
    bh = tune.get("block_h") or max(16, min(triton.next_power_of_2(h), budget // bv))
    n_hb = triton.cdiv(h, bh)
    rows = k1 + k2
    chunks = max(1, triton.cdiv(rows, bk))
    if num_splits is None:
        progs = t * n_hb * nv
        want = triton.cdiv(int(tune.get("waves", 1.0) * _num_sms(q3.device)), progs)
        min_rows = bk if interp else tune.get("min_rows", 256)  # the interpreter tests the merge
        num_splits = max(1, min(want, rows // max(1, min_rows)))
    cps = triton.cdiv(chunks, max(1, min(num_splits, chunks)))
    nsplit = triton.cdiv(chunks, cps)
    has_rope = out_rope is not None
    sink, cos, sin, rope_start, stride_cs = _finish_args(sinks, out_rope, o3)
    f32 = dict(dtype=torch.float32, device=q3.device)
    pm, pl, pacc = (torch.empty((t, nsplit, h), **f32), torch.empty((t, nsplit, h), **f32),
                    torch.empty((t, nsplit, h, dv), **f32)) if nsplit > 1 else (o3, o3, o3)
    lowp = q3.dtype in (torch.bfloat16, torch.float16) and not interp
    _sparse_mla_split_kernel[(n_hb * nv, nsplit, t)](
        q3, kv, idx, kv2, idx2, sink, cos, sin, o3, pm, pl, pacc,
        h, d, dv, k1, k2, nv, cps, scale * _LOG2E, rope_start,
        q3.stride(0), q3.stride(1), stride_kv, stride_kv2, idx.stride(0), idx2.stride(0),
        stride_cs, o3.stride(0), o3.stride(1),
        BLOCK_H=bh, BLOCK_K=bk, BD1=bd1, BD2=bd2, BLOCK_V=bv, HAS_TAIL=tail,
        V_IS_K=nv == 1 and bv == bd1, SINGLE=nsplit == 1, HAS_SINK=sinks is not None,
        HAS_ROPE=has_rope, LOWP=lowp, FP8_DS=packed, FP8_NATIVE=packed and _native_fp8(q3.device),
        num_warps=tune["num_warps"],
        num_stages=tune["num_stages"])
    if nsplit > 1:
        _merge(pm, pl, pacc, sinks, out_rope, o3)


def _finish_args(sinks, out_rope, o3):
    """(sink, cos, sin, rope_start, stride_cs) as the split and merge kernels take them; unused
    pointers get o3 as a placeholder."""
    if out_rope is None:
        cos = sin = o3
        rope_start = stride_cs = 0
    else:
        cos, sin = (x.reshape(o3.shape[0], -1).contiguous() for x in out_rope)
        rope_start, stride_cs = o3.shape[-1] - 2 * cos.shape[1], cos.stride(0)
    return sinks.contiguous() if sinks is not None else o3, cos, sin, rope_start, stride_cs


def _merge(pm, pl, pacc, sinks, out_rope, o3):
    """o3 [t, H, dv] from split partials pm, pl [t, n, H], pacc [t, n, H, dv] (sinks, the
    normalisation, the inverse RoPE of ``out_rope`` and the cast)."""
    t, nsplit, h = pm.shape
    dv = o3.shape[-1]
    sink, cos, sin, rope_start, stride_cs = _finish_args(sinks, out_rope, o3)
    has_rope = out_rope is not None
    bc = min(64, triton.next_power_of_2(dv))
    _sparse_mla_merge_kernel[(triton.cdiv(h, 16), triton.cdiv(dv, bc), t)](
        pm, pl, pacc, sink, cos, sin, o3, h, dv, nsplit, rope_start, stride_cs,
        o3.stride(0), o3.stride(1), BLOCK_H=16, BLOCK_C=bc, HAS_SINK=sinks is not None,
        HAS_ROPE=has_rope, num_warps=4)


def _ws_partials(q, kv_cache, v_dim, extra_kv_cache, want: bool | None):
    """The warp-specialised Gluon kernel's partials function for a decode call, or None for the
    Triton kernel: the call's ``ws`` keyword, else ``WS_DECODE`` (None: yes) for bf16 / fp16
    rows (:mod:`.sparse_mla_ws`, DeepSeek-V4's 512-wide and GLM-5's 576-wide rows; H100: V4
    HCA B = 128 728 -> 405 us, GLM-5 B = 128 214 -> 135) and
    ``WS_FP8_DECODE`` (None: yes) for packed ones (:mod:`.sparse_mla_ws_fp8`); only on NVIDIA
    sm_90, for calls the kernel's own check accepts."""
    packed = kv_cache.dtype == torch.uint8
    if want is None:
        want = (WS_FP8_DECODE if packed else WS_DECODE) is not False
    if not want or nvidia_capability(q.device) != (9, 0):   # (no Gluon import elsewhere)
        return None
    if packed:
        from hwinfer.kernels.triton import sparse_mla_ws_fp8 as ws
        ok = ws.ws_fp8_supported(q, kv_cache, v_dim, extra_kv_cache) is None
        return ws.sparse_mla_fp8_partials if ok else None
    from hwinfer.kernels.triton import sparse_mla_ws as ws
    ok = ws.ws_supported(q, kv_cache, v_dim, extra_kv_cache) is None
    return ws.sparse_mla_partials if ok else None


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                      out_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                      extra_kv_cache: torch.Tensor | None = None,
                      extra_indices: torch.Tensor | None = None,
                      num_splits: int | None = None, **tuning: int | None) -> torch.Tensor:
    """Triton sparse MLA decode: q [B, S, H, D], kv_cache [blocks, bs, D], indices [B, S, K]
    (+ extra_kv_cache [blocks2, bs2, D], extra_indices [B, S, K2]) -> [B, S, H, v_dim or D].
    Packed caches (uint8 [blocks, bs, 584], fp8_ds_mla, D = 512) are decoded in the gather:
    half the bytes per row of a bf16 cache.

    No host sync (CUDA-graph safe). Tuning keywords (None = ``DECODE_TUNING`` for the vendor):
    block_h heads per program (default: all, up to acc_budget // block_v), block_v output
    channels per program, block_k rows per chunk, num_splits of the index list (1 = no merge
    kernel; None = heuristic from waves / min_rows), num_warps, num_stages, acc_budget, waves,
    min_rows. On NVIDIA sm_90 the calls :mod:`.sparse_mla_ws` covers (bf16 / fp16, 64 heads x
    512 or 576 with v_dim 512, unpacked rows) run its warp-specialised Gluon kernel instead (``ws=False``, or any
    tiling keyword above but num_splits, keeps the Triton kernel; ``WS_DECODE``); packed rows
    through :mod:`.sparse_mla_ws_fp8` (``WS_FP8_DECODE``).
    """
    b, s, h, d = q.shape
    dv = d if v_dim is None else int(v_dim)
    t = b * s
    out = torch.empty((b, s, h, dv), dtype=q.dtype, device=q.device)
    if t == 0 or h == 0:
        return out
    q3, idx = _rows_contiguous(q.reshape(t, h, d)), _rows_contiguous(indices.reshape(t, -1))
    if extra_kv_cache is not None:
        idx2 = _rows_contiguous(extra_indices.reshape(t, -1))
        kv2, k2, stride_kv2 = extra_kv_cache, idx2.shape[1], extra_kv_cache.stride(1)
    else:
        idx2, kv2, k2, stride_kv2 = idx, kv_cache, 0, 0
    ws = tuning.pop("ws", None)
    if ws is None and any(v is not None for v in tuning.values()):
        ws = False   # a Triton tiling asked for by name (sweeps): the Triton kernel
    partials = _ws_partials(q, kv_cache, v_dim, extra_kv_cache, ws)
    if partials is not None:
        pm, pl, pacc = partials(q3, kv_cache, kv_cache.stride(1), idx, kv2, stride_kv2, idx2, k2,
                                scale, num_splits)
        _merge(pm, pl, pacc, sinks, out_rope, out.view(t, h, dv))
        return out
    _launch(q3, kv_cache, kv_cache.stride(1), idx, kv2, stride_kv2, idx2, k2, sinks, out_rope,
            out.view(t, h, dv), scale,
            _tuning(DECODE_TUNING, q.device, tuning, kv_cache.dtype == torch.uint8), num_splits)
    return out


def sparse_mla_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                       sinks: torch.Tensor | None = None, *, scale: float, v_dim: int | None = None,
                       out_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                       **tuning: int | None) -> torch.Tensor:
    """Triton sparse MLA prefill: q [T, H, D], kv [N, D], indices [T, K] -> [T, H, v_dim or D].

    The decode kernel with one split: a program per (token, head block, value tile) over the
    token's index list (no merge pass); launched in slices of 65,535 tokens (grid axis limit).
    Tuning keywords as for :func:`sparse_mla_decode` (defaults ``PREFILL_TUNING``).
    """
    t, h, d = q.shape
    dv = d if v_dim is None else int(v_dim)
    out = torch.empty((t, h, dv), dtype=q.dtype, device=q.device)
    if t == 0 or h == 0:
        return out
    q3, idx = _rows_contiguous(q), _rows_contiguous(indices)
    tune = _tuning(PREFILL_TUNING, q.device, tuning)
    for a in range(0, t, 65535):
        z = min(t, a + 65535)
        rope = tuple(x[a:z] for x in out_rope) if out_rope is not None else None
        _launch(q3[a:z], kv, kv.stride(0), idx[a:z], kv, 0, idx[a:z], 0, sinks, rope, out[a:z],
                scale, tune, 1)
    return out


def _common_check(q, kvs, idxs, dv, out_rope) -> str | None:
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {q.dtype} not supported"
    if q.shape[-1] > 1024:
        return f"D={q.shape[-1]} > 1024 (a program holds whole rows)"
    if out_rope is not None and dv % 2:
        return f"inverse RoPE needs an even v_dim, got {dv}"
    if any(kv is not None and kv.stride(-1) != 1 for kv in kvs):
        return "kv rows must be contiguous"
    if any(ix is not None and ix.dtype not in (torch.int32, torch.int64) for ix in idxs):
        return "indices must be int32 or int64"
    return None


def sparse_mla_decode_supported(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                                sinks: torch.Tensor | None = None, *, v_dim: int | None = None,
                                out_rope=None, extra_kv_cache: torch.Tensor | None = None,
                                extra_indices: torch.Tensor | None = None, **_: object) -> str | None:
    """Per-call check: refuse what the kernel does not cover (the dispatcher falls back)."""
    if q.dim() != 4 or kv_cache.dim() != 3 or indices.dim() != 3:
        return "expects q [B, S, H, D], kv_cache [blocks, block_size, D], indices [B, S, K]"
    if q.shape[0] * q.shape[1] > 65535:
        return f"B*S={q.shape[0] * q.shape[1]} > 65535 (grid axis limit)"
    for name, cache in (("kv_cache", kv_cache), ("extra_kv_cache", extra_kv_cache)):
        if cache is not None and (cache.stride(2) != 1 or cache.stride(0) != cache.shape[1] * cache.stride(1)):
            return f"{name} must be viewable as rows [blocks * block_size, D] without a copy"
        if cache is not None and cache.dtype == torch.uint8 and cache.stride(1) % 8:
            return f"packed {name} rows must start 8-byte aligned (row stride {cache.stride(1)})"
    try:
        check_packed_caches(q, kv_cache, extra_kv_cache)
    except ValueError as exc:
        return str(exc)
    dv = q.shape[-1] if v_dim is None else int(v_dim)
    return _common_check(q, (kv_cache, extra_kv_cache), (indices, extra_indices), dv, out_rope)


def sparse_mla_prefill_supported(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                                 sinks: torch.Tensor | None = None, *, v_dim: int | None = None,
                                 out_rope=None, **_: object) -> str | None:
    """Per-call check for :func:`sparse_mla_prefill`."""
    if q.dim() != 3 or kv.dim() != 2 or indices.dim() != 2:
        return "expects q [T, H, D], kv [N, D], indices [T, K]"
    dv = q.shape[-1] if v_dim is None else int(v_dim)
    return _common_check(q, (kv,), (indices,), dv, out_rope)
