"""Triton kernels; each module names the op contract it implements.

Shared facts every wrapper needs, read once: whether Triton runs under its CPU interpreter (the
flag is read when triton is imported, so it cannot change later) and the GPU's SM count.
"""
from __future__ import annotations

import functools
import os

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def num_sms(device, default: int) -> int:
    """Streaming multiprocessors of a CUDA / HIP ``device``; ``default`` elsewhere (the
    interpreter: a small count that keeps grids small yet still splits work)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return default
    return torch.cuda.get_device_properties(device).multi_processor_count
