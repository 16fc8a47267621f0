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


def programs_per_sm(registers: int, num_warps: int) -> int:
    """Programs of ``num_warps`` warps at ``registers`` a thread that an NVIDIA SM's 65,536
    registers hold (allocated 8 a thread at a time; shared memory not counted)."""
    return 65536 // (max(8, -(-registers // 8) * 8) * 32 * num_warps)


@functools.lru_cache(maxsize=None)
def nvidia_capability(device) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA CUDA ``device``; None for AMD (HIP), the CPU or the
    interpreter. Cached: wrappers that pick a kernel form by architecture ask on every call."""
    import torch

    device = torch.device(device)
    if INTERPRET or device.type != "cuda" or torch.version.hip:
        return None
    return torch.cuda.get_device_capability(device)


def compiled_report(kernel) -> list[str]:
    """One line per variant of the ``@triton.jit`` ``kernel`` compiled in this process:
    registers and spills (ptxas's report, as Triton keeps it), warps, shared memory, and the
    end of the variant's cache key (its specialisation). Spills are the first suspect of a slow
    Triton kernel; the benchmark scripts print this after timing."""
    lines = []
    for entry in getattr(kernel, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for key, compiled in cache.items():
            meta = getattr(compiled, "metadata", None)
            lines.append(f"{kernel.fn.__name__}: regs {getattr(compiled, 'n_regs', '?')} spills "
                         f"{getattr(compiled, 'n_spills', '?')} warps {getattr(meta, 'num_warps', '?')} "
                         f"shared {getattr(meta, 'shared', '?')} {str(key)[-120:]}")
    return lines



def to_device(t, device):
    """``t`` on ``device`` without waiting for the device: a host tensor (the sequence bounds
    the engine keeps on the CPU for the torch impls) goes through pinned memory and an
    asynchronous copy, as the engine's own uploads (a pageable copy may wait on the stream)."""
    import torch

    device = torch.device(device)
    if t.device == device or (device.type == t.device.type and device.index is None):
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
