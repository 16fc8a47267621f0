"""Triton token sampling (contract: :func:`hwinfer.ops.sampling.sample`).

``_sample_kernel``, one program per row, every step a loop over the vocabulary in BLOCK chunks
(no sort, no full-row buffer, no host sync: it runs inside captured decode graphs):

1. greedy argmax of the raw logits (ties: lowest id) and the row max; greedy rows stop here;
2. top-k: the k-th largest scaled logit, found by bisection on an order-preserving int32 key of
   the fp32 value. Each pass counts ``key >= mid`` and also returns the nearest keys that
   actually occur on either side of ``mid``, so the bounds snap to real values (few passes on
   real logits) and the search stops early when exactly k values are >= the bound;
3. top-p: with ``Z = sum exp(l - max)`` over the kept set, the cut value ``v`` is the smallest
   kept value whose strictly-greater mass is ``< p Z``, found by the same snapped bisection;
   tokens tied at ``v`` are kept in id order while ``mass_before < p Z`` (the contract's stable
   sort order), counted with a running cumsum in the final pass;
4. final pass: Gumbel-max over the kept set with the contract's counter-based noise, the mix32
   hash evaluated in uint32 (products wrap modulo 2**32, the same bits as the int64 reference).

Scaling uses a correctly rounded division (``div_rn``), as torch does, so the kept sets agree.

``_greedy_kernel`` (contract: :func:`hwinfer.ops.sampling.greedy_tokens`) is the greedy row alone,
split over the vocabulary: one program per (row, BLOCK chunk), so a batch-1 decode step's argmax
over ~250k logits runs on every SM instead of one. Each program folds its chunk's winner into a
per-row int64 with one ``atomic_max`` (key of the value in the high half, ``2**32 - 1 - id`` in
the low half, so the larger value and then the lower id wins) and takes a ticket; the program
with the last ticket reads the winner, writes the token and puts both per-row words back to
their start values. So the kernel needs no per-call initialisation and replays in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwinfer.kernels.triton.pdl import launch_kwargs, pdl_enter, pdl_ok
from hwinfer.kernels.triton.resting import resting_words

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INT32_MIN = tl.constexpr(-2147483648)
_INT32_MAX = tl.constexpr(2147483647)
_INT64_MIN = tl.constexpr(-9223372036854775808)


@triton.jit
def _mix32(x):
    """The contract's mix32 on uint32 values."""
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x2C1B3C6D, tl.uint32)
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x297A2D39, tl.uint32)
    return x ^ (x >> 15)


@triton.jit
def _key(v):
    """Order-preserving fp32 -> int32 map (-0.0 folded onto +0.0, as the float compare does)."""
    v = tl.where(v == 0.0, 0.0, v)
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b)


@triton.jit
def _unkey(k):
    """Inverse of :func:`_key` (int64 holding an int32 key) -> fp32."""
    k32 = k.to(tl.int32)
    return tl.where(k32 < 0, k32 ^ 0x7FFFFFFF, k32).to(tl.float32, bitcast=True)


@triton.jit
def _mid(lo, hi):
    """A probe strictly between keys lo and hi: the value midpoint (halves the value range,
    which real logits fill densely near the cut), else the key midpoint (infinite bounds)."""
    mk = _key(0.5 * _unkey(lo) + 0.5 * _unkey(hi)).to(tl.int64)
    return tl.where((mk > lo) & (mk < hi), mk, lo + ((hi - lo) >> 1))


