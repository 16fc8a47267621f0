"""Kernels to read with Nsight Compute: each target is built and run once to compile (and, for
fla, autotune), then once more between cudaProfilerStart / Stop, so that
``ncu --profile-from-start off`` sees exactly one call of each.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --csv --page details \
        python3 scripts/ncu_targets.py kda:1x4096 gdn:1x16384 mla:hca128 gemv:248320x1024

Targets: ``kda:NxT`` / ``gdn:NxT`` (our chunked kernels, then fla's when importable; N
sequences of T tokens, bench_delta_chunk's shapes), ``mla:hca128`` / ``mla:hca128fp8`` /
``mla:csa128`` (bench_sparse_mla's DeepSeek-V4 decode at B = 128), ``gemv:NxK`` (the decode
GEMV at one row, as the model calls it: bf16 weight, PDL off).
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_delta_chunk as bdc  # noqa: E402  (scripts/ is not a package)
import bench_sparse_mla as bsm  # noqa: E402


def chunked(kind: str, shape: str):
    nseq, seqlen = (int(x) for x in shape.split("x"))
    inputs, _, _ = bdc.make(kind, nseq, seqlen)
    ours = bdc.triton_la.gdn_chunked if kind == "gdn" else bdc.triton_la.kda_chunked
    calls = [lambda: ours(**inputs)]
    if bdc.FLA:
        fla = bdc.fla_call(kind)
        calls.append(lambda: fla(**inputs))
    return calls


def mla(shape: str):
    batch = int(shape.removesuffix("fp8")[3:])   # (rstrip("fp8") also ate the batch's last 8)
    inputs = bsm.dsv4_inputs(batch, 512 if shape.startswith("csa") else None)
    if shape.endswith("fp8"):
        inputs = bsm.packed(inputs)
    return [lambda: bsm.triton_decode(**inputs)]


def gemv(shape: str):
    from hwinfer.kernels.triton.gemv import gemv_rows

    n, k = (int(x) for x in shape.split("x"))
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    return [lambda: gemv_rows(x, w)]


def main() -> None:
    makers = {"kda": lambda s: chunked("kda", s), "gdn": lambda s: chunked("gdn", s),
              "mla": mla, "gemv": gemv}
    calls = []
    for target in sys.argv[1:]:
        kind, _, shape = target.partition(":")
        if kind not in makers:
            sys.exit(f"unknown target {target!r}: one of {sorted(makers)} with ':SHAPE'")
        calls += makers[kind](shape)
    for call in calls:   # compile / autotune outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
