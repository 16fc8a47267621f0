"""The ceilings a benchmark's percentages are taken against, measured on the card that runs it.

A "% of peak" means the same on every card only if the peak is that card's own: the bench scripts
once divided by the H200's 4,270 GB/s on an H100 as well (whose copy reaches 3,024). So each
process measures, once, on its first call:

* ``copy_gbps()``: the copy bandwidth, read + write bytes of ``y.copy_(x)`` over 1 GiB
  (``triton.testing.do_bench``): what a streaming kernel can reach;
* ``matmul_tflops()``: bf16 ``a @ b`` at 8192^3 (cuBLAS): what a compute-bound kernel can reach.

``HWINFER_PEAK_GBS`` / ``HWINFER_PEAK_TFLOPS`` set them instead (a run that has measured them
already, or a dry run without a GPU, which otherwise takes the H200 figures below).
``describe()`` is the line the scripts print to stderr, so every output file says what its
percentages are of.

Measured so far (docs/hardware-runs.md): H200 4,270 GB/s and ~780 TFLOP/s (first sessions),
H100 80 GB 3,024 GB/s (twenty-third session).
"""
from __future__ import annotations

import functools
import os

H200_GBPS, H200_TFLOPS = 4270.0, 780.0


def _bench_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _ceiling(env: str, h200: float, measure) -> float:
    """``env``'s value if set, else the H200's figure without a GPU, else ``measure()``."""
    if env in os.environ:
        return float(os.environ[env])
    return measure() if _on_gpu() else h200


@functools.cache
def copy_gbps() -> float:
    """The card's copy bandwidth, GB/s (read + write); the env override first."""
    def measure() -> float:
        import torch

        x = torch.empty(1 << 29, dtype=torch.float16, device="cuda")   # 1 GiB
        y = torch.empty_like(x)
        ms = _bench_ms(lambda: y.copy_(x))
        del x, y
        torch.cuda.empty_cache()
        return 2 * (1 << 30) / ms / 1e6
    return _ceiling("HWINFER_PEAK_GBS", H200_GBPS, measure)


@functools.cache
def matmul_tflops() -> float:
    """The card's bf16 matmul rate, TFLOP/s (8192^3); the env override first."""
    def measure() -> float:
        import torch

        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn_like(a)
        ms = _bench_ms(lambda: a @ b)
        del a, b
        torch.cuda.empty_cache()
        return 2 * n ** 3 / ms / 1e9
    return _ceiling("HWINFER_PEAK_TFLOPS", H200_TFLOPS, measure)


def peak(unit: str) -> float:
    """The ceiling of a rate in ``unit`` ("GB/s" or "TFLOP/s")."""
    return copy_gbps() if unit == "GB/s" else matmul_tflops()


def describe(units: tuple[str, ...] = ("GB/s", "TFLOP/s")) -> str:
    """One line naming the ceilings (and where they came from) for a script's stderr."""
    import torch

    card = torch.cuda.get_device_name() if _on_gpu() else "no GPU"
    parts = []
    if "GB/s" in units:
        src = "set" if "HWINFER_PEAK_GBS" in os.environ else "measured" if _on_gpu() else "H200's"
        parts.append(f"copy {copy_gbps():.0f} GB/s ({src})")
    if "TFLOP/s" in units:
        src = "set" if "HWINFER_PEAK_TFLOPS" in os.environ else "measured" if _on_gpu() else "H200's"
        parts.append(f"bf16 matmul {matmul_tflops():.0f} TFLOP/s ({src})")
    return f"# ceilings ({card}): " + "; ".join(parts) + "; every % is of these"