@triton.jit
def _scaled(base, offs, V, t):
    m = offs < V
    x = tl.load(base + offs, mask=m, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(x, t), m


@triton.jit
def _sample_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, step_ptr, out_ptr,
                   V, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    ar = tl.arange(0, BLOCK)
    # 1. greedy: first index of the maximum.
    best_v = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    best_i = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
    low = tl.min(tl.full([BLOCK], float("inf"), tl.float32), axis=0)
    for s0 in range(0, V, BLOCK):
        offs = s0 + ar
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        low = tl.minimum(low, tl.min(tl.where(offs < V, x, float("inf")), axis=0))
        bm = tl.max(x, axis=0)
        bi = tl.argmax(x, axis=0) + s0
        better = bm > best_v
        best_i = tl.where(better, bi, best_i)
        best_v = tl.where(better, bm, best_v)
    result = best_i
    temp = tl.load(temp_ptr + row).to(tl.float32)
    if temp > 0:
        t = tl.maximum(temp, 1e-6)
        smax = tl.math.div_rn(best_v, t)
        k = tl.minimum(tl.maximum(tl.load(topk_ptr + row).to(tl.int64), 0), V)
        p = tl.load(topp_ptr + row).to(tl.float32)
        # 2. top-k threshold thr_k: invariant count(key >= lo) >= k > count(key >= hi).
        lo = _key(tl.math.div_rn(low, t)).to(tl.int64)   # count(key >= row min) = V >= k
        hi = tl.where((k > 0) & (k < V), _key(smax).to(tl.int64) + 1, lo + 1)
        while hi - lo > 1:
            mid = _mid(lo, hi)
            cnt = tl.sum(tl.zeros([BLOCK], dtype=tl.int64), axis=0)
            nxt = tl.full((), _INT32_MAX, tl.int64)
            prv = tl.full((), _INT32_MIN, tl.int64)
            for s0 in range(0, V, BLOCK):
                sv, m = _scaled(base, s0 + ar, V, t)
                key = _key(sv).to(tl.int64)
                ge = m & (key >= mid)
                cnt += tl.sum(ge.to(tl.int64), axis=0)
                nxt = tl.minimum(nxt, tl.min(tl.where(ge, key, _INT32_MAX), axis=0))
                prv = tl.maximum(prv, tl.max(tl.where(m & ~ge, key, _INT32_MIN), axis=0))
            lo = tl.where(cnt >= k, nxt, lo)
            hi = tl.where(cnt >= k, tl.where(cnt == k, nxt + 1, hi), prv + 1)
        thr_k = lo   # without top-k: the row minimum, every token kept
        # 3. top-p cut thr_p: E_gt(lo) >= target > E_gt(hi), hi a kept key; e_hi = E_gt(hi).
        target = p * 0.0
        e_hi = p * 0.0
        q = p * 0.0
        lo = thr_k - 1
        hi = _key(smax).to(tl.int64)
        use_p = p < 1.0
        if use_p:
            z = p * 0.0
            for s0 in range(0, V, BLOCK):
                sv, m = _scaled(base, s0 + ar, V, t)
                keep = m & (_key(sv).to(tl.int64) >= thr_k)
                z += tl.sum(tl.where(keep, tl.exp(sv - smax), 0.0), axis=0)
            target = tl.maximum(p * z, 1e-30)
            while hi - lo > 1:
                mid = _mid(lo, hi)
                e = p * 0.0
                nxt = tl.full((), _INT32_MAX, tl.int64)
                prv = tl.full((), _INT32_MIN, tl.int64)
                for s0 in range(0, V, BLOCK):
                    sv, m = _scaled(base, s0 + ar, V, t)
                    key = _key(sv).to(tl.int64)
                    kept = m & (key >= thr_k)
                    gt = kept & (key > mid)
                    e += tl.sum(tl.where(gt, tl.exp(sv - smax), 0.0), axis=0)
                    nxt = tl.minimum(nxt, tl.min(tl.where(gt, key, _INT32_MAX), axis=0))
                    prv = tl.maximum(prv, tl.max(tl.where(kept & ~gt, key, _INT32_MIN), axis=0))
                below = e < target
                e_hi = tl.where(below, e, e_hi)
                hi = tl.where(below, prv, hi)
                lo = tl.where(below, lo, nxt - 1)
            kb = hi.to(tl.int32)
            vbits = tl.where(kb < 0, kb ^ 0x7FFFFFFF, kb)
            q = tl.exp(vbits.to(tl.float32, bitcast=True) - smax)
        thr_p = hi
        # 4. Gumbel-max over the kept set; noise from mix32(id ^ row hash).
        seed = tl.load(seed_ptr + row).to(tl.int64)
        step = tl.load(step_ptr + row).to(tl.int64)
        hrow = _mix32(step.to(tl.uint32) ^ _mix32(seed.to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32))))
        best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
        pick = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
        ties = p * 0.0
        for s0 in range(0, V, BLOCK):
            offs = s0 + ar
            sv, m = _scaled(base, offs, V, t)
            key = _key(sv).to(tl.int64)
            kept = m & (key >= thr_k)
            if use_p:
                tie = kept & (key == thr_p)
                rank = ties + tl.cumsum(tie.to(tl.float32), axis=0) - tie.to(tl.float32)
                ok_tie = tie & ((rank == 0) | (e_hi + rank * q < target))
                kept = kept & ((key > thr_p) | ok_tie)
                ties += tl.sum(tie.to(tl.float32), axis=0)
            h = _mix32(offs.to(tl.uint32) ^ hrow)
            u = ((h >> 8).to(tl.float32) + 0.5) / 16777216.0
            val = tl.where(kept, sv - tl.log(-tl.log(u)), float("-inf"))
            bm = tl.max(val, axis=0)
            bi = tl.argmax(val, axis=0) + s0
            better = bm > best
            pick = tl.where(better, bi, pick)
            best = tl.where(better, bm, best)
        result = pick
    tl.store(out_ptr + row, result)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
           block: int | None = None, num_warps: int = 8) -> torch.Tensor:
    """logits [B, V]; temperature, top_p [B] float; top_k, seeds, steps [B] int -> ids [B] int32."""
    if logits.dim() != 2:
        raise ValueError(f"sample: logits must be [B, V], got shape {tuple(logits.shape)}")
    b, v = logits.shape
    for name, tt in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                     ("seeds", seeds), ("steps", steps)):
        if tt.shape != (b,):
            raise ValueError(f"sample: {name} must have shape [{b}], got {tuple(tt.shape)}")
    out = torch.empty(b, dtype=torch.int32, device=logits.device)
    if b == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    blk = block or min(4096, triton.next_power_of_2(v))
    _sample_kernel[(b,)](logits, temperature.contiguous(), top_k.contiguous(),
                         top_p.contiguous(), seeds.contiguous(), steps.contiguous(), out, v,
                         logits.stride(0), BLOCK=blk, num_warps=num_warps)
    return out


