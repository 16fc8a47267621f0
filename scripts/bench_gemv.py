"""Decode GEMV (hwinfer/kernels/triton/gemv.py) against F.linear on the Qwen3.5-0.8B projection
shapes, bf16, weights cycled through copies larger than L2 (as a decode step reads them).
    python3 scripts/bench_gemv.py    ->  one CSV line per (shape, impl): us, GB/s, % of the card's copy bandwidth
(the lanes' CSV convention: op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak; "torch" is
F.linear, i.e. cuBLAS, "triton_gemv BNxBK sS wW" the kernel with that tiling). Timed as decode
runs them: 20 calls captured in a CUDA graph and replayed.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from hwinfer.ci.ceilings import copy_gbps, describe
from hwinfer.kernels.triton.gemv import cold_copies, gemv, time_on

SHAPES = [(8224, 1024), (7168, 1024), (5120, 1024), (1024, 2048), (1024, 3584), (248320, 1024)]
CONFIGS = [(16, 256, 3, 4), (32, 256, 3, 4), (64, 128, 3, 4), (32, 512, 2, 4), (64, 256, 4, 8),
           (128, 128, 3, 8)]  # block_n, block_k, stages, warps


def main() -> None:
    dev = torch.device("cuda")
    print("op,impl,shape,us,gbps_or_tflops,unit,pct_of_peak")
    for n, k in SHAPES:
        bytes_ = n * k * 2
        copies = cold_copies(torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5, 256 << 20)
        for m in (1, 4):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x.float(), copies[0].float())
            rows = [("torch", time_on(copies, lambda w: F.linear(x, w)))]
            for bn, bk, st, wp in CONFIGS:
                out = gemv(x, copies[0], block_n=bn, block_k=bk, num_stages=st, num_warps=wp)
                err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
                assert err < 2e-2, (n, k, bn, bk, err)
                rows.append((f"triton_gemv {bn}x{bk} s{st} w{wp}",
                             time_on(copies, lambda w, a=(bn, bk, st, wp): gemv(
                                 x, w, block_n=a[0], block_k=a[1], num_stages=a[2], num_warps=a[3]))))
            for name, ms in rows:
                gbs = bytes_ / (ms * 1e-3) / 1e9
                print(f"linear,{name},M{m} N{n} K{k},{ms * 1e3:.1f},{gbs:.0f},GB/s,{100 * gbs / copy_gbps():.0f}",
                      flush=True)


if __name__ == "__main__":
    print(describe(("GB/s",)), file=sys.stderr)
    main()
