"""Triton kernels for picking tokens: the greedy argmax, and the pieces the sampler shares with it.

The sampler itself (contract: :func:`hwinfer.ops.sampling.sample`) is in :mod:`.sample_split`;
it uses this module's order-preserving key of an fp32 value (``_key`` / ``_unkey``) and the
contract's mix32 hash in uint32 (``_mix32``: products wrap modulo 2**32, the same bits as the
int64 reference).

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
from hwinfer.kernels.triton.resting import last_arrival, resting_words

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
def _fold(word_ptr, key, offs):
    """Fold this chunk's winner (largest int32 key, then lowest id) into the row's int64 word:
    the key in the high half, 2^32 - 1 - id in the low half; atomic_max (acq_rel)."""
    top = tl.max(key, axis=0)
    first = tl.min(tl.where(key == top, offs, _INT32_MAX), axis=0)
    tl.atomic_max(word_ptr, top.to(tl.int64) * 4294967296 + (4294967295 - first.to(tl.int64)))


@triton.jit
def _take(word_ptr):
    """The id a row's folded word holds (int32); the word goes back to its start value."""
    won = tl.atomic_xchg(word_ptr, _INT64_MIN)
    return (4294967295 - (won & 4294967295)).to(tl.int32)


@triton.jit
def _greedy_kernel(logits_ptr, out_ptr, best_ptr, ticket_ptr, V, stride, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=offs < V, other=0.0)
    key = tl.where(x != x, _INT32_MAX, _key(x.to(tl.float32)))   # NaN above +inf, as torch
    key = tl.where(offs < V, key, _INT32_MIN)                     # below every real key
    _fold(best_ptr + row, key, offs)
    if last_arrival(ticket_ptr + row, tl.num_programs(1)):
        tl.store(out_ptr + row, _take(best_ptr + row).to(tl.int64))


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
        sig = {"logits_ptr": f"*{dtype}", "out_ptr": "*i64", "best_ptr": "*i64",
               "ticket_ptr": "*i32", "V": "i32", "stride": "i32", "BLOCK": "constexpr",
               "PDL": "constexpr"}
        specs.append(AotSpec(f"greedy_tokens[{dtype}]", _greedy_kernel, sig,
                             {"BLOCK": 2048, "PDL": False}, {"num_warps": 4}))
    return specs


AOT_SPECS = _aot_specs()
