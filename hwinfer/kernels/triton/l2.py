"""L2 prefetch of the next product's weights from a decode GEMV (NVIDIA sm_80+).

The decode GEMVs (:mod:`.gemv`, :mod:`.gemv_norm`) issue their own weight loads before waiting on
the previous kernel (:mod:`.pdl`), so the DRAM streams one kernel ahead at most and idles under
the recurrences, attention and norms between products. With a prefetch target (the weight the
step reads next, from :mod:`hwinfer.kernels.weight_order` while the engine captures the step) each
program of a GEMV also asks the L2 for its share of that weight, one ``prefetch.global.L2`` per
128-byte line, right after its own loads and before the wait: nothing is loaded into registers
and no value changes, so the next product then reads L2 instead of DRAM.

``ENABLED`` (``HWINFER_L2_PREFETCH``, read at import; a module constant the benchmarks toggle)
turns it on; off by default until the card says it pays (docs/kernels.md). Never under the
interpreter (no inline assembly there), on AMD (PTX) or before sm_80.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from hwinfer.kernels import weight_order
from hwinfer.kernels.triton import INTERPRET

ENABLED = os.environ.get("HWINFER_L2_PREFETCH", "0") != "0"
# "line": one ``prefetch.global.L2`` per 128-byte line (sm_80+); "bulk": one
# ``cp.async.bulk.prefetch.L2`` per 1 KB (the copy engine of sm_90+ fetches it). Timed on the card.
MODE = "line"
# The decode GEMVs' own weight loads: "" (no hint) or "evict_first" (an L2 hint that the line is
# read once: the prefetched lines of the next product, and the activations, stay). Timed on the card.
WEIGHT_EVICT = ""


@functools.lru_cache(maxsize=None)
def _capable(device) -> bool:
    device = torch.device(device)
    if INTERPRET or device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def target(weight: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(tensor, bytes, mode) for a GEMV about to read ``weight``: the weight the step reads next,
    its span and the prefetch form (1 line, 2 bulk) when prefetching is on and the engine's
    capture has a plan; else (weight, 0, 0), which the kernel ignores. Records ``weight`` while
    the engine records the order."""
    if not (ENABLED and _capable(weight.device)):
        return weight, 0, 0
    nxt = weight_order.note(weight)
    if nxt is None or nxt.device != weight.device:
        return weight, 0, 0
    bulk = MODE == "bulk" and torch.cuda.get_device_capability(nxt.device) >= (9, 0)
    if bulk and nxt.data_ptr() % 16:
        bulk = False   # the bulk form needs 16-byte aligned addresses
    return nxt, weight_order.span_bytes(nxt), 2 if bulk else 1


@triton.jit
def l2_prefetch(ptr, nbytes, ON: tl.constexpr):
    """Program p of P asks the L2 for its share, [p * n / P, (p + 1) * n / P) in 128-byte lines,
    of the ``nbytes`` from ``ptr`` (any element type), nothing loaded into registers, nothing
    waited for. ON: 0 nothing, 1 one ``prefetch.global.L2`` a line (normal eviction priority: a
    line the next product has read may leave first), 2 one ``cp.async.bulk.prefetch.L2`` per 8
    lines (16-byte aligned ``ptr``; the size rounded up to 16 bytes stays inside the
    allocation's 512-byte granule)."""
    if ON != 0:
        base = ptr.to(tl.pointer_type(tl.int8))
        lines = tl.cdiv(nbytes, 128)
        per = tl.cdiv(lines, tl.num_programs(0))
        lo = tl.program_id(0) * per
        hi = tl.minimum(lo + per, lines)
        if ON == 1:
            for start in range(lo, hi, 256):
                idx = start + tl.arange(0, 256)
                # The asm must return a value; the predicate skips the lines past this share.
                tl.inline_asm_elementwise(
                    "@$2 prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l,b",
                    [base + idx.to(tl.int64) * 128, idx < hi], dtype=tl.int32, is_pure=False,
                    pack=1)
        else:
            end = tl.minimum(hi.to(tl.int64) * 128, nbytes)
            for start in range(lo, hi, 8 * 256):
                first = (start + tl.arange(0, 256) * 8).to(tl.int64) * 128
                size = (tl.minimum(first + 1024, end) - first + 15) // 16 * 16
                tl.inline_asm_elementwise(
                    "@$3 cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                    "=r,l,r,b", [base + first, size.to(tl.int32), first < end], dtype=tl.int32,
                    is_pure=False, pack=1)
