"""Time rms_norm on the GPU: reference vs portable torch vs Triton, against the copy roofline.

Bytes moved per call: read x + write y (+ the weight, negligible). Reported GB/s = bytes / time.
"""
from __future__ import annotations

import torch
import triton.testing

from hwinfer.backend import resolve_device, select
from hwinfer.kernels.torch.norm import rms_norm as torch_rms_norm
from hwinfer.kernels.triton.norm import rms_norm as triton_rms_norm
from hwinfer.ops.norm import rms_norm as reference

dev = resolve_device("cuda")
table = select(dev)
print(f"device: {dev.describe()}; chosen rms_norm: {table.chosen('rms_norm')}")
for rows, dim, dtype in ((8192, 4096, torch.bfloat16), (32768, 2048, torch.bfloat16), (8192, 7168, torch.bfloat16), (4096, 4096, torch.float32)):
    x = torch.randn(rows, dim, device="cuda", dtype=dtype)
    w = torch.randn(dim, device="cuda")
    nbytes = 2 * x.numel() * x.element_size()
    ref = reference(x, w)
    for name, fn in (("reference", reference), ("torch", torch_rms_norm), ("triton", triton_rms_norm)):
        err = (fn(x, w).float() - ref.float()).abs().max().item()
        ms = triton.testing.do_bench(lambda: fn(x, w), warmup=25, rep=200)
        print(f"rms_norm [{rows}x{dim}] {str(dtype)[6:]:<9} {name:<10} {ms * 1e3:8.1f} us "
              f"{nbytes / ms / 1e6:8.0f} GB/s  max|diff| {err:.2e}")
