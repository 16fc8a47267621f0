"""One call of gdn_chunked / kda_chunked (ours, then fla-core's) inside a CUDA profiler range,
after warm calls (fla's autotuning included), for Nsight Compute to profile only those:

    ncu --clock-control none --profile-from-start off -k regex:"_state_kernel|fwd_kernel_h" \
        --section WarpStateStats -o state python3 scripts/probe_delta_chunk.py gdn 1x16384

Prints fla's chosen launch configuration of its state (h) kernel, where its autotuner exposes it.
"""
from __future__ import annotations

import sys

import torch

from bench_delta_chunk import FLA, fla_call, make
from hwinfer.kernels.triton import delta_chunk


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "gdn"
    nseq, seqlen = (int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1x16384").split("x"))
    inputs, _, _ = make(kind, nseq, seqlen)
    ours = delta_chunk.gdn_chunked if kind == "gdn" else delta_chunk.kda_chunked
    calls = [lambda: ours(**inputs, use_qk_l2norm=True)]
    if FLA:
        calls.append(lambda: fla_call(kind)(**inputs))
    for fn in calls:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    if FLA:
        from fla.ops.common import chunk_delta_h
        kernel = chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64
        for attr in ("best_config", "cache"):
            if hasattr(kernel, attr):
                print(f"fla h kernel {attr}: {getattr(kernel, attr)}")


if __name__ == "__main__":
    main()
