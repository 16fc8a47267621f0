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
LINE = 128   # bytes a prefetch asks for (the L2 line)


@functools.lru_cache(maxsize=None)
def _capable(device) -> bool:
    device = torch.device(device)
    if INTERPRET or device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def target(weight: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """(tensor, bytes, on) for a GEMV about to read ``weight``: the weight the step reads next
    and its span when prefetching is on and the engine's capture has a plan; else (weight, 0,
    False), which the kernel ignores. Records ``weight`` while the engine records the order."""
    if not (ENABLED and _capable(weight.device)):
        return weight, 0, False
    nxt = weight_order.note(weight)
    if nxt is None or nxt.device != weight.device:
        return weight, 0, False
    return nxt, weight_order.span_bytes(nxt), True


@triton.jit
def l2_prefetch(ptr, nbytes, ON: tl.constexpr):
    """Program p of P asks the L2 for lines [p * n / P, (p + 1) * n / P) of the ``nbytes`` from
    ``ptr`` (any element type): one ``prefetch.global.L2`` per line (normal eviction priority: a
    line the next product has read may leave first), no registers filled, nothing waited for. A no-op unless ``ON``."""
    if ON:
        base = ptr.to(tl.pointer_type(tl.int8))
        lines = tl.cdiv(nbytes, 128)
        per = tl.cdiv(lines, tl.num_programs(0))
        lo = tl.program_id(0) * per
        hi = tl.minimum(lo + per, lines)
        for start in range(lo, hi, 256):
            idx = start + tl.arange(0, 256)
            # The asm must return a value; the predicate skips the lines past this share.
            tl.inline_asm_elementwise(
                "@$2 prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l,b",
                [base + idx.to(tl.int64) * 128, idx < hi], dtype=tl.int32, is_pure=False, pack=1)