def sample_supported(logits: torch.Tensor, top_k: torch.Tensor, seeds: torch.Tensor,
                     steps: torch.Tensor, **_: object) -> str | None:
    """Per-call check: float logits, V < 2**31, integer top_k / seeds / steps."""
    if logits.dim() != 2 or logits.dtype not in _FLOATS:
        return "logits must be float [B, V]"
    if logits.shape[1] >= 2**31 - 4096:
        return "vocab too large for int32 ids"
    for name, tt in (("top_k", top_k), ("seeds", seeds), ("steps", steps)):
        if tt.is_floating_point():
            return f"{name} must be an integer tensor"
    return None


@triton.jit
def _greedy_kernel(logits_ptr, out_ptr, best_ptr, ticket_ptr, V, stride, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=offs < V, other=0.0)
    key = tl.where(x != x, _INT32_MAX, _key(x.to(tl.float32)))   # NaN above +inf, as torch
    key = tl.where(offs < V, key, _INT32_MIN)                     # below every real key
    top = tl.max(key, axis=0)
    first = tl.min(tl.where(key == top, offs, _INT32_MAX), axis=0)
    packed = top.to(tl.int64) * 4294967296 + (4294967295 - first.to(tl.int64))
    # acq_rel (the default): the last ticket's holder sees every program's atomic_max.
    tl.atomic_max(best_ptr + row, packed)
    if tl.atomic_add(ticket_ptr + row, 1) == tl.num_programs(1) - 1:
        won = tl.atomic_xchg(best_ptr + row, _INT64_MIN)
        tl.store(out_ptr + row, 4294967295 - (won & 4294967295))
        tl.atomic_xchg(ticket_ptr + row, 0)


# The per-row (winner, ticket) words of _greedy_kernel: at rest between calls (see .resting).
_GREEDY_STARTS = ((torch.int64, -2**63), (torch.int32, 0))


def greedy_tokens(logits: torch.Tensor, out: torch.Tensor, block: int = 2048,
                  num_warps: int = 4) -> torch.Tensor:
    """logits [B, V] float; out [B] int64, written in place -> out."""
    if logits.dim() != 2 or out.shape != (logits.shape[0],) or out.dtype != torch.int64:
        raise ValueError(f"greedy_tokens: want logits [B, V] and out [B] int64, got "
                         f"{tuple(logits.shape)} and {tuple(out.shape)} {out.dtype}")
    b, v = logits.shape
    if b == 0:
        return out
    if v == 0:
        raise ValueError("greedy_tokens: empty vocabulary")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    best, ticket = resting_words("greedy_tokens", b, logits.device, _GREEDY_STARTS)
    target = out if out.is_contiguous() else torch.empty_like(out)
    _greedy_kernel[(b, triton.cdiv(v, block))](logits, target, best, ticket, v, logits.stride(0),
                                               BLOCK=block, PDL=pdl_ok(logits.device),
                                               num_warps=num_warps, **launch_kwargs(logits.device))
    if target is not out:
        out.copy_(target)
    return out


def greedy_tokens_supported(logits: torch.Tensor, **_: object) -> str | None:
    """Per-call check: float logits [B, V], V < 2**31 - 4096 (int32 offsets)."""
    if logits.dim() != 2 or logits.dtype not in _FLOATS:
        return "logits must be float [B, V]"
    if logits.shape[1] >= 2**31 - 4096:
        return "vocab too large for int32 ids"
    return None


def _aot_specs():
    from hwinfer.kernels.triton.aot import AotSpec

    specs = []
    for dtype in ("fp32", "bf16"):
        sig = {"logits_ptr": f"*{dtype}", "temp_ptr": "*fp32", "topk_ptr": "*i32",
               "topp_ptr": "*fp32", "seed_ptr": "*i64", "step_ptr": "*i64", "out_ptr": "*i32",
               "V": "i32", "stride": "i32", "BLOCK": "constexpr"}
        specs.append(AotSpec(f"sample[{dtype}]", _sample_kernel, sig, {"BLOCK": 4096},
                             {"num_warps": 8}))
        sig = {"logits_ptr": f"*{dtype}", "out_ptr": "*i64", "best_ptr": "*i64",
               "ticket_ptr": "*i32", "V": "i32", "stride": "i32", "BLOCK": "constexpr",
               "PDL": "constexpr"}
        specs.append(AotSpec(f"greedy_tokens[{dtype}]", _greedy_kernel, sig,
                             {"BLOCK": 2048, "PDL": False}, {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
